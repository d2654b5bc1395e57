"""engram_viz.weights.pread_kernel: the compiled read loop against slices of the file's bytes."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("numba")

from engram_viz.weights.pread_kernel import compiled_preads


@pytest.fixture
def data_fd(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield data, fd
    os.close(fd)


def test_reads_land_back_to_back(data_fd):
    data, fd = data_fd
    offsets = np.array([9000, 0, 4321, 4321, 9999], dtype=np.int64)
    sizes = np.array([1000, 17, 512, 1, 1], dtype=np.int64)
    buf = np.zeros(int(sizes.sum()), dtype=np.uint8)
    assert compiled_preads()(fd, buf, offsets, sizes) == len(offsets)
    assert buf.tobytes() == b"".join(data[o : o + s] for o, s in zip(offsets.tolist(), sizes.tolist()))


def test_first_short_or_failed_read_is_returned(data_fd):
    data, fd = data_fd
    preads = compiled_preads()
    buf = np.zeros(300, dtype=np.uint8)
    offsets, sizes = np.array([0, 9950, 100], dtype=np.int64), np.array([100, 100, 100], dtype=np.int64)
    assert preads(fd, buf, offsets, sizes) == 1  # read 1 runs past the end of the file
    assert buf[:100].tobytes() == data[:100]
    assert preads(-1, buf, offsets, sizes) == 0  # a bad descriptor fails the first read
    assert preads(fd, buf[:150], offsets, sizes) == 1  # read 1 would not fit in the buffer
    assert preads(fd, buf, offsets[:0], sizes[:0]) == 0
