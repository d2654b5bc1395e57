"""File names made from user strings (prompt ids, categories, figure names): ``_files.safe_name``
gives one path component inside its folder, portable, and unique among the names already given."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.pyplot as plt
from hypothesis import given
from hypothesis import strategies as st

from engram_viz._files import NAME_BYTES, safe_name
from engram_viz.apps.notebook import export_figures

HOSTILE = st.sampled_from(["..", ".", "", "/", "\\", "\x00", "a/../b", "../../etc/passwd", "CON", "nul", "x.png", "é"])
TEXTS = st.one_of(
    st.text(max_size=300),
    st.text(
        alphabet=st.characters(categories=["Cs", "Lo", "Po", "Cc", "Zs"]), max_size=40
    ),  # lone surrogates, CJK, NUL
    st.lists(st.one_of(HOSTILE, st.text(alphabet="ab_-/.", max_size=4)), max_size=6).map("".join),
    st.text(alphabet="aA", min_size=1, max_size=3),  # equal ignoring case
)


def _one_component_inside(name: str, folder: Path) -> None:
    assert name and len(name.encode("utf-8")) <= NAME_BYTES
    assert name not in (".", "..") and not name.startswith(".")
    assert "/" not in name and "\\" not in name and "\x00" not in name and os.sep not in name
    assert (folder / name).parent == folder and Path(name).name == name and Path(name).suffix == ""
    assert name.isascii()


@given(st.lists(TEXTS, max_size=12))
def test_names_are_one_component_inside_the_folder_and_unique(texts):
    folder = Path("/out/figures")
    taken: set[str] = set()
    names = [safe_name(t, taken) for t in texts]
    for name in names:
        _one_component_inside(name, folder)
    assert len({n.casefold() for n in names}) == len(names)  # unique, even on a case-insensitive disk
    assert taken == set(names)


@given(TEXTS)
def test_a_name_is_stable_and_a_safe_one_is_kept(text):
    assert safe_name(text) == safe_name(text)
    assert safe_name("gates_en_alexander") == "gates_en_alexander"
    _one_component_inside(safe_name(text), Path("/out"))


def test_texts_equal_after_sanitising_stay_apart():
    taken: set[str] = set()
    names = [safe_name(t, taken) for t in ["a/b", "a_b", "a\\b", "a.b", "A_B", "a_b"]]
    assert len({n.casefold() for n in names}) == 6
    assert names[1] == "a_b" and names[4] != "A_B"  # the first keeps its name; a case twin is renamed
    assert safe_name("..") != safe_name(".") and safe_name("") != ""
    assert safe_name("x" * 1000) != safe_name("x" * 999) and len(safe_name("x" * 1000)) <= NAME_BYTES


def test_notebook_export_keeps_hostile_figure_names_inside(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    out = tmp_path / "a" / "figs"
    files = export_figures({"../../x": fig, "../../x/": fig, "..": fig}, out, ["png"], dpi=20)
    plt.close(fig)
    assert len(files) == 3 and set(files["check"]) == {"ok"}
    assert {Path(p).parent for p in files["path"]} == {out}
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(Path(p) for p in files["path"])
