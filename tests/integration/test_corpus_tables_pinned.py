"""The corpus analysis (``analyse_together`` and the tables it fills) gives, byte for byte, the
tables the code before its rewrite wrote (``tests/fixtures/corpus_tables``, from
``make_fixtures.py``): the default corpus under the default weights' config, and random ids under
the ``tiny`` preset (every bucket shared) and ``v41-flash`` (most n-grams alone in their bucket);
every case also with the compiled tallies forced, which their small corpora otherwise stay below:
the dense groups through the group tally (``group_tally``), V4.1's sparse columns through the radix
sort by bucket (``bucket_sort``)."""

from __future__ import annotations

import pytest
from corpus_tables_kit import CASES, FIXTURES, write_case

from engram_viz.analysis.corpus import bucket_passes

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("case", "compiled"), [(case, False) for case in CASES] + [(case, True) for case in CASES])
def test_tables_are_byte_identical_to_the_pinned_ones(case, compiled, tmp_path, monkeypatch):
    if compiled:
        pytest.importorskip("numba")
        monkeypatch.setattr(bucket_passes, "TALLY_MIN", 0)
    written = {p.name: p.read_bytes() for p in write_case(case, tmp_path / "out")}
    pinned = {p.name: p.read_bytes() for p in (FIXTURES / case).glob("*.csv")}
    assert sorted(written) == sorted(pinned)
    differ = [name for name in pinned if written[name] != pinned[name]]
    assert not differ, f"{case}: tables that differ from the pinned ones: {differ}"
