"""Scored groups -> training batch; pass@k; compute accounting."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from scalectl.rl.accounting import ComputeMeter
from scalectl.rl.train.batch import build_train_batch, keep_groups
from scalectl.rl.evaluation.pass_rate import pass_at_k
from scalectl.rl.rollout.groups import Group, rollout_stats


@dataclass
class C:  # the fields of a rollout Completion that batches read
    prompt_ids: list
    token_ids: list
    logprobs: list
    finish_reason: str = "stop"
    loss_mask: list | None = None
    text: str = ""


def group(pid, rewards, prompt, comps):
    return Group(pid, comps, [r > 0 for r in rewards], torch.tensor(rewards, dtype=torch.float))


def test_layout_masks_and_advantages():
    g0 = group(0, [1.0, -1.0], None, [C([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3]),
                                       C([5, 6], [7], [-0.4], finish_reason="length")])
    g1 = group(1, [1.0, 1.0], None, [C([4], [3, 2], [-0.5, -0.6]), C([4], [3], [-0.7])])
    g2 = group(2, [-1.0, 1.0], None, [C([1, 2, 3], [9, 9], [-1.0, -2.0], loss_mask=[1, 0]),
                                      C([1, 2, 3], [8], [-3.0])])
    kept = keep_groups([g0, g1, g2], zero_variance=True)
    assert [g.prompt_id for g in kept] == [0, 2]           # g1 is all-correct: dropped, not replaced
    assert len(keep_groups([g0, g1, g2], zero_variance=False)) == 3
    b = build_train_batch(kept, "none", pad_id=0)
    # P = 3 prompt columns (left padded), T = 3 completion columns (right padded)
    assert b.start == 2
    assert b.input_ids.tolist() == [[0, 5, 6, 7, 8, 9], [0, 5, 6, 7, 0, 0], [1, 2, 3, 9, 9, 0], [1, 2, 3, 8, 0, 0]]
    assert b.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]
    assert b.loss_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]]   # forced token masked out
    assert b.gen_logp[2].tolist() == pytest.approx([-1.0, -2.0, 0.0])
    assert b.group_ids.tolist() == [0, 0, 1, 1]
    assert b.advantages.tolist() == [1.0, -1.0, -1.0, 1.0]  # r - group mean, no division
    assert b.n_tokens == 6


def test_rollout_stats():
    g0 = group(0, [1.0, -1.0], None, [C([1], [1, 2, 3, 4], [0] * 4), C([1], [1, 2], [0] * 2, finish_reason="length")])
    g1 = group(1, [1.0, 1.0], None, [C([1], [1, 2], [0] * 2), C([1], [1, 2], [0] * 2)])
    s = rollout_stats([g0, g1])
    assert s["reward"] == 0.5 and s["truncation_rate"] == 0.25 and s["mean_length"] == 2.5
    assert s["zero_variance_share"] == 0.5 and s["pass_rate"] == 0.75


def test_pass_at_k_by_hand():
    # 4 samples; prompt A 1 correct, prompt B 4 correct, prompt C 0 correct
    # pass@1 = mean(1/4, 1, 0) ; pass@2 for A = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k([1, 4, 0], 4, 1) == pytest.approx((0.25 + 1 + 0) / 3)
    assert pass_at_k([1, 4, 0], 4, 2) == pytest.approx((0.5 + 1 + 0) / 3)
    with pytest.raises(ValueError):
        pass_at_k([1], 4, 5)


def test_compute_meter():
    m = ComputeMeter(devices=2, n_params=1000)
    m.add_generation(prompt_tokens=10, generated_tokens=30, completions=4)
    m.add_training(40)
    m.seconds = 1800
    assert m.flops == 2 * 1000 * 40 + 6 * 1000 * 40
    assert (m.tokens, m.samples) == (30, 4)
    assert m.gpu_hours == 1.0                                # 2 devices x 0.5 h
    assert ComputeMeter.from_dict(m.to_dict()) == m
