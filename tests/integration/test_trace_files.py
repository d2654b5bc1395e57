"""A saved Trace is trusted whole or refused by name: trace.json is covered by the checksum, and any
malformed or corrupted trace.json gives a TraceError naming the file (never a raw Python error)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_viz.errors import EngramVizError
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.trace import Trace, TraceError
from engram_viz.run.trace_doc import doc_sha256 as _doc_sha256
from engram_viz.weights.synthetic import synthetic_checkpoint

PROMPTS = [
    {"id": "en", "category": "english_entities", "text": "Alexander the Great tamed Bucephalus."},
    {"id": "img", "category": "image", "text": "Look <image:3x2> at it."},
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Trace, Path]:
    pipe = Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu")
    trace = pipe.run(PROMPTS)
    return trace, trace.save(tmp_path_factory.mktemp("trace") / "t")


def _copy(saved_dir: Path, where: Path) -> Path:
    shutil.copytree(saved_dir, where / "t")
    return where / "t"


def _doc(path: Path) -> dict:
    return json.loads((path / "trace.json").read_text(encoding="utf-8"))


def _write_doc(path: Path, doc: dict) -> None:
    (path / "trace.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(model_label="DeepSeek-V4.1-Flash (real weights)"),
        lambda d: d["meta"].update(synthetic=False),
        lambda d: d.update(streams_label="the model's own residual streams"),
        lambda d: d["texts"].__setitem__(0, "Another text"),
        lambda d: d["categories"].__setitem__(0, "idioms"),
    ],
    ids=["model_label", "meta.synthetic", "streams_label", "texts", "categories"],
)
def test_an_edited_trace_json_is_refused(saved, tmp_path, edit):
    _, src = saved
    path = _copy(src, tmp_path)
    doc = _doc(path)
    edit(doc)
    _write_doc(path, doc)
    with pytest.raises(TraceError, match=rf"{path / 'trace.json'} was edited after it was saved"):
        Trace.load(path)


def test_reformatting_trace_json_keeps_it_trusted(saved, tmp_path):
    """The checksum is of the content, not the bytes: re-indenting or reordering keys is no edit."""
    trace, src = saved
    path = _copy(src, tmp_path)
    doc = _doc(path)
    (path / "trace.json").write_text(json.dumps(dict(reversed(doc.items())), indent=4), encoding="utf-8")
    assert Trace.load(path).equals(trace)


def _retyped(field: str, value):
    def edit(doc: dict) -> None:
        if value is _DELETE:
            del doc[field]
        else:
            doc[field] = value

    return edit


_DELETE = object()
MALFORMED = {
    "not-json": (b"{not json", "is not valid JSON"),
    "not-utf8": (b'{"format": "engram-viz-trace\xff"}', r"is not UTF-8 text: byte 0xff at offset 28"),
    "a-list": (b"[1, 2]", r"is not an engram-viz trace \(format='list'\)"),
    "other-format": (b'{"format": "x"}', r"is not an engram-viz trace \(format='x'\)"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "is not valid JSON"),
}
RETYPED = {
    "version-old": (_retyped("version", 1), r"trace format version 1; this engram-viz reads version 2"),
    "version-str": (_retyped("version", "2"), r"trace format version '2'"),
    "no-prompt_ids": (_retyped("prompt_ids", _DELETE), r"lacks the field 'prompt_ids'"),
    "no-meta": (_retyped("meta", _DELETE), r"lacks the field 'meta'"),
    "layer_ids-floats": (_retyped("layer_ids", [1.0, 3.0]), r"field 'layer_ids' must be a list of integers"),
    "layer_ids-bools": (_retyped("layer_ids", [True, 3]), r"field 'layer_ids' must be a list of integers"),
    "pieces-str": (_retyped("pieces", "abc"), r"field 'pieces' must be a list of lists of strings"),
    "texts-ints": (_retyped("texts", [1, 2]), r"field 'texts' must be a list of strings"),
    "meta-list": (_retyped("meta", []), r"field 'meta' must be an object, got list"),
    "label-null": (_retyped("model_label", None), r"field 'model_label' must be a string, got NoneType"),
    "sha-int": (_retyped("tensors_sha256", 5), r"field 'tensors_sha256' must be a hex string"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_trace_json_names_the_file(saved, tmp_path, name):
    _, src = saved
    path = _copy(src, tmp_path)
    content, message = MALFORMED[name]
    (path / "trace.json").write_bytes(content)
    with pytest.raises(TraceError, match=message) as err:
        Trace.load(path)
    assert str(path / "trace.json") in str(err.value)


@pytest.mark.parametrize("name", list(RETYPED))
def test_a_trace_json_with_wrong_types_names_the_file_and_field(saved, tmp_path, name):
    _, src = saved
    path = _copy(src, tmp_path)
    edit, message = RETYPED[name]
    doc = _doc(path)
    edit(doc)
    _write_doc(path, doc)
    with pytest.raises(TraceError, match=message) as err:
        Trace.load(path)
    assert str(path / "trace.json") in str(err.value)


def test_an_inconsistent_trace_with_a_valid_checksum_is_a_trace_error(saved, tmp_path):
    """Past the checksum (a document re-signed by hand), the Trace's own checks still answer."""
    _, src = saved
    path = _copy(src, tmp_path)
    doc = _doc(path)
    doc["layer_ids"] = [1, 5]
    doc["trace_sha256"] = _doc_sha256(doc)
    _write_doc(path, doc)
    with pytest.raises(TraceError, match=rf"{path} holds an inconsistent Trace: engram.L3.\w+ belongs to no layer"):
        Trace.load(path)


# ---------------------------------------------------------------- random corruption


def _load_or_error(saved_dir: Path, content: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = _copy(saved_dir, Path(tmp))
        (path / "trace.json").write_bytes(content)
        try:
            return Trace.load(path)
        except EngramVizError as err:
            assert isinstance(err, TraceError) and str(path) in str(err), err
            return None


@given(data=st.data())
def test_random_byte_corruption_gives_only_trace_errors(saved, data):
    trace, src = saved
    raw = bytearray((src / "trace.json").read_bytes())
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    if kind == "flip":
        raw[at] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        del raw[at:]
    elif kind == "insert":
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        del raw[at : at + data.draw(st.integers(1, 64))]
    back = _load_or_error(src, bytes(raw))
    assert back is None or back.equals(trace)  # whitespace edits may leave the same document


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@given(data=st.data())
def test_random_field_values_give_only_trace_errors(saved, data):
    """A field replaced by any JSON value, with the checksum re-signed so the type and consistency
    checks behind it are reached."""
    _, src = saved
    doc = json.loads((src / "trace.json").read_text(encoding="utf-8"))
    field = data.draw(st.sampled_from(sorted(doc)))
    doc[field] = data.draw(_JSON)
    doc["trace_sha256"] = _doc_sha256(doc)
    back = _load_or_error(src, json.dumps(doc).encode())
    assert back is None or isinstance(back, Trace)  # a well-typed value (a new label, say) loads


def _with(trace: Trace, **changes) -> Trace:
    out = trace.select(trace.prompt_ids)
    for name, value in changes.items():
        setattr(out, name, value)
    return out


BAD_LABELS = {
    "meta_set": lambda t: _with(t, meta={**t.meta, "seen": {1, 2}}),
    "meta_object": lambda t: _with(t, meta={**t.meta, "cfg": object()}),
    "meta_int_key": lambda t: _with(t, meta={**t.meta, "by_layer": {1: "a"}}),
    "meta_nan": lambda t: _with(t, meta={**t.meta, "loss": float("nan")}),
    "text_lone_surrogate": lambda t: _with(t, texts=["bad \ud800 text", *t.texts[1:]]),
    "meta_key_lone_surrogate": lambda t: _with(t, meta={**t.meta, "k\udfff": 1}),
}


@pytest.mark.parametrize("name", sorted(BAD_LABELS))
def test_a_failed_save_keeps_the_earlier_trace_and_leaves_no_folder(saved, tmp_path, name):
    """A label JSON cannot hold is refused before anything is written: the earlier trace in the
    folder still loads, equal, and nothing is left beside it; into a new folder, no folder at all."""
    trace, src = saved
    path = _copy(src, tmp_path)
    bad = BAD_LABELS[name](trace)
    with pytest.raises(TraceError, match=r"cannot save the Trace: (meta|texts)\["):
        bad.save(path)
    assert Trace.load(path).equals(trace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
    with pytest.raises(TraceError):
        bad.save(tmp_path / "new" / "t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_a_save_interrupted_while_writing_keeps_the_earlier_trace(saved, tmp_path, monkeypatch):
    """A failure after the labels passed (the tensor file cannot be written) is all or nothing too."""
    trace, src = saved
    path = _copy(src, tmp_path)

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("engram_viz.run.trace.save_file", boom)
    with pytest.raises(OSError, match="No space left"):
        _with(trace, model_label="another run").save(path)
    assert Trace.load(path).equals(trace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_save_refuses_a_folder_of_something_else(saved, tmp_path):
    trace, _ = saved
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(EngramVizError, match="holds files of something else"):
        trace.save(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert Trace.load(trace.save(tmp_path / "mine2")).equals(trace)  # and a resave replaces a trace whole
    assert Trace.load(trace.save(tmp_path / "mine2")).equals(trace)
