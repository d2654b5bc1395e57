"""Two prompts aligned per token (``analysis.gates.comparison``)."""

from __future__ import annotations

from engram_viz.analysis.gates.comparison import align_tokens


def test_align_tokens_pairs_equal_replaced_inserted_and_deleted():
    assert align_tokens([1, 2, 3], [1, 2, 3]) == [(0, 0, "equal"), (1, 1, "equal"), (2, 2, "equal")]
    assert align_tokens([1, 2, 3], [1, 9, 3]) == [(0, 0, "equal"), (1, 1, "replace"), (2, 2, "equal")]
    assert align_tokens([1, 3], [1, 2, 3]) == [(0, 0, "equal"), (None, 1, "insert"), (1, 2, "equal")]
    assert align_tokens([1, 2, 3], [1, 3]) == [(0, 0, "equal"), (1, None, "delete"), (2, 1, "equal")]
    # a replaced block pairs position by position up to the shorter side
    assert align_tokens([1, 5, 6, 3], [1, 7, 3]) == [
        (0, 0, "equal"),
        (1, 1, "replace"),
        (2, None, "delete"),
        (3, 2, "equal"),
    ]
    assert align_tokens([], [4]) == [(None, 0, "insert")]
