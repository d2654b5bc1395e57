"""Where every n-gram lands: hash multipliers, prime bucket sizes and row offsets.

Reference section 2. Per Engram layer there is one table; its rows are split into
``n_hash_cols`` = (max_ngram_size - 1) x n_heads *columns*, column c = (n - 2) * n_heads + head
owning rows ``[offsets[c], offsets[c] + primes[c])``. The inverse questions a researcher asks -
which (layer, order, head) owns row r, which rows an n-gram lands in - are answered here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from engram_viz.config import ConfigError, EngramConfig
from engram_viz.errors import InputError, TokenInputError

# Witnesses for a deterministic Miller-Rabin test: the first 12 primes decide every n < 3.18e23
# (Sorenson and Webster 2015), which covers all of int64; the layout's primes are ~1.6e7.
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Deterministic for every n < 3.18e23 (so all of int64): trial division by the small witness
    primes, then Miller-Rabin with those primes as bases."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    # n - 1 = d * 2**s with d odd
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:  # a**(d * 2**r) never reached -1: a witnesses that n is composite
            return False
    return True


def next_prime(n: int) -> int:
    """The smallest prime strictly greater than n."""
    n += 1
    while not is_prime(n):
        n += 1
    return n


@lru_cache(maxsize=64)
def _layout_primes(vocab_size: int, n_layers: int, n_orders: int, n_heads: int) -> np.ndarray:
    """The reference's draws (see ``EngramLayout.primes``), read-only ``[n_layers, n_orders, n_heads]``.

    The draws take the primes above ``vocab_size - 1`` in order: the ``seen`` set is always the
    first k of them (each order restarts below them all and skips exactly those), so draw k + 1 is
    prime number k + 1 above the start (reference section 2: "the first 48 primes above 16,000,000,
    in order"). Cached per layout shape: every hasher, index and plot asks for the same primes.
    """
    out = np.empty(n_layers * n_orders * n_heads, dtype=np.int64)
    p = vocab_size - 1
    for i in range(len(out)):
        out[i] = p = next_prime(p)
    out = out.reshape(n_layers, n_orders, n_heads)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class RowOwner:
    """The column that owns a table row: Engram layer, n-gram order, head and bucket."""

    layer: int  # model layer id, e.g. 1 or 14
    layer_index: int  # index into engram_layer_ids
    order: int  # n-gram size, 2..max_ngram_size
    head: int
    column: int  # (order - 2) * n_heads + head
    bucket: int  # row - offset of the column, in [0, prime)


class EngramLayout:
    """Multipliers ``[n_layers, max_ngram]``, primes ``[n_layers, max_ngram - 1, n_heads]`` and
    offsets ``[n_layers, n_hash_cols]`` of a config, all int64 numpy arrays."""

    def __init__(self, config: EngramConfig):
        self.config = config
        self.layer_ids = config.engram_layer_ids
        self.max_ngram_size = config.engram_max_ngram_size
        self.n_heads = config.engram_n_heads
        self.n_hash_cols = config.n_hash_cols
        self.pad_id = config.engram_pad_id  # a *raw* id; the hash uses token_map[pad_id]

    @cached_property
    def multipliers(self) -> np.ndarray:
        """Odd multipliers; column i multiplies look-back i (column 0 is the current token)."""
        vocab = self.config.engram_compressed_vocab_size
        bound = max(1, (2**63 - 1) // vocab // 2)
        rows = []
        for layer_id in self.layer_ids:
            rng = np.random.default_rng(10007 * layer_id)
            draws = rng.integers(low=0, high=bound, size=(self.max_ngram_size,), dtype=np.int64)
            rows.append(draws * 2 + 1)
        return np.stack(rows)

    @cached_property
    def primes(self) -> np.ndarray:
        """Each draw is the smallest prime above the search start not yet taken by any layer;
        the start restarts at ``engram_vocab_size - 1`` for every n-gram order."""
        c = self.config
        shared = _layout_primes(c.engram_vocab_size, len(self.layer_ids), self.max_ngram_size - 1, self.n_heads)
        return shared.copy()  # the layout's own, writable (torch takes it); the search runs once

    @cached_property
    def column_primes(self) -> np.ndarray:
        """Primes flattened to ``[n_layers, n_hash_cols]`` in column order."""
        return self.primes.reshape(len(self.layer_ids), self.n_hash_cols)

    @cached_property
    def offsets(self) -> np.ndarray:
        """Exclusive running sum of each layer's column primes: every layer starts at row 0."""
        cp = self.column_primes
        return np.cumsum(cp, axis=1) - cp

    @cached_property
    def rows_per_layer(self) -> np.ndarray:
        return self.column_primes.sum(axis=1)

    def check_against_config(self) -> None:
        """A :class:`ConfigError` naming the config (its file) and ``engram_num_embeddings`` when the
        primes the layout derives do not sum to it: rows would land outside the tables."""
        want = np.asarray(self.config.engram_num_embeddings, dtype=np.int64)
        if not np.array_equal(self.rows_per_layer, want):
            raise ConfigError(
                f"config {self.config.name!r}: layout rows per layer {self.rows_per_layer.tolist()} "
                f"differ from engram_num_embeddings {want.tolist()}; the primes follow from engram_vocab_size="
                f"{self.config.engram_vocab_size}, engram_max_ngram_size and engram_n_heads, so one of these fields "
                "is wrong"
            )

    @staticmethod
    @lru_cache(maxsize=16)
    def checked(config: EngramConfig) -> EngramLayout:
        """The layout of ``config``, checked against it (``check_against_config``) and shared: one
        per config in a process, so a hasher built per run derives nothing again (configs are
        frozen, so equal configs share one). Its arrays are the layout's own; treat them as read-only."""
        layout = EngramLayout(config)
        layout.check_against_config()
        return layout

    def layer_index(self, layer: int) -> int:
        if layer not in self.layer_ids:
            raise InputError(f"layer {layer} is not an Engram layer; expected one of {list(self.layer_ids)}")
        return self.layer_ids.index(layer)

    def column(self, order: int, head: int) -> int:
        if order not in self.config.ngram_orders:
            raise InputError(f"n-gram order {order} out of range; expected one of {list(self.config.ngram_orders)}")
        if not 0 <= head < self.n_heads:
            raise InputError(f"head {head} out of range; expected 0..{self.n_heads - 1}")
        return (order - 2) * self.n_heads + head

    def owner(self, layer: int, row: int) -> RowOwner:
        """Which (order, head) of Engram layer ``layer`` owns table row ``row``."""
        li = self.layer_index(layer)
        n_rows = int(self.rows_per_layer[li])
        if not 0 <= row < n_rows:
            raise InputError(f"row {row} out of range for layer {layer}; expected 0..{n_rows - 1}")
        col = int(np.searchsorted(self.offsets[li], row, side="right") - 1)
        return RowOwner(
            layer=layer,
            layer_index=li,
            order=col // self.n_heads + 2,
            head=col % self.n_heads,
            column=col,
            bucket=int(row - self.offsets[li, col]),
        )

    def ngram_rows(self, layer: int, compressed_ngram: list[int] | tuple[int, ...]) -> np.ndarray:
        """The ``n_heads`` rows an n-gram of compressed ids lands in, for one layer.

        ``compressed_ngram`` lists the n-gram oldest token first, e.g. ``(c[t-2], c[t-1], c[t])``
        for a 3-gram ending at t; pad ids stand for blocked look-backs.
        """
        li = self.layer_index(layer)
        order = len(compressed_ngram)
        if order not in self.config.ngram_orders:
            raise InputError(f"an n-gram of {order} tokens; expected 2..{self.max_ngram_size}")
        vocab = self.config.engram_compressed_vocab_size
        for c in compressed_ngram:
            if not 0 <= int(c) < vocab:
                raise TokenInputError(f"compressed id {c} out of range; expected 0..{vocab - 1}")
        mult = self.multipliers[li]
        h = 0
        for shift, c in enumerate(reversed(compressed_ngram)):  # shift 0 is the newest token
            h ^= int(c) * int(mult[shift])
        cols = [self.column(order, head) for head in range(self.n_heads)]
        return np.array([h % int(self.column_primes[li, c]) + int(self.offsets[li, c]) for c in cols], dtype=np.int64)

    def summary(self) -> dict:
        """Plain-JSON description used by ``engram-viz layout``."""
        return {
            "config": self.config.name,
            "compressed_vocab_size": self.config.engram_compressed_vocab_size,
            "layer_ids": list(self.layer_ids),
            "n_hash_cols": self.n_hash_cols,
            "multipliers": self.multipliers.tolist(),
            "primes": self.primes.tolist(),
            "offsets": self.offsets.tolist(),
            "rows_per_layer": self.rows_per_layer.tolist(),
        }
