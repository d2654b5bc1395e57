"""Bad prompt files: every error is a PromptError naming the file, the line and the prompt, with a
clear message (never a tokenizer's or Python's own); random corruption gives nothing else."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_viz.errors import EngramVizError
from engram_viz.run.images import ImagePromptError
from engram_viz.run.prompts import PromptError, build_prompt, load_prompts


def _file(tmp_path: Path, *lines: str | bytes) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    return path


GOOD = '{"id": "ok", "text": "fine"}'
CASES = {
    # a lone surrogate as a JSON escape: valid JSON, valid UTF-8 file, not text a tokenizer takes
    "surrogate-escape": (
        '{"id": "s1", "text": "bad \\ud800 here"}',
        r":2: prompt 's1': 'text' holds U\+D800 at character 4",
    ),
    # the same surrogate written as (invalid) UTF-8 bytes
    "surrogate-bytes": (
        b'{"id": "s2", "text": "bad \xed\xa0\x80 here"}',
        r":2: prompt 's2': not UTF-8 text: byte 0xed at column 27",
    ),
    "latin1": (b'{"id": "l1", "text": "caf\xe9"}', r":2: prompt 'l1': not UTF-8 text: byte 0xe9"),
    "malformed-image": (
        '{"id": "im", "text": "see <image:big> now"}',
        r":2: prompt 'im': image placeholder <image:big> is malformed",
    ),
    "unterminated-image": (
        '{"id": "iu", "text": "see <image:3x3 now"}',
        r":2: prompt 'iu': unterminated image placeholder",
    ),
    "zero-grid": (
        '{"id": "iz", "text": "<image:0x3>"}',
        r":2: prompt 'iz': image placeholder <image:0x3>: the grid must be at least 1x1",
    ),
    "5000-digit-size": (
        '{"id": "id5", "text": "<image:' + "9" * 5000 + 'x480px>"}',
        r":2: prompt 'id5': image placeholder .* holds a number of 5,000 digits",
    ),
    "5000-digit-seed": (
        '{"id": "r", "text": null, "seed": ' + "7" * 5000 + ', "length": 3}',
        r":2: not valid JSON: Exceeds the limit",
    ),
    "negative-4000-digit-seed": (
        '{"id": "r", "text": null, "seed": -' + "7" * 4000 + ', "length": 3}',
        r":2: prompt 'r' has no 'text'.*seed=an integer of 4,000 digits",
    ),
    "bool-seed": ('{"id": "r", "text": null, "seed": true, "length": 3}', r":2: prompt 'r' has no 'text'; .*seed=True"),
    "huge-length": ('{"id": "r", "text": null, "seed": 1, "length": 10000000000}', r"'length' in 1\.\.1,000,000"),
    "blank-text": ('{"id": "b", "text": "   "}', r":2: prompt 'b': 'text' is empty"),
    "text-number": ('{"id": "n", "text": 5}', r":2: prompt 'n': 'text' must be text \(a str\), got int"),
    "blank-id": ('{"id": " ", "text": "x"}', r":2: 'id' must be a non-empty string"),
    "deep-json": ("[" * 100_000, r":2: not valid JSON"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_prompt_line_names_the_file_line_and_prompt(tmp_path, name):
    line, message = CASES[name]
    path = _file(tmp_path, GOOD, line)
    with pytest.raises(PromptError, match=message) as err:
        load_prompts(path)
    assert str(err.value).startswith(f"{path}:2: ") and len(str(err.value)) < 600


def test_a_grid_over_the_config_cap_names_the_file_line_and_prompt_when_built(tmp_path, tokenizer):
    """Limits that depend on the config (the span cap) are checked when the prompt is built."""
    path = _file(tmp_path, GOOD, '{"id": "wide", "text": "<image:32x32> a chart"}')
    wide = load_prompts(path)[1]
    with pytest.raises(
        ImagePromptError,
        match=rf"{path}:2: prompt 'wide': image placeholder <image:32x32> asks for 1024 image tokens \(32 x 32\) in a span of 1,058",
    ):
        build_prompt(wide, tokenizer)


def test_a_byte_order_mark_and_crlf_lines_are_read(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "x"}\r\n{"id": "b", "text": "y"}\r\n')
    assert [p.id for p in load_prompts(path)] == ["a", "b"]


# ---------------------------------------------------------------- random corruption

VALID = (
    '{"id": "en", "category": "english_entities", "text": "Alexander the Great tamed Bucephalus."}\n'
    '{"id": "zh", "category": "chinese_entities", "text": "张仲景是东汉末年的名医。"}\n'
    '{"id": "img", "category": "image", "text": "Look <image:3x2> and <image:640x480px>."}\n'
    '{"id": "rnd", "category": "random_token", "text": null, "seed": 7, "length": 9}\n'
).encode()


def _load_or_error(content: bytes, tokenizer):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        path.write_bytes(content)
        try:
            return [build_prompt(p, tokenizer) for p in load_prompts(path)]
        except EngramVizError as err:
            assert isinstance(err, (PromptError, ImagePromptError)) and str(path) in str(err), err
            return None


@given(data=st.data())
def test_random_byte_corruption_gives_only_prompt_errors(tokenizer, data):
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "flip" and raw:
            raw[at] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            raw[at:at] = data.draw(
                st.binary(min_size=1, max_size=6) | st.sampled_from([b"\xed\xa0\x80", b"<image:", b"\\ud800"])
            )
        elif kind == "delete":
            del raw[at : at + data.draw(st.integers(1, 12))]
        else:
            del raw[at:]
    _load_or_error(bytes(raw), tokenizer)


_VALUES = st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.lists(st.integers(), max_size=3)
_TEXTS = st.text() | st.builds(
    lambda a, w, h, px: f"{a}<image:{w}x{h}{'px' if px else ''}>",
    st.text(max_size=5),
    st.integers(0, 3000),
    st.integers(0, 3000),
    st.booleans(),
)


@given(field=st.sampled_from(["id", "category", "text", "seed", "length"]), value=_VALUES | _TEXTS)
def test_random_field_values_give_only_prompt_errors(tokenizer, field, value):
    lines = [json.loads(x) for x in VALID.decode().splitlines()]
    lines[3 if field in ("seed", "length") else 2][field] = value
    content = "\n".join(json.dumps(x) for x in lines).encode()
    _load_or_error(content, tokenizer)
