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
# # 01 · Quickstart: one prompt through the Engram path
#
# Load the weights (the embedded default, or a real checkpoint named by `ENGRAM_VIZ_CHECKPOINT`),
# run one prompt, and look at its **per-stream gates**: how strongly each of the `hc_mult` residual
# streams takes in the value that Engram read from its hash table at every token.
#
# Everything here runs on a laptop CPU without network; on a GPU node with the real checkpoint set
# `ENGRAM_VIZ_CHECKPOINT=/path/to/DeepSeek-V4.1-Flash` before starting Jupyter.

# %%
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
pipe = ev.notebook.load_pipeline()
pipe

# %% [markdown]
# Which model and weights produce every output below (the embedded default says plainly when its
# weights are synthetic). Every frame of a run carries this in its `attrs`, and every figure drawn
# from such a frame stamps it in a corner:

# %%
ev.notebook.provenance(pipe)

# %% [markdown]
# ## One prompt
# `Pipeline.run` tokenizes, hashes the 2-, 3- and 4-gram windows of every position into table rows,
# gathers and dequantises those fp8 rows, projects them and computes one gate per stream, for every
# Engram layer. The result is a `Trace`; `to_frame("gates")` is its tidy table, one row per
# (position, layer, stream).

# %%
prompt = "Only Alexander the Great could tame the horse Bucephalus."
trace = pipe.run([{"id": "alexander", "category": "english_entities", "text": prompt}])
gates = ev.gates_with_exposure(trace, pipe.config)  # the gates frame with its collision exposure
rows = trace.to_frame("rows")
display(ev.notebook.provenance(gates))
gates.head(8)

# %% [markdown]
# ## Token-coloured gates
# Each token's background is its gate (here the mean over the streams) at one Engram layer, in the
# style of the Engram paper's Figure 7. Hover a token for its per-stream gates and its 24 row ids.
# The view carries a PNG of itself, so it also shows where HTML does not.

# %%
for layer in trace.layer_ids:
    display(ev.viz.token_view(gates, layer=layer, stream="mean", rows=rows, title=f"layer {layer}"))

# %% [markdown]
# ## Stream x position heatmap
# All streams of all Engram layers at once (rows `L{layer} s{stream}`). The interactive figure's
# hover shows the token, the gate, the collision exposure and the row ids; the PNG beside it is the
# paper figure of the same data.

# %%
fig = ev.viz.gate_heatmap_interactive(gates, rows=rows)
paper = ev.viz.gate_heatmap(gates)
ev.notebook.show(fig, paper)

# %% [markdown]
# The numbers themselves, one column per stream:

# %%
gates.pivot_table(index=["position", "token"], columns=["layer", "stream"], values="gate").round(3).head(12)
