"""trace.json, the labels half of a saved Trace: its fields, its checksum, its checks both ways.

:func:`doc_text` checks a document before anything is written (every value plain JSON that loads
back equal: str keys, finite numbers, UTF-8-encodable text, no cycle) and gives its text, or a
:class:`TraceError` naming the field; :func:`read_doc` parses and checks a saved one;
:func:`doc_sha256` is the checksum of its content that ``trace_sha256`` records.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engram_viz.errors import TraceError

FORMAT_VERSION = 2  # 2: trace.json carries trace_sha256, the checksum of its own content
DOC_SHA256 = "trace_sha256"
_MAX_DEPTH = 100  # nesting past this is refused (a cycle, or a structure no label needs)
_NO_KEY = object()


def doc_sha256(doc: Mapping[str, Any]) -> str:
    """sha256 of a trace.json document without its own ``trace_sha256`` entry, in a canonical form
    (sorted keys, no spaces, ASCII escapes): the same document gives the same digest however it
    was indented or ordered on disk."""
    body = {k: v for k, v in doc.items() if k != DOC_SHA256}
    text = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


# field of trace.json -> (check, what it must be)
_DOC_FIELDS: dict[str, tuple[Any, str]] = {
    "tensors_sha256": (lambda v: isinstance(v, str), "a hex string"),
    "layer_ids": (
        lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "a list of integers",
    ),
    "prompt_ids": (_is_str_list, "a list of strings"),
    "categories": (_is_str_list, "a list of strings"),
    "texts": (_is_str_list, "a list of strings"),
    "pieces": (lambda v: isinstance(v, list) and all(_is_str_list(p) for p in v), "a list of lists of strings"),
    "model_label": (lambda v: isinstance(v, str), "a string"),
    "streams_label": (lambda v: isinstance(v, str), "a string"),
    "meta": (lambda v: isinstance(v, dict), "an object"),
}


def read_doc(jpath: Path) -> dict[str, Any]:
    """``trace.json`` parsed and checked: UTF-8 JSON, an engram-viz trace of a version this code
    reads, every field of the right type, and content equal to its recorded ``trace_sha256``."""
    try:
        doc = json.loads(jpath.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise TraceError(
            f"{jpath} is not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}"
        ) from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise TraceError(f"{jpath} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != "engram-viz-trace":
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TraceError(f"{jpath} is not an engram-viz trace (format={got!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version != FORMAT_VERSION:
        raise TraceError(
            f"{jpath} has trace format version {version!r}; this engram-viz reads version {FORMAT_VERSION} "
            "(traces saved by other versions carry no checksum of their labels): run the prompts again"
        )
    for name, (ok, expected) in _DOC_FIELDS.items():
        if name not in doc:
            raise TraceError(f"{jpath} lacks the field {name!r}")
        if not ok(doc[name]):
            raise TraceError(f"{jpath}: field {name!r} must be {expected}, got {type(doc[name]).__name__}")
    if doc.get(DOC_SHA256) != doc_sha256(doc):
        raise TraceError(
            f"{jpath} was edited after it was saved (its content differs from its {DOC_SHA256}): labels such as "
            "model_label or meta.synthetic can no longer be trusted; run the prompts again"
        )
    return doc


def _problem(value: Any, depth: int = 0) -> tuple[str, str] | None:
    """Where in ``value`` (``['key'][0]``...) and why it would not be written as JSON that loads
    back equal, or None."""
    if depth > _MAX_DEPTH:
        return "", f"nested deeper than {_MAX_DEPTH} levels (a cycle?)"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else ("", f"{value!r} is not a finite number")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return "", f"{value[max(err.start - 10, 0) : err.end + 10]!r} holds a lone surrogate (not UTF-8 text)"
        return None
    if isinstance(value, dict):
        key = next((k for k in value if not isinstance(k, str)), _NO_KEY)
        if key is not _NO_KEY:
            return "", f"the key {key!r} is a {type(key).__name__}, not a string"
        items = [(k, v) for k, v in value.items()] + [(k, k) for k in value]  # the keys are text too
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        return "", f"{value!r} is a {type(value).__name__}, not a JSON value (str, number, bool, None, list, dict)"
    for k, v in items:
        found = _problem(v, depth + 1)
        if found:
            return f"[{k!r}]{found[0]}", found[1]
    return None


def doc_text(doc: Mapping[str, Any]) -> str:
    """The text of trace.json for ``doc`` (UTF-8, indented), after checking every field; a
    :class:`TraceError` names the first place that JSON cannot hold as it is (``meta['k']``),
    before anything is written."""
    for name, value in doc.items():
        found = _problem(value)
        if found:
            raise TraceError(f"cannot save the Trace: {name}{found[0]}: {found[1]}")
    return json.dumps(doc, ensure_ascii=False, indent=1)
