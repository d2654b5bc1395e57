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
# # 05 · Image-masked spans
#
# In a multimodal prompt, an image becomes a span of positions
# `[START] + ([IMAGE] * w + [NEWLINE]) * h + [END]`. Engram masks them: their gates are shut (0)
# and their hash ids are DEAD, so every n-gram reaching into an image is blocked and the first text
# token after an image hashes **as if it started a new sequence**. No vision encoder is needed to
# see this: write `<image:WxH>` (a grid of image tokens) or `<image:WxHpx>` (a size in pixels) in a
# prompt.

# %%
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
pipe = ev.notebook.load_pipeline()
prompts = [
    {"id": "caption", "category": "image", "text": "Here is the Milky Way: <image:6x3> It stretches across the sky."},
    {"id": "zh_photo", "category": "image", "text": "万里长城 <image:4x2> 嘉峪关是长城的西端。"},
    {"id": "two_images", "category": "image", "text": "Before <image:3x2> between <image:640x480px> after."},
]
trace = pipe.run(prompts)
gates = ev.gates_with_exposure(trace, pipe.config)
rows = trace.to_frame("rows")
ev.notebook.provenance(trace)

# %% [markdown]
# ## Shut gates
# Image spans show as one grey chip in the token view and as grey cells in the heatmap:

# %%
display(ev.viz.token_view(gates, layer=trace.layer_ids[0], rows=rows, title="gates with image spans"))
ev.notebook.show(ev.viz.gate_heatmap_interactive(gates, "caption", rows=rows), ev.viz.gate_heatmap(gates, "caption"))

# %%
img = gates[gates["is_image"]]
print(
    f"{img['position'].nunique()} image positions across {img['prompt'].nunique()} prompts; "
    f"largest gate there: {img['gate'].abs().max()}"
)
gates.groupby(["prompt", "is_image"])["gate"].agg(["count", "mean", "max"])

# %% [markdown]
# ## Blocked n-grams
# The n-gram each position hashes, per order: `BLOCKED` where the window reaches before the start
# of the sequence or onto an image position (the hasher then reads the pad id there).

# %%
table = ev.ngram_windows_table(trace, pipe.config, "caption")
span = table.index[table["is_image"]]
table.iloc[max(span.min() - 3, 0) : span.max() + 6]

# %% [markdown]
# ## The first token after an image hashes as a sequence start
# The row ids (all 24 columns of every Engram layer) of the text after an image, against the same
# text run alone as a fresh sequence (no BOS): they are equal token for token, and they stay equal
# once the n-grams no longer reach into the image, because then both read the same tokens.

# %%
check = ev.after_image_vs_fresh_start(pipe, " It stretches across the sky.")
display(check)
assert check["equal_rows"].all(), "the text after an image should hash exactly like a fresh sequence"
print("all row ids equal: the first token after an image hashes as a sequence start")
