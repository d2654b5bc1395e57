"""``engram-viz corpus`` counts without torch or matplotlib: the whole command, run in a fresh
interpreter on a one-line file under the default weights' config, leaves neither in ``sys.modules``
(the default weights' config is read from headers, ``weights.weights_rule``; the tables are written
with pandas alone). The start-up time itself is a benchmark figure (``benchmarks/corpus_job.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "matplotlib", "engram_viz.run", "engram_viz.viz")


def test_the_corpus_command_imports_no_torch_and_no_matplotlib(tmp_path):
    text = tmp_path / "one_line.txt"
    text.write_text("In the beginning God created the heaven and the earth.\n", encoding="utf-8")
    out = tmp_path / "out"
    code = (
        "import json, sys\n"
        "from engram_viz.cli import main\n"
        f"assert main(['corpus', {str(text)!r}, '--out', {str(out)!r}, '--quiet']) == 0\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith({HEAVY!r}))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["tokens"] == 12  # BOS + 11 tokens: the command did count
