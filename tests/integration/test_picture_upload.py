"""Pictures uploaded into the prompt comparison (``apps.picture_upload``, the view's ``picture_upload``
trait): a good one becomes an ``<image:upload-...>`` span of its prompt, stored under its content's
hash, and the gates after it are the ones ``picture_vs_placeholder`` computes from the file by another
route; each bad upload is one line in the view and writes nothing."""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import replace

import numpy as np
import pytest
from block0_kit import SMALL
from PIL import Image
from vision_kit import SMALL_VISION, gradient

import engram_viz.apps.picture_upload as upload_module
from engram_viz.analysis.gates.picture_twin import picture_vs_placeholder
from engram_viz.apps.picture_upload import MAX_UPLOAD_BYTES, store_upload
from engram_viz.apps.widget import PromptComparison
from engram_viz.config import load_config
from engram_viz.errors import UploadError
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.synthetic import write_synthetic_checkpoint

pytestmark = pytest.mark.integration
SMALL_PICTURES = replace(load_config("tiny"), name="tiny-small-pictures", vision_min_pixels=0)
BEFORE, AFTER = "Look at this: ", " It shows the Great Wall of China."
TWIN = f"{BEFORE}<image:84x56px>{AFTER}"


def png(w: int = 84, h: int = 56, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(gradient(w, h)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upload") / "ckpt"
    write_synthetic_checkpoint(folder, SMALL_PICTURES, seed=0, block0=SMALL, vision=SMALL_VISION)
    return Pipeline(folder, streams="block0")


@pytest.fixture()
def cmp(pipe, tmp_path):
    return PromptComparison([TWIN, BEFORE.strip()], pipeline=pipe, picture_folder=tmp_path / "uploads")


def _send(cmp: PromptComparison, name: str, data: bytes, slot: str = "B") -> None:
    """What the browser sends: the file's bytes as base64 in the view's picture_upload trait."""
    cmp.widget.picture_upload = {"slot": slot, "name": name, "data": base64.b64encode(data).decode(), "nonce": name}


def test_an_uploaded_picture_becomes_a_span_and_moves_the_gates_after_it(cmp, pipe, tmp_path):
    data = png()
    _send(cmp, "wall.png", data)
    stored = f"upload-{hashlib.sha256(data).hexdigest()[:16]}.png"
    assert cmp.prompts[1] == f"{BEFORE.strip()} <image:{stored}> "
    assert (tmp_path / "uploads" / stored).read_bytes() == data
    assert cmp.widget.picture_upload == {}  # the bytes do not stay in the view's state
    assert cmp.widget.image_info == f"wall.png -> <image:{stored}> in prompt B"
    cmp.set_prompts(TWIN, cmp.prompts[1] + AFTER.strip())
    assert cmp.messages == {"A": None, "B": None}
    summary = cmp.summaries["diff B-A"]
    assert summary["insert"] == summary["delete"] == summary["replace"] == 0  # same span, same text
    assert summary["changed"] > 0 and summary["max_abs_diff"] > 0.05  # the twin's gates after it differ

    twins = picture_vs_placeholder(pipe, BEFORE, data, AFTER)  # the picture from bytes, another route
    span = cmp.traces["B"].meta["image_spans"]["_0"][0]
    assert span["fill"].endswith("(84x56px)") and stored in span["fill"]
    w, h = span["grid"]
    assert span["stop"] - span["start"] == h * (w + 1) + 2 == int(cmp.results["B"].is_image.sum())
    diff = cmp.difference.query("layer == 1 and position_b >= @span['stop']")
    ours = diff.pivot_table(index="position_b", columns="stream", values="diff").to_numpy()
    theirs = twins.query("layer == 1").pivot_table(index="position", columns="stream", values="difference")
    np.testing.assert_allclose(ours, theirs.to_numpy(), atol=1e-6)


def test_the_same_picture_twice_is_stored_once_and_jpeg_keeps_its_format(cmp, tmp_path):
    data = png(fmt="JPEG")
    a = cmp.insert_picture("A", data, "wall.jpg")
    b = cmp.insert_picture("B", Image.open(io.BytesIO(data)))  # a Pillow image: stored as PNG
    assert a.endswith(".jpg>") and b.endswith(".png>")
    assert cmp.insert_picture("B", data) == a
    assert sorted(p.suffix for p in (tmp_path / "uploads").iterdir()) == [".jpg", ".png"]


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("notes.txt", b"not a picture at all\n", "not a readable image"),
        ("cut.png", png()[:300], "not a readable image"),
        ("empty.png", b"", "is empty (0 bytes)"),
        ("huge.png", b"\x89PNG" + bytes(MAX_UPLOAD_BYTES), f"at most {MAX_UPLOAD_BYTES:,} are taken"),
    ],
)
def test_a_bad_upload_is_one_line_and_writes_nothing(cmp, tmp_path, name, data, says):
    before = list(cmp.prompts)
    _send(cmp, name, data)
    line = cmp.widget.image_info
    assert line.startswith(f"upload {name!r}") and says in line and "\n" not in line, line
    assert cmp.prompts == before and cmp.widget.picture_upload == {}
    assert not (tmp_path / "uploads").exists() or not any((tmp_path / "uploads").iterdir())


def test_data_that_is_not_base64_is_one_line(cmp):
    cmp.widget.picture_upload = {"slot": "B", "name": "x.png", "data": "%%% not base64 %%%"}
    assert cmp.widget.image_info == "upload 'x.png': the browser's data is not base64; try uploading it again"


def test_the_comparison_reads_pictures_from_its_folder_only(cmp, tmp_path):
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(png())
    cmp.set_prompts(f"{BEFORE}<image:{outside}>{AFTER}", f"{BEFORE}<image:../elsewhere.png>{AFTER}")
    for slot in "AB":
        assert "leads outside" in cmp.messages[slot] and "\n" not in cmp.messages[slot]


def test_store_upload_refuses_a_missing_file(tmp_path, monkeypatch):
    with pytest.raises(UploadError, match="no such file"):
        store_upload(tmp_path / "gone.png", "gone.png", tmp_path / "uploads")
    monkeypatch.setattr(upload_module, "MAX_UPLOAD_BYTES", 100)
    (tmp_path / "big.png").write_bytes(png())
    with pytest.raises(UploadError, match="at most 100 are taken"):
        store_upload(tmp_path / "big.png", "big.png", tmp_path / "uploads")
    assert not (tmp_path / "uploads").exists()
