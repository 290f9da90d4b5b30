"""The policy losses a recipe can choose, with their defaults and companion values.

One table, read by the recipe validator (:class:`scalectl.recipe.schema.Loss` fills
``clip_low``/``clip_high`` from it), the loader (:mod:`scalectl.recipe.load`:
when a layer changes ``loss.type``, companions it does not set take the new
loss's defaults), the ablation planner (:func:`scalectl.ablation.with_companions`)
and the loss registry (:data:`scalectl.rl.train.losses.POLICY_LOSSES` has exactly these
names).  So ``--set loss.type=ppo_clip`` means the same thing in ``run``,
``validate`` and ``ablate``: a PPO clip of 0.2/0.28, never CISPO's eps_max 5.0
carried over.

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
                           "PPO (Schulman et al. 2017) with DAPO's decoupled clip 0.2/0.28 "
                           "(Yu et al. 2025, section 3.1)"),
    "gspo": LossChoice("gspo", 3e-3, 5e-3, "sequence",
                       "GSPO (Zheng et al. 2025), clip 3e-3/5e-3 as ScaleRL's best"),
    "cispo": LossChoice("cispo", 0.2, 5.0, "token",
                        "CISPO (MiniMax-M1, 2025), eps_max 5.0 (ScaleRL)"),
}
LOSS_NAMES = tuple(LOSS_CHOICES)
DEFAULT_LOSS = "cispo"


def stale_companions(before: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, float]:
    """Companions that a layer's change of ``type`` leaves stale, with the new loss's defaults.

    before: the ``[loss]`` table merged so far; layer: the ``[loss]`` table of the
    layer laid over it (a file that extends another, or the ``--set`` overrides).
    When the layer sets ``type`` to a known loss other than the one before, every
    companion it does not set itself takes the new loss's default.  Returns
    {companion: default}; empty when the type does not change or is unknown (the
    validator reports an unknown type).
    """
    new = layer.get("type")
    old = before.get("type", DEFAULT_LOSS)
    if new is None or new == old or new not in LOSS_CHOICES:
        return {}
    return {key: value for key, value in LOSS_CHOICES[new].companions.items() if key not in layer}
