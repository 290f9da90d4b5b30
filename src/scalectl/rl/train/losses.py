"""Policy-gradient losses and their aggregation over tokens.

Every policy loss is a pure function with one signature, registered by name in
``POLICY_LOSSES`` (``loss.type`` in a recipe)::

    loss, metrics = loss_fn(logp, gen_logp, advantages, mask, weights, clip_low=..., clip_high=...)

Shapes: N completions (rows), T tokens (columns, padded).

- ``logp`` (N, T): log pi_train(y_t) of each completion token under the policy
  being trained (with gradient).
- ``gen_logp`` (N, T): log pi_gen(y_t), the log-prob the generator recorded when
  it sampled the token (no gradient).
- ``advantages`` (N,): one advantage per completion (see ``advantages.py``).
- ``mask`` (N, T) float: 1 on completion tokens, 0 on padding.
- ``weights`` (N, T): the aggregation weights of ``aggregation_weights``, computed
  once over the whole batch.

Each loss returns ``loss = -sum_{i,t} weights_{i,t} * J_{i,t}``, where J is the
per-token objective (maximised), and a dict of float metrics. Because the loss is
a plain weighted sum, the losses of the micro-batches of a batch (rows split any
way, each with its slice of ``weights``) add up to the full-batch loss, and so do
their gradients: gradient accumulation does not change the loss scale.

The importance ratio is rho_{i,t} = pi_train(y_t) / pi_gen(y_t) = exp(logp - gen_logp);
log rho is clamped to [-20, 20] before exp, as in verl, so that a padding slot or
a wild token cannot overflow (gradient is zero past the clamp).

The losses are built from two separate choices, as ``docs/recipe-axes.md`` asks:
the ratio level (token: ``token_log_ratio``; sequence: ``sequence_log_ratio``)
and the clipping style (PPO two-sided: ``ppo_clip_objective``; CISPO truncated
weight: ``cispo_objective``). The published combinations are the registered
losses ``ppo_clip`` (token, PPO), ``gspo`` (sequence, PPO), ``cispo`` (token, CISPO).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from scalectl.recipe.loss_choices import LOSS_NAMES

AGGREGATIONS = ("sample", "prompt", "token")
LOG_RATIO_CLAMP = 20.0


# -- aggregation --------------------------------------------------------------------------------


def aggregation_weights(mask: torch.Tensor, group_ids: torch.Tensor, mode: str, totals=None) -> torch.Tensor:
    """Per-token weights w (N, T) such that sum(w * J) is the aggregated objective of the batch.

    Computed over the WHOLE batch (all groups kept after filtering), so that the
    micro-batches' losses sum to the batch loss. With len_i = sum_t mask_{i,t}:

    - ``sample`` (GRPO, DeepSeekMath arXiv 2402.03300 Sec. 4.1): w = mask / (N * len_i):
      mean over each completion's tokens, then mean over the N completions.
    - ``prompt`` (DAPO arXiv 2503.14476 Sec. 3.3, token-level loss within a group; ScaleRL Sec. 3):
      w = mask / (n_groups * tokens_g): sum over a group's tokens divided by the group's
      token count, then mean over the groups.
    - ``token``: w = mask / (total masked tokens in the batch).

    Args:
        mask: (N, T) float, 1 on completion tokens.
        group_ids: (N,) long, the group of each completion.
        mode: one of ``sample``, ``prompt``, ``token``.
        totals: for one trainer's share of a batch split by whole groups, the whole
            batch's :class:`scalectl.rl.train.sharding.BatchTotals` (completions, groups,
            tokens), used as N, n_groups and the token count; the weights of all the
            shares then sum to 1. None: ``mask`` is the whole batch.

    Returns:
        (N, T) float weights, summing to 1 (0 if the mask is empty). A completion with no
        token gets weight 0 but still counts in N (``sample``).

    Raises:
        ValueError: unknown mode or mismatched shapes.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss.aggregation = {mode!r} is not one of {', '.join(AGGREGATIONS)}")
    if mask.dim() != 2 or group_ids.shape != mask.shape[:1]:
        raise ValueError(
            f"mask must be (N, T) and group_ids (N,); got {tuple(mask.shape)} and {tuple(group_ids.shape)}"
        )
    mask = mask.detach().float() if not mask.is_floating_point() else mask.detach()
    lengths = mask.sum(dim=1)  # (N,)
    if mode == "sample":
        n = mask.shape[0] if totals is None else totals.completions
        return mask / (n * lengths.clamp(min=1))[:, None]
    if mode == "prompt":
        _, inv = torch.unique(group_ids, return_inverse=True)
        n_groups = int(inv.max()) + 1 if inv.numel() else 0
        group_tokens = torch.zeros(n_groups, dtype=mask.dtype, device=mask.device).index_add_(0, inv, lengths)
        n_all = n_groups if totals is None else totals.groups
        return mask / (n_all * group_tokens[inv].clamp(min=1))[:, None]
    if totals is not None:
        return mask / max(totals.tokens, 1.0)
    return mask / mask.sum().clamp(min=1)


# -- the two choices: ratio level and clipping style --------------------------------------------


def token_log_ratio(logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_{i,t} = logp - gen_logp on completion tokens, 0 on padding. (N, T)."""
    log_rho = torch.where(mask.bool(), logp - gen_logp, torch.zeros_like(logp))
    return log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def sequence_log_ratio(logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's log s_i = (1/|y_i|) sum_t log rho_{i,t}, broadcast to every token of row i. (N, T).

    Source: GSPO (Zheng et al. 2025, arXiv 2507.18071), Sec. 4.1. Gradient flows through the
    mean: d log s_i / d logp_{i,t} = 1/|y_i| on every completion token.
    """
    log_rho = token_log_ratio(logp, gen_logp, mask)
    log_s = log_rho.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return log_s[:, None].expand_as(logp)


def ppo_clip_objective(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """J = min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A).

    Source: PPO (Schulman et al. 2017, Eq. 7); decoupled clip_low/clip_high from DAPO Sec. 3.1.

    Args:
        ratio: (N, T) importance ratio (token or sequence level).
        adv: (N, 1) advantages.

    Returns:
        (J, clipped): J (N, T); clipped (N, T) bool, True where the clipped term is strictly
        the smaller one, i.e. where the gradient is zero (rho > 1 + clip_high with A > 0,
        rho < 1 - clip_low with A < 0). This is verl's ``pg_clipfrac`` definition.
    """
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    return torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def cispo_objective(
    ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """J = sg(min(rho, eps_max)) A log pi_train(y_t); CISPO, MiniMax-M1 (arXiv 2506.13585) Sec. 3.1.

    Only the upper truncation eps_max = ``clip_high`` exists (the paper's eps_low is unused);
    every token keeps a gradient, weighted by the truncated ratio.

    Returns:
        (J, truncated): J (N, T); truncated (N, T) bool, True where rho > eps_max.
    """
    weight = ratio.detach().clamp(max=clip_high)
    return weight * adv * logp, (ratio > clip_high).detach()


# -- registered losses ---------------------------------------------------------------------------


def _finish(J, clipped, ratio, logp, gen_logp, mask, weights):
    """Aggregate -sum(w J) over completion tokens and compute the metrics (no gradient)."""
    on = mask.bool()
    loss = -(weights * torch.where(on, J, torch.zeros_like(J))).sum()
    with torch.no_grad():
        n = on.sum()
        denom = n.clamp(min=1)
        metrics = {
            "clip_fraction": float((clipped & on).sum() / denom),
            "ratio_mean": float(torch.where(on, ratio, 0).sum() / denom),
            "ratio_max": float(ratio[on].max()) if n > 0 else 0.0,
            "logprob_mismatch": float(torch.where(on, (logp - gen_logp).abs(), 0).sum() / denom),
            "tokens": float(n),
        }
    return loss, metrics


def _check(logp, gen_logp, advantages, mask, weights):
    if logp.dim() != 2 or not (logp.shape == gen_logp.shape == mask.shape == weights.shape):
        raise ValueError(
            "logp, gen_logp, mask and weights must share one (N, T) shape; got "
            f"{tuple(logp.shape)}, {tuple(gen_logp.shape)}, {tuple(mask.shape)}, {tuple(weights.shape)}"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logp.shape[0]},); got {tuple(advantages.shape)}")
    return advantages.detach()[:, None]


def ppo_clip(
    logp: Tensor,
    gen_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate on token-level ratios (GRPO / DAPO family).

    J_{i,t} = min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - clip_low, 1 + clip_high) A_i),
    rho_{i,t} = exp(logp - gen_logp). GRPO uses 0.2/0.2, DAPO 0.2/0.28.

    Args: see the module docstring; logp, gen_logp, mask, weights (N, T); advantages (N,).

    Returns:
        (loss, metrics): scalar loss = -sum(weights * J); metrics ``clip_fraction`` (share of
        completion tokens whose clipped term is active, i.e. zero gradient), ``ratio_mean``,
        ``ratio_max`` (of rho over completion tokens), ``logprob_mismatch`` (mean |logp - gen_logp|, the
        train/generator log-prob gap), ``tokens`` (completion tokens in this call).
    """
    adv = _check(logp, gen_logp, advantages, mask, weights)
    ratio = token_log_ratio(logp, gen_logp, mask).exp()
    J, clipped = ppo_clip_objective(ratio, adv, clip_low, clip_high)
    return _finish(J, clipped, ratio, logp, gen_logp, mask, weights)


def gspo(
    logp: Tensor,
    gen_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: the PPO clip on one ratio per completion (Zheng et al. 2025, arXiv 2507.18071, Sec. 4).

    s_i = exp((1/|y_i|) sum_t (logp_{i,t} - gen_logp_{i,t})) over completion tokens, and
    J_{i,t} = min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i) for every token t of
    completion i (the same value on each token). The gradient flows through s_i, so for an
    unclipped completion d(sum_t w_{i,t} J_{i,t}) / d logp_{i,t} = W_i A_i s_i / |y_i| with
    W_i = sum_t w_{i,t}. With ``sample`` aggregation W_i = 1/N and this is exactly GSPO's
    objective (1/G) sum_i min(s_i A_i, clip(s_i) A_i) and its gradient (Sec. 4.2); with
    ``token`` or ``prompt`` aggregation each completion's sequence objective is weighted by
    its share of tokens. Clip values are of order 1e-3 (ScaleRL: 3e-3 low / 5e-3 high).

    Metrics as for ``ppo_clip``, with s_i standing for the ratio on each of completion i's
    tokens (``clip_fraction`` is then the token share of clipped completions).
    """
    adv = _check(logp, gen_logp, advantages, mask, weights)
    ratio = sequence_log_ratio(logp, gen_logp, mask).exp()
    J, clipped = ppo_clip_objective(ratio, adv, clip_low, clip_high)
    return _finish(J, clipped, ratio, logp, gen_logp, mask, weights)


def cispo(
    logp: Tensor,
    gen_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: a truncated importance-sampling weight times the REINFORCE term.

    Source: MiniMax-M1 (arXiv 2506.13585), Sec. 3.1.

    J_{i,t} = sg(min(rho_{i,t}, clip_high)) A_i logp_{i,t}; clip_high is eps_max (paper 4-8,
    default 5.0). ``clip_low`` is accepted for the common signature and ignored: CISPO has no
    lower clip. The loss value itself depends on the size of logp and means little; its
    gradient is -w_{i,t} sg(min(rho, eps_max)) A_i d logp_{i,t}.

    Metrics as for ``ppo_clip``; ``clip_fraction`` is the share of completion tokens with
    rho > clip_high (weight truncated).
    """
    adv = _check(logp, gen_logp, advantages, mask, weights)
    ratio = token_log_ratio(logp, gen_logp, mask).exp()
    J, truncated = cispo_objective(ratio, adv, logp, clip_high)
    return _finish(J, truncated, ratio, logp, gen_logp, mask, weights)


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

#: Every choice of :data:`scalectl.recipe.loss_choices.LOSS_CHOICES` (the recipe's ``loss.type``
#: with its companion defaults), in its order; a choice without an implementation fails here.
POLICY_LOSSES: dict[str, PolicyLoss] = {
    name: {"ppo_clip": ppo_clip, "gspo": gspo, "cispo": cispo}[name] for name in LOSS_NAMES}


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered loss called ``name``; ValueError naming the allowed ones otherwise."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"loss.type = {name!r} is not one of {', '.join(POLICY_LOSSES)}") from None
