"""The bucketed weight broadcast: buckets by dtype and size; 3 gloo processes ending with the
trainer's weights bit for bit, by a plain broadcast and by in-flight updates between decoding steps."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from conftest import ROOT
from scalectl.rl.roles import free_port
from scalectl.rl.broadcast import buckets_of
from scalectl.weight_sync import weight_sync_plan

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
