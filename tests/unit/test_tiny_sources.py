"""The one reader of the corpus sources (engram_viz.tiny.sources): each parser on small hand-made
input, and the packages named when a source is missing."""

from __future__ import annotations

import pytest

from engram_viz.errors import EngramVizError
from engram_viz.tiny import sources
from engram_viz.tiny.sources import (
    SOURCES,
    SourceMissingError,
    fortune_entries,
    group_lines,
    kjv_chapters,
    source_documents,
    wordnet_line,
    zh_prose,
)


def test_kjv_chapters_drop_verse_numbers_and_join_wrapped_lines():
    printed = "\nGenesis 1\n\n  1 In the beginning.\n  2 And the earth\nwas void.\n\n1 Samuel 2\n\n  1 Thus.\n"
    assert kjv_chapters(printed) == ["Genesis 1\nIn the beginning. And the earth was void.", "1 Samuel 2\nThus."]


def test_wordnet_line_keeps_lemmas_gloss_and_examples():
    line = (
        "10793922 18 n 02 Alexander_the_Great 0 Alexander 0 001 @i 10231515 n 0000 | king of Macedon; "
        'conquered Persia and Egypt (356-323 BC); "he tamed Bucephalus"  \n'
    )
    assert wordnet_line(line) == (
        'Alexander the Great, Alexander: king of Macedon; conquered Persia and Egypt (356-323 BC); "he tamed Bucephalus"'
    )
    assert wordnet_line("  1 This software and database is being provided to you\n") is None
    assert wordnet_line("00001 00 a 01 big(a) 0 000 | large\n") == "big: large"


def test_fortune_entries_drop_colour_tables_and_latin_text():
    text = (
        "\x1b[32m《静夜思》\x1b[m\n床前明月光，\n  疑是地上霜。\n%\n"
        "┌──┐\n│表│\n%\nThis entry is English only.\n%\n学而时习之\n    --《论语》\n"
    )
    assert fortune_entries(text) == ["《静夜思》\n床前明月光，\n疑是地上霜。", "学而时习之\n--《论语》"]


def test_zh_prose_keeps_chinese_paragraphs_joined_without_spaces():
    text = "  这是一\n  份指南 and\n  more text\n\n$ apt-get install x\n\nno chinese here\n\n| 表 | 格 |\n"
    assert zh_prose(text) == ["这是一份指南 and more text"]


def test_group_lines_closes_documents_at_the_size():
    assert group_lines(["aaaa", "bb", "cccccc", "d"], doc_chars=6) == ["aaaa\nbb", "cccccc", "d"]


def test_every_source_has_a_licence_and_a_missing_one_names_its_package(tmp_path, monkeypatch):
    assert set(SOURCES) == set(sources.READERS)
    assert all(meta["licence"] and meta["packages"] for meta in SOURCES.values())
    monkeypatch.setattr(sources, "WORDNET_NOUNS", tmp_path / "data.noun")
    monkeypatch.setitem(sources.READERS, "wordnet", lambda: sources.wordnet_documents(tmp_path / "data.noun"))
    with pytest.raises(SourceMissingError, match="apt-get install wordnet-base"):
        source_documents("wordnet")
    monkeypatch.setitem(sources.READERS, "zh-sayings", lambda: sources.zh_sayings_documents(tmp_path))
    with pytest.raises(SourceMissingError, match="fortunes-zh"):
        source_documents("zh-sayings")
    with pytest.raises(EngramVizError, match="unknown"):
        source_documents("nope")
