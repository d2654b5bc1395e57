# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Table row usage
#
# Which rows of the Engram tables does text actually read? Each position reads 24 rows per Engram
# layer; over a corpus, some rows are read thousands of times and most never. Like the collisions,
# row usage depends only on the tokenizer and the layout, so it is exact for DeepSeek-V4.1-Flash
# without any weights. Corpus: the default corpus capped at `ENGRAM_VIZ_CORPUS_TOKENS` tokens per
# file (default 60,000).

# %%
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
v41 = ev.load_config("v41-flash")
tok = ev.get_tokenizer(v41)
corpus, description = ev.corpus_sample(v41, tokenizer=tok)
print(description)
usage = ev.RowUsage(v41, counts=corpus.counts)
print(f"{usage.n_positions:,} positions counted")
ev.notebook.layout_provenance(v41, description)

# %% [markdown]
# ## Coverage per column
# The fraction of each (order, head) column's rows read at least once (rows touched / prime):

# %%
coverage = usage.coverage()
summary = coverage.groupby("layer")[["hits", "rows_touched", "prime"]].sum()
summary["coverage"] = summary["rows_touched"] / summary["prime"]
display(summary)
ev.viz.coverage_per_column(coverage, log=True)[0].figure  # one Axes per layer, in one figure

# %% [markdown]
# ## Rank-frequency
# Hits of the r-th most read row, log-log: a few rows (the n-grams of very common words and
# punctuation) take a large share of all reads.

# %%
ev.viz.row_rank_frequency(usage.rank_frequency()).figure

# %% [markdown]
# ## Hot rows, decoded
# The most read rows of each layer and the n-grams that land there:

# %%
decoder = ev.NgramDecoder(tok, corpus.counts.pad_id, corpus.raw_counts)
usage.hot_rows(top=8, ngrams_per_row=2, tokenizer=decoder)

# %% [markdown]
# ## Where the touched rows lie
# Each strip is one (order, head) column's range of rows, cut into bins; the colour is the fraction
# of rows touched in each bin. A good hash spreads the reads evenly over the address space.

# %%
ev.viz.touched_rows_map(usage, ev.EngramLayout(v41))[0].figure
