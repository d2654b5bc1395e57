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
# Where: `ENGRAM_VIZ_FIGURES_DIR` (CI points it at a temporary folder), else `out/figures/` in the
# repository (git-ignored: nothing tracked is overwritten) - all figures go to `paper/` inside it;
# the few small PNGs the README shows go to the folder itself (`ENGRAM_VIZ_FIGURES_DIR=figures`
# regenerates the README's own). Every figure carries the label of the model and weights that made
# it: drawn in a corner, and in the PDF/SVG/PNG metadata; `ev.save_figure(ax, "fig.pdf", stamp=False)`
# leaves the corner clean and keeps the metadata.

# %%
import json

from IPython.display import Image, display

import engram_viz as ev

ev.notebook.setup()
out = ev.notebook.figures_dir()
paper = out / "paper"
pipe = ev.notebook.load_pipeline()
print(f"writing to {out}")
ev.notebook.provenance(pipe)

# %% [markdown]
# ## The data: the prompt set, a corpus sample and a prompt pair

# %%
trace = pipe.run(ev.load_prompts(ev.PROMPT_SETS["paper"]), names=["engram.*.dot"])
label = trace.model_label
v41 = ev.load_config("v41-flash")
corpus, description = ev.corpus_sample(v41)
print(description)
layout = ev.layout_provenance(v41, description)  # hash figures are exact for the layout: no weights
collisions = ev.CollisionStats(v41, counts=corpus.counts)
usage = ev.RowUsage(v41, counts=corpus.counts)
own = ev.CollisionStats(pipe.config, counts=corpus.counts) if pipe.config.name != v41.name else collisions
gates = ev.gates_with_exposure(trace, pipe.config, own)  # frames carry the weights that ran
rows = trace.to_frame("rows")
cmp = ev.PromptComparison(
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
v = ev.viz
figures = {  # every figure stamps the provenance of the frame it draws
    "tokens_english": v.token_text_figure(gates, en, layer=last, title=f"English, layer {last}"),
    "tokens_chinese": v.token_text_figure(gates, zh, layer=last, title=f"Chinese, layer {last}"),
    "tokens_view": v.token_view(gates, en + zh, layer=last, rows=rows, title="gates, mean of streams"),
    "gate_heatmap": v.gate_heatmap(gates, "en_alexander"),
    "gate_heatmap_dark": v.gate_heatmap(gates, "zh_four_inventions", theme="dark"),
    "gate_distributions": v.gate_distributions(gates, by="category"),
    "exposure_beside_gates": v.exposure_beside_gates(gates, "en_alexander"),
    "collisions_vs_expected": v.collisions_vs_expected(layout.tag(collisions.columns())),
    "heads_shared": v.heads_shared_vs_expected(layout.tag(collisions.heads_shared())),
    "coverage_per_column": v.coverage_per_column(layout.tag(usage.coverage())),
    "row_rank_frequency": v.row_rank_frequency(layout.tag(usage.rank_frequency())),
    "touched_rows_map": v.touched_rows_map(usage, ev.EngramLayout(v41)),
    "gate_difference": v.gate_difference_heatmap(diff),
    "gate_heatmap_interactive": v.gate_heatmap_interactive(gates, "en_alexander", rows=rows),
    "gate_difference_interactive": v.gate_difference_interactive(diff),
}
files = ev.notebook.export_figures(figures, paper)
files.pivot_table(index="figure", columns="format", values="bytes", aggfunc="sum")

# %%
bad = files[files["check"] != "ok"]
print(f"{len(files)} files, {len(bad)} not ok")
bad

# %% [markdown]
# ## One figure for a paper
# `ev.save_figure` writes any figure, the format from the suffix; `stamp=False` leaves the provenance
# line out of the picture (cropped to what is drawn) and keeps it in the file's metadata.

# %%
one = ev.save_figure(figures["gate_heatmap"], paper / "gate_heatmap_clean.pdf", stamp=False)
print(one, ev.notebook.check_file(one))

# %% [markdown]
# ## The README figures
# A few small PNGs for the README, written to the figures folder itself:

# %%
readme = {
    "readme_tokens": v.token_text_figure(gates, en[:2] + zh[:1], layer=last, title=f"Gate per token, layer {last}"),
    "readme_gate_heatmap": v.gate_heatmap(gates, "en_alexander"),
    "readme_collisions": v.collisions_vs_expected(ev.layout_provenance(v41).tag(collisions.columns())),
    "readme_difference": v.gate_difference_heatmap(diff, width=6.0, title="gate B - gate A: 'China' -> 'Chile'"),
}
readme_files = ev.notebook.export_figures(readme, out, ["png"], dpi=110)
for p in readme_files["path"]:
    print(p)
(out / "paper" / "provenance.json").write_text(
    json.dumps({"model": label, "streams": trace.streams_label, "corpus": description}, indent=1, ensure_ascii=False)
)
display(readme_files)
for p in readme_files["path"]:
    display(Image(filename=p))
