"""The compiled read loop of ``LazyRows`` (numba, optional): coalesced ``pread`` calls and the rows picked out.

``compiled_gather`` returns ``gather(fd, base, row_bytes, local, starts, ends, firsts, spans, out,
scratch) -> int``. Read r asks for ``spans[r]`` rows of ``row_bytes`` from row ``firsts[r]`` of the
tensor that starts at byte ``base`` of ``fd``, and holds the wanted rows ``local[starts[r]:ends[r]]``;
wanted row j lands at byte ``j * row_bytes`` of ``out``. A read whose rows are all wanted goes
straight into ``out``; any other lands in ``scratch`` (reused, so it stays in the CPU cache) and its
wanted rows are copied out at once, so the gap rows merged into a read are copied by the kernel once
and never touched again. libc ``pread`` is called through ctypes from nopython mode with the GIL
released: a read costs the system call and nothing around it, and the thread pool's pieces read in
parallel.

It returns the index of the first read that came back short or failed, or did not fit in
``scratch`` (``len(starts)`` when all were full); the caller redoes the reads from there from
Python, which loops over partial reads and raises ``CheckpointError`` for a file that ends early.
Without numba (``pip install numba``) ``compiled_gather`` returns None and ``LazyRows`` reads from
Python. The loop is compiled once per process (about 2 s).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import numpy as np

GatherReads = Callable[..., int]


@functools.cache
def compiled_gather() -> GatherReads | None:
    """The compiled read loop (see the module docstring), or None without numba."""
    try:
        import numba
    except ImportError:
        return None
    pread = ctypes.CDLL(None, use_errno=True).pread
    # ssize_t pread(int fd, void *buf, size_t count, off_t offset); the buffer's address is passed as an
    # integer of pointer width (same calling convention as void *), off_t is 64-bit on the platforms numba runs on
    pread.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
    pread.restype = ctypes.c_ssize_t

    def gather(fd, base, row_bytes, local, starts, ends, firsts, spans, out, scratch):
        out_addr, scratch_addr = out.ctypes.data, scratch.ctypes.data
        for r in range(starts.shape[0]):
            size = spans[r] * row_bytes
            whole = ends[r] - starts[r] == spans[r]  # every row of the read wanted: straight into out
            if whole and starts[r] * row_bytes + size > out.shape[0] or not whole and size > scratch.shape[0]:
                return r
            dst = out_addr + starts[r] * row_bytes if whole else scratch_addr
            if pread(fd, dst, size, base + firsts[r] * row_bytes) != size:
                return r
            if not whole:
                for j in range(starts[r], ends[r]):
                    src = (local[j] - firsts[r]) * row_bytes
                    out[j * row_bytes : (j + 1) * row_bytes] = scratch[src : src + row_bytes]
        return starts.shape[0]

    sig = (
        "int64(int32, int64, int64, int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[::1])"
    )
    return numba.njit(sig, nogil=True)(gather)


def scratch_bytes(row_bytes: int, starts: np.ndarray, ends: np.ndarray, spans: np.ndarray) -> int:
    """Bytes of ``scratch`` the reads need: the largest read that holds rows not wanted (0 if none)."""
    partial = (ends - starts) != spans
    return int(spans[partial].max()) * row_bytes if partial.any() else 0
