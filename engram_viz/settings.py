"""Every ``ENGRAM_VIZ_*`` environment variable, read in one place.

==============================  =====================================================================
variable                        meaning (default)
==============================  =====================================================================
``ENGRAM_VIZ_CACHE``            folder for derived files: token maps, synthetic checkpoints
                                (``$XDG_CACHE_HOME/engram-viz``, else ``~/.cache/engram-viz``)
``ENGRAM_VIZ_CHECKPOINT``       the checkpoint folder every entry point runs on when given none (``report``,
                                ``explain``, ``corpus``/``hash``/``layout``/``params`` for their config, the
                                app, the widget, the notebooks, ``Pipeline()``); an explicit checkpoint
                                wins (unset: the embedded default ``data/tiny-engram``; ``weights.resolve``);
                                ``hf://owner/repo[@revision]`` names a repository on the Hub (``weights.hub``)
``ENGRAM_VIZ_CORPUS_TOKENS``    tokens the notebooks read per corpus file (60,000)
``ENGRAM_VIZ_OFFLINE``          ``1``: Hub checkpoints from the local Hub cache only, no network (``--offline``;
                                ``HF_HUB_OFFLINE=1`` does the same) (unset)
``ENGRAM_VIZ_ROW_CACHE_MB``     bound of the on-disk cache of table rows read from the Hub, in MiB
                                (``weights.row_store``; under ``ENGRAM_VIZ_CACHE``/hub-rows) (4096)
``ENGRAM_VIZ_FIGURES_DIR``      where notebooks 07-09 write figures (``out/figures/`` at the repository
                                root; ``figures`` regenerates the README's)
``ENGRAM_VIZ_PAUSE_AT``         tests only: a job stage (``report:tables``, ``corpus:counted``, ``swap``...)
                                where ``report``/``corpus`` stop and wait to be interrupted (unset)
==============================  =====================================================================

Each is read when asked for (never at import), so a test or a notebook may set it late.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from engram_viz.errors import SettingError

CACHE = "ENGRAM_VIZ_CACHE"
CHECKPOINT = "ENGRAM_VIZ_CHECKPOINT"
CORPUS_TOKENS = "ENGRAM_VIZ_CORPUS_TOKENS"
FIGURES_DIR = "ENGRAM_VIZ_FIGURES_DIR"
OFFLINE = "ENGRAM_VIZ_OFFLINE"
ROW_CACHE_MB = "ENGRAM_VIZ_ROW_CACHE_MB"
PAUSE_AT = "ENGRAM_VIZ_PAUSE_AT"
PAUSE_S = 300.0  # long enough for a test to interrupt the job; it goes on afterwards


def cache_dir() -> Path:
    """Folder for derived files (token maps, synthetic checkpoints), created; git never sees it."""
    root = os.environ.get(CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "engram-viz"
    )
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = "it is a file" if path.exists() else (err.strerror or str(err))
        source = f"${CACHE}={root}" if os.environ.get(CACHE) else f"the cache folder {root}"
        raise SettingError(f"{source}: expected a folder for derived files, cannot use it: {why}") from None
    return path


def checkpoint() -> str | None:
    """``$ENGRAM_VIZ_CHECKPOINT`` (a checkpoint folder), or None when unset or empty."""
    return os.environ.get(CHECKPOINT) or None


def offline() -> bool:
    """True when ``$ENGRAM_VIZ_OFFLINE`` or huggingface_hub's ``$HF_HUB_OFFLINE`` says so (``1``,
    ``true``, ``yes``, ``on``): Hub checkpoints then come from the local cache only."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in (OFFLINE, "HF_HUB_OFFLINE"))


def corpus_tokens(default: int) -> int:
    """``$ENGRAM_VIZ_CORPUS_TOKENS`` as a positive int, else ``default``."""
    raw = os.environ.get(CORPUS_TOKENS)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingError(f"${CORPUS_TOKENS}={raw!r}: expected a positive integer (tokens per file)")
    return value


def row_cache_bytes(default_mb: int = 4096) -> int:
    """``$ENGRAM_VIZ_ROW_CACHE_MB`` (a non-negative number of MiB; 0: keep no rows) in bytes."""
    raw = os.environ.get(ROW_CACHE_MB)
    try:
        mb = float(raw) if raw else float(default_mb)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise SettingError(f"${ROW_CACHE_MB}={raw!r}: expected a non-negative number of MiB (the row cache's bound)")
    return int(mb * 2**20)


def figures_dir() -> Path | None:
    """``$ENGRAM_VIZ_FIGURES_DIR`` as a path, or None when unset or empty."""
    raw = os.environ.get(FIGURES_DIR)
    return Path(raw) if raw else None


def pause_at(stage: str) -> None:
    """Test hook of the interrupt tests: when ``$ENGRAM_VIZ_PAUSE_AT`` names ``stage``, say so on
    stderr and wait there (a test then sends SIGINT or SIGKILL); otherwise return at once."""
    if os.environ.get(PAUSE_AT) == stage:
        print(f"engram-viz: paused at {stage} (pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(PAUSE_S)
