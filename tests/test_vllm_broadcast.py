"""vLLM generators (CPU build) receiving the trainer's weights by broadcast: each loads the
update between two decoding steps, and its log-probs then match the trainer's recomputation
on the same weights. Runs where vllm imports (``make test-vllm``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from scalectl.rl.transport.roles import free_port

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (make test-vllm)")


def test_two_vllm_generators_receive_broadcast_weights(tmp_path):
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    ckpt = tmp_path / "policy"
    save_policy(build_tiny_model(seed=0), build_tokenizer(), ckpt)
    out, port = str(tmp_path / "w"), free_port()
    worker = str(ROOT / "tests" / "vllm_weights_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, str(r), "3", str(port), str(ckpt), out], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    logs = [p.communicate(timeout=1200)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    got = [torch.load(f"{out}.{r}.pt") for r in range(3)]
    for r in (1, 2):
        assert all(torch.equal(got[r]["state"][k], v) for k, v in got[0]["state"].items())
        assert all(v == sorted(v) and set(v) <= {0, 1} for v in got[r]["versions"])
        assert all(v == [1] * len(v) for v in got[r]["after_versions"])
        print(f"\ngenerator {r}: max |vLLM log-prob - trainer log-prob| after the update "
              f"{got[r]['max_diff']:.2e} over {got[r]['tokens']} tokens")
        # fp32 weights and head on both sides: the same sums in another order (vLLM's kernels,
        # KV cache), a few fp32 ulps of log-probs of size ~5 -> 1e-5
        assert got[r]["max_diff"] < 1e-5


@pytest.mark.parametrize("tp, kind", [(2, "tiny"), (1, "moe")], ids=["tp2-dense", "tp1-moe"])
def test_a_generator_receives_the_broadcast_in_its_workers(tmp_path, tp, kind):
    """A vLLM engine whose workers take their seats in the weights' group: at tensor-parallel size 2
    (two worker processes, the CPU build with one core each, ``VLLM_CPU_OMP_THREADS_BIND="0|1"``)
    on the tiny dense model, and at size 1 on the tiny mixture of experts (4 experts, 2 per token,
    whose fused expert tensors travel as the trainer holds them and are loaded per expert).  Each
    worker receives the trainer's push itself (the whole broadcast, loading its shard in place),
    the generator samples with the new version, and its log-probs then match a teacher-forced pass
    of the pushed weights to the bound of the in-process generators (1e-5; fp32 weights and head,
    sums in another order) while they miss the checkpoint's by far."""
    from scalectl.rl.policy.model import build_tiny_model, build_tiny_moe, build_tokenizer, save_policy

    ckpt = tmp_path / "policy"
    save_policy(build_tiny_moe(seed=0) if kind == "moe" else build_tiny_model(seed=0), build_tokenizer(), ckpt)
    out, port = str(tmp_path / "w"), free_port()
    worker = str(ROOT / "tests" / "vllm_tp_worker.py")
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "0")
    procs = [subprocess.Popen([sys.executable, worker, role, str(port), str(ckpt), out, str(tp), kind], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for role in ("trainer", "generator")]
    logs = [p.communicate(timeout=1500)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    gen, trainer = torch.load(f"{out}.generator.pt"), torch.load(f"{out}.trainer.pt")
    assert gen["tp"] == tp
    ranks, pids = zip(*gen["ranks"])
    assert list(ranks) == list(range(tp)) and len(set(pids)) == tp       # one seat per worker process
    assert gen["loads"] == 1 and gen["ended"]
    nbytes = sum(t.numel() * t.element_size() for t in trainer["state"].values())
    assert trainer["bytes"] == 8 + gen["bytes"] == 8 + nbytes           # the header, then every weight
    assert all(v == [1] * len(v) for v in gen["after_versions"])
    print(f"\n{kind} at tensor-parallel size {tp}: engine init {gen['init_s']:.0f} s; max |vLLM log-prob - trainer "
          f"log-prob| after the update {gen['max_diff']:.2e} over {gen['tokens']} tokens (against the checkpoint's "
          f"weights {gen['max_diff_original']:.2e})")
    assert gen["max_diff"] < 1e-5
    assert gen["max_diff_original"] > 1e-3
