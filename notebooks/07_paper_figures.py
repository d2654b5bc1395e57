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
# # 07 · Paper figures
#
# Every figure of the suite, exported for papers: matplotlib figures as PDF (TrueType fonts
# embedded), SVG (text kept as text) and PNG; plotly figures as offline HTML (plotly.js inlined) and,
# with Chromium, PNG and SVG; the token-coloured text as HTML, PNG, PDF and SVG. Each file is
# written atomically and checked.
#
# Where: `ENGRAM_VIZ_FIGURES_DIR` (CI points it at a temporary folder), else `figures/` in the
# repository - all figures go to `paper/` inside it (not committed); the few small PNGs the README
# shows go to the folder itself. Every figure carries the label of the model and weights that made it.

# %%
import json

from IPython.display import Image, display

from engram_viz.analysis.corpus.counting import corpus_sample
from engram_viz.analysis.row_stats.collisions import CollisionStats
from engram_viz.analysis.row_stats.trace_ngrams import collision_exposure
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.apps import notebook as nb
from engram_viz.apps.widget import PromptComparison
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.run.prompts import PROMPT_SETS, load_prompts
from engram_viz.viz import (
    collisions_vs_expected,
    coverage_per_column,
    exposure_beside_gates,
    gate_difference_heatmap,
    gate_difference_interactive,
    gate_distributions,
    gate_heatmap,
    gate_heatmap_interactive,
    heads_shared_vs_expected,
    row_rank_frequency,
    token_text_figure,
    token_view,
    touched_rows_map,
)

nb.setup()
out = nb.figures_dir()
paper = out / "paper"
pipe = nb.load_pipeline()
print(f"writing to {out}")
nb.provenance(pipe)

# %% [markdown]
# ## The data: the prompt set, a corpus sample and a prompt pair

# %%
trace = pipe.run(load_prompts(PROMPT_SETS["paper"]), names=["engram.*.dot"])
label = trace.model_label
v41 = load_config("v41-flash")
corpus, description = corpus_sample(v41)
print(description)
collisions = CollisionStats(v41, counts=corpus.counts)
usage = RowUsage(v41, counts=corpus.counts)
own = CollisionStats(pipe.config, counts=corpus.counts) if pipe.config.name != v41.name else collisions
trace.extras["exposure"] = collision_exposure(trace, pipe.config, own)
gates = trace.to_frame("gates")
rows = trace.to_frame("rows")
cmp = PromptComparison(
    (
        "The Great Wall of China stretches across the northern border.",
        "The Great Wall of Chile stretches across the northern border.",
    ),
    pipeline=pipe,
)
diff = cmp.difference[cmp.difference["compare"] == "B-A"]

# %% [markdown]
# ## Every figure

# %%
en, zh = ["en_alexander", "en_milky_way", "en_princess_wales"], ["zh_four_inventions", "zh_zhang_zhongjing"]
last = trace.layer_ids[-1]
figures = {
    "tokens_english": token_text_figure(gates, en, layer=last, title=f"English, layer {last}"),
    "tokens_chinese": token_text_figure(gates, zh, layer=last, title=f"Chinese, layer {last}"),
    "tokens_view": token_view(gates, en + zh, layer=last, rows=rows, title="gates, mean of streams"),
    "gate_heatmap": gate_heatmap(gates, "en_alexander"),
    "gate_heatmap_dark": gate_heatmap(gates, "zh_four_inventions", theme="dark"),
    "gate_distributions": gate_distributions(gates, by="category"),
    "exposure_beside_gates": exposure_beside_gates(gates, "en_alexander"),
    "collisions_vs_expected": collisions_vs_expected(collisions.columns()),
    "heads_shared": heads_shared_vs_expected(collisions.heads_shared()),
    "coverage_per_column": coverage_per_column(usage.coverage(), log=True),
    "row_rank_frequency": row_rank_frequency(usage.rank_frequency()),
    "touched_rows_map": touched_rows_map(usage, EngramLayout(v41)),
    "gate_difference": gate_difference_heatmap(diff),
    "gate_heatmap_interactive": gate_heatmap_interactive(gates, "en_alexander", rows=rows),
    "gate_difference_interactive": gate_difference_interactive(diff),
}
gate_figures = {"tokens_english", "tokens_chinese", "tokens_view", "gate_heatmap", "gate_heatmap_dark",
                "gate_distributions", "exposure_beside_gates", "gate_difference", "gate_heatmap_interactive",
                "gate_difference_interactive"}  # fmt: skip
for name, fig in figures.items():  # gates need weights: say which; hash figures are layout-exact
    nb.stamp(fig, label if name in gate_figures else f"DeepSeek-V4.1-Flash layout (exact, no weights); {description}")
files = nb.export_figures(figures, paper)
files.pivot_table(index="figure", columns="format", values="bytes", aggfunc="sum")

# %%
bad = files[files["check"] != "ok"]
print(f"{len(files)} files, {len(bad)} not ok")
bad

# %% [markdown]
# ## The README figures
# A few small PNGs for the README, written to the figures folder itself:

# %%
readme = {
    "readme_tokens": token_text_figure(gates, en[:2] + zh[:1], layer=last, title=f"Gate per token, layer {last}"),
    "readme_gate_heatmap": gate_heatmap(gates, "en_alexander"),
    "readme_collisions": collisions_vs_expected(collisions.columns()),
    "readme_difference": gate_difference_heatmap(diff, width=6.0, title="gate B - gate A: 'China' -> 'Chile'"),
}
for name, fig in readme.items():
    nb.stamp(fig, label if name != "readme_collisions" else "DeepSeek-V4.1-Flash layout (exact, no weights)")
readme_files = nb.export_figures(readme, out, ["png"], dpi=110)
for p in readme_files["path"]:
    print(p)
(out / "paper" / "provenance.json").write_text(
    json.dumps({"model": label, "streams": trace.streams_label, "corpus": description}, indent=1, ensure_ascii=False)
)
display(readme_files)
for p in readme_files["path"]:
    display(Image(filename=p))
