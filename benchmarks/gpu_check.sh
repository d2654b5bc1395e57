#!/usr/bin/env bash
# GPU check (issue 3): the Engram forward at v41-flash dimensions on CUDA and on the CPU with the
# same inputs (4096 tokens, procedural synthetic table); asserts the gates agree within the stated
# tolerance and prints prefill tokens/s beside the bandwidth/FLOP bound. Under 5 minutes on a
# 16-core H200 machine. Extra arguments go to benchmarks/gpu_check.py (e.g. --mode bf16, --tokens N,
# --json-out FILE; --device cpu for a smoke run without a GPU).
#
# Python: $PYTHON if set, else the repo's .venv, else python3 - the first whose torch sees CUDA
# (the GPU image's python3 already holds torch, numpy, safetensors and tokenizers). Only if none
# does, a venv .venv-gpu is created with a CUDA build of torch (needs network).
set -euo pipefail
cd "$(dirname "$0")/.."

want_cuda=1
for arg in "$@"; do [ "$arg" = "cpu" ] && want_cuda=0; done

probe='import torch, numpy, safetensors, tokenizers; import sys; sys.exit(0 if (torch.cuda.is_available() or not int(sys.argv[1])) else 3)'
PY=""
for cand in "${PYTHON:-}" .venv/bin/python .venv-gpu/bin/python python3; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$probe" "$want_cuda" 2>/dev/null; then
    PY="$cand"
    break
  fi
done
if [ -z "$PY" ]; then
  echo "gpu_check: no python with a CUDA torch found; creating .venv-gpu (needs network)" >&2
  python3 -m venv .venv-gpu
  .venv-gpu/bin/python -m pip install -q torch numpy safetensors tokenizers
  PY=.venv-gpu/bin/python
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the synthetic v41 wkv weights are cached here after the first run (2 x 157 MB)
export ENGRAM_VIZ_CACHE="${ENGRAM_VIZ_CACHE:-${TMPDIR:-/tmp}/engram-viz-cache}"
echo "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec timeout 290 "$PY" benchmarks/gpu_check.py "$@"
