"""The argparse types and actions of the ``engram-viz`` parser that need nothing of the library:
bounded integers written in decimal digits, and ``--version`` (``engram_viz.cli`` imports them; the
standard library only, so ``--help`` stays instant)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

# The shared argparse types of the numeric options: digits only (no 1e3, 0x10, 1_000, 1.0), each
# bounded, so nothing past argparse meets NaN, inf, an overflow, a negative or a zero it cannot use.
INT_LIMITS: dict[str, tuple[int, int]] = {}  # the name of each integer type -> its (lowest, highest)
_DIGITS = re.compile(r"[+-]?[0-9]+")


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``lo`` to ``hi`` written in decimal digits."""
    what = f"an integer from {lo:,} to {hi:,}"

    def parse(text: str) -> int:
        digits = text.strip()
        if not _DIGITS.fullmatch(digits):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if len(digits.lstrip("+-0")) > len(str(max(abs(lo), abs(hi)))):  # before int(): no 5,000-digit parse
            raise argparse.ArgumentTypeError(f"expected {what}, got a number {len(digits)} digits long")
        value = int(digits)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = f"int_{lo}_{hi}".replace("-", "minus")
    INT_LIMITS[parse.__name__] = (lo, hi)
    return parse


POSITIVE = int_range(1, 2**62)  # counts of things: tokens
TOKEN_INDEX = int_range(-(2**31), 2**31 - 1)  # explain's --position (negative from the end)
LAYER = int_range(0, 2**31 - 1)
TOP = int_range(0, 1_000_000)  # hot rows per layer (0: none)
WORKERS = int_range(1, 1024)
SEED = int_range(0, 2**32 - 1)  # a 32-bit seed
STEPS = int_range(1, 10_000_000)
PORT = int_range(0, 65535)  # 0: any free port


class Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib import metadata  # stdlib, and only for this flag

        try:
            version = metadata.version("engram-viz")
        except metadata.PackageNotFoundError:
            version = "unknown (the package is not installed; run from a source tree)"
        print(f"engram-viz {version}")
        parser.exit(0)
