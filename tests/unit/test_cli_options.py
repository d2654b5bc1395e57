"""Every numeric option of every ``engram-viz`` sub-command goes through one of the shared argparse
types in ``cli.py`` (bounded integers, a byte size): a value is either accepted and in range, or
refused with exit code 2 and one line naming the option; never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_viz import cli
from engram_viz.analysis.corpus.spill import MAX_MEMORY_LIMIT, parse_memory_limit
from engram_viz.apps.corpus_job import run_corpus
from engram_viz.commands import option_types
from engram_viz.errors import CorpusError, MemoryLimitError


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _limits(action: argparse.Action) -> tuple[int, int] | None:
    if action.type is cli.byte_size:
        return (1, MAX_MEMORY_LIMIT)
    return option_types.INT_LIMITS.get(getattr(action.type, "__name__", ""))


NUMERIC = sorted(
    (name, action.option_strings[-1], action.dest, _limits(action))
    for name, parser in _subparsers().items()
    for action in parser._actions
    if _limits(action) is not None
)


def _base(parser: argparse.ArgumentParser, skip: str) -> list[str]:
    """The least argv the sub-command parses: each positional and each other required option."""
    argv = []
    for action in parser._actions:
        if not action.option_strings:
            argv.append("x")
        elif action.required and action.dest != skip:
            argv += [action.option_strings[-1], "1" if _limits(action) else "x"]
    return argv


def _parse(command: str, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return cli.build_parser().parse_args([command, *argv]), err.getvalue()
        except SystemExit as stop:
            assert stop.code == 2, (argv, stop.code, err.getvalue())
    return None, err.getvalue()


def test_every_numeric_option_uses_a_shared_type():
    plain = [
        (name, action.option_strings)
        for name, parser in _subparsers().items()
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert not plain, f"options with a bare int/float type (no bounds): {plain}"
    options = {(name, opt) for name, opt, _, _ in NUMERIC}
    want = {("explain", "--position"), ("explain", "--layer"), ("corpus", "--max-tokens"), ("corpus", "--top")}
    want |= {("corpus", "--workers"), ("corpus", "--memory-limit"), ("train-tiny", "--seed")}
    want |= {("train-tiny", "--steps"), ("app", "--port")}
    assert want <= options, want - options


SIZES = st.builds(
    lambda n, unit: f"{n}{unit}",
    st.one_of(st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True)),
    st.sampled_from(["", "b", "k", "KB", "MiB", "GB", "gib", "TB", "PB", "x"]),
)
VALUES = st.one_of(
    st.text(max_size=12),
    st.integers(-(10**40), 10**40).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "-0", "+5", "0x10", "1_000", " 7 ", "\u0663", "2**70", "", "-"]),
    SIZES,
)


@pytest.mark.parametrize(("command", "option", "dest", "limits"), NUMERIC, ids=[f"{c} {o}" for c, o, _, _ in NUMERIC])
@given(value=VALUES)
def test_a_numeric_option_is_in_range_or_one_line_naming_it(command, option, dest, limits, value):
    parser = _subparsers()[command]
    args, err = _parse(command, [*_base(parser, dest), option, value])
    if args is not None:
        got = getattr(args, dest)
        assert isinstance(got, int) and not isinstance(got, bool)
        assert limits[0] <= got <= limits[1], (value, got)
        return
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"engram-viz {command}: error: argument {option}"), lines[0]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["corpus", "--out", "o", "--memory-limit", "1e999"],
            "argument --memory-limit: memory limit '1e999' is too large",
        ),
        (
            ["corpus", "--out", "o", "--memory-limit", "nan"],
            "argument --memory-limit: memory limit 'nan' is not a size",
        ),
        (["corpus", "--out", "o", "--top", "-1"], "argument --top: expected an integer from 0 to 1,000,000, got -1"),
        (["corpus", "--out", "o", "--workers", "0"], "argument --workers: expected an integer from 1"),
        (["corpus", "--out", "o", "--max-tokens", "0"], "argument --max-tokens: expected an integer from 1"),
        (["train-tiny", "--out", "o", "--steps", "-1"], "argument --steps: expected an integer from 1"),
        (["train-tiny", "--out", "o", "--steps", "0"], "argument --steps: expected an integer from 1"),
        (["train-tiny", "--out", "o", "--seed", str(2**70)], "argument --seed: expected an integer from 0"),
        (["app", "--port", "65536"], "argument --port: expected an integer from 0 to 65,535, got 65536"),
        (["explain", "x", "--position", "1.5"], "argument --position: expected an integer"),
        (["explain", "x", "--position", "1", "--layer", "-1"], "argument --layer: expected an integer from 0"),
    ],
)
def test_the_reported_numeric_options_are_one_line(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("1e999", "too large"),
        (float("inf"), "not a size"),
        (float("nan"), "not a size"),
        (10**30, "from 1 byte to 1EiB"),
        (-5, "from 1 byte"),
        ("0.4", "from 1 byte"),
        (True, "must be bytes or a size"),
        ([1], "must be bytes or a size"),
    ],
)
def test_parse_memory_limit_refuses_what_it_cannot_use(value, match):
    with pytest.raises(MemoryLimitError, match=match):
        parse_memory_limit(value)


def test_parse_memory_limit_keeps_sizes():
    assert parse_memory_limit("2GB") == 2 * 10**9 and parse_memory_limit("512MiB") == 512 * 2**20
    assert parse_memory_limit(2.5e9) == 2_500_000_000 and parse_memory_limit(None) is None


@pytest.mark.parametrize("top", [-1, 1.5, True, "3"])
def test_run_corpus_refuses_a_bad_top(tmp_path, top):
    with pytest.raises(CorpusError, match="top .* must be a non-negative integer"):
        run_corpus([tmp_path / "a.txt"], tmp_path / "out", config="tiny", top=top)
    assert not (tmp_path / "out").exists()
