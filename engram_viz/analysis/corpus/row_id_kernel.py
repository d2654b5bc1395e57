"""The row-id hash as one compiled loop (numba, optional): the fast path of ``rows_from_windows``.

The same arithmetic as :func:`~engram_viz.analysis.corpus.row_ids.rows_from_windows`, per position in one
pass: the rolling XOR of the look-back products per layer, then every column's ``% prime +
offset``, written straight into the position's row of the output (sequential writes, no
scratch, no transpose). The kernel is generated per layout with the multipliers, primes and
offsets as literal constants, so the compiler turns each ``% prime`` into a multiply by a
precomputed reciprocal and a shift (no hardware division), and unrolls the columns.
``compiled_rows`` returns None without numba (``pip install numba``); the numpy path is then
used. Compiling takes about a second, so the caller uses the kernel only for large inputs, and
it is compiled once per layout and machine (``_compiled``: the generated source kept in
``settings.cache_dir()/numba/``, numba's compiled kernel beside it), so a later process loads it
instead of compiling. Bit-identity to the numpy
path and the reference is tested.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from engram_viz._compiled import compiled_kernel
from engram_viz.core.layout import EngramLayout


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


@functools.lru_cache(maxsize=8)
def _compile(
    multipliers: tuple, primes: tuple, offsets: tuple, max_ngram: int, n_heads: int, out_type: str
) -> Callable | None:
    source = _source(multipliers, primes, offsets, max_ngram, n_heads)
    signature = f"void(int64[:, ::1], {out_type}[:, ::1])"
    return compiled_kernel(source, "row_kernel", "kernel", signature, nogil=True, boundscheck=False)


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
