"""Kernels compiled with numba once per machine: the source kept in ``settings.cache_dir()/numba/``.

numba (optional: ``pip install numba``) caches a compiled function (``cache=True``) beside its
source file, so :func:`compiled_kernel` writes the kernel's Python source into
``cache_dir()/numba/STEM_<sha256>.py`` (``$ENGRAM_VIZ_CACHE``; written once, with a checksum
sidecar, ``_cache``: a rewrite would change the time stamp numba's cache checks), loads it as a
module and compiles its function with ``cache=True``: numba keeps the machine code in that
folder's ``__pycache__``, and a later process loads it instead of compiling (a second or more a
kernel). Where the cache folder cannot be written, the kernel is compiled for the process alone;
without numba it returns None and the caller takes its numpy path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from engram_viz._cache import cached_path, is_verified
from engram_viz.errors import SettingError
from engram_viz.settings import cache_dir


def _source_file(source: str, stem: str) -> Path:
    path = cache_dir() / "numba" / f"{stem}_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"
    if not (is_verified(path) and path.read_text(encoding="utf-8") == source):
        path.parent.mkdir(exist_ok=True)
        with cached_path(path, suffix=".tmp.py") as tmp:
            tmp.write_text(source, encoding="utf-8")
    return path


def compiled_kernel(source: str, stem: str, function: str, signature: str, **options) -> Callable | None:
    """``function`` of the Python ``source`` compiled by numba for ``signature`` (eagerly, with
    ``options`` such as ``nogil``), cached across processes as the module docstring says; None
    without numba."""
    try:
        import numba
    except ImportError:
        return None
    try:
        path = _source_file(source, stem)
    except (OSError, SettingError):  # no writable cache folder: compiled for this process only
        namespace: dict = {}
        exec(compile(source, f"<{stem}>", "exec"), namespace)  # noqa: S102 - the kernel's own source
        return numba.njit(signature, **options)(namespace[function])
    spec = importlib.util.spec_from_file_location(f"engram_viz_{path.stem}", path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba's cache finds the function's module by name when it loads it
    spec.loader.exec_module(module)
    return numba.njit(signature, cache=True, **options)(getattr(module, function))


def readonly(dtype: str) -> str:
    """A signature's C-contiguous 1-d array of ``dtype`` that may be read-only (a memory-mapped or
    spilled array: ``int64[::1]`` refuses those; a writable array is taken too)."""
    return f"Array({dtype}, 1, 'C', readonly=True)"
