"""scripts/gpu-check.sh in its degraded CPU mode: every code path of the GPU check but CUDA and NCCL."""

from __future__ import annotations

import subprocess

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_gpu_check_runs_degraded_on_the_cpu():
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--cpu", "--threads", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "DEGRADED" in out and "backend gloo" in out
    assert "gpu check: PASS (DEGRADED: CPU)" in out
    # the generator's recorded log-probs and the trainer's agree in fp32 (bound 1e-3 in the script)
    line = next(l for l in out.splitlines() if l.startswith("log-prob agreement (fp32"))
    assert float(line.split("max ")[1].split(",")[0]) < 1e-5
