"""_compiled: a kernel's source is kept once in the cache folder and compiled with numba's cache
beside it; where no cache folder can be made the kernel still compiles, for the process alone."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz._compiled import compiled_kernel

SOURCE = "import numpy as np\n\n\ndef twice(a):\n    return a * 2\n"


def test_a_kernel_is_kept_in_the_cache_folder(tmp_path, monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path))
    kernel = compiled_kernel(SOURCE, "test_twice", "twice", "int64[::1](int64[::1])")
    assert kernel is not None and kernel(np.arange(4)).tolist() == [0, 2, 4, 6]
    (kept,) = (tmp_path / "numba").glob("test_twice_*.py")
    assert kept.read_text(encoding="utf-8") == SOURCE and kept.with_name(kept.name + ".sha256").is_file()
    assert kernel.stats.cache_path == str(tmp_path / "numba" / "__pycache__")


def test_without_a_cache_folder_the_kernel_compiles_for_the_process(tmp_path, monkeypatch):
    pytest.importorskip("numba")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(blocker))
    kernel = compiled_kernel(SOURCE, "test_twice", "twice", "int64[::1](int64[::1])")
    assert kernel is not None and kernel(np.arange(3)).tolist() == [0, 2, 4]
