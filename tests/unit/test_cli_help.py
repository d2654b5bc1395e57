"""``engram-viz`` answers at once: ``--help`` of the command and of every sub-command imports none of
the library's heavy parts (torch, numpy, pandas, matplotlib, the run and apps layers), so it costs a
small multiple of a bare ``python -c pass``; every option has a help text and one spelling; the
sub-commands are listed by group with examples; ``--version`` prints the installed version."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import time

import pytest

from engram_viz import cli

HEAVY = ("torch", "numpy", "pandas", "matplotlib", "engram_viz.run", "engram_viz.apps", "engram_viz.analysis")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)


def test_every_help_imports_nothing_heavy():
    code = (
        "import contextlib, io, sys\n"
        "from engram_viz import cli\n"
        f"names = [None, *cli.COMMANDS]\n"
        "for name in names:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        assert cli.main([name, '--help'] if name else ['--help']) == 0\n"
        "    assert 'usage: engram-viz' in out.getvalue(), name\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    assert _python(code).stdout.strip() == "[]"


def _seconds(argv: list[str]) -> float:
    """Wall seconds of one child process (the child's CPU time would hide a slow import of a
    file that is not yet in the page cache; the minimum of a few runs sheds the machine's noise)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], capture_output=True, timeout=120, check=True)
    return time.perf_counter() - start


def test_help_costs_a_small_multiple_of_a_bare_python():
    """A ratio against ``python -c pass`` measured side by side, not a wall time: importing torch
    alone would make it about 100x."""
    bare, helped = [], []
    for _ in range(3):
        bare.append(_seconds(["-c", "pass"]))
        helped.append(_seconds(["-m", "engram_viz.cli", "--help"]))
        helped.append(_seconds(["-m", "engram_viz.cli", "corpus", "--help"]))
    assert min(helped) < 15 * min(bare), (helped, bare)


def test_every_option_has_help_and_one_spelling():
    missing, aliases, spellings = [], [], {}
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.help == argparse.SUPPRESS:  # a deprecated spelling: it must set a visible option's value
                visible = [a for a in parser._actions if a.dest == action.dest and a.help != argparse.SUPPRESS]
                assert visible, f"{name} {action.option_strings}: hidden, and no visible option sets {action.dest}"
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings or action.dest}")
            longs = [o for o in action.option_strings if o.startswith("--")]
            if len(longs) > 1:
                aliases.append(f"{name} {longs}")
            for option in longs:
                spellings.setdefault(action.dest, set()).add(option)
    assert not missing, f"options without a help text: {missing}"
    assert not aliases, f"options with two spellings: {aliases}"
    two = {dest: sorted(s) for dest, s in spellings.items() if len(s) > 1}
    assert not two, f"one setting, two spellings across commands: {two}"


def test_progress_is_quiet_everywhere_and_the_old_spelling_still_parses():
    parsers = _subparsers()
    for name in ("corpus", "report", "train-tiny"):
        assert "--quiet" in parsers[name]._option_string_actions, name
    args = cli.build_parser().parse_args(["corpus", "--out", "o", "--no-progress"])
    assert args.quiet is True
    assert "--no-progress" not in parsers["corpus"].format_help()


def test_the_overview_groups_every_command_and_shows_examples():
    text = cli.build_parser().format_help()
    assert set(cli.GROUPS) == {"run", "inspect", "corpus", "apps"}
    assert {c.group for c in cli.COMMANDS.values()} <= set(cli.GROUPS)
    heads = [text.index(f"\n{group}: ") for group in cli.GROUPS]
    assert heads == sorted(heads)
    for name, command in cli.COMMANDS.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  {name} "))
        assert command.summary in line
        group_head = max(h for h in heads if h < text.index(line))
        assert text[group_head:].startswith(f"\n{command.group}: "), name
    assert "examples:" in text and 'engram-viz compare "' in text


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"engram-viz {importlib.metadata.version('engram-viz')}\n"
