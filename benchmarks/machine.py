"""The machine a benchmark ran on, as its results files name it (imported by the scripts beside it)."""

from __future__ import annotations

import subprocess


def cpu_features() -> str:
    """The CPU's model name and which of avx2 / avx512_bf16 / amx_bf16 it has (``lscpu``)."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    found = sorted({f for f in ("avx2", "avx512_bf16", "amx_bf16") if f in text.split()})
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")), "?")
    return f"{model}; {', '.join(found) or 'none of avx2/avx512_bf16/amx_bf16'}"
