"""engram_viz.weights.pread_kernel: the compiled read loop against rows sliced from the file's bytes."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("numba")

from engram_viz.weights.pread_kernel import compiled_gather, scratch_bytes

ROW, BASE = 8, 40  # row bytes, where the tensor starts in the file
N_ROWS = 1000


@pytest.fixture
def table_fd(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, BASE + N_ROWS * ROW, dtype=np.uint8)
    path = tmp_path / "rows.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    yield data[BASE:].reshape(N_ROWS, ROW), fd
    os.close(fd)


def reads(local: np.ndarray, cut: list[int]) -> tuple[np.ndarray, ...]:
    """Reads over sorted ``local`` rows broken before the positions ``cut``: starts, ends, firsts, spans."""
    starts = np.array([0, *cut], dtype=np.int64)
    ends = np.array([*cut, len(local)], dtype=np.int64)
    firsts = local[starts]
    return starts, ends, firsts, local[ends - 1] - firsts + 1


def test_wanted_rows_land_in_order_gap_rows_dropped(table_fd):
    rows, fd = table_fd
    local = np.array([0, 1, 2, 5, 9, 10, 500, 998, 999], dtype=np.int64)
    starts, ends, firsts, spans = reads(local, [3, 6, 7])  # [0 1 2] whole, [5 9 10] with gaps, [500], [998 999]
    scratch = np.empty(scratch_bytes(ROW, starts, ends, spans), dtype=np.uint8)
    assert len(scratch) == 6 * ROW  # rows 5..10: the only read holding rows not wanted
    out = np.zeros(len(local) * ROW, dtype=np.uint8)
    done = compiled_gather()(fd, BASE, ROW, local, starts, ends, firsts, spans, out, scratch)
    assert done == len(starts)
    assert np.array_equal(out.reshape(-1, ROW), rows[local])


def test_first_short_failed_or_unfitting_read_is_returned(table_fd):
    rows, fd = table_fd
    gather = compiled_gather()
    local = np.array([3, 7, 999], dtype=np.int64)
    starts, ends, firsts, spans = reads(local, [1, 2])
    out = np.zeros(len(local) * ROW, dtype=np.uint8)
    scratch = np.empty(0, dtype=np.uint8)
    assert gather(fd, BASE, ROW, local, starts, ends, firsts, spans, out, scratch) == 3
    assert gather(fd, BASE + 8, ROW, local, starts, ends, firsts, spans, out, scratch) == 2  # row 999 past the end
    assert np.array_equal(out[: 2 * ROW].reshape(-1, ROW), rows[[4, 8]])  # reads before it are kept
    assert gather(-1, BASE, ROW, local, starts, ends, firsts, spans, out, scratch) == 0  # a bad descriptor
    assert gather(fd, BASE, ROW, local, starts, ends, firsts, spans, out[:ROW], scratch) == 1  # out too small
    one = np.array([0, 2], dtype=np.int64)
    s1, e1, f1, sp1 = reads(one, [])  # one read of rows 0..2 wanting 0 and 2: needs 3 rows of scratch
    assert gather(fd, BASE, ROW, one, s1, e1, f1, sp1, out, np.empty(2 * ROW, dtype=np.uint8)) == 0
    empty = np.empty(0, dtype=np.int64)
    assert gather(fd, BASE, ROW, empty, empty, empty, empty, empty, out, scratch) == 0
