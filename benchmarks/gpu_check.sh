#!/usr/bin/env bash
# GPU check (issues 3 and 14), one command from the repository root of a bare machine:
#
#   bash benchmarks/gpu_check.sh            # with a CUDA device: under 8 minutes on an H200 machine
#   bash benchmarks/gpu_check.sh --dry-run  # no CUDA: the CPU parts at tiny widths, then at full widths
#                                           # with the CPU as the device (512 tokens); exit 0 when they pass
#   bash benchmarks/gpu_check.sh --blocks-only  # section 4 alone (under 3 minutes on an H200), written to
#                                           # benchmarks/results/gpu_blocks.txt (dry run: gpu_blocks_dry_run.txt)
#
# 1. the CUDA tests (tests that skip without CUDA: CPU vs CUDA agreement, the bf16 GEMM on CUDA,
#    pinned host-to-device rows);
# 2. benchmarks/gpu_check.py: CPU and CUDA hooks on the same 4,096-token prefill at V4.1-Flash
#    widths against the stated tolerances, then the prefill timed per wkv GEMM path (bf16, float32)
#    beside the H200 roofline (memory and FLOP bounds);
# 4. benchmarks/blocks_gpu.py: blocks 0-13 (the streams entering Engram layer 14): device vs CPU at small
#    widths, then 14 blocks x 4,096 tokens at V4.1-Flash widths timed per block beside the roofline.
# Everything printed goes to benchmarks/results/gpu.txt (a dry run: gpu_dry_run.txt). Exit status:
# 0 all passed (or a dry run without CUDA), 1 a check failed, 3 no usable python.
#
# Python: $PYTHON if set, else the repo's .venv, else python3 - the first that imports torch,
# numpy, safetensors and tokenizers and (unless --dry-run) sees CUDA. The GPU image's python3
# already holds those (and pytest, hypothesis, pandas, matplotlib); nothing is downloaded.
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
blocks_only=0
for arg in "$@"; do
  [ "$arg" = "--dry-run" ] && dry=1
  [ "$arg" = "--blocks-only" ] && blocks_only=1
done
probe='import torch, numpy, safetensors, tokenizers, sys; sys.exit(0 if (torch.cuda.is_available() or int(sys.argv[1])) else 3)'
PY=""
for want_dry in "$dry" 1; do
  for cand in "${PYTHON:-}" .venv/bin/python python3; do
    if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$probe" "$want_dry" 2>/dev/null; then
      PY="$cand"
      break 2
    fi
  done
  [ "$dry" = 1 ] && break
done
if [ -z "$PY" ]; then
  echo "gpu_check: no python with torch, numpy, safetensors and tokenizers found" >&2
  exit 3
fi
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  dry=1
fi
args=()
for arg in "$@"; do [ "$arg" != "--blocks-only" ] && args+=("$arg"); done
if [ "$dry" = 1 ]; then
  case " $* " in *" --dry-run "*) ;; *) args+=(--dry-run) ;; esac
fi

mkdir -p benchmarks/results
out=benchmarks/results/gpu.txt
[ "$dry" = 1 ] && out=benchmarks/results/gpu_dry_run.txt
[ "$blocks_only" = 1 ] && out=benchmarks/results/gpu_blocks.txt
[ "$blocks_only" = 1 ] && [ "$dry" = 1 ] && out=benchmarks/results/gpu_blocks_dry_run.txt
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the synthetic v41 wkv weights are cached here after the first run (2 x 157 MB)
export ENGRAM_VIZ_CACHE="${ENGRAM_VIZ_CACHE:-${TMPDIR:-/tmp}/engram-viz-cache}"

{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$([ -n "$(git status --porcelain 2>/dev/null | head -1)" ] && echo ' (+ local changes)')"
  echo "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  [ "$dry" = 1 ] && echo "DRY RUN: no CUDA device visible to torch; the CUDA tests skip and the check runs at tiny widths on the CPU"
  tests=0
  check=0
  wide=0
  if [ "$blocks_only" = 0 ]; then
  echo
  echo "== 1. CUDA tests =="
  timeout 180 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -rs \
    tests/unit/test_wkv.py tests/unit/test_engram.py -k "cuda or CUDA"
  tests=$?
  echo
  echo "== 2. CPU vs CUDA hooks and the prefill against the roofline =="
  timeout 300 "$PY" benchmarks/gpu_check.py "${args[@]}"
  check=$?
  wide=0
  if [ "$dry" = 1 ]; then
    echo
    echo "== 3. (dry run) step 2 at V4.1-Flash widths, 512 tokens, the CPU standing in for the device =="
    timeout 300 "$PY" benchmarks/gpu_check.py --device cpu --tokens 512 --repeats 1
    wide=$?
  fi
  fi
  echo
  echo "== 4. blocks 0-13 (the streams entering Engram layer 14) on the device, beside the roofline =="
  # under 3 minutes on an H200; a dry run on a busy 2-core CPU takes several
  timeout "$([ "$dry" = 1 ] && echo 900 || echo 170)" "$PY" benchmarks/blocks_gpu.py $([ "$dry" = 1 ] && echo --dry-run)
  blocks=$?
  echo
  echo "tests exit ${tests}, check exit ${check}$([ "$dry" = 1 ] && echo ", full-width CPU check exit ${wide}"), blocks exit ${blocks}"
  # pytest exits 5 when every selected test was deselected; a dry run skips them all (exit 0)
  [ "$tests" = 0 ] && [ "$check" = 0 ] && [ "$wide" = 0 ] && [ "$blocks" = 0 ] && exit 0
  exit 1
} 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
echo "gpu_check: wrote $out (exit $status)"
exit "$status"
