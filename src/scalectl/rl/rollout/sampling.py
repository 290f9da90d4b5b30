"""The sampling parameters of one ``generate`` call, built from the recipe in one place.

Every engine call (CPU and vLLM engines; training rollouts in every async mode,
held-out evaluation, the warm start's checks) takes one :class:`SamplingParams`,
so a sampling setting of the recipe cannot reach one call site and miss another.

* :meth:`SamplingParams.for_training`: ``sampling.temperature``, ``sampling.top_p``,
  ``length.max_new_tokens`` and the interruption of ``length.control = "interrupt"``.
* :meth:`SamplingParams.for_evaluation`: the held-out protocol (docs/method.md, section 5):
  ``eval.temperature``, no top-p (the pass rate is that of the policy itself, the same
  protocol for every recipe, so recipes that differ in ``sampling.top_p`` are compared
  on equal terms; as verl's validation defaults), and the training length settings
  (a completion truncated in training is truncated in evaluation too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: (interrupt_min, interrupt_max, phrase): length control by interruption (ScaleRL Sec. 3).
Interrupt = tuple[int, int, str]


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled.

    Fields:
        max_new_tokens: cap on each completion's length (tokens); hitting it gives
            ``finish_reason = "length"`` (a truncated completion).
        temperature: softmax temperature (> 0); the recorded log-probs refer to it.
        top_p: nucleus sampling, in (0, 1]; 1 is off.  The recorded log-probs stay
            those of the full softmax (no top-p renormalisation), which is what the
            importance ratio needs.
        interrupt: ``(lo, hi, phrase)`` or None: a completion that reaches a length drawn
            uniformly from the integers in [lo, hi] without having stopped gets ``phrase``
            appended as forced tokens (loss mask 0), then continues to EOS or
            ``max_new_tokens`` (ScaleRL, arXiv 2510.13786, Sec. 3, length interruption).

    Raises:
        ValueError: max_new_tokens < 1, temperature <= 0, top_p outside (0, 1], or an
            interrupt range outside 1 <= lo <= hi < max_new_tokens or with an empty phrase.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    interrupt: Interrupt | None = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"need max_new_tokens >= 1; got {self.max_new_tokens}")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature > 0 and 0 < top_p <= 1; got {self.temperature}, {self.top_p}")
        if self.interrupt is not None:
            lo, hi, phrase = self.interrupt
            if not phrase:
                raise ValueError("length.interrupt_phrase is empty")
            if not 1 <= lo <= hi < self.max_new_tokens:
                raise ValueError(f"interrupt range [{lo}, {hi}] must satisfy 1 <= min <= max < "
                                 f"max_new_tokens ({self.max_new_tokens})")
            object.__setattr__(self, "interrupt", (int(lo), int(hi), str(phrase)))

    @classmethod
    def for_training(cls, recipe) -> "SamplingParams":
        """The rollouts of training steps: the recipe's ``sampling`` and ``length`` sections."""
        return cls(max_new_tokens=recipe.length.max_new_tokens, temperature=recipe.sampling.temperature,
                   top_p=recipe.sampling.top_p, interrupt=interrupt_spec(recipe.length))

    @classmethod
    def for_evaluation(cls, recipe) -> "SamplingParams":
        """Held-out evaluation: ``eval.temperature``, top-p off, the training length settings."""
        return replace(cls.for_training(recipe), temperature=recipe.eval.temperature, top_p=1.0)


def interrupt_spec(length) -> Interrupt | None:
    """``(lo, hi, phrase)`` of a recipe's ``length`` section, or None unless ``control = "interrupt"``."""
    if length.control != "interrupt":
        return None
    return (length.interrupt_min, length.interrupt_max, length.interrupt_phrase)
