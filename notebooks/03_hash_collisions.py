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
# # 03 · Hash collisions
#
# Every position reads 24 table rows per Engram layer: one per (n-gram order 2-4, head 0-7). A row
# id is `hash(n-gram) mod prime + offset`, so two different n-grams can land on the same row - a
# **collision**. None of this needs weights: it depends only on the tokenizer and the layout, so
# the numbers below are exact for DeepSeek-V4.1-Flash on any machine.
#
# The corpus is the default one (`engram_viz.apps.corpus_job`: the King James Bible and the Chinese Debian
# Reference), capped at `ENGRAM_VIZ_CORPUS_TOKENS` tokens per file (default 60,000) so that the
# notebook runs in seconds; raise the cap for the full picture.

# %%
import pandas as pd
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
v41 = ev.load_config("v41-flash")
layout = ev.EngramLayout(v41)

# %% [markdown]
# ## The layout
# Per Engram layer, each of the 24 columns has its own prime number of buckets; the columns tile
# the layer's table one after another (`offset`).

# %%
pd.DataFrame(
    [
        {
            "layer": layer,
            "order": col // layout.n_heads + 2,
            "head": col % layout.n_heads,
            "prime": int(layout.column_primes[li, col]),
            "offset": int(layout.offsets[li, col]),
        }
        for li, layer in enumerate(layout.layer_ids)
        for col in range(layout.n_hash_cols)
    ]
).pivot_table(index=["layer", "order"], columns="head", values="prime")

# %%
print(f"rows per layer: {dict(zip(layout.layer_ids, map(int, layout.rows_per_layer)))}")

# %% [markdown]
# ## Observed vs expected collisions per head, on a real corpus

# %%
tok = ev.get_tokenizer(v41)
corpus, description = ev.corpus_sample(v41, tokenizer=tok)
print(description)
print(f"{corpus.tokens:,} tokens, {corpus.documents:,} documents in {corpus.elapsed_s:.1f} s")
display(ev.notebook.layout_provenance(v41, description))
collisions = ev.CollisionStats(v41, counts=corpus.counts)
columns = collisions.columns()
columns.groupby(["layer", "order"]).agg(  # an order's n-grams once (all 8 heads hash the same ones); buckets summed
    distinct_ngrams=("distinct_ngrams", "max"),
    shared_buckets=("shared_buckets", "sum"),
    expected_shared_buckets=("expected_shared_buckets", "sum"),
)

# %%
fig = ev.viz.collisions_vs_expected(columns)[0].figure  # the plot returns its Axes, one per layer
fig.suptitle(f"V4.1-Flash layout; {description[:90]}", x=0.01, ha="left", fontsize=7)
fig

# %% [markdown]
# ## Multi-head sharing
# Each n-gram order has 8 heads with different primes: an n-gram whose bucket is shared on one head
# is still told apart on the other seven. How many n-grams share on k of their 8 heads, against a
# uniform hash:

# %%
heads = collisions.heads_shared()
display(heads[heads["ngrams"] > 0])
ev.viz.heads_shared_vs_expected(heads)[0, 0].figure  # Axes [layers, orders], in one figure

# %% [markdown]
# ## Decoded examples
# The buckets where the most frequent colliding n-grams meet (each id shown as its commonest raw form):

# %%
decoder = ev.NgramDecoder(tok, corpus.counts.pad_id, corpus.raw_counts)
collisions.examples(n_examples=2, ngrams_per_bucket=3, tokenizer=decoder).head(24)

# %% [markdown]
# ## Collision exposure beside the gates
# For the model we run, how many of a position's 24 rows also hold a different n-gram (bars under
# each gate heatmap); the population is the shipped prompt set. Gates come from the model's
# weights; the provenance says which. With a corpus as the population the embedded default's small
# tables (a few thousand buckets per column) are shared everywhere - its exposure is then 24/24 at
# almost every position (printed below); the V4.1-Flash tables, 16M buckets per column, are not.

# %%
pipe = ev.notebook.load_pipeline()
trace = pipe.run(ev.load_prompts(ev.PROMPT_SETS["paper"]))
gates = ev.gates_with_exposure(trace, pipe.config)
display(ev.notebook.provenance(gates))
for pid in ("en_alexander", "zh_great_wall"):
    display(ev.viz.exposure_beside_gates(gates, pid)[0].figure)
own = ev.CollisionStats(pipe.config, counts=corpus.counts) if pipe.config.name != v41.name else collisions
wide = ev.gates_with_exposure(trace, pipe.config, own)
print(
    f"mean exposure, prompt set only: {gates.exposure[~gates.is_image].mean():.1f}/24; "
    f"with the corpus sample too: {wide.exposure[~wide.is_image].mean():.1f}/24 ({pipe.config.name} layout)"
)
