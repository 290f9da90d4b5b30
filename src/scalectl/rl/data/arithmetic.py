"""Synthetic prompt sets: multi-step integer arithmetic (``data.source = "synthetic:arithmetic"``).

A problem is a chain of additions and subtractions, ``"47+8-63="``; the reference
completion writes the running sums, then the answer in ``\\boxed{}``::

    prompt      47+8-63=
    completion  55;-8;\\boxed{-8}

``data.difficulty`` (1-9) sets the number of terms, their size and the operators
(:data:`DIFFICULTIES`).  Everything is deterministic in (seed, difficulty): the
held-out evaluation split and the training split come from two separate random
streams; training skips every prompt among the first :func:`reserve_size`
held-out prompts (5,000, fewer at small levels), so the splits are disjoint for any
held-out size up to that (larger sizes are refused),
and neither split depends on the other's size (the first k prompts of a split are
the same for any size >= k).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from scalectl.rl.policy.tiny_config import BOXED


@dataclass(frozen=True)
class Problem:
    """One prompt of a prompt set: ``id`` (its index in its split), the prompt text and the gold answer."""

    id: int
    prompt: str
    answer: str


@dataclass(frozen=True)
class Difficulty:
    """What a difficulty level generates: ``terms`` integers in [0, ``max_value``],
    joined by operators drawn uniformly from ``ops``."""

    terms: int
    max_value: int
    ops: str


#: difficulty -> generator settings: more digits, then more terms.  Longest reference
#: completion seen in 2,100 problems, in tokens of the tiny model (``\\boxed{`` is
#: one token), EOS included: 1: 8, 2: 10, 3: 12, 4: 16, 5: 19, 6: 25, 7: 31, 8: 37, 9: 49.
DIFFICULTIES: dict[int, Difficulty] = {
    1: Difficulty(2, 9, "+"),
    2: Difficulty(2, 99, "+-"),
    3: Difficulty(2, 999, "+-"),
    4: Difficulty(3, 99, "+-"),
    5: Difficulty(3, 999, "+-"),
    6: Difficulty(4, 999, "+-"),
    7: Difficulty(5, 999, "+-"),
    8: Difficulty(6, 999, "+-"),
    9: Difficulty(8, 999, "+-"),
}

_TRAIN_STREAM, _EVAL_STREAM = 0, 1
#: Largest held-out split; training never uses these prompts.
HELD_OUT_RESERVE = 5000


def _spec(difficulty: int) -> Difficulty:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"data.difficulty = {difficulty} is not one of {min(DIFFICULTIES)}-{max(DIFFICULTIES)}")
    return DIFFICULTIES[difficulty]


def running_sums(prompt: str) -> list[int]:
    """The partial results of a chain prompt, left to right: ``"47+8-63="`` -> [55, -8].

    Raises:
        ValueError: the prompt is not ``<int>(<+|-><int>)+=``.
    """
    body = prompt.removesuffix("=")
    if body == prompt or not body:
        raise ValueError(f"not an arithmetic chain prompt (must end with '='): {prompt!r}")
    tokens, num = [], ""
    for ch in body:
        if ch in "+-" and num:
            tokens += [num, ch]
            num = ""
        elif ch.isdigit():
            num += ch
        else:
            raise ValueError(f"not an arithmetic chain prompt (unexpected {ch!r}): {prompt!r}")
    if not num or len(tokens) < 2:
        raise ValueError(f"not an arithmetic chain prompt (needs >= 2 terms): {prompt!r}")
    tokens.append(num)
    acc, sums = int(tokens[0]), []
    for op, val in zip(tokens[1::2], tokens[2::2]):
        acc = acc + int(val) if op == "+" else acc - int(val)
        sums.append(acc)
    return sums


def sft_target(prompt: str) -> str:
    """The reference completion (without EOS): running sums separated by ``;`` then
    ``\\boxed{answer}``: ``"47+8-63="`` -> ``"55;-8;\\boxed{-8}"``."""
    sums = running_sums(prompt)
    return "".join(f"{s};" for s in sums) + f"{BOXED}{sums[-1]}}}"


def _draw(rng: np.random.Generator, spec: Difficulty) -> str:
    values = rng.integers(0, spec.max_value + 1, size=spec.terms)
    ops = rng.integers(0, len(spec.ops), size=spec.terms - 1)
    text = str(values[0])
    for op, v in zip(ops, values[1:]):
        text += spec.ops[op] + str(v)
    return text + "="


def _stream(seed: int, difficulty: int, stream: int, size: int, exclude: set[str]) -> list[Problem]:
    spec = _spec(difficulty)
    rng = np.random.default_rng([seed, difficulty, stream])
    seen, out = set(exclude), []
    attempts, limit = 0, 50 * size + 1000
    while len(out) < size:
        attempts += 1
        if attempts > limit:
            raise ValueError(
                f"difficulty {difficulty} has too few distinct problems for {size} prompts "
                f"(found {len(out)}); use a smaller size or a higher difficulty"
            )
        prompt = _draw(rng, spec)
        if prompt in seen:
            continue
        seen.add(prompt)
        out.append(Problem(id=len(out), prompt=prompt, answer=str(running_sums(prompt)[-1])))
    return out


def eval_problems(size: int, *, seed: int = 0, difficulty: int = 3) -> list[Problem]:
    """The held-out evaluation split: ``size`` distinct problems (ids 0..size-1).

    The first k problems do not depend on ``size``.

    Raises:
        ValueError: unknown difficulty, size above :data:`HELD_OUT_RESERVE`, or fewer
            distinct problems than ``size``.
    """
    if size > reserve_size(difficulty):
        raise ValueError(f"eval.prompts = {size}: the synthetic held-out split at difficulty {difficulty} "
                         f"has at most {reserve_size(difficulty)} prompts")
    return _stream(seed, difficulty, _EVAL_STREAM, size, exclude=set())


def distinct_problems(difficulty: int) -> int:
    """How many distinct prompts ``difficulty`` can generate: (max_value + 1)^terms values times
    len(ops)^(terms - 1) operator choices."""
    spec = _spec(difficulty)
    return (spec.max_value + 1) ** spec.terms * len(spec.ops) ** (spec.terms - 1)


def reserve_size(difficulty: int) -> int:
    """Prompts reserved for the held-out split: :data:`HELD_OUT_RESERVE`, or a quarter of
    all distinct problems at small levels (the rest stays for training)."""
    return min(HELD_OUT_RESERVE, distinct_problems(difficulty) // 4)


def max_train_size(difficulty: int) -> int:
    """The most training prompts ``difficulty`` can supply: its distinct problems less those
    reserved for the held-out split (:func:`reserve_size`)."""
    return distinct_problems(difficulty) - reserve_size(difficulty)


def check_sizes(train_size: int, eval_size: int, difficulty: int) -> list[str]:
    """What is wrong with asking ``difficulty`` for these split sizes (empty: nothing), each
    naming the key (``data.train_size``, ``eval.prompts``), the limit and what to change."""
    problems = []
    if train_size > max_train_size(difficulty):
        problems.append(
            f"data.train_size = {train_size}: data.difficulty = {difficulty} generates {distinct_problems(difficulty):,} "
            f"distinct problems, {reserve_size(difficulty):,} of them kept for the held-out split, so at most "
            f"{max_train_size(difficulty):,} training prompts; lower data.train_size or raise data.difficulty")
    if eval_size > reserve_size(difficulty):
        problems.append(f"eval.prompts = {eval_size}: the synthetic held-out split at data.difficulty = {difficulty} "
                        f"has at most {reserve_size(difficulty):,} prompts")
    return problems


@functools.lru_cache(maxsize=16)
def _reserved(seed: int, difficulty: int) -> frozenset[str]:
    return frozenset(p.prompt for p in _stream(seed, difficulty, _EVAL_STREAM, reserve_size(difficulty), set()))


def train_problems(size: int, *, seed: int = 0, difficulty: int = 3) -> list[Problem]:
    """The training split: ``size`` distinct problems (ids 0..size-1), none of which is
    among the first :func:`reserve_size` held-out problems.

    Raises:
        ValueError: unknown difficulty, or more than :func:`max_train_size` problems asked for.
    """
    if size > max_train_size(difficulty):
        raise ValueError(check_sizes(size, 0, difficulty)[0])
    return _stream(seed, difficulty, _TRAIN_STREAM, size, exclude=_reserved(seed, difficulty))


def make_splits(train_size: int, eval_size: int, *, seed: int = 0,
                difficulty: int = 3) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) splits, disjoint; see :func:`train_problems` and :func:`eval_problems`."""
    return (train_problems(train_size, seed=seed, difficulty=difficulty),
            eval_problems(eval_size, seed=seed, difficulty=difficulty))
