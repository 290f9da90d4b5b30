"""scripts/gpu-check.sh in its degraded CPU mode: every code path of the GPU check but CUDA and NCCL."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_gpu_check_runs_degraded_on_the_cpu():
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--cpu", "--threads", "1"], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "DEGRADED" in out and "backend gloo" in out
    assert "gpu check: PASS (DEGRADED: CPU)" in out
    # the generator's recorded log-probs and the trainer's agree in fp32 (bound 1e-3 in the script)
    line = next(l for l in out.splitlines() if l.startswith("log-prob agreement (fp32"))
    assert float(line.split("max ")[1].split(",")[0]) < 1e-5
    # evaluation for the trainer as the generators sample it: every completion of the point from
    # the one version it names, the point equal to evaluate() on the same engine
    line = next(l for l in out.splitlines() if l.startswith("evaluation for the trainer"))
    assert "64 completions all of version 2" in line and line.endswith("equal to evaluate() on the same engine: True")
    # the tiny MoE through a ZeRO-3 step: 2 layers x 4 experts x 3 projections pushed in checkpoint names,
    # then sampled by the CPU engine with the pushed version only
    line = next(l for l in out.splitlines() if l.startswith("MoE trainer (ZeRO-3"))
    assert "4 experts" in line and "(24 per-expert checkpoint tensors)" in line
    assert float(line.split("largest change ")[1]) > 0
    assert "versions [1]" in next(l for l in out.splitlines() if l.startswith("MoE generation after the push"))
    assert "not measured on the CPU" in next(l for l in out.splitlines() if l.startswith("MoE trainer memory"))
