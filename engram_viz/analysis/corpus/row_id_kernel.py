"""The row-id hash as one compiled loop (numba, optional): the fast path of ``rows_from_windows``.

The same arithmetic as :func:`~engram_viz.analysis.corpus.row_ids.rows_from_windows`, per position in one
pass: the rolling XOR of the look-back products per layer, then every column's ``% prime +
offset``, written straight into the position's row of the output (sequential writes, no
scratch, no transpose). The kernel is generated per layout with the multipliers, primes and
offsets as literal constants, so the compiler turns each ``% prime`` into a multiply by a
precomputed reciprocal and a shift (no hardware division), and unrolls the columns.
``compiled_rows`` returns None without numba (``pip install numba``); the numpy path is then
used. Compiling takes about a second, so the caller uses the kernel only for large inputs, and
it is compiled once per layout and machine: the generated source is kept as a file in
``settings.cache_dir()/numba/`` (``$ENGRAM_VIZ_CACHE``; named by its sha256, with a checksum
sidecar, ``_cache``) and numba keeps the compiled kernel beside it (``cache=True``: its
``__pycache__``), so a later process loads it instead of compiling. Bit-identity to the numpy
path and the reference is tested.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engram_viz._cache import cached_path, is_verified
from engram_viz.core.layout import EngramLayout
from engram_viz.settings import cache_dir


def _source(multipliers: tuple, primes: tuple, offsets: tuple, max_ngram: int, n_heads: int) -> str:
    """Python source of ``kernel(windows int64 [N, max_ngram], out [N, n_layers * cols])``; ``out``
    int32 or int64 (``row_ids.row_dtype``: each row id is stored as the array's type)."""
    lines = ["import numpy as np", "", "", "def kernel(w, out):", "    for t in range(w.shape[0]):"]
    lines += [f"        c{s} = w[t, {s}]" for s in range(max_ngram)]
    cols = (max_ngram - 1) * n_heads
    for li, mult in enumerate(multipliers):
        lines.append(f"        h = c0 * {mult[0]}")
        for s in range(1, max_ngram):
            lines.append(f"        h = h ^ (c{s} * {mult[s]})")
            lines.append(
                "        u = np.uint64(h)  # h >= 0: unsigned division by a constant is the cheaper reciprocal"
            )
            for head in range(n_heads):
                col = (s - 1) * n_heads + head
                j = li * cols + col
                lines.append(f"        out[t, {j}] = np.int64(u % np.uint64({primes[li][col]})) + {offsets[li][col]}")
    return "\n".join(lines) + "\n"


def _kernel_file(source: str) -> Path:
    """The generated source as a file in ``cache_dir()/numba/`` named by its sha256, written once:
    a rewrite would change its time stamp, which numba's cache checks, and compile again."""
    path = cache_dir() / "numba" / f"row_kernel_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"
    if not (is_verified(path) and path.read_text(encoding="utf-8") == source):
        path.parent.mkdir(exist_ok=True)
        with cached_path(path, suffix=".tmp.py") as tmp:
            tmp.write_text(source, encoding="utf-8")
    return path


@functools.lru_cache(maxsize=8)
def _compile(
    multipliers: tuple, primes: tuple, offsets: tuple, max_ngram: int, n_heads: int, out_type: str
) -> Callable | None:
    try:
        import numba
    except ImportError:
        return None
    path = _kernel_file(_source(multipliers, primes, offsets, max_ngram, n_heads))
    spec = importlib.util.spec_from_file_location(f"engram_viz_{path.stem}", path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba's cache finds the kernel's module by name when it loads it
    spec.loader.exec_module(module)  # the generated source above, read back from its file
    signature = f"void(int64[:, ::1], {out_type}[:, ::1])"
    return numba.njit(signature, nogil=True, boundscheck=False, cache=True)(module.kernel)


def compiled_rows(layout: EngramLayout, out_dtype=np.int64) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """The compiled kernel of ``layout`` (``kernel(windows, out)``, both C-contiguous; windows
    int64, ``out`` of ``out_dtype`` (int32 or int64) and shape ``[N, n_layers * n_hash_cols]``),
    or None without numba."""
    as_tuple = lambda a: tuple(tuple(int(v) for v in row) for row in np.asarray(a))
    return _compile(
        as_tuple(layout.multipliers),
        as_tuple(layout.column_primes),
        as_tuple(layout.offsets),
        layout.max_ngram_size,
        layout.n_heads,
        np.dtype(out_dtype).name,
    )
