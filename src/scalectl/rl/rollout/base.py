"""The rollout-engine interface: what every generator (CPU sampler, vLLM) provides.

An engine samples n completions for each prompt with the current policy and
returns, for every completion token, the generator's own log-prob (the
``pi_gen`` of the importance ratio, docs/recipe-axes.md) and the policy version that
produced it (PipelineRL-k: weights may change while a completion is in flight).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from scalectl.rl.rollout.sampling import Interrupt, SamplingParams

FinishReason = Literal["stop", "length"]
__all__ = ["Completion", "FinishReason", "Interrupt", "RolloutEngine", "SamplingParams", "check_prompt_lengths"]


@dataclass
class Completion:
    """One sampled completion of one prompt.

    Fields (T = len(token_ids), the completion length in tokens, the stop id included
    when the completion stopped):

    - ``prompt_index``: index of the prompt in the ``prompts`` list given to ``generate``.
    - ``prompt_ids``: the prompt's token ids (:func:`scalectl.rl.policy.model.encode_prompt`: BOS first
      when the tokenizer has one; no padding).
    - ``token_ids`` (T): the completion's token ids.
    - ``logprobs`` (T): log pi_gen(token) at the sampling temperature, from the full
      softmax (no top-p/top-k renormalisation), with the engine's LM-head precision.
      For forced (interruption) tokens: the model's log-prob of the forced token.
    - ``versions`` (T): policy version that produced each token.
    - ``loss_mask`` (T): 1 for sampled tokens, 0 for forced tokens (the interruption
      phrase), which the trainer must exclude from the loss.
    - ``finish_reason``: ``"stop"`` (a stop id sampled: the tokenizer's EOS or an EOS id
      of the model's generation config, :func:`scalectl.rl.policy.model.stop_token_ids`) or
      ``"length"`` (``max_new_tokens`` hit: truncated).
    - ``text``: the decoded completion (special tokens removed, forced phrase included).
    - ``interrupted``: whether the interruption phrase was appended.
    """

    prompt_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    text: str
    interrupted: bool = False
    loss_mask: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.loss_mask:
            self.loss_mask = [1] * len(self.token_ids)
        n = len(self.token_ids)
        if not (len(self.logprobs) == len(self.versions) == len(self.loss_mask) == n):
            raise ValueError(
                f"completion of prompt {self.prompt_index}: token_ids ({n}), logprobs ({len(self.logprobs)}), "
                f"versions ({len(self.versions)}) and loss_mask ({len(self.loss_mask)}) must have one entry per token"
            )

    @property
    def truncated(self) -> bool:
        """True when the completion hit ``max_new_tokens`` (counts in the truncation rate)."""
        return self.finish_reason == "length"


def check_prompt_lengths(encoded: list[list[int]], max_prompt_tokens: int | None) -> None:
    """Refuse prompts longer than ``length.max_prompt_tokens``: both engines' rule.

    The prompt sets drop such prompts (:mod:`scalectl.rl.data.splits`, every source) and a
    completion is promised ``max_new_tokens`` tokens after a prompt of up to
    ``max_prompt_tokens`` (the vLLM engine's ``max_model_len`` is their sum), so a longer
    prompt would get a shorter completion, counted as truncation.

    Args:
        encoded: each prompt's token ids (:func:`scalectl.rl.policy.model.encode_prompts`).
        max_prompt_tokens: the limit (tokens); None: no limit.

    Raises:
        ValueError: a prompt longer than the limit (its index, length and the limit).
    """
    if max_prompt_tokens is None:
        return
    for i, ids in enumerate(encoded):
        if len(ids) > max_prompt_tokens:
            raise ValueError(f"prompt {i} has {len(ids)} tokens, more than length.max_prompt_tokens = "
                             f"{max_prompt_tokens} (the prompt sets drop such prompts)")


@dataclass(frozen=True)
class SeedBlock:
    """Rows ``[first, stop)`` of a :meth:`RolloutEngine.generate` call (prompt-major: prompt i's
    n completions are rows i n .. i n + n - 1) that draw from one random stream, seeded ``seed``."""

    first: int
    stop: int
    seed: int


def seed_blocks(n_prompts: int, n: int, seed: int, block: int | None = None) -> list[SeedBlock]:
    """The random streams of a call of ``n_prompts`` prompts x ``n`` completions: prompts ``[lo,
    lo + block)`` draw from a stream seeded ``seed + lo``; ``block`` None: one stream, ``seed``.

    So a call of blocks of the same prompts samples what calls of each block alone with seed
    ``seed + lo`` sample, however an engine batches its rows (an evaluation split over several
    generators, or decoded many prompts to a call, gives the same samples).

    Raises:
        ValueError: ``block`` < 1.
    """
    if block is None or n_prompts <= block:
        return [SeedBlock(0, n_prompts * n, seed)]
    if block < 1:
        raise ValueError(f"seed_block must be >= 1, got {block}")
    return [SeedBlock(lo * n, min(lo + block, n_prompts) * n, seed + lo) for lo in range(0, n_prompts, block)]


class RolloutEngine(ABC):
    """A generator of completions with the policy it holds.

    Implementations: :class:`scalectl.rl.rollout.cpu.CPURolloutEngine` (torch, KV cache),
    and :class:`scalectl.rl.rollout.vllm.VLLMRolloutEngine` at paper scale.  Both must use the
    same prompt encoding (:func:`scalectl.rl.policy.model.encode_prompt`) and LM-head precision
    as the trainer.

    Attributes:
        poll_weights: called with no argument before every decoding step, outside any lock the
            engine holds, or None.  A generator process sets it to load the trainer's next
            version between two steps (its :class:`~scalectl.rl.transport.slot.BaseWeightSlot`),
            so a completion's tokens may come from several versions (PipelineRL-k).
    """

    poll_weights: Callable[[], object] | None = None

    @abstractmethod
    def generate(self, prompts: list[str], n: int, params: SamplingParams, *, seed: int = 0,
                 seed_block: int | None = None) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt.

        Args:
            prompts: prompt texts (encoded with :func:`scalectl.rl.policy.model.encode_prompt`).
            n: completions per prompt (the group size G).
            params: every sampling setting (length cap, temperature, top-p, interruption),
                built from the recipe by :meth:`SamplingParams.for_training` or
                :meth:`SamplingParams.for_evaluation`.
            seed: sampling seed; same seed, weights and arguments give the same completions.
            seed_block: prompts per random stream (:func:`seed_blocks`): prompts ``[lo, lo +
                seed_block)`` are sampled as a call of them alone with seed ``seed + lo`` would
                sample them.  None: the call is one stream.

        Returns:
            One list of ``n`` completions per prompt, in prompt order.
        """

    def check_request(self, n: int, params: SamplingParams) -> list[int]:
        """Validate the arguments of :meth:`generate`; return the interruption phrase's
        token ids (empty without interruption).  Needs ``self.tokenizer``.

        Raises:
            ValueError: n < 1, ``params`` not a :class:`SamplingParams`, or an interruption
                phrase that encodes to no token.
        """
        if n < 1:
            raise ValueError(f"need n >= 1; got n={n}")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.interrupt is None:
            return []
        phrase_ids = self.tokenizer.encode(params.interrupt[2], add_special_tokens=False)
        if not phrase_ids:
            raise ValueError("length.interrupt_phrase encodes to no token")
        return phrase_ids

    @abstractmethod
    def update_weights(self, state_dict: dict | None, version: int) -> None:
        """Load new policy weights (a model ``state_dict``) and tag later tokens with ``version``.

        ``None`` keeps the weights (an engine that shares the trainer's model object)."""

    @property
    @abstractmethod
    def version(self) -> int:
        """The policy version of the weights held now."""


class NoRolloutEngine(RolloutEngine):
    """The engine of a trainer process that samples nothing: its run's rollouts and evaluations
    come from the generator processes.  It keeps the version the loop tells it (the loop moves
    it after every step) and refuses to generate."""

    def __init__(self, version: int = 0):
        self._version = version

    def generate(self, prompts, n, params, *, seed=0, seed_block=None):
        """Raises:
            RuntimeError: always; this process holds no rollout engine."""
        raise RuntimeError("this trainer process holds no rollout engine: its rollouts and evaluations are "
                           "sampled by the generator processes")

    def update_weights(self, state_dict, version: int) -> None:
        """Keep ``version`` (``state_dict`` is ignored: nothing here samples)."""
        self._version = int(version)

    @property
    def version(self) -> int:
        return self._version
