"""How ``engram-viz`` prints errors: a user error (an ``EngramVizError``, an ``OSError``) as one line
on stderr and exit code 2; anything else (a bare ``TypeError`` or ``ValueError`` raised inside
the library is a bug) with its traceback. The library raises no bare ``ValueError`` / ``TypeError``
that a user's input can reach: each is an ``EngramVizError`` that keeps that second base."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from engram_viz import errors
from engram_viz.cli import main
from engram_viz.commands import inspect_commands
from engram_viz.errors import EngramVizError, InputError, InputTypeError, StreamsError

PACKAGE = Path(__file__).resolve().parents[2] / "engram_viz"

# bare raises left on purpose: genuine internal invariants, reached only through a bug (file, message start)
INTERNAL = {
    ("_files.py", "mode must be 'wb' or 'w'"),  # atomic_writer's mode: the library's own calls
    ("analysis/corpus/spill.py", "FileArray reads contiguous slices only"),  # the spill store's own reads
    ("viz/report_page.py", "a report section part must be"),  # the report's declared sections
}


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"engram-viz {command}: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("exc", [TypeError("boom"), ValueError("boom"), KeyError("boom")])
def test_a_bug_inside_the_library_is_not_caught(monkeypatch, exc):
    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(inspect_commands, "hash_prompt", broken)
    with pytest.raises(type(exc), match="boom"):
        main(["hash", "--config", "tiny", "Alexander the Great"])


def test_a_bug_reaches_the_terminal_with_its_traceback():
    code = (
        "import sys, engram_viz.cli as cli, engram_viz.commands.inspect_commands as commands\n"
        "def broken(*a, **k):\n"
        "    raise TypeError('boom')\n"
        "commands.EngramLayout = broken\n"
        "sys.exit(cli.main(['layout', '--config', 'tiny']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith("TypeError: boom"), proc.stderr
    assert "error: boom" not in proc.stderr


def test_a_config_path_that_does_not_exist_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert main(["layout", "--config", str(missing)]) == 2
    assert str(missing) in _one_line(capsys, "layout")


def test_a_prompt_file_that_does_not_exist_is_one_line(tmp_path, capsys):
    missing = tmp_path / "prompts.jsonl"
    assert main(["report", "--prompts", str(missing), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert str(missing) in _one_line(capsys, "report")
    assert not (tmp_path / "out").exists()


def test_a_bad_streams_file_is_one_line_and_still_a_value_error(tmp_path, capsys):
    bad = tmp_path / "streams.safetensors"
    bad.write_bytes(b"not a safetensors file")
    argv = ["report", "--streams", str(bad), "--out", str(tmp_path / "out"), "--device", "cpu", "--quiet"]
    assert main(argv) == 2
    assert "is not a readable safetensors file" in _one_line(capsys, "report")
    assert issubclass(StreamsError, ValueError)


def test_a_bad_argument_the_library_refuses_is_one_line(capsys):
    """``app --port 70000``: refused by the option's own type (``cli.PORT``) before ``apps.app.bind``
    (which raises an ``InputError``, a ``ValueError``, for a caller from Python)."""
    assert main(["app", "--port", "70000"]) == 2
    assert "argument --port: expected an integer from 0 to 65,535, got 70000" in _one_line(capsys, "app")
    assert main(["explain", "Alexander", "--position", "99", "--device", "cpu"]) == 2  # the library's AttributionError
    assert "position 99 is outside the prompt" in _one_line(capsys, "explain")


def test_input_errors_keep_their_builtin_base():
    assert issubclass(InputError, EngramVizError) and issubclass(InputError, ValueError)
    assert issubclass(InputTypeError, EngramVizError) and issubclass(InputTypeError, TypeError)


def test_every_exception_class_lives_in_errors():
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and (b.id.endswith(("Error", "Warning", "Exception"))) for b in node.bases
            ):
                defined.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert not defined, f"exception classes outside engram_viz/errors.py: {defined}"
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert len(classes) > 30


def _bare_raises(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        exc = node.exc if isinstance(node, ast.Raise) else None
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id in ("ValueError", "TypeError"):
            first = exc.args[0] if exc.args else None
            if isinstance(first, ast.JoinedStr):
                first = first.values[0] if first.values else None
            text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
            out.append((node.lineno, text))
    return out


def test_no_bare_value_or_type_error_a_user_can_reach():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, text in _bare_raises(path):
            if not any(rel == f and text.startswith(start) for f, start in INTERNAL):
                found.append(f"{rel}:{line} {text!r}")
    assert not found, f"raise an EngramVizError subclass (InputError, InputTypeError, ...) instead: {found}"
