"""Pictures uploaded into the prompt comparison: checked, then stored where the comparison reads them.

``store_upload(data, name, folder)`` takes the bytes a browser (or a notebook) sends, checks them
as every picture input is checked (``run.pictures.open_image``: Pillow reads every pixel, so a file
that is not an image or ends early is refused; zero bytes and more than ``MAX_UPLOAD_BYTES`` are
refused before decoding) and writes them atomically into ``folder`` under a name made from their
content, ``upload-<sha256[:16]>.<png|jpg|...>``. It returns the ``<image:NAME>`` span to put in a
prompt. Nothing from the browser becomes a path: its file name is only quoted in messages, and the
comparison reads pictures from ``folder`` only (``PromptComparison``'s ``picture_folder``).
A bad upload is one :class:`~engram_viz.errors.UploadError` line naming the file, and nothing is written.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from pathlib import Path
from typing import Any

from PIL import Image

from engram_viz._files import atomic_write_bytes
from engram_viz.config import EngramConfig
from engram_viz.errors import PictureError, UploadError
from engram_viz.run.pictures import open_image, plan_for
from engram_viz.settings import cache_dir

# base64-encoded, an upload this large fits a 10 MiB websocket message (tornado's default, Jupyter's too)
MAX_UPLOAD_BYTES = 7 * 2**20
UPLOADS = "uploads"  # the cache's sub-folder for uploaded pictures


def upload_folder() -> Path:
    """The default folder of uploaded pictures: ``<cache>/uploads`` (``settings.cache_dir``)."""
    return cache_dir() / UPLOADS


def decode_base64(data: str, name: str) -> bytes:
    """The bytes of a base64 text (what the browser sends), or an UploadError naming the file."""
    if len(data) > 4 * (MAX_UPLOAD_BYTES // 3 + 1):
        raise UploadError(
            f"upload {name!r} has about {len(data) * 3 // 4:,} bytes; at most {MAX_UPLOAD_BYTES:,} are taken"
        )
    try:
        return base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise UploadError(f"upload {name!r}: the browser's data is not base64; try uploading it again") from None


def _picture_bytes(source: Any, name: str) -> bytes:
    """Encoded bytes of ``source``: bytes as given, a file's content, a Pillow image as PNG."""
    if isinstance(source, Image.Image):
        image, _ = open_image(source)
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    path = Path(source).expanduser()
    if not path.is_file():
        raise UploadError(f"upload {name!r}: no such file; expected a PNG or JPEG file")
    if path.stat().st_size > MAX_UPLOAD_BYTES:
        raise UploadError(f"upload {name!r} has {path.stat().st_size:,} bytes; at most {MAX_UPLOAD_BYTES:,} are taken")
    return path.read_bytes()


def store_upload(source: Any, name: str, folder: Path, config: EngramConfig | str = "tiny") -> str:
    """Check ``source`` (encoded bytes, a file path or a Pillow image) and store it in ``folder``;
    returns its span ``<image:upload-<hash>.<ext>>``. ``name`` (the browser's file name) is only
    quoted in messages. The picture must give a usable grid under ``config``."""
    data = _picture_bytes(source, name)
    if not data:
        raise UploadError(f"upload {name!r} is empty (0 bytes); expected a PNG or JPEG file")
    if len(data) > MAX_UPLOAD_BYTES:
        raise UploadError(f"upload {name!r} has {len(data):,} bytes; at most {MAX_UPLOAD_BYTES:,} are taken")
    try:
        image, _ = open_image(data)  # every pixel decoded: not an image, truncated -> PictureError
        plan_for(image.width, image.height, config)
        with Image.open(io.BytesIO(data)) as probe:
            fmt = (probe.format or "png").lower()
    except PictureError as err:
        raise UploadError(f"upload {name!r}: {str(err).replace('picture ', '', 1)}") from None
    ext = {"jpeg": "jpg"}.get(fmt, fmt)
    stored = f"upload-{hashlib.sha256(data).hexdigest()[:16]}.{ext}"
    target = Path(folder) / stored
    if not target.is_file() or target.stat().st_size != len(data):  # same content, same name: written once
        atomic_write_bytes(target, data)
    return f"<image:{stored}>"


def picture_span(comparison: Any, slot: str, picture: Any, name: str | None = None) -> str | None:
    """``picture`` stored for ``comparison`` (a ``PromptComparison``) and its span, with one line in
    its view saying what became of it; None (and the line saying why) when the picture is bad."""
    name = name or (str(picture) if isinstance(picture, (str, Path)) else "picture")
    try:
        span = store_upload(picture, name, comparison.picture_folder, comparison.pipeline.config)
    except UploadError as err:
        comparison.widget.image_info = str(err)
        return None
    comparison.widget.image_info = f"{name} -> {span} in prompt {slot}"
    return span


def answer_upload(comparison: Any, request: dict) -> None:
    """The view's upload (``picture_upload``: ``{slot, name, data (base64), nonce}``) put into its
    prompt, then cleared so the bytes do not stay in the view's state."""
    if not request or "data" not in request:
        return
    name = str(request.get("name") or "picture")[:200]
    try:
        data = decode_base64(str(request["data"]), name)
    except UploadError as err:
        comparison.widget.image_info = str(err)
    else:
        comparison.insert_picture(str(request.get("slot", "A")), data, name)
    finally:
        comparison.widget.picture_upload = {}
