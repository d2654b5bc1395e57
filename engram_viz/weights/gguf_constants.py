"""The Engram constants in a GGUF file's metadata, checked against the suite's own layout and token map.

Converters write the hash constants under the architecture prefix (``{arch}.engram.multipliers``,
``.primes``, ``.offsets``, ``.token_map``, ``.pad_id``, ``.layer_ids``, ``.head_count``,
``.key_length``, ``.max_ngram_size``; names in ``core/schema.GGUF_NAMES``, a fork's own through
``names``). Arrays are flat in GGUF (no multi-dimensional arrays): each is compared with the suite's
array flattened in C order. Whatever the file carries is checked; whatever it lacks is skipped and
listed. A mismatch is one ``CheckpointError`` line naming the key and the first differing value.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engram_viz.config import EngramConfig
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import CheckpointError
from engram_viz.weights.gguf_file import GGUFFile


def expected_constants(config: EngramConfig, token_map: np.ndarray | None) -> dict[str, np.ndarray]:
    """role -> the suite's value as a flat int64 array (``token_map`` skipped when None)."""
    layout = EngramLayout(config)
    want = {
        "layer_ids": np.asarray(config.engram_layer_ids),
        "head_count": np.asarray([config.engram_n_heads]),
        "key_length": np.asarray([config.engram_head_dim]),
        "max_ngram_size": np.asarray([config.engram_max_ngram_size]),
        "multipliers": layout.multipliers,
        "primes": layout.primes,
        "offsets": layout.offsets,
        "pad_id": np.asarray([config.engram_pad_id]),
    }
    if token_map is not None:
        want["token_map"] = np.asarray(token_map)
    return {k: np.asarray(v, dtype=np.int64).reshape(-1) for k, v in want.items()}


def _as_ints(value, key: str, where: str) -> np.ndarray:
    a = np.asarray(value).reshape(-1)
    if a.dtype.kind not in "iub":
        raise CheckpointError(f"{where}: metadata {key} must hold integers, got {a.dtype} {str(value)[:40]}")
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise CheckpointError(f"{where}: metadata {key} holds {int(a.max())}, beyond int64")
    return a.astype(np.int64)


def check_constant(key: str, got: np.ndarray, want: np.ndarray, where: str, what: str) -> None:
    """One line naming ``key`` and the first differing value (or the lengths) when they differ."""
    if len(got) != len(want):
        raise CheckpointError(
            f"{where}: metadata {key} has {len(got):,} values; {what} has {len(want):,} "
            f"(first values {got[:4].tolist()} vs {want[:4].tolist()})"
        )
    diff = np.flatnonzero(got != want)
    if len(diff):
        i = int(diff[0])
        raise CheckpointError(
            f"{where}: metadata {key}[{i}] is {int(got[i])}; {what} has {int(want[i])} "
            f"({len(diff):,} of {len(want):,} values differ)"
        )


def check_gguf_constants(
    file: GGUFFile,
    config: EngramConfig,
    token_map: np.ndarray | None,
    names: Mapping[str, str],
) -> list[str]:
    """Check every Engram constant ``file`` carries against ``config``'s layout and ``token_map``;
    returns the roles the file lacks (nothing to check). ``names`` is ``schema.gguf_names(...)``."""
    missing = []
    what = f"the suite's layout of config {config.name!r}"
    for role, want in expected_constants(config, token_map).items():
        key = names[role].format(arch=file.arch)
        value = file.value(key)
        if value is None:
            missing.append(role)
            continue
        src = "the suite's token map" if role == "token_map" else what
        check_constant(key, _as_ints(value, key, str(file.path)), want, str(file.path), src)
    return missing
