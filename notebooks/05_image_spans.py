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

# %% [markdown]
# ## A real picture beside its placeholder twin
# A placeholder's span has the right length, token types and hashes, but it carries **no image
# features**: the text after it reads streams the model never produces, because block 0's attention
# reads the image positions. A real picture (`<image:path>`, or a bare `<image>` with `images=[...]`:
# a path, PNG/JPEG bytes or a Pillow image) is pre-processed as the reference does and, on a
# checkpoint with block 0 and the vision tower (`streams="block0"`), encoded by the ViT and aligner
# and merged into the streams. Here on small SYNTHETIC weights (random, labelled so): the gates of
# the text after the picture against the placeholder twin `<image:640x480px>` (same span, no features).

# %%
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

from engram_viz.core.block0_config import Block0Config
from engram_viz.core.vision_config import VisionConfig
from engram_viz.weights.synthetic import write_synthetic_checkpoint

small_block0 = Block0Config(
    dim=64, n_heads=4, head_dim=64, rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=32,
    window_size=16, n_routed_experts=8, n_activated_experts=3, moe_inter_dim=64,
)  # fmt: skip
small_vision = VisionConfig(dim=64, vision_n_layers=2, vision_dim=64, vision_n_heads=4, vision_inter_dim=96)
folder = write_synthetic_checkpoint(
    Path(tempfile.mkdtemp()) / "small-vision", "tiny", seed=0, block0=small_block0, vision=small_vision
)
card = Image.new("RGB", (640, 480), (240, 236, 220))
draw = ImageDraw.Draw(card)
for k in range(10):
    draw.text((20, 20 + 45 * k), f"The Milky Way, line {k}", fill=(20, 20, 60))
vision_pipe = ev.Pipeline(folder, streams="block0")
twins = ev.picture_vs_placeholder(vision_pipe, "Here is the Milky Way: ", card, " It stretches across the sky.")
ev.notebook.provenance(twins)

# %% [markdown]
# The gate of each text position after the picture minus its twin's, per stream (thin) and their mean
# (bold); the table gives the largest and 99th-percentile difference per layer. Block 0 attends
# within a window (16 positions here): beyond it, it reads text only and the twins agree again.

# %%
ev.viz.picture_twin_plot(twins, layer=1).figure  # one layer: the plot returns its Axes

# %%
ev.twin_summary(twins)
