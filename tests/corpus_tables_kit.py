"""The corpora whose row-usage and collision tables are pinned byte for byte in
``tests/fixtures/corpus_tables/`` (written by the code before the analysis pass was rewritten, with
``tests/fixtures/corpus_tables/make_fixtures.py``): the default corpus under the default weights'
config (every bucket of its small tables shared), and random compressed ids with Zipf-skewed
repeats under the ``tiny`` preset and under ``v41-flash`` (most n-grams alone in their bucket)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engram_viz._files import write_table
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.row_stats.collisions import CollisionStats, analyse_together
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.apps.corpus_job import run_corpus
from engram_viz.config import load_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "corpus_tables"
CASES = ("default-corpus", "random-tiny", "random-v41-flash")
DEFAULT_TOKENS = 300_000


def random_ids(config_name: str, seed: int = 0, batch: int = 150, length: int = 2_000) -> np.ndarray:
    """Compressed ids ``[batch, length]``: half uniform, half Zipf-skewed (repeated n-grams, ties)."""
    vocab = load_config(config_name).engram_compressed_vocab_size
    rng = np.random.default_rng(seed)
    uniform = rng.integers(0, vocab, (batch // 2, length))
    skewed = (rng.zipf(1.4, (batch - batch // 2, length)) - 1) % vocab
    return np.concatenate([uniform, skewed]).astype(np.int64)


def write_case(case: str, out: Path) -> list[Path]:
    """The case's tables as CSV files in ``out`` (``out`` must not exist for the default corpus)."""
    if case == "default-corpus":
        run_corpus(None, out, max_tokens=DEFAULT_TOKENS, progress=False)
        return sorted(p for p in out.glob("*.csv") if p.name != "corpus_files.csv")  # paths of this machine
    name = case.removeprefix("random-")
    counts = NgramCounts(load_config(name))
    counts.add_compressed(random_ids(name))
    usage, collisions = RowUsage(name, counts), CollisionStats(name, counts)
    analyse_together(usage, collisions, top=20)
    tables = {f"row_usage_{k}": v for k, v in usage.to_frame(top=20).items()}
    tables.update({f"collisions_{k}": v for k, v in collisions.to_frame().items()})
    out.mkdir(parents=True)
    return [write_table(df, out, table, formats=("csv",))[0] for table, df in sorted(tables.items())]
