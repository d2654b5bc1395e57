"""The sub-command record of ``engram-viz`` and the grouped listing of its top-level help (the
standard library only: ``engram_viz.cli`` imports it at module top)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One sub-command: its group, a one-line summary, its options and what runs it
    (``"module:function"``, called with the parsed arguments; imported only then)."""

    group: str
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    target: str
    example: str = ""


GROUPS = {
    "run": "run a model on prompts",
    "inspect": "the layout, the hash and the weights (no model run)",
    "corpus": "row usage and collisions over text files",
    "apps": "pages to explore in a browser",
}


def overview(commands: Mapping[str, Command], groups: Mapping[str, str]) -> str:
    """The sub-commands by group, for the top-level help."""
    width = max(map(len, commands)) + 2
    lines = []
    for group, what in groups.items():
        lines.append(f"{group}: {what}")
        lines += [f"  {name:<{width}}{c.summary}" for name, c in commands.items() if c.group == group]
    return "\n".join(lines)


def examples(commands: Mapping[str, Command]) -> str:
    return "examples:\n" + "\n".join(f"  {c.example}" for c in commands.values() if c.example)
