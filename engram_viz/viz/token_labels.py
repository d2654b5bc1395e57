"""How a token is shown, once for every figure, table and view: special tokens as short labels
(``BOS``), controls made visible (``↵``), a character split over several byte-level tokens shown
on each of them with ``…`` on the side where it continues (``鸺…`` then ``…鸺``; the tooltip
names the bytes), stray bytes as ``<0xE7>`` (never U+FFFD), and an image span as one block.

Pieces are a Trace's (``core.tokenizer.EngramTokenizer.pieces``: lossless, a fragment written as
``<0xE7>``); the merge reads those bytes back, so a prompt's literal text ``<0xE7>`` inside one
token would be read as a byte too (no token of the V4 vocabulary holds one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engram_viz.core.token_text import BYTE, special_label

ELLIPSIS = "\u2026"  # the character continues in the neighbouring token


def visible(text: str) -> str:
    """``text`` on one line: newline -> '↵', tab -> '→', carriage return -> '␍', other
    controls -> '·'."""
    out = []
    for ch in str(text):
        if ch == "\n":
            out.append("\u21b5")
        elif ch == "\t":
            out.append("\u2192")
        elif ch == "\r":
            out.append("\u240d")
        elif ord(ch) < 32 or 127 <= ord(ch) < 160:  # C0, DEL, C1
            out.append("\u00b7")
        else:
            out.append(ch)
    return "".join(out)


def token_label(piece: str) -> str:
    """One token on its own: a special token's short label, else its text with controls visible."""
    return special_label(str(piece)) or visible(str(piece))


def is_special(piece: str) -> bool:
    return special_label(str(piece)) is not None


def image_label(n: int) -> str:
    """The one block an image span of ``n`` positions shows as."""
    return f"[image \u00d7{n}]"


def image_spans(is_image: Sequence[bool] | np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of image positions, in order."""
    flags = np.asarray(is_image, dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


@dataclass(frozen=True)
class _Unit:
    token: int  # the token it belongs to
    text: str  # a run of text, or "" for one stray byte
    byte: int = -1


def _units(pieces: Sequence[str]) -> list[_Unit]:
    out: list[_Unit] = []
    for k, piece in enumerate(pieces):
        at = 0
        for m in BYTE.finditer(piece):
            if m.start() > at:
                out.append(_Unit(k, piece[at : m.start()]))
            out.append(_Unit(k, "", int(m.group(1), 16)))
            at = m.end()
        if at < len(piece) or not piece:
            out.append(_Unit(k, piece[at:]))
    return out


def _merge(run: list[_Unit], shown: list[list[str]], notes: dict[int, list[str]]) -> None:
    """Decode one run of consecutive stray bytes; a character whose bytes lie in several tokens is
    shown on each with ``…`` towards the others; bytes that form no character stay ``<0xE7>``."""
    data = bytes(u.byte for u in run)
    at = 0
    for ch in data.decode("utf-8", errors="surrogateescape"):
        n = 1 if 0xDC80 <= ord(ch) <= 0xDCFF else len(ch.encode("utf-8"))
        owners = [u.token for u in run[at : at + n]]
        first, last = owners[0], owners[-1]
        if n == 1 and 0xDC80 <= ord(ch) <= 0xDCFF:
            shown[first].append(f"<0x{data[at]:02X}>")
        else:
            for k in sorted(set(owners)):
                shown[k].append((ELLIPSIS if k > first else "") + ch + (ELLIPSIS if k < last else ""))
                if first != last:
                    mine = "".join(f"<0x{run[at + j].byte:02X}>" for j in range(n) if owners[j] == k)
                    notes.setdefault(k, []).append(
                        f"bytes {mine} of {ch!r} (U+{ord(ch):04X}), split over positions {first}-{last}"
                    )
        at += n


def token_labels(pieces: Sequence[str]) -> tuple[list[str], dict[int, str]]:
    """Labels of one prompt's tokens, in order, and a note for each token that holds part of a
    character split over tokens (index -> 'bytes <0xE9><0xB8> of '鸺' (U+9E3A), split over
    positions 11-12'; indices are into ``pieces``). Special tokens and controls as in
    :func:`token_label`."""
    pieces = [str(p) for p in pieces]
    shown: list[list[str]] = [[] for _ in pieces]
    notes: dict[int, list[str]] = {}
    run: list[_Unit] = []
    for u in _units(pieces):
        if u.byte >= 0:
            run.append(u)
            continue
        if run:
            _merge(run, shown, notes)
            run = []
        shown[u.token].append(u.text)
    if run:
        _merge(run, shown, notes)
    labels = [special_label(p) or visible("".join(parts)) for p, parts in zip(pieces, shown)]
    return labels, {k: "; ".join(v) for k, v in notes.items()}
