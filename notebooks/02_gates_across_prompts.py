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
# # 02 · Gates across prompts
#
# Two prompt sets ship (`engram_viz.run.prompts`): **default** for the embedded tiny Engram
# LM, whose entities and set phrases (English and Chinese, several tokens each) occur in its
# training text, with controls (the same templates with unseen names, novel sentences, random
# tokens, image spans); and **paper**, the Engram paper's Figure-7-style prompts, for a real
# checkpoint. The notebook picks the set that fits the weights and says which. Do the gates open
# where the model's memory holds the n-gram? Do they differ by category, layer and stream?

# %%
from IPython.display import display

import engram_viz as ev

ev.notebook.setup()
pipe = ev.notebook.load_pipeline()
set_name = ev.prompt_set_for(pipe.lm is not None)
prompts = ev.load_prompts(ev.prompt_set_path(set_name))
print(
    f"prompt set: {set_name} ({ev.prompt_set_path(set_name).name}, {len(prompts)} prompts) - the one that fits the weights"
)
trace = pipe.run(prompts)
gates = ev.gates_with_exposure(trace, pipe.config)
ev.notebook.provenance(trace)

# %% [markdown]
# ## Gate versus memory
# For the tiny LM we know what it read in training (the windows of its batches, from the recipe and
# seed in its `config.json`), so each text position gets a **training count**: how often the model
# read the trigram ending there. Mean gate (over the streams) per group - seen at
# least 20 times, 1-19 times, never, and random-token controls - and gate against the training
# count, with the Spearman correlation; the loss column is what the open gates save on the
# next-token loss (gates forced to 0 minus open, nats). Other weights have no training text here:
# the section is skipped.

# %%
if pipe.lm is not None:
    counts = ev.training_counts(pipe.config, pipe.lm.provenance)
    memory = ev.gate_memory(trace, pipe.lm, counts)  # the report's tables gate_memory, memory_targets, ...
    axes = ev.viz.stamp(ev.viz.gate_vs_memory(memory.summary, memory.curve, memory.rho), trace)  # two Axes
    display(axes[0].figure)
    display(memory.summary.round(3))
    display(memory.targets.round(3))
    display(memory.by_category.round(3))
    display(memory.by_order.round(3))

# %% [markdown]
# ## Distributions per category, layer and stream
# Mean gate over text positions (image positions are left out: their gate is 0 by construction):

# %%
ev.gate_overview(gates).round(3)

# %%
ev.viz.gate_distributions(gates, by="category")[0].figure  # one Axes per layer, in one figure

# %% [markdown]
# ## Figure-7-style panels, English and Chinese
# Text coloured token by token by the gate, as in the Engram paper: entities and set phrases of
# the chosen set beside their controls, one panel per language and Engram layer.

# %%
first = {}
for p in prompts:
    first.setdefault((p.category, p.id.split("_")[0]), p.id)
english = [first[k] for k in sorted(first) if k[1] == "en" and k[0] not in ("image",)][:4]
chinese = [first[k] for k in sorted(first) if k[1] == "zh" and k[0] not in ("image",)][:4]
for layer in trace.layer_ids:
    for name, chosen in (("English", english), ("Chinese", chinese)):
        display(ev.viz.token_text_figure(gates, chosen, layer=layer, stream="mean", title=f"{name}, layer {layer}"))

# %% [markdown]
# The same as HTML with tooltips (hover a token for all its stream gates):

# %%
ev.viz.token_view(
    gates, english + chinese, layer=trace.layer_ids[-1], stream="mean", title="mean gate, last Engram layer"
)

# %% [markdown]
# ## All gate values per token
# `hc_mult x n_layers` gates per token (8 on the V4.1-Flash layout: 4 streams x 2 Engram layers),
# for one English and one Chinese prompt:

# %%
for pid in (english[0], chinese[0]):
    display(ev.viz.gate_heatmap(gates, pid).figure)

# %% [markdown]
# ## Which stream is most selective for multi-token patterns?
# Per (layer, stream), the AUC of the gate: the probability that a random position of the
# named-entity and idiom prompts (English and Chinese) has a higher gate than a random position of
# the random-token controls (0.5 = no separation).

# %%
by_prompt = ev.stream_selectivity(gates)
best = by_prompt.iloc[0]
print(
    f"by prompt: most selective layer {int(best.layer)}, stream {int(best.stream)} (AUC {best.auc:.3f}, "
    f"mean gate {best.mean_pattern:.3f} on patterns vs {best.mean_control:.3f} on random tokens)"
)
print(ev.notebook.provenance(trace))
by_prompt.round(3)
