"""``engram-viz app``: the prompt-comparison app served as a web page."""

from __future__ import annotations

import argparse

from engram_viz.apps.app import serve


def app(args: argparse.Namespace) -> None:
    serve(args.checkpoint, port=args.port, host=args.host, streams=args.streams)
