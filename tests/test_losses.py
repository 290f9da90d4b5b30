"""Policy losses and aggregation on small tensors, with values and gradients worked out by hand."""

import math

import pytest
import torch

from scalectl.rl.train.losses import POLICY_LOSSES, aggregation_weights, cispo, get_policy_loss, gspo, ppo_clip

D = torch.float64

# Shared case: 2 completions x 3 tokens, generator probabilities all 0.5, trained-policy probabilities
#   row 0: 0.75, 0.55, 0.25  -> rho = 1.5, 1.1, 0.5   advantage +1
#   row 1: 0.75, 0.45, 0.25  -> rho = 1.5, 0.9, 0.5   advantage -2
P_TRAIN = [[0.75, 0.55, 0.25], [0.75, 0.45, 0.25]]
ADV = torch.tensor([1.0, -2.0], dtype=D)
MASK = torch.ones(2, 3, dtype=D)
W_TOKEN = torch.full((2, 3), 1 / 6, dtype=D)  # token aggregation: 1 / 6 tokens


def case():
    logp = torch.tensor(P_TRAIN, dtype=D).log().requires_grad_()
    gen_logp = torch.full((2, 3), math.log(0.5), dtype=D)
    return logp, gen_logp


# -- aggregation -------------------------------------------------------------------------------


def test_aggregation_weights_each_mode():
    # lengths 3, 1, 2 (6 tokens); groups {row 0, row 1} with 4 tokens and {row 2} with 2 tokens
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=D)
    groups = torch.tensor([5, 5, 2])
    third, sixth, ninth, eighth, quarter = 1 / 3, 1 / 6, 1 / 9, 1 / 8, 1 / 4
    expected = {
        # 1 / (N * len_i) = 1/(3*3), 1/(3*1), 1/(3*2)
        "sample": [[ninth, ninth, ninth, 0], [third, 0, 0, 0], [sixth, sixth, 0, 0]],
        # 1 / (n_groups * tokens_g) = 1/(2*4), 1/(2*2)
        "prompt": [[eighth, eighth, eighth, 0], [eighth, 0, 0, 0], [quarter, quarter, 0, 0]],
        # 1 / 6 tokens
        "token": [[sixth, sixth, sixth, 0], [sixth, 0, 0, 0], [sixth, sixth, 0, 0]],
    }
    for mode, want in expected.items():
        w = aggregation_weights(mask, groups, mode)
        torch.testing.assert_close(w, torch.tensor(want, dtype=D), msg=mode)
        assert float(w.sum()) == pytest.approx(1.0)


def test_aggregation_rejects_unknown_mode():
    with pytest.raises(ValueError, match="loss.aggregation = 'seq' is not one of sample, prompt, token"):
        aggregation_weights(MASK, torch.tensor([0, 0]), "seq")


# -- ppo_clip ------------------------------------------------------------------------------------


def test_ppo_clip_value_metrics_and_gradient():
    logp, gen_logp = case()
    loss, m = ppo_clip(logp, gen_logp, ADV, MASK, W_TOKEN, clip_low=0.2, clip_high=0.28)
    # clip range [0.8, 1.28]
    # row 0 (A=+1): min(1.5, 1.28)=1.28 [clipped]   min(1.1, 1.1)=1.1   min(0.5, 0.8)=0.5
    # row 1 (A=-2): min(-3, -2.56)=-3               min(-1.8,-1.8)=-1.8 min(-1.0, -1.6)=-1.6 [clipped]
    # sum = 1.28 + 1.1 + 0.5 - 3 - 1.8 - 1.6 = -3.52; loss = -(-3.52) / 6
    assert float(loss.detach()) == pytest.approx(0.5866666667, abs=1e-9)
    assert m["clip_fraction"] == pytest.approx(2 / 6)
    assert m["ratio_mean"] == pytest.approx((1.5 + 1.1 + 0.5 + 1.5 + 0.9 + 0.5) / 6)
    assert m["ratio_max"] == pytest.approx(1.5)
    # |log rho|: ln 1.5 = 0.4054651, ln 1.1 = 0.0953102, ln 2 = 0.6931472, |ln 0.9| = 0.1053605
    assert m["logprob_mismatch"] == pytest.approx((2 * 0.4054651 + 0.0953102 + 2 * 0.6931472 + 0.1053605) / 6, abs=1e-7)
    assert m["tokens"] == 6.0
    loss.backward()
    # d loss / d logp = -w * rho * A where the unclipped term is taken, 0 where the clip is active
    expected = [[0.0, -1.1 / 6, -0.5 / 6], [1.5 * 2 / 6, 0.9 * 2 / 6, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=D))


def test_ppo_clip_gradient_zero_only_on_the_side_the_advantage_pushes():
    # rho = 1.5 (above 1 + 0.28) and 0.5 (below 1 - 0.2), each with A = +1 and A = -1
    logp = torch.tensor([[0.75, 0.25], [0.75, 0.25]], dtype=D).log().requires_grad_()
    gen_logp = torch.full((2, 2), math.log(0.5), dtype=D)
    loss, m = ppo_clip(logp, gen_logp, torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 2, dtype=D),
                       torch.full((2, 2), 0.25, dtype=D), clip_low=0.2, clip_high=0.28)
    loss.backward()
    g = logp.grad
    assert g[0, 0] == 0.0  # rho > 1 + clip_high, A > 0: clipped
    assert g[1, 1] == 0.0  # rho < 1 - clip_low, A < 0: clipped
    assert float(g[0, 1]) == pytest.approx(-0.25 * 0.5)  # rho < 1 - clip_low, A > 0: -w rho A
    assert float(g[1, 0]) == pytest.approx(0.25 * 1.5)  # rho > 1 + clip_high, A < 0: -w rho A
    assert m["clip_fraction"] == 0.5


# -- gspo ----------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_value_and_gradient():
    # row 0: log rho = 0.001, 0.002, 0.003 -> mean 0.002, s0 = exp(0.002) = 1.0020020, inside [0.997, 1.005]
    # row 1: log rho = 0.004, 0.010, (pad) -> mean 0.007, s1 = exp(0.007) = 1.0070246 > 1.005: clipped for A > 0
    gen_logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, float("-inf")]], dtype=D)
    logp = (gen_logp + torch.tensor([[0.001, 0.002, 0.003], [0.004, 0.010, 0.0]], dtype=D)).detach()
    logp[1, 2] = -50.0  # garbage on the padding slot must not matter
    logp.requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    adv = torch.tensor([1.0, 2.0], dtype=D)
    w = torch.tensor([[1 / 6, 1 / 6, 1 / 6], [1 / 4, 1 / 4, 0]], dtype=D)  # sample aggregation, N = 2
    loss, m = gspo(logp, gen_logp, adv, mask, w, clip_low=3e-3, clip_high=5e-3)
    # objective = 3 * (1/6) * 1.0020020 * 1 + 2 * (1/4) * min(1.0070246 * 2, 1.005 * 2) = 0.5010010 + 1.005
    assert float(loss.detach()) == pytest.approx(-1.5060010, abs=1e-7)
    assert m["clip_fraction"] == pytest.approx(2 / 5)  # row 1's two tokens of 5
    assert m["ratio_mean"] == pytest.approx((3 * 1.0020020 + 2 * 1.0070246) / 5, abs=1e-7)
    assert m["ratio_max"] == pytest.approx(1.0070246, abs=1e-7)
    assert m["logprob_mismatch"] == pytest.approx((0.001 + 0.002 + 0.003 + 0.004 + 0.010) / 5)
    loss.backward()
    # row 0: -(sum_t w) * A * s0 / |y0| = -(1/2) * 1.0020020 / 3 on each token; row 1 clipped: 0
    expected = [[-0.1670003] * 3, [0.0, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=D), atol=1e-7, rtol=0)


# -- cispo ---------------------------------------------------------------------------------------


def test_cispo_value_metrics_and_gradient():
    logp, gen_logp = case()
    # eps_max = 1.2; clip_low is ignored (a value that would clip everything in PPO)
    loss, m = cispo(logp, gen_logp, ADV, MASK, W_TOKEN, clip_low=0.99, clip_high=1.2)
    # sg weights: row 0: 1.2, 1.1, 0.5   row 1: 1.2, 0.9, 0.5
    # ln 0.75 = -0.2876821, ln 0.55 = -0.5978370, ln 0.45 = -0.7985077, ln 0.25 = -1.3862944
    # row 0 (A=+1): -0.3452185 -0.6576207 -0.6931472   row 1 (A=-2): 0.6904370 1.4373139 1.3862944
    # sum = 1.8180589; loss = -1.8180589 / 6
    assert float(loss.detach()) == pytest.approx(-0.3030098, abs=1e-7)
    assert m["clip_fraction"] == pytest.approx(2 / 6)  # the two rho = 1.5 > 1.2
    assert m["ratio_max"] == pytest.approx(1.5)
    loss.backward()
    # gradient = -w * sg(min(rho, eps_max)) * A: nonzero on truncated tokens too
    expected = [[-1.2 / 6, -1.1 / 6, -0.5 / 6], [2.4 / 6, 1.8 / 6, 1.0 / 6]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=D))


def test_cispo_padding_with_minus_infinity_gives_finite_loss_and_zero_gradient():
    logp = torch.tensor([[-0.5, float("-inf")]], dtype=D, requires_grad=True)
    gen_logp = torch.tensor([[-0.5, float("-inf")]], dtype=D)
    mask = torch.tensor([[1.0, 0.0]], dtype=D)
    loss, m = cispo(logp, gen_logp, torch.tensor([3.0], dtype=D), mask, mask.clone(), clip_low=0.0, clip_high=5.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-(1.0 * 3.0 * -0.5))  # rho = 1, weight 1
    assert logp.grad.tolist() == [[-3.0, 0.0]]
    assert m["tokens"] == 1.0 and m["logprob_mismatch"] == 0.0


# -- gradient accumulation ---------------------------------------------------------------------


MICRO = (slice(0, 2), slice(2, 6), slice(6, 8))  # splits group 0 and group 2 across micro-batches


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
@pytest.mark.parametrize("mode", ["sample", "prompt", "token"])
def test_micro_batches_sum_to_the_full_batch_loss_and_gradient(name, mode):
    g = torch.Generator().manual_seed(0)
    n, t = 8, 6
    lengths = torch.tensor([6, 2, 4, 1, 5, 3, 6, 2])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(D)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    gen_logp = -torch.rand(n, t, generator=g, dtype=D) * 3
    logp0 = gen_logp + 0.3 * torch.randn(n, t, generator=g, dtype=D)
    adv = torch.randn(n, generator=g, dtype=D)
    w = aggregation_weights(mask, groups, mode)
    fn, clips = POLICY_LOSSES[name], dict(clip_low=0.2, clip_high=0.28)

    full_logp = logp0.clone().requires_grad_()
    full, _ = fn(full_logp, gen_logp, adv, mask, w, **clips)
    full.backward()

    micro_logp = logp0.clone().requires_grad_()
    total = 0.0
    for rows in MICRO:
        part, _ = fn(micro_logp[rows], gen_logp[rows], adv[rows], mask[rows], w[rows], **clips)
        part.backward()
        total += float(part.detach())
    assert total == pytest.approx(float(full.detach()), abs=1e-12)
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, atol=1e-12, rtol=0)

    # the bug class this guards against: weights recomputed per micro-batch and averaged give another loss
    naive = sum(
        float(fn(logp0[r], gen_logp[r], adv[r], mask[r], aggregation_weights(mask[r], groups[r], mode), **clips)[0])
        for r in MICRO
    ) / 3
    assert abs(naive - float(full.detach())) > 1e-6


def test_registry_and_lookup():
    assert set(POLICY_LOSSES) == {"ppo_clip", "gspo", "cispo"}
    assert get_policy_loss("cispo") is cispo
    with pytest.raises(ValueError, match="loss.type = 'cisp' is not one of ppo_clip, gspo, cispo"):
        get_policy_loss("cisp")


def test_shape_errors_are_named():
    logp, gen_logp = case()
    with pytest.raises(ValueError, match=r"advantages must be \(N,\)"):
        ppo_clip(logp, gen_logp, ADV[:1], MASK, W_TOKEN, clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="share one"):
        ppo_clip(logp, gen_logp[:, :2], ADV, MASK, W_TOKEN, clip_low=0.2, clip_high=0.2)
