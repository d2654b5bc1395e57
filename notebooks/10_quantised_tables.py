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
# # 10 · Quantised tables
#
# GGUF files of V4.1 ship the Engram tables at Q8_0, Q4_K, Q2_K, MXFP4 ... What does that cost? Here
# the tiny Engram LM's fp8 tables are quantised with gguf's own quantisers (the types gguf can
# quantise: Q8_0, Q5_0, Q4_0, MXFP4) and read back through the `GGUFTable` a GGUF file's table
# opens as; "Engram off" (every row zeroed) is the end point. For each: the row error, the gate
# change, the next-token loss and KL against the fp8 tables.

# %%
import tempfile
from pathlib import Path

import torch
from IPython.display import display

import engram_viz as ev
from engram_viz.analysis.gates.gate_memory import training_counts
from engram_viz.analysis.quant.study import quant_study
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts
from engram_viz.tiny.files import load_tiny_model
from engram_viz.viz.quant_plots import quality_vs_bits
from engram_viz.weights.gguf_export import export_gguf
from engram_viz.weights.tiny_folder import DEFAULT_DIR

ev.notebook.setup()
model = load_tiny_model()
prompts = load_prompts()  # the shipped default prompt set
counts = training_counts(model.config, model.provenance)  # for the read-count groups
study = quant_study(model, prompts, ["Q8_0", "Q5_0", "Q4_0", "MXFP4", "off"], counts)
cols = ["candidate", "bits_per_weight", "table_gb", "row_error", "gate_change_p99", "streams_moved"]
display(study.summary[cols + ["streams_crossed", "delta_loss", "kl"]].round(5))

# %% [markdown]
# ## Quality against bits per weight
# KL of the next-token distribution from the fp8 tables' (left) and the gate change (right); the
# legend gives the size of one V4.1-Flash table (384 M rows x 256) stored each way.

# %%
axes = quality_vs_bits(study.summary)
axes[0].figure

# %% [markdown]
# ## Where it hurts: per read-count group and per n-gram order
# Positions whose 3-gram the model read often in training, seldom, or never (random-token controls
# apart); and the row error per order (mean over heads and layers).

# %%
display(study.by_group[["candidate", "group", "positions", "gate_change_mean", "streams_crossed", "delta_loss", "kl"]])
display(study.columns.groupby(["candidate", "order"])["row_error"].mean().unstack().round(4))

# %% [markdown]
# ## A GGUF file, opened like a checkpoint
# The tiny LM written as a GGUF file with Q8_0 tables (gguf's writer), run whole from the file: the
# same row ids as the safetensors folder; no gate moves by 0.05 (the few largest changes sit where the
# dot is near 0, where the signed square root is steepest).

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = export_gguf(DEFAULT_DIR, Path(tmp) / "tiny_q8.gguf", "Q8_0")
    texts = [p.text for p in prompts if p.text][:8]
    pipe = Pipeline(path)
    from_file, from_folder = pipe.run(texts), Pipeline(DEFAULT_DIR).run(texts)
    display(ev.notebook.provenance(from_file))
    print("row ids identical:", torch.equal(from_file.row_ids, from_folder.row_ids))
    print(f"largest gate change: {(from_file.gates - from_folder.gates).abs().max().item():.4f}")
