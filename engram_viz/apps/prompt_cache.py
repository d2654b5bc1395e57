"""The prompt comparison's runs: each prompt text run once through one Pipeline, kept by text (LRU).

``PromptCache(pipeline)``: ``run(texts)`` runs the texts not yet cached, in one batch when they
build, and stores a :class:`~engram_viz.analysis.gates.comparison.PromptResult` per text: its arrays, or
a readable error (a prompt that does not build, one over ``max_tokens`` tokens, a failed run).
``get(text)`` returns a stored result and marks it recently used. On the CPU a small model (dim
<= ``SMALL_DIM``, e.g. the embedded default) runs its forward on one torch thread
(``torch_threads='auto'``; restored afterwards): for tensors this small, intra-op threads cost
more than they give, several times more on a busy machine. Collision exposure is not computed.
With ``folder``, a text's ``<image:NAME>`` pictures are read from that folder only (the comparison's
uploads: ``apps.picture_upload``), and their spans get image features where the streams merge them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from engram_viz.analysis.gates.comparison import PromptResult
from engram_viz.run.pipeline import Pipeline

MAX_TOKENS = 2_048
SMALL_DIM = 512  # models up to this width run the widget's forward on one torch thread (CPU)


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch intra-op threads (None: as set), restoring the setting afterwards."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _readable(err: BaseException) -> str:
    """One line for the widget: the exception's own message (its type when it has none)."""
    msg = str(err).strip() or type(err).__name__
    if isinstance(err, UnicodeError):
        msg = f"the text is not valid UTF-8 ({msg})"
    return msg


class PromptCache:
    """Results of prompt texts run through ``pipeline``, the last ``size`` kept (module docstring)."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        max_tokens: int = MAX_TOKENS,
        size: int = 64,
        torch_threads: int | str | None = "auto",
        folder: Path | None = None,
    ):
        self.pipeline = pipeline
        self.folder = folder
        self.max_tokens = int(max_tokens)
        if torch_threads == "auto":  # small models: intra-op threads cost more than they give
            small_cpu = pipeline.config.dim <= SMALL_DIM and pipeline.device.type == "cpu"
            torch_threads = 1 if small_cpu else None
        self.torch_threads = torch_threads
        self._results: OrderedDict[str, PromptResult] = OrderedDict()
        self._size = int(size)

    def get(self, text: str) -> PromptResult:
        """The stored result of ``text`` (run by :meth:`run`), marked recently used."""
        self._results.move_to_end(text)
        return self._results[text]

    def _prompt(self, pid: str, text: str) -> dict[str, Any]:
        """A prompt of ``text`` for the pipeline (built again by the run, so picture spans keep their pixels)."""
        return {"id": pid, "text": text} if self.folder is None else {"id": pid, "text": text, "folder": self.folder}

    def _build(self, todo: list[str]) -> tuple[list[tuple[str, Any]], dict[str, str]]:
        """``([(text, built prompt)], {text: error})``: each text tokenized, or why it cannot run."""
        built, errors = [], {}
        for t in todo:
            try:
                p = self.pipeline.build([self._prompt("_", t)])[0]
            except Exception as err:  # noqa: BLE001 - any bad prompt becomes a message
                errors[t] = _readable(err)
                continue
            if len(p.input_ids) > self.max_tokens:
                errors[t] = (
                    f"{len(p.input_ids):,} tokens (image spans included); the comparison takes at most "
                    f"{self.max_tokens:,}. Shorten it or use smaller image grids"
                )
                continue
            built.append((t, p))
        return built, errors

    def run(self, texts: list[str]) -> None:
        """Run the texts not in the cache, in one batch when they are fine, one by one otherwise."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._results]
        if not todo:
            return
        built, errors = self._build(todo)
        if built:
            try:
                with _torch_threads(self.torch_threads):
                    trace = self.pipeline.run([self._prompt(f"_{i}", t) for i, (t, _) in enumerate(built)])
            except Exception as err:  # noqa: BLE001
                for t, _ in built:
                    errors[t] = _readable(err)
            else:
                for i, (t, _) in enumerate(built):
                    self._store(t, PromptResult.from_trace(t, trace, i))
        for t, msg in errors.items():
            self._store(t, PromptResult(text=t, error=msg))

    def _store(self, text: str, result: PromptResult) -> None:
        self._results[text] = result
        self._results.move_to_end(text)
        while len(self._results) > self._size:
            self._results.popitem(last=False)
