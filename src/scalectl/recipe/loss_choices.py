"""The policy losses a recipe can choose, with their defaults and companion values.

One table, :data:`LOSS_CHOICES`: the recipe schema builds ``loss.type``'s allowed
values from its keys, and the loss registry
(:data:`scalectl.rl.train.losses.POLICY_LOSSES`) implements exactly these names.  One
rule, :func:`companion_defaults`: when a layer changes ``loss.type`` without setting
``clip_low``/``clip_high``, they take the new loss's defaults.  The validator
(:class:`scalectl.recipe.schema.Loss` completing its table), the loader
(:mod:`scalectl.recipe.load`: a file that ``extends`` another, the ``--set`` overrides)
and the ablation planner (:func:`scalectl.ablation.with_companions`: a variant) all
call it, so ``--set loss.type=ppo_clip`` means the same thing in ``run``, ``validate``
and ``ablate``: a PPO clip of 0.2/0.28, never CISPO's eps_max 5.0 carried over.

Pure data and dict functions: no torch, no pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class LossChoice:
    """One ``loss.type``: its companion defaults and where its importance ratio lives.

    clip_low / clip_high: epsilon- / epsilon+ of the ratio clip (CISPO: clip_high
    is eps_max, clip_low unused).  ratio_level: ``token`` or ``sequence`` (GSPO).
    source: what the loss is and the papers it and its defaults come from (shown by
    ``scalectl validate --explain loss.type``).
    """

    name: str
    clip_low: float
    clip_high: float
    ratio_level: str
    source: str

    @property
    def companions(self) -> dict[str, float]:
        """The companion keys (under ``loss``) and their defaults."""
        return {key: getattr(self, key) for key in COMPANIONS}


#: Keys under ``[loss]`` whose meaning depends on ``loss.type``.
COMPANIONS = ("clip_low", "clip_high")

LOSS_CHOICES: dict[str, LossChoice] = {
    "ppo_clip": LossChoice("ppo_clip", 0.2, 0.28, "token",
                           "PPO's clipped ratio per token (Schulman et al. 2017) with DAPO's decoupled "
                           "clip-higher (arXiv 2503.14476, Sec. 3.1)"),
    "gspo": LossChoice("gspo", 3e-3, 5e-3, "sequence",
                       "the PPO clip on one ratio per completion (GSPO, arXiv 2507.18071, Sec. 4); "
                       "clip values as ScaleRL's best (arXiv 2510.13786, Sec. 3.2)"),
    "cispo": LossChoice("cispo", 0.2, 5.0, "token",
                        "the truncated importance weight sg(min(rho, eps_max)) times log pi "
                        "(CISPO, MiniMax-M1 arXiv 2506.13585, Sec. 3.1; ScaleRL's loss)"),
}
LOSS_NAMES = tuple(LOSS_CHOICES)
DEFAULT_LOSS = "cispo"


def companion_defaults(layer: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The companions a ``[loss]`` layer must be completed with: the new loss's defaults.

    The rule (docs/recipe-axes.md, "Loss"): a layer that sets ``type`` to a known loss
    other than the one before it, without setting a companion (:data:`COMPANIONS`)
    itself, gives that companion the new loss's default, never the old loss's value.

    Args:
        layer: the ``[loss]`` table of the layer: a file that extends another, the
            ``--set`` overrides, an ablation variant's overrides, or the whole validated
            table.  A companion counts as set when it holds a value other than None.
        before: the ``[loss]`` table merged below the layer; its ``type`` is
            :data:`DEFAULT_LOSS` when it sets none.  ``None``: nothing is known below
            (the validator completing a table, a variant whose base is loaded later), so
            the layer's ``type`` always counts as a change.

    Returns:
        {companion: default of the layer's loss}; empty when the layer sets no ``type``,
        an unknown one (the validator reports it), or the one before.
    """
    new = layer.get("type")
    if not isinstance(new, str) or new not in LOSS_CHOICES:
        return {}
    if before is not None and new == before.get("type", DEFAULT_LOSS):
        return {}
    return {key: value for key, value in LOSS_CHOICES[new].companions.items() if layer.get(key) is None}
