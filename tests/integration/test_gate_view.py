"""The gate view's state (apps/gate_view.py) as the browser receives it, and its exports
(apps/view_export.py): the payload against the comparison's own arrays, the host theme, the
settings, and every export format opened as the file it claims to be."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from engram_viz.apps.view_export import export_view
from engram_viz.apps.widget import PromptComparison
from engram_viz.viz.export import check_offline_html
from engram_viz.viz.token_labels import token_labels

pytestmark = pytest.mark.integration
A = "A photo <image:4x3> of the Great Wall."
B = "A photo <image:4x3> of the Small Wall."


@pytest.fixture(scope="module")
def cmp():
    return PromptComparison((A, B))


def test_the_payload_is_the_comparisons_arrays(cmp):
    w = cmp.widget
    assert [p["slot"] for p in w.panels] == ["A", "B"] and set(w.diffs) == {"diff B-A"}
    for panel, slot in zip(w.panels, "AB"):
        res = cmp.results[slot]
        n, n_layers, hc = res.gates.shape
        assert panel["n"] == n == len(panel["labels"]) and panel["image"] == res.is_image.astype(int).tolist()
        assert panel["labels"] == token_labels(res.pieces)[0] and "begin" not in panel["labels"][0]  # BOS, short
        np.testing.assert_allclose(np.reshape(panel["gates"], (n, n_layers, hc)), res.gates, atol=5e-5)
        rows = np.reshape(panel["rows"], (n, n_layers, panel["n_cols"]))
        assert np.array_equal(rows, res.trace.row_ids[0, :n].numpy())
    assert w.header["model"] == cmp.pipeline.model_label
    json.dumps({k: getattr(w, k) for k in w.keys if not k.startswith("_") and k != "layout"})  # all of it is JSON


def test_theme_follows_the_host_unless_set(cmp):
    w = cmp.widget
    assert w.theme == "auto" and cmp.theme == "light"
    w.host_theme = "dark"  # what the browser reports from a dark JupyterLab
    assert cmp.theme == "dark" and "#16181d" in cmp.panels["A"]  # the static panels follow it
    cmp.theme = "light"  # set explicitly: the host no longer counts
    assert cmp.theme == "light" and "#16181d" not in cmp.panels["A"]
    cmp.theme = "auto"
    w.host_theme = "light"
    with pytest.raises(ValueError, match="theme"):
        cmp.theme = "sepia"


def _file(answer: dict) -> bytes:
    return base64.b64decode(answer["data"])


def test_every_export_opens_as_what_it_claims(cmp):
    cmp.explainer.select(3, "A")
    cmp.explainer.ablate()
    page = _file(export_view(cmp, "html")).decode("utf-8")
    check_offline_html(page, "exported view")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()
    assert "the 24 rows of position 3" in page and "zeroed" in page and cmp.pipeline.model_label in page
    png = export_view(cmp, "png")
    assert png["name"].endswith(".png") and png["mime"] == "image/png"
    with Image.open(io.BytesIO(_file(png))) as im:
        assert im.format == "PNG" and im.width > 200 and im.height > 50
    pdf = _file(export_view(cmp, "pdf"))
    assert pdf.startswith(b"%PDF-") and b"%%EOF" in pdf[-64:]
    settings = json.loads(_file(export_view(cmp, "json")))
    assert settings["prompts"] == [A, B] and settings["layer"] == cmp.layer and settings["stream"] == "mean"
    assert settings["selected"] == {"slot": "A", "position": 3} and settings["model"] == cmp.pipeline.model_label
    with pytest.raises(ValueError, match="export format"):
        export_view(cmp, "gif")


def test_export_asked_by_the_browser_answers_with_its_nonce(cmp):
    w = cmp.widget
    w.export_request = {"format": "json", "nonce": "n1"}
    assert w.export_file["nonce"] == "n1" and w.export_file["name"].endswith(".json")
    cmp.set_prompts("", "")
    w.export_request = {"format": "png", "nonce": "n2"}
    assert w.export_file["nonce"] == "n2" and "no prompt runs" in w.export_file["error"]
