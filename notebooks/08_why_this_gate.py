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
# # 08 · Why this gate?
#
# A gate opens because the key of its stream lines up with the stream. The key is a linear map of
# the 24 gathered rows (3 n-gram orders x 8 heads), so it splits exactly into 24 parts, and so does
# the numerator of `dot` (`engram_viz.analysis.explain.attribution`: what is exact and what is rounded is
# stated there). On top of the split: the gate with one row, head or order left out, and the
# Shapley values of the three orders (8 coalitions, each a re-run of the gate arithmetic).
#
# Which orders open the gate on entities, and which on function words?

# %%
import matplotlib.pyplot as plt
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
pipe = ev.notebook.load_pipeline()
prompts = [p for p in ev.load_prompts() if p.category in ("english_entities", "chinese_entities", "idioms")]
ev.notebook.provenance(pipe)

# %% [markdown]
# ## One position, row by row
# `explain` runs the prompt once and attributes every position; `position_table` shows the 24 rows
# of one position: owner, decoded n-gram, each row's share of every stream's `dot`, its value part,
# and the gate with that row left out (what `engram-viz explain TEXT --position N` prints).

# %%
text = "Alexander the Great crossed the Mediterranean Sea and took Egypt from the Persians."
ex = ev.explain(pipe, text)
position = 3  # " Great"
layer = pipe.layer_ids[-1]
print(f"position {position}: {ex.pieces[position]!r}")
ex.position_table(position, layer).round(3)

# %% [markdown]
# The same position per order and per head (bars: each stream's share of `dot`), and the orders'
# Shapley values for the gate, which sum to gate(all orders) - gate(no order):

# %%
groups = ex.groups_frame()
display(ev.viz.attribution_bars(groups, position, layer=layer)[0].figure)  # stamped from the frame's provenance
display(ev.viz.attribution_bars(groups, position, layer=layer, value="shapley")[0].figure)
plt.close("all")

# %%
ev.viz.attribution_bars_interactive(groups, position, layer=layer)

# %% [markdown]
# ## Entities vs function words
# Every text position of the entity and idiom prompts, classed by a plain rule
# (`analysis.order_profile.token_class`: closed-class words and punctuation are function words;
# capitalised or CJK tokens in entity prompts are entities). Mean Shapley value of each order for
# the gate, per class:

# %%
profile = ev.order_profile(pipe, prompts)
summary = profile.groupby(["layer", "token_class", "order"])["shapley"].mean().unstack("order")
summary.round(3)

# %%
fig, axes = plt.subplots(1, len(pipe.layer_ids), figsize=(4.2 * len(pipe.layer_ids), 2.8), layout="constrained")
for a, layer_id in zip(axes, pipe.layer_ids):
    ev.viz.order_profile_plot(profile, layer=layer_id, ax=a)
display(fig)

# %% [markdown]
# The figure for the README (small PNG):

# %%
out = ev.notebook.figures_dir()
ev.notebook.export_figures({"readme_attribution": fig}, out, ["png"], dpi=80)
