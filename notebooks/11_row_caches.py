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
# # 11 · Row caches, planned from real text
#
# Serving ports of V4.1 keep the 101 GB Engram tables in host memory or on disk and cache the hot
# rows (an LRU, a 50 GB hot cache, 16,384 rows a table). What would such a cache hit on real text?
# The row ids a text reads depend only on the tokenizer and the layout, so the trace of row reads
# is exact without weights; libCacheSim replays it through LRU, LFU, ARC, S3-FIFO, SIEVE,
# W-TinyLFU and Belady's offline optimum. Text: the first `ENGRAM_VIZ_CORPUS_TOKENS` tokens
# (default 30,000) of the default corpus's English and Chinese, of Python code, and random token
# ids. The same runs from the shell: `engram-viz cache-sim FILES --out DIR`.

# %%
import pathlib

import numpy as np
import pandas as pd
from IPython.display import display

import engram_viz as ev
from engram_viz import settings
from engram_viz.analysis.caches.cache_sizes import SHIPPED_SIZES, parse_size, row_bytes
from engram_viz.analysis.caches.corpus_trace import trace_corpus, trace_texts, trace_token_ids
from engram_viz.analysis.caches.page_io import disk_table, page_io
from engram_viz.analysis.caches.simulate import simulate_trace
from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.analysis.corpus.documents import CorpusError, DocumentSpec, first_documents

ev.notebook.setup()
v41 = ev.load_config("v41-flash")
tok = ev.get_tokenizer(v41)
ROW = row_bytes(v41)  # 256 fp8 features + 8 e8m0 scales
TABLE = int(ev.EngramLayout(v41).rows_per_layer.min())
N = settings.corpus_tokens(30_000)  # tokens per text source
print(f"V4.1-Flash: {TABLE:,} rows a table, {ROW} B a row, {TABLE * ROW / 1e9:.1f} GB a table")
display(ev.notebook.layout_provenance(v41, f"row reads of up to {N:,} tokens per text source"))

# %% [markdown]
# ## The traces
# Per token, each Engram layer reads 24 rows (8 heads of each of the 2-, 3- and 4-gram orders).
# `token` traces every read in order (decode, or a gather per token); `chunk512` is a prefill step
# of 512 tokens whose distinct rows are gathered once. The default corpus is traced with one cache
# per n-gram order too.


# %%
try:
    kjv, zh = default_corpus_files()
    english, chinese = first_documents(kjv, 2 * N), first_documents(zh, N // 2)  # about N / 2 tokens each
except CorpusError as err:  # without the Debian packages: the shipped prompt set's texts
    print(f"FALLBACK: {err}")
    english = [p.text for p in ev.load_prompts() if p.text and p.category != "zh"]
    chinese = [p.text for p in ev.load_prompts() if p.text and p.category == "zh"] or english
code_files = sorted(pathlib.Path(ev.__file__).parent.rglob("*.py"))  # this package's own Python sources
rng = np.random.default_rng(0)
traces = {
    "default corpus": trace_texts(english + chinese, v41, tok, chunk=512, source="default corpus"),
    "Chinese": trace_texts(chinese, v41, tok, chunk=512, orders=False, source="Chinese"),
    "code": trace_corpus(code_files, v41, tok, N, DocumentSpec(doc_mode="file"), 512, False, progress=False),
    "random ids": trace_token_ids(
        rng.integers(0, v41.vocab_size, (N // 512, 512)), v41, tok, chunk=512, orders=False, source="random ids"
    ),
}
for name, t in traces.items():
    print(f"{name:>15}: {t.tokens:,} tokens, {t.accesses(1):,} reads a layer, {t.distinct_rows(1):,} distinct rows")

# %% [markdown]
# ## Hit rate against cache size, every policy
# Sizes a table from 256 KiB up to every row the sample reads (16,384 rows = 4.3 MB is the size one
# port ships; half of a 50 GB cache, 25 GB a table, holds far more than a sample reads, so it hits as
# an infinite cache does). The dotted line is that infinite cache: only first reads miss. Belady
# (dashed) is the offline optimum no online policy passes. Layer 1 here; `engram-viz cache-sim` runs
# every layer, and `benchmarks/results/cache_hit_rates.txt` holds the whole default corpus.

# %%
default = traces["default corpus"]
sizes = sorted({parse_size(s, ROW, TABLE) for s in ["256KiB", "1MiB", "16384", "16MiB"]} | {default.distinct_rows(1)})
marks = {label: parse_size(s, ROW, TABLE) * ROW for label, s in SHIPPED_SIZES.items()}
hit_rates, warmup = simulate_trace(default, None, sizes, ROW, layers=[1], scopes=["all"])
ev.viz.hit_rate_vs_size(hit_rates, marks=marks).figure

# %%
table = hit_rates[hit_rates["mode"] == "token"].pivot_table(
    index=["layer", "cache_rows"], columns="policy", values="hit_rate", sort=False
)
display(table.style.format("{:.3f}"))

# %% [markdown]
# A prefill step of 512 tokens gathers each distinct row once, so repeats inside a step never reach
# the cache; what is left to hit are rows shared across steps:

# %%
ev.viz.hit_rate_vs_size(hit_rates, mode="chunk512", marks=marks).figure

# %% [markdown]
# ## Warm-up
# The hit rate of each twentieth of the trace, cache carried over (16,384 rows, layer 1):

# %%
w = warmup[(warmup["cache_rows"] == 16384) & (warmup["layer"] == 1) & (warmup["mode"] == "token")]
w.pivot_table(index="window", columns="policy", values="hit_rate", sort=False).round(3)

# %% [markdown]
# ## Per n-gram order
# A cache for one order's rows only (8 of the 24 reads a token): bigram rows repeat most.

# %%
per_order = simulate_trace(default, ["LRU", "Belady"], [1024, 16384], ROW, layers=[1], modes=["token"])[0]
per_order.pivot_table(index=["scope", "cache_rows"], columns="policy", values="hit_rate", sort=False).round(3)

# %% [markdown]
# ## Chinese, code and random ids
# LRU and Belady on each text, per token, layer 1, at the port's 16,384 rows. Random ids are the
# uniform worst case: almost every n-gram is new, so almost every read misses.

# %%
compare = []
for name, t in traces.items():
    h = simulate_trace(t, ["LRU", "Belady"], [16384], ROW, layers=[1], scopes=["all"], modes=["token"])[0]
    compare.append(h.assign(text=name))
pd.concat(compare).pivot_table(index=["text", "cache_rows"], columns="policy", values="hit_rate", sort=False).round(3)

# %% [markdown]
# ## What the misses cost a disk
# The last 1,000 tokens' misses (LRU, 16,384 rows), as pages of 4 KiB: `split` is the checkpoint's
# layout (weights and scales in two arrays: two pages a missed row), `packed` a row with its scales
# (15 rows a page). IOPS and bandwidth for 1,000 decode tokens a second and 20,000 prefill tokens a second:

# %%
pages, order_hits = page_io(default, ["LRU"], [16384], tokens=1_000)
display(pages)
disk_table(pages, decode_tokens_per_s=1_000, prefill_tokens_per_s=20_000).round(1)

# %% [markdown]
# The same cache's hits split by n-gram order (one shared cache):

# %%
order_hits

# %%
for t in traces.values():
    t.cleanup()
