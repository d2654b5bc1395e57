"""The corpus analysis (``analyse_together`` and the tables it fills) gives, byte for byte, the
tables the code before its rewrite wrote (``tests/fixtures/corpus_tables``, from
``make_fixtures.py``): the default corpus under the default weights' config, and random ids under
the ``tiny`` preset (every bucket shared) and ``v41-flash`` (most n-grams alone in their bucket);
the dense cases also with every group through the compiled group tally (``group_tally``), which
their small corpora otherwise stay below."""

from __future__ import annotations

import pytest
from corpus_tables_kit import CASES, FIXTURES, write_case

from engram_viz.analysis.corpus import bucket_passes

pytestmark = pytest.mark.integration

FORCED = [case for case in CASES if case != "random-v41-flash"]  # v41's sparse groups take the sorted path


@pytest.mark.parametrize(("case", "group_tally"), [(case, False) for case in CASES] + [(case, True) for case in FORCED])
def test_tables_are_byte_identical_to_the_pinned_ones(case, group_tally, tmp_path, monkeypatch):
    if group_tally:
        pytest.importorskip("numba")
        monkeypatch.setattr(bucket_passes, "TALLY_MIN", 0)
    written = {p.name: p.read_bytes() for p in write_case(case, tmp_path / "out")}
    pinned = {p.name: p.read_bytes() for p in (FIXTURES / case).glob("*.csv")}
    assert sorted(written) == sorted(pinned)
    differ = [name for name in pinned if written[name] != pinned[name]]
    assert not differ, f"{case}: tables that differ from the pinned ones: {differ}"
