"""The bucketed weight broadcast: buckets by dtype and size; 3 gloo processes ending with the
trainer's weights bit for bit, by a plain broadcast and by in-flight updates between decoding steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from scalectl.rl.transport.roles import free_port
from scalectl.rl.transport.broadcast import buckets_of
from scalectl.rl.transport.weight_sync import weight_sync_plan

WORKER = str(ROOT / "tests" / "broadcast_worker.py")


def test_buckets_split_by_dtype_and_size():
    f32 = [torch.zeros(10), torch.zeros(10), torch.zeros(30)]        # 40, 40, 120 bytes
    bf16 = [torch.zeros(10, dtype=torch.bfloat16)] * 2               # 20 bytes each
    assert buckets_of(f32 + bf16 + [torch.zeros(5)], bucket_bytes=80) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert buckets_of([], 80) == []


def test_generators_load_each_version_between_decoding_steps(tmp_path):
    worker = str(ROOT / "tests" / "receiver_worker.py")
    out = str(tmp_path / "r")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, worker, str(r), "3", str(port), out], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = [torch.load(f"{out}.{r}.pt") for r in range(3)]
    # the plain broadcast: the generators end with the trainer's weights, bit for bit (a copy, no
    # arithmetic), in the buckets the plan counts (tensors over 64 KiB, e.g. the 128 x 512 MLP
    # matrices of 262,144 bytes, travel alone; the small ones share buckets)
    first = got[0]["first"]
    sizes = [t.numel() * t.element_size() for t in first.values()]
    assert sum(sizes) == 4 * 1_118_080                                # the tiny model in fp32
    plan = weight_sync_plan(0, "fp32", 2, bucket_bytes=65536, sizes=sizes)
    assert plan.buckets == len(buckets_of(list(first.values()), 65536)) > 1
    for r in (1, 2):
        assert all(torch.equal(got[r]["first"][name], t) for name, t in first.items()), r
        assert got[r]["first_stats"] == got[0]["first_stats"] == (sum(sizes), plan.buckets)
    # then three versions in flight
    for r in (1, 2):
        for name, t in got[0]["state"].items():
            assert torch.equal(got[r]["state"][name], t), (r, name)   # the third version, bit for bit
        # each completion's tokens carry non-decreasing versions (an update lands between two
        # decoding steps), and the generator saw its first weights, then the trainer's
        per_completion = got[r]["versions"]
        assert all(v == sorted(v) for v in per_completion)
        seen = {x for v in per_completion for x in v}
        assert 0 in seen and seen <= {0, 1, 2, 3}
        assert got[r]["stats"][0] == 4 * 1_118_080


@pytest.mark.slow   # 10-25 s: make test-slow (the default suite keeps under 10 minutes)
def test_a_zero3_leader_pushes_the_gathered_weights_a_zero0_leader_would(tmp_path):
    """Two trainer ranks take one step at ZeRO 0, then at ZeRO 3, and the leader pushes to a
    generator each time: under ZeRO-3 the leader holds a partition of each parameter (half of its
    elements, padded), yet pushes and the generator loads the full weights, equal to ZeRO 0's
    within fp32 rounding (the same step, reduced in another order), and bit for bit what it read."""
    worker = str(ROOT / "tests" / "zero3_push_worker.py")
    out = str(tmp_path / "z")
    port, weights_port = free_port(), free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, worker, str(r), str(port), str(weights_port), out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    pushed, got = torch.load(f"{out}.0.pt"), torch.load(f"{out}.2.pt")
    assert got["ended"] and got["loads"] == 2 and sorted(got["versions"]) == [1, 2]
    from scalectl.rl.policy.model import build_tiny_model

    init = build_tiny_model(seed=0).state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in init.values())
    assert nbytes == 4 * 1_118_080
    # ZeRO 0: whole parameters on the leader; ZeRO 3: outside the gathering a parameter's data is
    # empty (its partition lives in ds_tensor)
    params = dict(build_tiny_model(seed=0).named_parameters())
    assert pushed["1/partition"] == {k: (p.numel(), False) for k, p in params.items()}
    assert pushed["2/partition"] == {k: (0, True) for k in params}
    for v in (1, 2):
        assert pushed[f"{v}/stats"][0] == 8 + nbytes                       # the header, then every weight
        for name, t in pushed[v].items():
            assert torch.equal(got["versions"][v][name], t), (v, name)       # loaded as sent, bit for bit
    moved = 0
    for name, t in init.items():
        z0, z3 = got["versions"][1][name], got["versions"][2][name]
        assert z3.shape == t.shape
        torch.testing.assert_close(z3, z0, rtol=1e-5, atol=1e-6)
        moved += not torch.equal(z0, t)
    assert moved > len(init) // 2                                           # the step changed the weights
