"""Data-parallel trainers: a batch split by whole groups over 2 DeepSpeed ranks (gloo) gives
the 1-trainer gradient, for every loss aggregation and advantage normalisation, also when one
rank's share is empty."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from scalectl.rl.transport.roles import free_port
from scalectl.rl.train.sharding import batch_std, batch_totals, split_groups

WORKER = str(ROOT / "tests" / "dp_worker.py")


def test_split_groups_gives_whole_groups_to_every_rank():
    assert split_groups(6, 2) == [range(0, 3), range(3, 6)]
    assert split_groups(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert split_groups(1, 2) == [range(0, 1), range(1, 1)]
    with pytest.raises(ValueError):
        split_groups(3, 0)


def test_one_rank_reduce_is_the_plain_batch_statistics():
    a = torch.tensor([1.0, -1.0, 0.5, 0.5, -0.25, 2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.float)
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    same = lambda x: x  # noqa: E731 - the sum over one rank
    # float64 two-pass std against torch's float32 one: equal to fp32 rounding
    assert batch_std(a, same).item() == pytest.approx(a.std(unbiased=False).item(), rel=1e-6)
    totals = batch_totals(mask, ids, same)
    assert (totals.completions, totals.groups, totals.tokens) == (6, 3, 9.0)


@pytest.mark.long
def test_two_trainers_give_the_one_trainer_gradient(tmp_path):
    """Each aggregation and normalisation; then a leader and a follower training, saving and
    loading like one trainer (the same processes, to start DeepSpeed once)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    one = tmp_path / "one"
    two = tmp_path / "two"
    port = free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "2", str(port), str(two)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    single = subprocess.run([sys.executable, WORKER, "0", "1", str(free_port()), str(one)], env=env,
                            capture_output=True, text=True, timeout=900)
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert single.returncode == 0, single.stdout + single.stderr
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    r1, r2, follower = (torch.load(tmp_path / name) for name in ("one.0.pt", "two.0.pt", "two.1.pt"))
    g1, g2 = r1["grads"], r2["grads"]
    assert set(g1) == set(g2) and len(g1) == 13
    for key in g1:
        # fp32 forward/backward: the two runs sum the same terms in another order (split rows,
        # other padding widths, a float64 batch std), an error of a few fp32 ulps (6e-8 relative) of
        # the largest entries (|g| < 0.1 here), and the recovery from an update of a parameter of
        # size ~0.1 adds one ulp of it (7.5e-9): both far below 1e-6
        assert g1[key].abs().max() > 1e-3, key          # a real gradient, not zeros
        diff = (g1[key] - g2[key]).abs().max().item()
        assert diff < 1e-6, f"{key}: max |g1 - g2| = {diff:.3g}"
    for key, m1 in r1["metrics"].items():
        m2 = r2["metrics"][key]
        # the step's metrics are the whole batch's on every rank: sums and token-weighted means of
        # fp32 values combined in float64 (a few fp32 ulps apart); lr and the rows passed are exact
        for name in ("loss", "clip_fraction", "logprob_mismatch", "entropy", "max_ratio", "grad_norm"):
            assert m2[name] == pytest.approx(m1[name], rel=1e-5, abs=1e-7), (key, name, m1[name], m2[name])
        assert (m2["lr"], m2["rows"]) == (m1["lr"], m1["rows"]), key
    one, lead, follow = r1["ranks"], r2["ranks"], follower["ranks"]
    assert (one["size"], lead["size"], follow["steps"]) == (1, 2, 3)
    # three steps of updates close to the gradient (lr = eps = 1): the 1e-6 of one step's gradient,
    # three times, plus the rounding of parameters of size ~0.1 (7.5e-9 each)
    for key in ("after_two", "after_three", "loaded"):
        assert (one[key] - lead[key]).abs().max().item() < 3e-6, key
    assert (lead["after_three"] - lead["after_two"]).abs().max() > 1e-3      # the third step moved them
    assert torch.equal(lead["loaded"], lead["after_two"])                    # load restored the checkpoint
    assert torch.equal(follow["loaded"], lead["loaded"])                     # replicas stay identical
    for m1, m2 in zip(one["metrics"], lead["metrics"]):
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
        assert m2["grad_norm"] > 0.05                                        # clipping was active
        assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)



@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_ranks_with_different_micro_batch_counts_give_the_one_trainer_gradient(tmp_path, stage):
    """ZeRO-2 reduces and ZeRO-3 gathers and reduces at every micro-batch, so two ranks must
    run as many micro-batches as each other: here one rank's share loses its all-wrong group
    (no gradient, out of the pass) and keeps 8 completions (4 micro-batches of 2), the other
    keeps 12 (6).  The gradient equals one trainer's on the whole batch (tolerance as above)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "2", str(port), two, str(stage)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    single = subprocess.run([sys.executable, WORKER, "0", "1", str(free_port()), one, str(stage)], env=env,
                            capture_output=True, text=True, timeout=900)
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert single.returncode == 0, single.stdout + single.stderr
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    r1, r2 = torch.load(one + ".0.pt"), torch.load(two + ".0.pt")
    assert set(r1["grads"]) == set(r2["grads"]) and len(r1["grads"]) == 3
    for key, g1 in r1["grads"].items():
        assert g1.abs().max() > 1e-3, key
        diff = (g1 - r2["grads"][key]).abs().max().item()
        assert diff < 1e-6, f"{key}: max |g1 - g2| = {diff:.3g}"
        assert r2["metrics"][key]["rows"] == r1["metrics"][key]["rows"], key
    assert r1["metrics"]["cispo/prompt/prompt"]["rows"] == 20      # 24 completions, the all-wrong 4 out
