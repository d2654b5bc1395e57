"""io_uring vs the compiled pread loop: one-row reads from the page cache, side by side in one run.

    python benchmarks/uring_reads.py [--rows 2000000] [--reps 7] [--batch 4096]

An experiment kept so the comparison can be rerun, not part of the library: io_uring did not win,
so ``LazyRows`` keeps one ``pread`` per read from its compiled loop (``weights/pread_kernel.py``).

The question: the lazy gather's floor is the kernel's cost per read (about 0.5-0.8 us a row here,
``results/row_gather.txt``). io_uring submits many reads with one system call; does that lower it?
Both engines read the same rows of a table file (``--rows`` x 256 e4m3 rows, written as
``row_gather.py`` writes them, then read once so the page cache is warm) and of the full-size
sparse table (384,016,682 rows, no disk): the unique rows of one 4096-token real-text prompt,
one row per read, bytes asserted identical. io_uring is driven from numpy (ring set up with
``io_uring_setup``, submission entries written for a whole batch at once, one ``io_uring_enter``
per ``--batch`` reads that waits for all of them), so Python costs a few calls per batch, not
per read. One thread each: the figure is the kernel's cost per read.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from row_gather import V41_ROWS, W, real_text_ids, warm_file, write_table

from engram_viz.weights.pread_kernel import compiled_gather
from engram_viz.weights.rows import unique_ids
from engram_viz.weights.safetensors import create_sparse_safetensors, read_safetensors_header

SYS_IO_URING_SETUP, SYS_IO_URING_ENTER = 425, 426  # x86-64 and arm64
IORING_OP_READ, IORING_ENTER_GETEVENTS = 22, 1
IORING_OFF_SQES = 0x10000000
SQE = np.dtype(  # struct io_uring_sqe (64 bytes), the fields a read uses
    [("opcode", "u1"), ("flags", "u1"), ("ioprio", "<u2"), ("fd", "<i4"), ("off", "<u8"), ("addr", "<u8")]
    + [("len", "<u4"), ("rw_flags", "<u4"), ("user_data", "<u8"), ("pad", "V24")]
)
CQE = np.dtype([("user_data", "<u8"), ("res", "<i4"), ("flags", "<u4")])
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class Ring:
    """One io_uring (single-mmap rings, kernel 5.4+) that reads batches of (offset, address, length)."""

    def __init__(self, entries: int):
        params = (ctypes.c_uint32 * 30)()  # struct io_uring_params (120 bytes)
        self.fd = _libc.syscall(SYS_IO_URING_SETUP, ctypes.c_uint(entries), params)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "io_uring_setup")
        p = np.frombuffer(params, np.uint32)
        sq_entries, cq_entries, sq_off, cq_off = int(p[0]), int(p[1]), p[10:20], p[20:30]
        size = max(int(sq_off[6]) + 4 * sq_entries, int(cq_off[5]) + 16 * cq_entries)
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        self._ring = mmap.mmap(self.fd, size, mmap.MAP_SHARED, rw, offset=0)
        self._sqe_map = mmap.mmap(self.fd, 64 * sq_entries, mmap.MAP_SHARED, rw, offset=IORING_OFF_SQES)
        ring = np.frombuffer(self._ring, np.uint8)

        def u32(at, n=1):
            return ring[int(at) : int(at) + 4 * n].view(np.uint32)

        self.sq_tail, self.sq_mask = u32(sq_off[1]), int(u32(sq_off[2])[0])
        self.cq_head, self.cq_tail, self.cq_mask = u32(cq_off[0]), u32(cq_off[1]), int(u32(cq_off[2])[0])
        self.cqes = ring[int(cq_off[5]) : int(cq_off[5]) + 16 * cq_entries].view(CQE)
        self.sqes = np.frombuffer(self._sqe_map, SQE)
        u32(sq_off[6], sq_entries)[:] = np.arange(sq_entries, dtype=np.uint32)  # slot i -> entry i
        self.entries = sq_entries

    def read(self, fd: int, offsets: np.ndarray, addrs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Submit the reads (at most ``entries``), wait for all; bytes read per read, in order."""
        n, tail = len(offsets), int(self.sq_tail[0])
        slot = (tail + np.arange(n)) & self.sq_mask
        entry = np.zeros(n, SQE)
        entry["opcode"], entry["fd"], entry["off"], entry["addr"], entry["len"] = (
            IORING_OP_READ,
            fd,
            offsets,
            addrs,
            lengths,
        )
        entry["user_data"] = np.arange(n)
        self.sqes[slot] = entry
        self.sq_tail[0] = tail + n  # the kernel reads the tail on entering: no barrier needed without SQPOLL
        done = _libc.syscall(SYS_IO_URING_ENTER, self.fd, n, n, IORING_ENTER_GETEVENTS, None, 0)
        if done != n:
            raise OSError(ctypes.get_errno(), f"io_uring_enter submitted {done} of {n}")
        head = int(self.cq_head[0])
        cqes = self.cqes[(head + np.arange(n)) & self.cq_mask]
        self.cq_head[0] = head + n
        got = np.empty(n, dtype=np.int64)
        got[cqes["user_data"].astype(np.int64)] = cqes["res"]
        return got


def compare(label: str, path: Path, rows: np.ndarray, args) -> None:
    tensor = read_safetensors_header(path).tensors[W]
    row_bytes = tensor.shape[1]
    n = len(rows)
    one = np.ones(n, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64)
    gather = compiled_gather()
    ring = Ring(args.batch)
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        by_pread, by_uring = np.zeros(n * row_bytes, np.uint8), np.zeros(n * row_bytes, np.uint8)
        empty = np.empty(0, np.uint8)

        def pread_loop():  # one read a row, every row wanted: each lands straight in the output
            assert gather(fd, tensor.start, row_bytes, rows, idx, idx + 1, rows, one, by_pread, empty) == n

        offsets = tensor.start + rows * row_bytes
        addrs = by_uring.ctypes.data + idx * row_bytes
        lengths = np.full(n, row_bytes, dtype=np.int64)

        def uring():
            for a in range(0, n, ring.entries):
                got = ring.read(
                    fd, offsets[a : a + ring.entries], addrs[a : a + ring.entries], lengths[a : a + ring.entries]
                )
                assert (got == row_bytes).all()

        pread_loop()  # pages in, compiles
        uring()
        assert np.array_equal(by_pread, by_uring)
        times = {"pread loop": [], "io_uring": []}
        for _ in range(args.reps):  # interleaved
            for name, fn in (("pread loop", pread_loop), ("io_uring", uring)):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{label}: {n:,} one-row reads; pread loop {med['pread loop'] * 1e3:.1f} ms "
        f"({med['pread loop'] / n * 1e6:.2f} us a read), io_uring {med['io_uring'] * 1e3:.1f} ms "
        f"({med['io_uring'] / n * 1e6:.2f} us a read) = {med['io_uring'] / med['pread loop']:.2f}x the pread loop"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=4096, help="reads submitted per io_uring_enter")
    args = ap.parse_args()
    prompt = torch.from_numpy(real_text_ids(1, 4096)[0])
    with tempfile.TemporaryDirectory(prefix="uring_reads-") as tmp:
        table = Path(tmp) / "table.safetensors"
        write_table(table, args.rows)
        warm_file(table)
        compare(f"table file ({args.rows:,} rows)", table, unique_ids(prompt % args.rows)[0], args)
        full = Path(tmp) / "full.safetensors"
        create_sparse_safetensors(full, {W: ("F8_E4M3", (V41_ROWS, 256))})
        compare(f"full-size sparse table ({V41_ROWS:,} rows)", full, unique_ids(prompt)[0], args)


if __name__ == "__main__":
    main()
