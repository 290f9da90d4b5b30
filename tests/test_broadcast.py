"""The bucketed weight broadcast: buckets by dtype and size, and 3 gloo processes ending with
the trainer's weights, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from conftest import ROOT
from scalectl.launch.roles import free_port
from scalectl.rl.broadcast import buckets_of
from scalectl.weight_sync import BUCKET_BYTES, weight_sync_plan

WORKER = str(ROOT / "tests" / "broadcast_worker.py")


def test_buckets_split_by_dtype_and_size():
    f32 = [torch.zeros(10), torch.zeros(10), torch.zeros(30)]        # 40, 40, 120 bytes
    bf16 = [torch.zeros(10, dtype=torch.bfloat16)] * 2               # 20 bytes each
    assert buckets_of(f32 + bf16 + [torch.zeros(5)], bucket_bytes=80) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert buckets_of([], 80) == []


def test_generators_receive_the_trainers_weights(tmp_path):
    out = str(tmp_path / "w")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "3", str(port), out], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = [torch.load(f"{out}.{r}.pt") for r in range(3)]
    trainer = got[0]["state"]
    n_bytes = sum(t.numel() * t.element_size() for t in trainer.values())
    assert n_bytes == 4 * 1_118_080                                  # the tiny model in fp32
    for r in (1, 2):
        assert got[r]["state"].keys() == trainer.keys()
        for name, t in trainer.items():
            assert torch.equal(got[r]["state"][name], t), (r, name)  # bit for bit: a copy, no arithmetic
        assert got[r]["stats"] == got[0]["stats"]
    # the count every rank reported is the plan's: tensors over 64 KiB (the 128 x 512 MLP
    # matrices, 262,144 bytes) travel alone, the small ones share buckets
    sizes = [t.numel() * t.element_size() for t in trainer.values()]
    plan = weight_sync_plan(0, "fp32", 2, bucket_bytes=65536, sizes=sizes)
    assert got[0]["stats"] == [(n_bytes, plan.buckets)] * 2
    assert plan.buckets == len(buckets_of(list(trainer.values()), 65536)) > 1
    assert BUCKET_BYTES == 256 * 2**20


def test_generators_load_each_version_between_decoding_steps(tmp_path):
    worker = str(ROOT / "tests" / "receiver_worker.py")
    out = str(tmp_path / "r")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, worker, str(r), "3", str(port), out], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = [torch.load(f"{out}.{r}.pt") for r in range(3)]
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
