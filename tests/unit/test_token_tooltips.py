"""The token HTML's tooltip with the n-gram orders' shares of a position's gate (viz/token_chips.py,
viz/tokens.py), on hand-made frames: the percentages are the frame's own numbers, per stream or
averaged over streams, in the ``title`` attribute of each token (no scripts)."""

from __future__ import annotations

from html.parser import HTMLParser

import pandas as pd
import pytest

from engram_viz.viz.token_chips import order_shares_text
from engram_viz.viz.tokens import token_html, token_view

pytestmark = pytest.mark.unit
TOKENS = ["<bos>", "Alexander", " the", " Great"]
# dot shares per (position, order, stream): stream 0 and stream 1
SHARES = {
    1: {2: (1.0, 3.0), 3: (1.0, 1.0), 4: (2.0, 0.0)},
    2: {2: (-1.0, 0.5), 3: (3.0, 0.5), 4: (0.0, 0.0)},
    3: {2: (0.0, 0.0), 3: (0.0, 0.0), 4: (0.0, 0.0)},
}


def _gates() -> pd.DataFrame:
    recs = [
        {"prompt": "p", "position": i, "token": t, "is_image": False, "layer": 1, "stream": s, "gate": 0.2 + 0.1 * i}
        for i, t in enumerate(TOKENS)
        for s in (0, 1)
    ]
    return pd.DataFrame(recs)


def _attribution() -> pd.DataFrame:
    recs = [
        {
            "prompt": "p",
            "position": p,
            "token": TOKENS[p],
            "layer": 1,
            "kind": "order",
            "group": o,
            "stream": s,
            "dot_share": v,
        }
        for p, orders in SHARES.items()
        for o, per_stream in orders.items()
        for s, v in enumerate(per_stream)
    ]
    # head rows are present in a groups frame too and must be ignored
    recs.append(
        {
            "prompt": "p",
            "position": 1,
            "token": TOKENS[1],
            "layer": 1,
            "kind": "head",
            "group": 0,
            "stream": 0,
            "dot_share": 99.0,
        }
    )
    return pd.DataFrame(recs)


class _Titles(HTMLParser):
    def __init__(self):
        super().__init__()
        self.titles: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.titles += [v for k, v in attrs if k == "title"]


def test_order_shares_per_stream_and_averaged():
    text = order_shares_text(_attribution(), "p", 1, 0)
    assert text[1] == "order shares of dot (stream 0): 2-gram +25%  3-gram +25%  4-gram +50%"
    assert text[2] == "order shares of dot (stream 0): 2-gram -50%  3-gram +150%  4-gram +0%"
    assert text[3].endswith("none (dot 0)")
    mean = order_shares_text(_attribution(), "p", 1, "mean")
    # mean over streams: order 2 (1 + 3) / 2 = 2, order 3 1, order 4 1 -> 50 / 25 / 25
    assert mean[1] == "order shares of dot (mean of streams): 2-gram +50%  3-gram +25%  4-gram +25%"
    assert order_shares_text(None, "p", 1, 0) == {} and order_shares_text(_attribution(), "p", 3, 0) == {}
    with pytest.raises(ValueError, match="attribution"):
        order_shares_text(_attribution().drop(columns="dot_share"), "p", 1, 0)


def test_token_html_tooltips_carry_the_order_shares():
    page = token_html(_gates(), layer=1, stream=1, attribution=_attribution())
    parsed = _Titles()
    parsed.feed(page)
    assert "<script" not in page and "script" not in parsed.tags
    titles = {t.splitlines()[0]: t for t in parsed.titles}
    assert "order shares of dot (stream 1): 2-gram +75%  3-gram +25%  4-gram +0%" in titles["'Alexander'  position 1"]
    assert "2-gram +50%  3-gram +50%" in titles["' the'  position 2"]
    assert "order shares" not in titles["'<bos>'  position 0"]  # not explained: no line
    plain = _Titles()
    plain.feed(token_html(_gates(), layer=1))
    assert not any("order shares" in t for t in plain.titles)
    view = token_view(_gates(), layer=1, attribution=_attribution())
    assert "order shares of dot (mean of streams)" in view.html(full_page=False)
