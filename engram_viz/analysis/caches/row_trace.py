"""The row-access trace of an Engram table: which rows a cache in front of it is asked for, in order.

Every position reads 24 rows per Engram layer (``(max_ngram - 1) x n_heads`` columns, in column
order: the 2-gram heads, the 3-gram heads, the 4-gram heads), so a stream of N tokens asks layer
L's table for 24 N rows. Two ways a server asks:

- ``token``: decode, or a prefill that gathers row by row: every access in token order, the 24
  rows of a token in column order (repeats included).
- ``chunk<C>``: chunked prefill with a budget of C tokens a step. The scheduler packs consecutive
  tokens of the stream (several requests' documents) into one step, and the step gathers each
  distinct row once (serving engines deduplicate the ids of a batch before the gather): the trace
  holds each step's distinct rows in order of first access. Step k covers tokens ``[k C, (k+1) C)``
  of the whole stream; the last step may be shorter.

A *scope* is which rows a cache holds: ``all`` (one cache per layer for all 24 columns) or one
n-gram order (``n2``, ``n3``, ``n4``: a cache for that order's 8 columns only, as a port that
caches the hot bigram rows would).

**Format.** One file per (layer, scope, mode) in the trace folder, ``L{layer}-{scope}-{mode}.u32``:
the row ids as little-endian uint32 (4 B an access; a V4.1-Flash table has 384 M rows < 2**32),
appended as batches come, so a trace of any length streams to disk in the memory of one batch;
``L{layer}-{scope}-chunk<C>.steps`` holds each prefill step's count of distinct rows (uint32), and
``trace.json`` says what the folder holds. libCacheSim reads these files directly
(``simulate``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engram_viz._files import atomic_write_text
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import CacheSimError

ROW_DTYPE = np.dtype("<u4")  # one access on disk


def scope_names(config: EngramConfig, orders: bool) -> tuple[str, ...]:
    """``("all",)`` plus ``"n2", "n3", ...`` (one per n-gram order) when ``orders``."""
    return ("all", *(f"n{n}" for n in config.ngram_orders)) if orders else ("all",)


def mode_names(chunk: int | None) -> tuple[str, ...]:
    """``("token",)``, plus ``"chunk<C>"`` when a prefill chunk of C tokens is given."""
    return ("token",) if chunk is None else ("token", f"chunk{chunk}")


def scope_columns(config: EngramConfig, scope: str) -> np.ndarray:
    """The hash columns a scope holds: all ``n_hash_cols``, or order n's ``n_heads`` columns."""
    if scope == "all":
        return np.arange(config.n_hash_cols)
    n = int(scope.removeprefix("n"))
    return np.arange((n - 2) * config.engram_n_heads, (n - 1) * config.engram_n_heads)


@dataclass
class RowTrace:
    """A trace folder (see the module docstring): ``tokens`` positions, the files of each
    ``(layer, scope, mode)``, ``source``: what was traced, in words; ``layers``: the Engram layers
    traced (empty: all of the config's)."""

    folder: Path
    config: EngramConfig
    tokens: int
    chunk: int | None
    scopes: tuple[str, ...]
    source: str = ""
    files: list[dict] = field(default_factory=list)  # the corpus files and their tokens
    layers: tuple[int, ...] = ()

    @property
    def modes(self) -> tuple[str, ...]:
        return mode_names(self.chunk)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.layers) or tuple(self.config.engram_layer_ids)

    def table_rows(self, layer: int) -> int:
        """Rows of layer ``layer``'s table (the range its row ids fall in)."""
        self.path(layer, self.scopes[0])  # checks the layer
        return int(EngramLayout(self.config).rows_per_layer[list(self.config.engram_layer_ids).index(layer)])

    def path(self, layer: int, scope: str = "all", mode: str = "token") -> Path:
        if layer not in self.layer_ids or scope not in self.scopes or mode not in self.modes:
            raise CacheSimError(
                f"trace {self.folder} has layers {list(self.layer_ids)}, scopes {list(self.scopes)} and modes "
                f"{list(self.modes)}; got layer {layer}, scope {scope!r}, mode {mode!r}"
            )
        return self.folder / f"L{layer}-{scope}-{mode}.u32"

    def steps_path(self, layer: int, scope: str = "all") -> Path:
        """The chunk trace's cuts: distinct rows of each prefill step, uint32 ``[steps]``."""
        return self.path(layer, scope, f"chunk{self.chunk}").with_suffix(".steps")

    def step_sizes(self, layer: int, scope: str = "all") -> np.ndarray:
        return np.fromfile(self.steps_path(layer, scope), dtype=ROW_DTYPE).astype(np.int64)

    def accesses(self, layer: int, scope: str = "all", mode: str = "token") -> int:
        return self.path(layer, scope, mode).stat().st_size // ROW_DTYPE.itemsize

    def rows(self, layer: int, scope: str = "all", mode: str = "token") -> np.ndarray:
        """The trace as a read-only memory map, uint32 ``[accesses]`` (nothing read until used)."""
        p = self.path(layer, scope, mode)
        if not p.stat().st_size:
            return np.zeros(0, dtype=ROW_DTYPE)
        return np.memmap(p, dtype=ROW_DTYPE, mode="r")

    def distinct_rows(self, layer: int, scope: str = "all", mode: str = "token", block: int = 1 << 23) -> int:
        """The trace's working set: how many distinct rows it reads. One pass in blocks read with
        positioned I/O (no memory map: the file's pages never count in this process); memory: a
        flag a table row, of which only the pages of rows read are touched (at most the table's
        rows in bytes, whatever the trace's length)."""
        seen = np.zeros(self.table_rows(layer), dtype=bool)  # calloc: untouched pages cost nothing
        with open(self.path(layer, scope, mode), "rb") as fh:
            while chunk := fh.read(block * ROW_DTYPE.itemsize):
                seen[np.frombuffer(chunk, ROW_DTYPE)] = True
        return int(np.count_nonzero(seen))

    def cleanup(self) -> None:
        """Remove the trace folder."""
        shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def open(cls, folder: str | Path) -> RowTrace:
        """A trace folder written by :class:`TraceWriter`."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / "trace.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise CacheSimError(f"{folder} is not a row-trace folder (no readable trace.json: {err})") from None
        cfg = EngramConfig.from_dict(meta["config"], meta["config_name"])
        layers = tuple(meta.get("layers", ()))
        return cls(
            folder, cfg, meta["tokens"], meta["chunk"], tuple(meta["scopes"]), meta["source"], meta["files"], layers
        )


class TraceWriter:
    """Row ids in token order -> the trace files of every (layer, scope, mode), appended batch by
    batch (memory: one batch plus the tokens of an unfinished prefill chunk). ``layers`` /
    ``scopes``: trace only these (default: every Engram layer; ``all``, and each order's scope
    when ``orders``)."""

    def __init__(
        self,
        config: EngramConfig | str,
        folder: str | Path,
        chunk: int | None = None,
        orders: bool = True,
        layers: Sequence[int] | None = None,
        scopes: Sequence[str] | None = None,
    ):
        self.config = load_config(config)
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise CacheSimError(f"prefill chunk must be a positive number of tokens, got {chunk!r}")
        every = list(self.config.engram_layer_ids)
        layers, scopes = tuple(layers or ()), tuple(scopes or scope_names(self.config, orders))
        if not set(layers) <= set(every) or not set(scopes) <= set(scope_names(self.config, True)):
            raise CacheSimError(
                f"config {self.config.name!r} has layers {every} and scopes {list(scope_names(self.config, True))}; "
                f"got layers {list(layers)}, scopes {list(scopes)}"
            )
        self.layer_index = [every.index(layer) for layer in layers] if layers else slice(None)
        rows = EngramLayout(self.config).rows_per_layer
        if int(rows.max()) > 2**32:
            raise CacheSimError(f"config {self.config.name!r}: tables of {int(rows.max()):,} rows exceed uint32 ids")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.chunk, self.scopes = chunk, scopes
        self.tokens = 0
        self.trace = RowTrace(self.folder, self.config, 0, chunk, self.scopes, layers=layers)
        self.pending = np.zeros((0, len(self.trace.layer_ids), self.config.n_hash_cols), dtype=np.int64)
        self._handles = {  # closed in close()
            (layer, scope, mode): open(self.trace.path(layer, scope, mode), "wb")  # noqa: SIM115
            for layer in self.trace.layer_ids
            for scope in self.scopes
            for mode in self.trace.modes
        }
        if chunk is not None:  # how many accesses each prefill step made (the chunk trace's cuts)
            for layer in self.trace.layer_ids:
                for scope in self.scopes:
                    self._handles[(layer, scope, "steps")] = open(self.trace.steps_path(layer, scope), "wb")  # noqa: SIM115

    def add(self, rows: np.ndarray) -> None:
        """The row ids of the next ``N`` tokens of the stream, int ``[N, n_layers, n_hash_cols]``
        (every Engram layer of the config; ``add_traced``: the traced layers only)."""
        rows = np.asarray(rows)
        want = (self.config.n_engram_layers, self.config.n_hash_cols)
        if rows.ndim != 3 or rows.shape[1:] != want:
            raise CacheSimError(f"row ids must have shape [N, {want[0]}, {want[1]}], got {list(rows.shape)}")
        self.add_traced(rows[:, self.layer_index])

    def add_traced(self, rows: np.ndarray) -> None:
        """As :meth:`add`, the rows of the traced layers only, int ``[N, len(layer_ids), n_hash_cols]``."""
        rows = np.asarray(rows)
        want = (len(self.trace.layer_ids), self.config.n_hash_cols)
        if rows.ndim != 3 or rows.shape[1:] != want:
            raise CacheSimError(f"row ids must have shape [N, {want[0]}, {want[1]}], got {list(rows.shape)}")
        self.tokens += len(rows)
        for li, layer in enumerate(self.trace.layer_ids):
            for scope in self.scopes:
                cols = rows[:, li, scope_columns(self.config, scope)]
                self._handles[(layer, scope, "token")].write(cols.astype(ROW_DTYPE).tobytes())
        if self.chunk is not None:
            self.pending = np.concatenate([self.pending, rows.astype(np.int64, copy=False)])
            full = len(self.pending) // self.chunk * self.chunk
            self._write_chunks(self.pending[:full])
            self.pending = self.pending[full:]

    def _write_chunks(self, rows: np.ndarray) -> None:
        """Each prefill step's distinct rows in order of first access, for every layer and scope."""
        if not len(rows):
            return
        assert self.chunk is not None
        step = np.arange(len(rows)) // self.chunk
        mode = f"chunk{self.chunk}"
        for li, layer in enumerate(self.trace.layer_ids):
            for scope in self.scopes:
                cols = rows[:, li, scope_columns(self.config, scope)]
                distinct, per_step = first_accesses(cols, step)
                self._handles[(layer, scope, mode)].write(distinct.astype(ROW_DTYPE).tobytes())
                self._handles[(layer, scope, "steps")].write(per_step.astype(ROW_DTYPE).tobytes())

    def close(self, source: str = "", files: list[dict] | None = None) -> RowTrace:
        """Flush the last (short) prefill step, close the files, write ``trace.json``."""
        self._write_chunks(self.pending)
        self.pending = self.pending[:0]
        for fh in self._handles.values():
            fh.close()
        t = self.trace
        t.tokens, t.source, t.files = self.tokens, source, list(files or [])
        meta = {
            "config_name": self.config.name,
            "config": self.config.to_dict(),
            "tokens": t.tokens,
            "chunk": t.chunk,
            "scopes": list(t.scopes),
            "source": source,
            "files": t.files,
            "layers": list(t.layers),
        }
        atomic_write_text(self.folder / "trace.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        return t


def first_accesses(rows: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of each step in order of first access: rows ``[N, cols]`` (token order, then
    column order), step int ``[N]`` non-decreasing from 0 -> ``(rows int64 [U], distinct rows per
    step int64 [steps])``, steps in order."""
    steps = np.repeat(step.astype(np.int64), rows.shape[1])
    flat = rows.reshape(-1).astype(np.int64)
    _, first = np.unique(steps << 32 | flat, return_index=True)  # (step, row) keys: rows < 2**32
    first.sort()  # flat position order = step order, then first access within the step
    return flat[first], np.bincount(steps[first], minlength=int(step[-1]) + 1)
