"""engram_viz.core.hooks: the one hook-site table, and everything made from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engram_viz.core.hooks import HOOK_SITES, SITES, HookPoint, hook_name, hook_table_markdown, parse_hook_name

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_hook_table() -> str:
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("| name | shape | meaning |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end])


def test_readme_hook_table_is_generated_from_the_site_table():
    assert _readme_hook_table() == hook_table_markdown()


def test_sites_are_in_forward_order_and_named_once():
    assert HOOK_SITES == ("streams", "token_mask", "hash_ids", "rows", "key", "value", "dot", "gate", "out")
    assert len({s.name for s in SITES}) == len(SITES)
    assert all(s.shape.startswith("[B, T") for s in SITES)


def test_hook_names_round_trip_and_reject_unknown_sites():
    for site in HOOK_SITES:
        assert parse_hook_name(hook_name(14, site)) == (14, site)
    with pytest.raises(ValueError, match="unknown hook kind 'gates'"):
        hook_name(1, "gates")
    for bad in ("engram.L1.gates", "engram.1.gate", "L1.gate"):
        with pytest.raises(ValueError, match="is not a hook name"):
            parse_hook_name(bad)


def test_hook_point_replaces_only_with_a_same_shape_tensor():
    point = HookPoint(hook_name(1, "gate"))
    x = torch.zeros(2, 3, 4)
    with point.add_hook(lambda t, name: t + 1):
        assert torch.equal(point(x), x + 1)
    assert torch.equal(point(x), x)  # the handle removed its hook
    point.add_hook(lambda t, name: t[:1])
    with pytest.raises(ValueError, match="returned shape"):
        point(x)
