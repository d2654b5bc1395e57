"""The text of one raw token, readable and lossless: the exact bytes a byte-level BPE token stands
for, shown as UTF-8 text where they are whole characters and as ``<0xE7>`` where they are a
fragment of one (a rare CJK character or an emoji is often split over 2-4 tokens, and decoding
each token alone would give U+FFFD); special tokens keep their text here and get a short label
(``BOS``) from :func:`special_label`.
"""

from __future__ import annotations

import re
from functools import cache

SPECIAL = re.compile(r"^<\uff5c(.+)\uff5c>$")  # <｜begin▁of▁sentence｜>: fullwidth bars around the name
BYTE = re.compile(r"<0x([0-9A-F]{2})>")  # one stray byte as readable_text writes it
SHORT_SPECIALS = {"begin▁of▁sentence": "BOS", "end▁of▁sentence": "EOS", "▁pad▁": "PAD"}


@cache
def _byte_of_char() -> dict[str, int]:
    """The byte-level BPE alphabet, inverted: each of the 256 bytes is written as one printable
    character (printable Latin-1 bytes as themselves, the rest as U+0100 + k in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1)]
    printable += list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars |= {b: chr(256 + k) for k, b in enumerate(others)}
    return {c: b for b, c in chars.items()}


def token_bytes(vocab_string: str) -> bytes | None:
    """The bytes a byte-level vocabulary entry stands for (``'Ġn'`` -> ``b' n'``), or None when
    the entry is not written in the byte-level alphabet (an added or special token)."""
    table = _byte_of_char()
    if not vocab_string or any(c not in table for c in vocab_string):
        return None
    return bytes(table[c] for c in vocab_string)


def readable_text(data: bytes) -> str:
    """``data`` as text: whole UTF-8 characters as themselves, each stray byte as ``<0xE7>``."""
    text = data.decode("utf-8", errors="surrogateescape")  # a stray byte b -> the lone surrogate U+DC00 + b
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def spelled_bytes(piece: str) -> bytes:
    """The bytes a readable piece spells: its text as UTF-8, each ``<0xE7>`` as that byte."""
    parts = BYTE.split(piece)  # text, byte, text, byte, ..., text
    return b"".join(bytes([int(p, 16)]) if k % 2 else p.encode("utf-8") for k, p in enumerate(parts))


def joined_text(pieces) -> str:
    """Readable pieces joined, a character split over pieces made whole again (stray bytes stay ``<0xE7>``)."""
    return readable_text(b"".join(spelled_bytes(p) for p in pieces))


def special_label(piece: str) -> str | None:
    """A short label for a special token's text (``<｜begin▁of▁sentence｜>`` -> ``BOS``, ``EOS``,
    ``PAD``, ``<｜User｜>`` -> ``<User>``), or None when ``piece`` is not a special token."""
    m = SPECIAL.match(piece)
    if m is None:
        return None
    name = m.group(1)
    return SHORT_SPECIALS.get(name) or "<" + name.replace("\u2581", " ").strip() + ">"
