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
# # 06 · Comparing prompts
#
# `PromptComparison` runs two (or more) prompts through one Pipeline and shows them side by side:
# token-coloured gates at a chosen layer and stream (or all `n_layers x hc_mult` gates per token),
# and a **difference view**: prompt B's tokens are aligned to prompt A's (matching token blocks;
# replaced tokens pair up position by position) and coloured by `gate_B - gate_A`. Type in a box and
# every view updates. Image spans: the *insert image* button appends an `<image:WxH>` placeholder.

# %%
from IPython.display import HTML, display

import engram_viz as ev

ev.notebook.setup()
pipe = ev.notebook.load_pipeline()
cmp = ev.PromptComparison(
    (
        "Only Alexander the Great could tame the horse Bucephalus.",
        "Only Alexander the Small could tame the horse Bucephalus.",
    ),
    pipeline=pipe,
)
cmp

# %% [markdown]
# ## A worked example: how far does an edit reach?
# Replace one word. A gate at position *t* reads the residual stream at *t* and the table rows of
# the 2-, 3- and 4-grams ending at *t*; so no gate **before** the edit can change (the model is
# causal), and with embedding streams no gate more than 3 tokens **after** it either. With a whole
# model's own streams (the trained default, or a real checkpoint), later positions change too,
# through attention - the difference view shows how far.

# %%
cmp.set_prompts(
    "The Great Wall of China stretches across the northern border.",
    "The Great Wall of Chile stretches across the northern border.",
)
summary = cmp.summaries["diff B-A"]
print(ev.notebook.provenance(pipe))
print(summary)
diff = cmp.difference
changed = diff[diff["diff"].abs() > 1e-6]
changed.groupby(["position_b", "token_b", "kind"])["diff"].agg(["count", "min", "max"]).round(3)

# %%
display(HTML(cmp.panels["diff B-A"]))

# %% [markdown]
# The same difference for every layer and stream, as a figure:

# %%
figs = cmp.figures
ev.notebook.show(figs["diff B-A"], figs["diff B-A (paper)"])  # each stamped with the weights that ran

# %% [markdown]
# ## Layer, stream and the all-gates view
# The selectors are attributes too:

# %%
cmp.layer = pipe.layer_ids[-1]
cmp.stream = 0
cmp.view = "all gates"
display(HTML(cmp.panels["A"]))
print(f"last update: {cmp.last_update_ms:.0f} ms")

# %% [markdown]
# ## Image spans and bad prompts
# Insert an image into prompt B: the span's gates are shut and the tokens after it hash as a
# sequence start. A bad prompt (empty, too long, invalid UTF-8, an image grid over 1,024 tokens)
# shows a message in its panel; the other prompt keeps working.

# %%
cmp.view = "tokens"
cmp.insert_image("B", "8x4")
print(cmp.prompts[1])
cmp.set_prompts("A picture: <image:40x40>", "Only Alexander the Great could tame the horse Bucephalus.")
print(cmp.messages)
display(HTML(cmp.panels["A"]))

# %% [markdown]
# The view above is interactive: click a token to see its 24 rows (decoded n-grams, shares of the
# gate, the gate without each row) and press *ablate* beside a row to see what zeroing it changes;
# hover a token for every stream's gate and its row ids; *export* saves the view as HTML, PNG, PDF
# or its settings as JSON. It is one anywidget component (`cmp.widget`), so it runs the same in
# JupyterLab (following its light or dark theme), VS Code, Colab and marimo
# (`mo.ui.anywidget(cmp.widget)`), and `engram-viz app` serves it as a page of its own.
