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

``data.mix`` mixes levels: ``{8 = 0.4}`` with ``data.difficulty = 2`` draws each prompt's
level first (0.6 level 2, 0.4 level 8, from a stream of its own), then the prompt from that
level's own stream (:func:`mixed_levels`).  Each level keeps its own held-out reserve, so the
splits stay disjoint, deterministic and prefix-stable; a level's training prompts are limited
by what it can generate (:func:`check_sizes`).
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
#: The stream that draws each prompt's level in a mixture (apart from every level's own).
_LEVEL_STREAM = 1009
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


def eval_problems(size: int, *, seed: int = 0, difficulty: int = 3, mix: dict | None = None) -> list[Problem]:
    """The held-out evaluation split: ``size`` distinct problems (ids 0..size-1), of
    ``difficulty`` or of the mixture ``mix`` adds (:func:`mixed_levels`).

    The first k problems do not depend on ``size``.

    Raises:
        ValueError: an unknown level or a bad mixture, or more problems of a level than its
            held-out reserve (:func:`reserve_size`; :data:`HELD_OUT_RESERVE` at most).
    """
    levels = mixed_levels(difficulty, mix)
    if size > reserve_size(difficulty) and len(levels) == 1:
        raise ValueError(f"eval.prompts = {size}: the synthetic held-out split at difficulty {difficulty} "
                         f"has at most {reserve_size(difficulty)} prompts")
    if len(levels) == 1:
        return _stream(seed, difficulty, _EVAL_STREAM, size, exclude=set())
    if problems := check_sizes(0, size, difficulty, mix, seed=seed):
        raise ValueError(problems[0])
    return _mixed(seed, levels, _EVAL_STREAM, size, excluded=False)


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


def mixed_levels(difficulty: int, mix: dict | None = None) -> list[tuple[int, float]]:
    """The (level, share) pairs of a prompt set: ``difficulty`` with what ``mix`` leaves, then
    ``mix``'s levels in order.

    Raises:
        ValueError: an unknown level, ``difficulty`` in ``mix``, a share outside (0, 1), or
            shares that leave nothing for ``difficulty``.
    """
    mix = {int(k): float(v) for k, v in (mix or {}).items()}
    for level, share in mix.items():
        _spec(level)
        if level == difficulty:
            raise ValueError(f"data.mix names data.difficulty = {difficulty}: give the other levels only")
        if not 0 < share < 1:
            raise ValueError(f"data.mix share of level {level} is {share}: must be in (0, 1)")
    rest = 1.0 - sum(mix.values())
    if rest <= 0:
        raise ValueError(f"data.mix shares add up to {sum(mix.values()):g}: they must leave a share for "
                         f"data.difficulty = {difficulty}")
    _spec(difficulty)
    return [(difficulty, rest), *sorted(mix.items())]


def level_of_each(size: int, seed: int, levels: list[tuple[int, float]], stream: int) -> np.ndarray:
    """The level index (into ``levels``) of each of the first ``size`` prompts of a split:
    drawn from a stream of its own by the shares, the first k the same for any size >= k."""
    if len(levels) == 1:
        return np.zeros(size, dtype=np.int64)
    rng = np.random.default_rng([seed, _LEVEL_STREAM, stream])
    edges = np.cumsum([share for _, share in levels])
    return np.minimum(np.searchsorted(edges / edges[-1], rng.random(size), side="right"), len(levels) - 1)


def check_sizes(train_size: int, eval_size: int, difficulty: int, mix: dict | None = None, *,
                seed: int = 0) -> list[str]:
    """What is wrong with asking for these split sizes (empty: nothing), each naming the key
    (``data.train_size``, ``eval.prompts``), the level, its limit and what to change.  In a
    mixture each level's count (drawn by :func:`level_of_each`) must fit that level."""
    levels = mixed_levels(difficulty, mix)
    problems = []
    for key, size, stream in (("data.train_size", train_size, _TRAIN_STREAM), ("eval.prompts", eval_size, _EVAL_STREAM)):
        counts = np.bincount(level_of_each(size, seed, levels, stream), minlength=len(levels))
        for (level, _), n in zip(levels, counts.tolist()):
            of = f" ({n} of them at level {level})" if len(levels) > 1 else ""
            if key == "data.train_size" and n > max_train_size(level):
                problems.append(
                    f"{key} = {size}{of}: data.difficulty = {level} generates {distinct_problems(level):,} distinct "
                    f"problems, {reserve_size(level):,} of them kept for the held-out split, so at most "
                    f"{max_train_size(level):,} training prompts; lower data.train_size or raise data.difficulty")
            if key == "eval.prompts" and n > reserve_size(level):
                problems.append(f"{key} = {size}{of}: the synthetic held-out split at data.difficulty = {level} "
                                f"has at most {reserve_size(level):,} prompts")
    return problems


def _mixed(seed: int, levels: list[tuple[int, float]], stream: int, size: int, excluded: bool) -> list[Problem]:
    which = level_of_each(size, seed, levels, stream)
    per_level = {}
    for i, (level, _) in enumerate(levels):
        n = int((which == i).sum())
        exclude = _reserved(seed, level) if excluded else set()
        per_level[i] = iter(_stream(seed, level, stream, n, exclude=exclude))
    return [Problem(id=k, prompt=p.prompt, answer=p.answer)
            for k, p in enumerate(next(per_level[int(i)]) for i in which)]


@functools.lru_cache(maxsize=16)
def _reserved(seed: int, difficulty: int) -> frozenset[str]:
    return frozenset(p.prompt for p in _stream(seed, difficulty, _EVAL_STREAM, reserve_size(difficulty), set()))


def train_problems(size: int, *, seed: int = 0, difficulty: int = 3, mix: dict | None = None) -> list[Problem]:
    """The training split: ``size`` distinct problems (ids 0..size-1), of ``difficulty`` or of
    the mixture ``mix`` adds, none of which is among its level's first :func:`reserve_size`
    held-out problems.

    Raises:
        ValueError: an unknown level or a bad mixture, or more problems of a level than it can
            generate besides its reserve (:func:`check_sizes`).
    """
    if problems := check_sizes(size, 0, difficulty, mix, seed=seed):
        raise ValueError(problems[0])
    levels = mixed_levels(difficulty, mix)
    if len(levels) == 1:
        return _stream(seed, difficulty, _TRAIN_STREAM, size, exclude=_reserved(seed, difficulty))
    return _mixed(seed, levels, _TRAIN_STREAM, size, excluded=True)


def make_splits(train_size: int, eval_size: int, *, seed: int = 0, difficulty: int = 3,
                mix: dict | None = None) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) splits, disjoint; see :func:`train_problems` and :func:`eval_problems`."""
    return (train_problems(train_size, seed=seed, difficulty=difficulty, mix=mix),
            eval_problems(eval_size, seed=seed, difficulty=difficulty, mix=mix))
