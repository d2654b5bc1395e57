"""One base for every error a user can cause.

Each user-facing exception of the suite derives from :class:`EngramVizError`, so a caller (the
CLI, a notebook, a service) can catch them all in one place and show one line: the message names
the input, what was expected and what came. Errors that are also a ``ValueError`` or a
``RuntimeError`` by nature keep that second base, so existing ``except ValueError`` code works.
"""

from __future__ import annotations


class EngramVizError(Exception):
    """Base of every user-facing error of engram-viz (bad input, missing file, corrupt weights...)."""
