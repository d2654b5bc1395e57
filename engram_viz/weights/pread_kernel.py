"""Many ``pread`` calls from one compiled loop (numba, optional): the fast path of ``LazyRows``.

``compiled_preads`` returns ``preads(fd, buf, offsets, sizes) -> int``: read ``sizes[r]`` bytes
from ``offsets[r]`` of ``fd`` into ``buf`` one after another (read r lands right after read
r - 1), calling libc ``pread`` through ctypes from numba's nopython mode with the GIL released, so
a read costs the system call and nothing around it, and the thread pool's pieces read in parallel.
It returns the index of the first read that came back short or failed (``len(offsets)`` when all
were full); the caller redoes the reads from there with ``safetensors.pread_into``, which loops over
partial reads and raises the same ``CheckpointError`` for a file that ends early. Without numba
(``pip install numba``) it returns None and ``LazyRows`` issues ``os.preadv`` from Python. The
loop is compiled once per process (well under a second).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import numpy as np


@functools.cache
def compiled_preads() -> Callable[[int, np.ndarray, np.ndarray, np.ndarray], int] | None:
    """The compiled read loop ``preads(fd, buf uint8 [total], offsets int64 [n], sizes int64 [n])``
    -> index of the first short or failed read (``n``: none), or None without numba."""
    try:
        import numba
    except ImportError:
        return None
    pread = ctypes.CDLL(None, use_errno=True).pread
    # ssize_t pread(int fd, void *buf, size_t count, off_t offset); the buffer's address is passed as an
    # integer of pointer width (same calling convention as void *), off_t is 64-bit on the platforms numba runs on
    pread.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
    pread.restype = ctypes.c_ssize_t

    def preads(fd, buf, offsets, sizes):
        addr = buf.ctypes.data
        pos = 0
        for r in range(offsets.shape[0]):
            size = sizes[r]
            if pos + size > buf.shape[0] or pread(fd, addr + pos, size, offsets[r]) != size:
                return r
            pos += size
        return offsets.shape[0]

    return numba.njit("int64(int32, uint8[::1], int64[::1], int64[::1])", nogil=True)(preads)
