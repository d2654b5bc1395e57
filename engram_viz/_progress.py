"""The one progress bar of the suite: ``tqdm.auto`` (a text bar in a terminal, a widget in Jupyter).

Every long loop that shows progress (training the tiny LM, ``inspect --verify``, a pipeline run in
batches, counting a corpus) makes its bar with :func:`progress_bar`, so they all look and switch
off alike (``disable=True``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

ProgressBar = tqdm  # the type of a bar, for annotations


def progress_bar(iterable: Iterable | None = None, **options: Any) -> ProgressBar:
    """A bar over ``iterable`` (or a manual one, ``.update(n)``); ``options`` are tqdm's (``total``,
    ``desc``, ``unit``, ``unit_scale``, ``disable``, ...)."""
    return tqdm(iterable, **options)
