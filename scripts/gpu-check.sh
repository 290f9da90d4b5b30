#!/usr/bin/env bash
# The GPU check, for the day a GPU is lent (under 8 minutes on one GPU):
# a DeepSpeed trainer step on CUDA (bf16, NCCL, world size 1), the CPU engine's
# code path generating on CUDA with the fp32 LM head, log-prob agreement between
# them, tokens/s and step time; held-out evaluation as the generators sample it for
# the trainer (every completion from the point's version); a tiny mixture of experts
# through a DeepSpeed ZeRO-3 step, its experts pushed to the CPU engine, and the
# trainer's memory estimate against torch.cuda.max_memory_allocated
# (scripts/gpu_check.py says what each line means).
#
#   scripts/gpu-check.sh            # on a GPU machine; PYTHON=... to choose the interpreter
#   scripts/gpu-check.sh --cpu      # DEGRADED: the same code on the CPU (fp32, gloo)
#
# Needs a Python with a CUDA build of torch, deepspeed and transformers and this
# package installed (`pip install -e .` without constraints.txt, whose torch is the
# CPU build). No download: the model is built from a config. The vLLM side is
# checked with the CPU build (`make test-vllm`). Exit status 0 when every check passes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}"
start=$(date +%s)
status=0
timeout "${GPU_CHECK_TIMEOUT_S:-470}" "$PYTHON" scripts/gpu_check.py "$@" || status=$?
echo "gpu-check: exit status $status after $(( $(date +%s) - start )) s"
exit "$status"
