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
# The shipped prompt set (`data/prompts/default.jsonl`) holds English and Chinese named entities,
# idioms, code, math, random-token controls and prompts with images. Do the gates differ by
# category, layer and stream? Which stream is most selective for multi-token patterns?

# %%
import numpy as np
from IPython.display import display

from engram_viz.analysis.corpus_counts import corpus_sample
from engram_viz.analysis.selectivity import stream_selectivity
from engram_viz.analysis.trace_ngrams import ngram_frequency
from engram_viz.apps import notebook as nb
from engram_viz.analysis.gate_summary import gate_overview
from engram_viz.analysis.exposure import collision_exposure
from engram_viz.run.prompts import load_prompts
from engram_viz.viz import gate_distributions, gate_heatmap, token_text_figure, token_view

nb.setup()
pipe = nb.load_pipeline()
prompts = load_prompts()
trace = pipe.run(prompts)
trace.extras["exposure"] = collision_exposure(trace, pipe.config)
gates = trace.to_frame("gates")
nb.provenance(trace)

# %% [markdown]
# ## Distributions per category, layer and stream
# Mean gate over text positions (image positions are left out: their gate is 0 by construction):

# %%
gate_overview(gates).round(3)

# %%
nb.stamp(gate_distributions(gates, by="category"), trace.model_label)

# %% [markdown]
# ## Figure-7-style panels, English and Chinese
# The Engram paper shows text coloured token by token by the gate; here are the same kinds of
# prompts (named entities, in sentences of our own), one panel per language and Engram layer.

# %%
english = ["en_alexander", "en_milky_way", "en_princess_wales"]
chinese = ["zh_four_inventions", "zh_zhang_zhongjing", "zh_great_wall"]
for layer in trace.layer_ids:
    for name, chosen in (("English", english), ("Chinese", chinese)):
        display(
            nb.stamp(
                token_text_figure(gates, chosen, layer=layer, stream="mean", title=f"{name}, layer {layer}"),
                trace.model_label,
            )
        )

# %% [markdown]
# The same as HTML with tooltips (hover a token for all its stream gates):

# %%
token_view(gates, english + chinese, layer=trace.layer_ids[-1], stream="mean", title="mean gate, last Engram layer")

# %% [markdown]
# ## All gate values per token
# `hc_mult x n_layers` gates per token (8 on the V4.1-Flash layout: 4 streams x 2 Engram layers),
# for one English and one Chinese prompt:

# %%
for pid in ("en_alexander", "zh_four_inventions"):
    display(nb.stamp(gate_heatmap(gates, pid), trace.model_label))

# %% [markdown]
# ## Which stream is most selective for multi-token patterns?
# Two ways to say which positions complete a multi-token pattern, each scored per (layer, stream)
# by the AUC of the gate (the probability that a random pattern position has the higher gate than
# a random control position; 0.5 = no separation):
#
# 1. **by prompt**: text positions of the named-entity and idiom prompts (English and Chinese)
#    against the random-token controls;
# 2. **by n-gram frequency**: positions whose 2-gram (the token and the one before it) occurs at
#    least twice in a corpus sample (the default corpus: the text the trained default saw) against
#    positions whose 2-gram never occurs there. The prompts are modern text and the sample is
#    small, so few positions qualify: raise `ENGRAM_VIZ_CORPUS_TOKENS` for a firmer answer.

# %%
by_prompt = stream_selectivity(gates)
best = by_prompt.iloc[0]
print(
    f"by prompt: most selective layer {int(best.layer)}, stream {int(best.stream)} (AUC {best.auc:.3f}, "
    f"mean gate {best.mean_pattern:.3f} on patterns vs {best.mean_control:.3f} on random tokens)"
)
by_prompt.round(3)

# %%
corpus, description = corpus_sample(pipe.config, tokenizer=pipe.tokenizer)
print(description)
freq = ngram_frequency(trace, corpus.counts, order=2)
labelled = gates.merge(freq, on=["prompt", "position"], how="left")
labelled["frequent_2gram"] = np.where(
    labelled["ngram_count"] >= 2, True, np.where(labelled["ngram_count"] == 0, False, None)
)
by_ngram = stream_selectivity(labelled, label="frequent_2gram")
best = by_ngram.iloc[0]
print(
    f"by n-gram frequency: most selective layer {int(best.layer)}, stream {int(best.stream)} "
    f"(AUC {best.auc:.3f}; {int(best.pattern_positions)} frequent vs {int(best.control_positions)} unseen 2-grams)"
)
print(nb.provenance(trace))
by_ngram.round(3)
