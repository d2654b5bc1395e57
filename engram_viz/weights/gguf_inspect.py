"""``engram-viz inspect`` for a GGUF file: its Engram tensors (GGML type, shape, bytes) and whether the
file opens as a checkpoint of the config (constants, names, shapes; ``gguf_checkpoint.py``).

The report has the keys of ``inspect.inspect_checkpoint``'s, so ``inspect.format_inspect`` prints it.
``verify`` (a whole-tensor NaN/Inf scan) is not offered for GGUF files: a table is never read whole;
rows are checked as they are dequantised.
"""

from __future__ import annotations

from pathlib import Path

from engram_viz.config import ConfigError, EngramConfig
from engram_viz.errors import CheckpointError
from engram_viz.weights.gguf_checkpoint import LAYOUT_GGUF, open_gguf_checkpoint
from engram_viz.weights.gguf_file import open_gguf

ENGRAM_PATH = (".engram_", "token_embd.", "tiny.embed.")  # tensors the Engram path reads


def inspect_gguf(path: str | Path, config: EngramConfig | str | Path | None = None) -> dict:
    """The ``inspect`` report of a GGUF file (see the module docstring)."""
    file = open_gguf(path)
    tensors = [
        {
            "name": t.name,
            "dtype": t.type_name,
            "shape": list(t.shape),
            "bytes": t.nbytes,
            "files": [file.path.name],
            "parts": 1,
            "split": False,
        }
        for t in file.tensors.values()
        if any(key in t.name for key in ENGRAM_PATH)
    ]
    out = {
        "path": str(file.path),
        "layout": LAYOUT_GGUF,
        "files": [file.path.name],
        "n_tensors": len(file.tensors),
        "tensors": tensors,
        "engram_bytes": sum(t["bytes"] for t in tensors),
        "synthetic": False,
        "tokenizer": None,
        "verify": None,
    }
    try:
        ckpt = open_gguf_checkpoint(file.path, config)
    except (CheckpointError, ConfigError) as err:
        return out | {"config": None, "label": None, "valid": False, "error": str(err), "problems": [str(err)]}
    return out | {"config": ckpt.config.name, "label": ckpt.label, "valid": True, "error": None, "problems": []}
