"""A report from the loopback Hub at V4.1-Flash size: the rows and bytes it reads instead of the tables.

    python benchmarks/hub_rows.py [--prompt-set paper|default] [--prompts N] [--seed 0] [--out FILE]

Builds, in a temporary folder, a checkpoint with V4.1-Flash's Engram names, dtypes and shapes whose
two tables are full size (each 98.3 GB of e4m3 rows + 3.1 GB of scales) as sparse safetensors files
(holes: no disk). ``wkv``, ``q_weight`` and ``k_weight`` are written whole, and so are the rows a run
over the prompt set gathers (table rows and token-embedding rows, recorded while the seeded
procedural checkpoint ``synthetic_checkpoint("v41-flash", seed)`` ran the same prompts), with the
procedural checkpoint's values. It serves the folder from ``tests/hub_kit.HubServer`` on 127.0.0.1,
runs ``engram-viz report --checkpoint hf://bench/v41-flash`` over the prompt set (``paper``: what the
report runs on a checkpoint other than the tiny LM; or ``default``) in a fresh process with an empty
row cache, and reads the rows and bytes from the report's provenance (``manifest.json``:
``hub_rows``). The gates of the report's trace are compared bit for bit with the folder opened from
disk and with the procedural checkpoint itself. A second report shows the row cache at work.
Default output: ``benchmarks/results/hub_rows.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hub_kit import HubServer, Repo

from engram_viz.config import CONFIG_DIR, load_config
from engram_viz.core.schema import EMBED_NAME, engram_names, expected_tensors
from engram_viz.core.tokenizer import bundled_tokenizer_file
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts, prompt_set_path
from engram_viz.run.trace import Trace
from engram_viz.weights.index import INDEX_FILE
from engram_viz.weights.safetensors import create_sparse_safetensors
from engram_viz.weights.synthetic import synthetic_checkpoint

REPO = "bench/v41-flash"


def same_gates(a: Trace, b: Trace) -> str:
    """Whether two traces' gates are bit for bit equal at the valid positions, in words."""
    ga, gb = a.gates[a.valid].contiguous(), b.gates[b.valid].contiguous()
    if ga.shape == gb.shape and torch.equal(ga.view(torch.int32), gb.view(torch.int32)):
        return f"bit for bit ({ga.numel():,} gates)"
    if ga.shape != gb.shape:
        return f"NOT EQUAL (shapes {list(ga.shape)} and {list(gb.shape)})"
    diff = (ga - gb).abs().nan_to_num(nan=float("inf"))
    return f"NOT EQUAL ({int((diff > 0).sum()):,} of {ga.numel():,} differ, max {diff.max():.3g})"


def recorded_run(seed: int, prompts: list) -> tuple[Trace, dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """The procedural checkpoint over the default prompts: its gates, and the rows each tensor gave
    (name -> sorted ids) with their bytes (name -> rows)."""
    ckpt = synthetic_checkpoint("v41-flash", seed)
    asked: dict[str, list[np.ndarray]] = {}

    def record(name: str, read):
        def wrapped(ids: np.ndarray):
            asked.setdefault(name, []).append(np.asarray(ids).copy())
            return read(ids)

        return wrapped

    for layer_id, w in ckpt.layers.items():
        w.table._gather_unique = record(engram_names(layer_id)["table_weight"], w.table._gather_unique)
    ckpt.embed.source.read_unique = record(EMBED_NAME, ckpt.embed.source.read_unique)
    trace = Pipeline(ckpt, streams="embedding").run(prompts)
    ids = {name: np.unique(np.concatenate(parts)) for name, parts in asked.items()}
    rows: dict[str, torch.Tensor] = {}
    for layer_id, w in ckpt.layers.items():
        names = engram_names(layer_id)
        rows[names["table_weight"]], rows[names["table_scale"]] = w.table.gather_fp8(ids[names["table_weight"]])
        ids[names["table_scale"]] = ids[names["table_weight"]]
        for part in ("wkv_weight", "wkv_scale", "q_weight", "k_weight"):
            rows[names[part]] = getattr(w, part)
    rows[EMBED_NAME] = ckpt.embed.rows(torch.from_numpy(ids[EMBED_NAME]))
    return trace, ids, rows


def write_folder(folder: Path, ids: dict[str, np.ndarray], rows: dict[str, torch.Tensor]) -> dict[str, int]:
    """The sparse checkpoint folder (shards: the embedding; layer 1; each later table), -> bytes per tensor."""
    cfg = load_config("v41-flash")
    specs = expected_tensors(cfg)
    later = cfg.engram_layer_ids[1:]
    later_tables = [engram_names(n)[k] for n in later for k in ("table_weight", "table_scale")]
    groups = [[EMBED_NAME], [n for n in specs if n != EMBED_NAME and n not in later_tables]]
    groups += [[engram_names(n)["table_weight"], engram_names(n)["table_scale"]] for n in later]
    weight_map, sizes = {}, {}
    for i, names in enumerate(groups, start=1):
        shard = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        header = create_sparse_safetensors(folder / shard, {n: specs[n] for n in names}, {"format": "pt"})
        fd = os.open(folder / shard, os.O_WRONLY)
        try:
            for name in names:
                info, data = header.tensors[name], rows[name].contiguous().view(torch.uint8).numpy()
                sizes[name] = info.nbytes
                if name in ids:  # only the rows read, at their places
                    row_bytes = data.shape[1]
                    for r, row in zip(ids[name].tolist(), data):
                        os.pwrite(fd, row.tobytes(), info.start + r * row_bytes)
                else:
                    os.pwrite(fd, data.tobytes(), info.start)
        finally:
            os.close(fd)
        weight_map.update(dict.fromkeys(names, shard))
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text((CONFIG_DIR / "v41-flash.json").read_text())
    (folder / "tokenizer.json").write_bytes(bundled_tokenizer_file().read_bytes())
    return sizes


def report(url: str, tmp: Path, out: Path, prompts: Path) -> tuple[float, dict]:
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_CACHE": str(tmp / "hub"), "HF_HOME": str(tmp / "hf-home")}
    env.update(ENGRAM_VIZ_CACHE=str(tmp / "cache"), HF_HUB_DISABLE_PROGRESS_BARS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "engram_viz.cli", "report", "--checkpoint", f"hf://{REPO}", "--out", str(out)]
    cmd += ["--prompts", str(prompts)]
    start = time.perf_counter()
    subprocess.run([*cmd, "--quiet", "--device", "cpu"], check=True, env=env)
    return time.perf_counter() - start, json.loads((out / "manifest.json").read_text())["provenance"]["hub_rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hub_rows.txt")
    ap.add_argument(
        "--prompt-set",
        default="paper",
        help="paper (what `report` runs on a checkpoint other than the tiny LM) or default",
    )
    ap.add_argument("--prompts", type=int, default=None, help="the first N prompts of the set only (a quick check)")
    args = ap.parse_args()
    lines = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    lines_in = prompt_set_path(args.prompt_set).read_text(encoding="utf-8").splitlines()[: args.prompts]
    with tempfile.TemporaryDirectory(prefix="hub-rows-") as tmp_name:
        tmp = Path(tmp_name)
        prompt_file = tmp / "prompts.jsonl"
        prompt_file.write_text("\n".join(lines_in) + "\n", encoding="utf-8")
        prompts = load_prompts(prompt_file)
        trace_proc, ids, rows = recorded_run(args.seed, prompts)
        folder = tmp / "v41-flash"
        folder.mkdir()
        sizes = write_folder(folder, ids, rows)
        with HubServer({REPO: Repo(folder)}) as hub:
            seconds, reads = report(hub.url, tmp, tmp / "report", prompt_file)
            sent_first = hub.bytes_sent(REPO)
            seconds_again, again = report(hub.url, tmp, tmp / "again", prompt_file)
            sent_again = hub.bytes_sent(REPO) - sent_first
        trace_hub = Trace.load(tmp / "report" / "trace")
        trace_disk = Pipeline(folder, streams="embedding").run(prompts)

    tensors = reads["tensors"]
    tables = [n for n in tensors if n.endswith(("engram.embed.weight", "engram.embed.scale"))]
    table_rows = sum(tensors[n]["rows_remote"] for n in tables if n.endswith("weight"))
    table_bytes = sum(tensors[n]["bytes_remote"] for n in tables)
    n_positions = int(trace_hub.lengths.sum())
    say(f"engram-viz report --checkpoint hf://{REPO} --prompts {args.prompt_set} set ({len(prompts)} prompts, ")
    say(f"{n_positions:,} positions), CPU {os.cpu_count()} cores shared (avx2 avx512_bf16), ")
    say("served by tests/hub_kit.HubServer on 127.0.0.1: V4.1-Flash Engram shapes, full-size sparse tables")
    say(
        f"  table rows read: {table_rows:,} (+ their scales) in {table_bytes / 1e6:.2f} MB by "
        f"{sum(tensors[n]['requests'] for n in tables):,} range requests"
    )
    say(f"  tables' size not downloaded: {sum(sizes[n] for n in tables) / 1e9:.1f} GB (weight + scale, 2 layers)")
    for name, c in tensors.items():
        say(
            f"    {name:34s} rows {c['rows_remote']:>9,}  {c['bytes_remote'] / 1e6:9.2f} MB  "
            f"{c['requests']:>6,} requests  (tensor {sizes[name] / 1e6:,.1f} MB)"
        )
    total = reads["total"]
    say(
        f"  every Engram tensor: {total['bytes_remote'] / 1e6:.1f} MB over {total['requests']:,} requests "
        f"(the loopback server sent {sent_first / 1e6:.1f} MB in all, config and headers included)"
    )
    say(
        f"  report time: {seconds:.0f} s (first), {seconds_again:.0f} s (second run, row cache: "
        f"{again['total']['rows_cached']:,} rows cached, {again['total']['rows_remote']} from the Hub, "
        f"{sent_again / 1e6:.2f} MB sent)"
    )
    say(f"  gates of the report from the Hub vs the folder opened from disk: {same_gates(trace_hub, trace_disk)}")
    say(f"  gates of the folder vs the procedural checkpoint it was written from: {same_gates(trace_disk, trace_proc)}")
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
