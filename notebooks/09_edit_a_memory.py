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
# # 09 · Edit a memory
#
# An Engram memory is a handful of table rows: the 2-, 3- and 4-gram ending at a token, each hashed
# by 8 heads into its own row. Here we **edit** rows - in memory, never on disk
# (`weights.row_edits.edit_rows`) - and re-run: which gates move, how the next-token loss changes,
# and who else shares the edited rows (hash collisions: collateral damage).
#
# Everything runs on the embedded default (the tiny Engram LM, which has an LM head, so losses are
# real); the numbers below are whatever that model gives.

# %%
import matplotlib.pyplot as plt
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
pipe = ev.notebook.load_pipeline()
print(ev.notebook.provenance(pipe))
texts = [p.text for p in ev.load_prompts() if p.text and "<image" not in p.text]  # the shipped prompt set

# %% [markdown]
# ## Knock out one entity's memory
# For each entity below, the rows of its own n-grams (those wholly inside its tokens, every layer,
# order and head) read zeros. The loss is compared on the **entity continuation** (positions
# predicting its 2nd..last token), the **rest of its text**, and **other texts** - beside "Engram
# off" (every gate 0), the Engram paper's ablation, here at the granularity of one memory.

# %%
candidates = [
    ("And the children of Israel went up out of the land of Egypt.", "children of Israel"),
    ("Then Nebuchadnezzar king of Babylon came against Jerusalem.", "Nebuchadnezzar king of Babylon"),
    ("Alexander the Great crossed the Mediterranean Sea.", "Alexander the Great"),
    ("After the war the United States and Great Britain met.", "United States"),
]
others = [t for t in texts if not any(e in t for _, e in candidates)][:6]
summary, runs = ev.localise_entities(pipe, candidates, others)
summary.round(3)

# %% [markdown]
# The entity whose continuation depends most on its own rows:

# %%
cont = summary[summary["part"] == "entity continuation"]
entity = cont.sort_values("d_loss_ablated", ascending=False)["entity"].iloc[0]
loc = runs[entity]
print(f"{entity!r}: tokens {loc.entity.start}..{loc.entity.end - 1} of {loc.entity.text!r}")
loc.entity.ngrams.groupby(["layer", "order", "ngram"]).agg(rows=("row", "nunique")).reset_index()

# %% [markdown]
# ## Gates under the edit
# Per position and layer: how many of the 24 rows read are edited, and how gate, value and output
# moved. Positions marked `touched = False` read no edited row (and no earlier position did): they
# are bit-identical to the unedited run.

# %%
pos = loc.effect.positions
pos[pos["prompt"] == ev.ENTITY_PROMPT][
    ["position", "token", "layer", "edited_slots", "touched", "gate", "gate_edited", "d_gate_max", "value_change"]
].round(4)

# %% [markdown]
# ## The row lens
# One of the entity's rows: which column owns it, and which tokens its value pushes up and down
# through the rest of the output path (the direct logit effect, before the later blocks). Then the
# whole memory read at the entity's last token.

# %%
first = loc.entity.ngrams.sort_values(["order", "layer"], ascending=[False, True]).iloc[0]
lens = ev.row_lens(pipe, int(first["layer"]), int(first["row"]))
print(f"row {lens.row} of layer {lens.layer}: {lens.owner}; read for {first['ngram']!r}")
display(lens.promoted.head(8).assign(suppressed=lens.suppressed["token"].head(8).to_numpy()))
plens = ev.position_lens(pipe, loc.entity.text, loc.entity.end - 1, int(first["layer"]))
print(f"position {plens.position} ({plens.token!r}), gate {plens.gate:.3f}")
display(plens.promoted.head(8).assign(suppressed=plens.suppressed["token"].head(8).to_numpy()))
plens.rows.groupby("order")[["value_norm", "value_share"]].sum().round(3)

# %% [markdown]
# ## Collateral damage: who else reads the edited rows
# A row is shared by every n-gram hashed into it. A small corpus sample (the default corpus,
# capped) gives the inverse index row -> n-grams (`analysis.row_stats.row_index.RowIndex`, saved and reloaded
# like any file); every corpus n-gram in the edited rows moves with the edit.

# %%
corpus, description = ev.corpus_sample(pipe.config, tokens_per_file=1500, tokenizer=pipe.tokenizer)
print(description, f"({corpus.tokens:,} tokens)")
index = ev.RowIndex.build(corpus.counts, max_per_row=8)
decoder = ev.NgramDecoder(pipe.tokenizer, corpus.counts.pad_id)
shared = ev.collateral_ngrams(index, loc.entity.rows, decoder)
print(f"{len(shared)} corpus n-grams share the {sum(len(r) for r in loc.entity.rows.values())} edited rows")
shared.sort_values("count", ascending=False).head(12)

# %% [markdown]
# And in the texts we ran: edited rows read by n-grams that are not the entity's own.

# %%
ev.collateral_reads(loc.effect, loc.entity.ngrams, ev.ENTITY_PROMPT).round(4)

# %% [markdown]
# ## Collision interference
# For every position of a few prompts and each of its rows, take that one row out (one-head-out)
# and re-run the layer; then take out all the heads of an order whose row is a collision bucket of
# the corpus sample. How often do all 8 heads of an order collide, against a uniform hash?

# %%
heads, orders = ev.collision_interference(pipe, [loc.entity.text, *others[:3]], index)
print(heads.groupby("collision")[["d_gate", "d_value"]].mean().round(4))
heads_shared = ev.CollisionStats(pipe.config, counts=corpus.counts).heads_shared()
ev.viz.heads_shared_vs_expected(ev.layout_provenance(pipe.config, description).tag(heads_shared))[0, 0].figure

# %% [markdown]
# ## The figure
# Left: the loss change at every token of the entity's text with its rows ablated, and with Engram
# off; right: the gate change that shared rows make, against how many heads of the order collide.

# %%
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2), width_ratios=[1.7, 1], layout="constrained")
ev.viz.loss_change_by_token(
    loc.loss, ev.ENTITY_PROMPT, highlight=loc.entity.continuation, ax=a, title=f"ablate the rows of {entity!r}"
)
ev.viz.gate_change_vs_colliding_heads(orders, ax=b)  # both frames carry the weights: the figure is stamped
out = ev.notebook.figures_dir()
files = ev.notebook.export_figures({"readme_edit": fig}, out, ["png"], dpi=90)
files
