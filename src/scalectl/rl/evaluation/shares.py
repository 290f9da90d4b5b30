"""Held-out evaluation split across generator processes: who samples which prompts, and the point
put back together.

An evaluation of step v on the generators (``hardware.evaluation``, docs/launching.md,
"Evaluation") cuts the held-out prompts into chunks, each sampled by one engine call, its prompts
``[lo, lo + 64)`` with seed ``eval_seed + lo``, as in :func:`scalectl.rl.evaluation.pass_rate.evaluate`
(:func:`chunk_size`: up to the 512 prompts of a call on one engine, a multiple of the 64 prompts
of a random stream), and gives chunk i to evaluating generator i mod M (:func:`assign_chunks`);
each generator samples its chunks with the weights of version v (:func:`evaluate_share`) and
sends them back; :class:`PointParts` collects them, checks that every completion was sampled by
version v alone, and combines them in prompt order.  With 64 held-out prompts or more per
generator these are the very numbers :func:`~scalectl.rl.evaluation.pass_rate.evaluate` gives
on one engine with those weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scalectl.rl.evaluation.pass_rate import (CHUNK_PROMPTS, SEED_PROMPTS, combine_chunks, evaluate_chunk,
                                              evaluation_chunks)


class EvaluationVersionError(RuntimeError):
    """A completion of an evaluation point was sampled (in part) by weights of another version."""


def chunk_size(n_prompts: int, evaluators: int, chunk_prompts: int = CHUNK_PROMPTS,
               seed_prompts: int = SEED_PROMPTS) -> int:
    """Prompts per chunk when ``evaluators`` generators share ``n_prompts``: ceil(n / M), so that
    every generator has work, rounded up to a multiple of ``seed_prompts`` when it is at least
    that, at most ``chunk_prompts``.  With n >= seed_prompts x M every chunk starts at a
    multiple of ``seed_prompts``, so its random streams (seed + each block's first prompt) are
    those of an evaluation on one engine (:data:`~scalectl.rl.evaluation.pass_rate.SEED_PROMPTS`)."""
    share = -(-n_prompts // max(evaluators, 1))
    if share >= seed_prompts:
        share = -(-share // seed_prompts) * seed_prompts
    return max(1, min(chunk_prompts, share))


def assign_chunks(n_prompts: int, evaluators: list[int],
                  chunk_prompts: int = CHUNK_PROMPTS) -> dict[int, list[range]]:
    """Each evaluating generator's chunks of the held-out prompts (of :func:`chunk_size`): chunk i
    to ``evaluators[i % M]``.

    Raises:
        ValueError: no evaluator.
    """
    if not evaluators:
        raise ValueError("an evaluation on the generators needs at least one generator")
    out: dict[int, list[range]] = {g: [] for g in evaluators}
    size = chunk_size(n_prompts, len(evaluators), chunk_prompts)
    for i, chunk in enumerate(evaluation_chunks(n_prompts, size)):
        out[evaluators[i % len(evaluators)]].append(chunk)
    return out


def evaluate_share(engine, problems: list, chunks: list[range], params, *, samples_per_prompt: int,
                   seed: int, score) -> list[dict]:
    """A generator's part of one evaluation: :func:`~scalectl.rl.evaluation.pass_rate.evaluate_chunk`
    of each of its ``chunks`` with the engine's current weights (held for the evaluation), scored
    by ``score`` (the run's reward, :func:`scalectl.rl.reward.scoring.scorer_for`)."""
    return [evaluate_chunk(engine, problems, chunk, params, samples_per_prompt=samples_per_prompt, seed=seed,
                           score=score)
            for chunk in chunks]


@dataclass
class PointParts:
    """The chunks of the evaluation of ``step`` as they come in from the generators.

    Attributes:
        step: the version evaluated (the point's step).
        expected: generator rank -> how many chunks it sends.
        parts: the chunks received, each with its ``generator``.
    """

    step: int
    expected: dict[int, int]
    parts: list = field(default_factory=list)
    arrived: set = field(default_factory=set)

    def add(self, generator: int, chunks: list[dict]) -> None:
        """Take a generator's chunks.

        Raises:
            ValueError: chunks from a generator that was not asked, twice, or not as many as asked.
            EvaluationVersionError: a completion with a token of another version than ``step``.
        """
        if generator not in self.expected or generator in self.arrived:
            raise ValueError(f"unexpected evaluation chunks of step {self.step} from generator {generator}")
        if len(chunks) != self.expected[generator]:
            raise ValueError(f"generator {generator} sent {len(chunks)} evaluation chunk(s) of step {self.step}, "
                             f"{self.expected[generator]} were asked")
        for chunk in chunks:
            wrong = [v for v in chunk["versions"] if v != [self.step]]
            if wrong:
                raise EvaluationVersionError(
                    f"the evaluation of step {self.step}: generator {generator} sampled a completion of prompt "
                    f"chunk {chunk['start']} with weights of version(s) {wrong[0]}")
            self.parts.append({**chunk, "generator": generator})
        self.arrived.add(generator)

    @property
    def complete(self) -> bool:
        """Whether every generator asked has sent its chunks."""
        return self.arrived == set(self.expected)

    def result(self, samples_per_prompt: int) -> dict:
        """The evaluation's numbers (:func:`~scalectl.rl.evaluation.pass_rate.combine_chunks`)."""
        return combine_chunks(self.parts, samples_per_prompt)

    def record(self) -> list[dict]:
        """One line per chunk for ``RUN_DIR/evaluations.jsonl``: ``step``, ``generator``,
        ``start`` (first prompt), ``prompts``, and ``versions``: for every completion, the
        versions of its tokens (``[step]`` each)."""
        return [{"step": self.step, "generator": p["generator"], "start": p["start"],
                 "prompts": len(p["correct_counts"]), "versions": p["versions"]}
                for p in sorted(self.parts, key=lambda p: p["start"])]
