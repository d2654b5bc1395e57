"""Where a V4.1-width Engram forward spends its op time on the CPU, from torch's profiler.

``Pipeline`` on the procedural ``v41-flash`` checkpoint (synthetic weights of the real shapes;
embedding streams, fp8 wkv, the reference path), one prompt of about 80 tokens, run once to warm
up and once profiled: the GEMM share (``aten::mm`` and friends) against everything else (hash,
gathers, norms, gates), and the run's process CPU time. Nothing on the run's path derives a
constant any more (``tests/integration/test_pipeline_constants.py`` counts the calls)::

    taskset -c 1 .venv/bin/python benchmarks/forward_profile.py
"""

from __future__ import annotations

import time

from torch.profiler import ProfilerActivity, profile

import engram_viz as ev

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::_scaled_mm")


def main() -> None:
    pipe = ev.Pipeline(ev.synthetic_checkpoint("v41-flash", 0), streams="embedding", device="cpu")
    text = " ".join(["The Great Wall of China is visible from afar."] * 8)
    pipe.run([text])  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.process_time()
        trace = pipe.run([text])
        run_s = time.process_time() - t0
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS)
    print(f"{pipe}\n{int(trace.lengths[0])} tokens; run: {run_s:.3f} s process CPU")
    print(
        f"op self time {total / 1e6:.3f} s: GEMM {100 * gemm / total:.1f}%, everything else {100 * (1 - gemm / total):.1f}%"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
