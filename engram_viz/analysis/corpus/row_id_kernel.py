"""The row-id hash as one compiled loop (numba, optional): the fast path of ``rows_from_windows``.

The same arithmetic as :func:`~engram_viz.analysis.corpus.row_ids.rows_from_windows`, per position in one
pass: the rolling XOR of the look-back products per layer, then every column's ``% prime +
offset``, written straight into the position's row of the output (sequential writes, no
scratch, no transpose). The kernel is generated per layout with the multipliers, primes and
offsets as literal constants, so the compiler turns each ``% prime`` into a multiply by a
precomputed reciprocal and a shift (no hardware division), and unrolls the columns.
``compiled_rows`` returns None without numba (``pip install numba``); the numpy path is then
used. The kernel is compiled once per process and layout (about a second), so the caller uses
it only for large inputs; bit-identity to the numpy path and the reference is tested.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from engram_viz.core.layout import EngramLayout


def _source(multipliers: tuple, primes: tuple, offsets: tuple, max_ngram: int, n_heads: int) -> str:
    """Python source of ``kernel(windows int64 [N, max_ngram], out int64 [N, n_layers * cols])``."""
    lines = ["def kernel(w, out):", "    for t in range(w.shape[0]):"]
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
def _compile(multipliers: tuple, primes: tuple, offsets: tuple, max_ngram: int, n_heads: int) -> Callable | None:
    try:
        import numba
    except ImportError:
        return None
    namespace: dict = {"np": np}
    exec(_source(multipliers, primes, offsets, max_ngram, n_heads), namespace)  # noqa: S102 - generated above
    return numba.njit("void(int64[:, ::1], int64[:, ::1])", nogil=True, boundscheck=False)(namespace["kernel"])


def compiled_rows(layout: EngramLayout) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """The compiled kernel of ``layout`` (``kernel(windows, out)``, both C-contiguous int64;
    ``out`` of shape ``[N, n_layers * n_hash_cols]``), or None without numba."""
    as_tuple = lambda a: tuple(tuple(int(v) for v in row) for row in np.asarray(a))
    return _compile(
        as_tuple(layout.multipliers),
        as_tuple(layout.column_primes),
        as_tuple(layout.offsets),
        layout.max_ngram_size,
        layout.n_heads,
    )
