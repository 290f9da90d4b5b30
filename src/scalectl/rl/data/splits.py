"""Prompt sets for a run: the training split and the disjoint held-out split.

``data.source`` selects the loader:

* ``synthetic:arithmetic``: generated from ``data.seed`` at ``data.difficulty``
  (:mod:`scalectl.rl.data.arithmetic`); ``data.train_size`` prompts (default
  :data:`DEFAULT_SYNTHETIC_TRAIN`) and ``eval.prompts`` held-out prompts, less those
  longer than ``length.max_prompt_tokens`` (:func:`drop_long_prompts`).
* a ``.jsonl``/``.json``/``.parquet`` file or ``hf:NAME``: a real prompt set
  (:mod:`scalectl.rl.data.files`): ``eval.prompts`` held-out prompts drawn by
  ``data.seed``, the rest (or its first ``data.train_size``) for training;
  prompts rendered with the tokenizer's chat template when
  ``model.chat_template`` is true, told the answer format (``reward.format``,
  ``reward.instruction``), and longer than ``length.max_prompt_tokens``
  dropped; each problem keeps its row (``fields``) for a reward function of the
  user's.  A relative file path is read from the working directory.

Every source thus drops, and counts in the run log, the prompts longer than
``length.max_prompt_tokens`` as the engines encode them (when the policy's tokenizer is
at hand): the rollout engines refuse them
(:func:`scalectl.rl.rollout.base.check_prompt_lengths`), since their completions would
get fewer than ``length.max_new_tokens`` tokens.

With ``model.think_tags`` every problem's answer is a :class:`~scalectl.rl.reward.gold.Gold`
that grades only the text after a completion's last ``</think>`` (training rollouts and
held-out evaluation alike).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from scalectl.errors import UserError
from scalectl.recipe.reward_function import BUILTIN_REWARD
from scalectl.rl.reward.gold import Gold

DEFAULT_SYNTHETIC_TRAIN = 4000


def policy_tokenizer(model_cfg):
    """The tokenizer of ``model.path`` (``builtin:tiny``: the project's own), or None
    when the path is not a checkpoint folder on this machine."""
    if model_cfg.path.startswith("builtin:"):
        from scalectl.rl.policy.model import build_tokenizer

        return build_tokenizer()
    if not Path(model_cfg.path).is_dir():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_cfg.path)


def drop_long_prompts(problems: list, tokenizer, max_prompt_tokens: int) -> tuple[list, int]:
    """The problems whose prompts have at most ``max_prompt_tokens`` tokens as the engines
    encode them (:func:`scalectl.rl.policy.model.encode_prompts`, BOS included where the
    tokenizer has one), renumbered 0, 1, ... in their order, and how many were dropped.

    Args:
        problems: objects with ``id`` and ``prompt`` (dataclasses, e.g.
            :class:`~scalectl.rl.data.arithmetic.Problem`).

    Returns:
        (kept, dropped); ``problems`` itself when none is dropped.
    """
    from scalectl.rl.policy.model import encode_prompts

    if not problems:
        return problems, 0
    fits = [len(ids) <= max_prompt_tokens for ids in encode_prompts(tokenizer, [p.prompt for p in problems])]
    if all(fits):
        return problems, 0
    kept = [replace(p, id=j) for j, p in enumerate(p for p, ok in zip(problems, fits) if ok)]
    return kept, len(problems) - len(kept)


def _synthetic(recipe, tokenizer, log) -> tuple[list, list]:
    """The synthetic splits, less the prompts longer than ``length.max_prompt_tokens``."""
    from scalectl.rl.data.arithmetic import make_splits

    try:
        train, held_out = make_splits(recipe.data.train_size or DEFAULT_SYNTHETIC_TRAIN, recipe.eval.prompts,
                                      seed=recipe.data.seed, difficulty=recipe.data.difficulty, mix=recipe.data.mix)
    except ValueError as exc:  # sizes the synthetic task cannot supply
        raise UserError(f"data.source = 'synthetic:arithmetic': {exc}") from None
    if tokenizer is None:
        tokenizer = policy_tokenizer(recipe.model)
    limit = recipe.length.max_prompt_tokens
    if tokenizer is None:
        if log is not None:
            log(f"prompt set synthetic:arithmetic: {len(train)} training, {len(held_out)} held-out prompts; "
                f"lengths not checked against {limit} tokens (no tokenizer of model.path here)")
        return train, held_out
    train, long_train = drop_long_prompts(train, tokenizer, limit)
    held_out, long_held = drop_long_prompts(held_out, tokenizer, limit)
    if not train or not held_out:
        raise UserError(f"data.source = 'synthetic:arithmetic' at data.difficulty = {recipe.data.difficulty}: "
                        f"no {'training' if not train else 'held-out'} prompt fits length.max_prompt_tokens = {limit}")
    if log is not None:
        log(f"prompt set synthetic:arithmetic: {long_train + long_held} longer than {limit} tokens dropped; "
            f"{len(train)} training, {len(held_out)} held-out prompts")
    return train, held_out


def load_prompt_sets(recipe, tokenizer=None, *, log=None) -> tuple[list, list]:
    """(train, held-out) problems for ``recipe`` (objects with ``id``, ``prompt``, ``answer``).

    Args:
        recipe: the validated :class:`~scalectl.recipe.schema.Recipe`.
        tokenizer: the policy's tokenizer, for chat templates and the prompt-length
            filter of every source; default :func:`policy_tokenizer`.
        log: called with one line saying what the set gave (rows, duplicates and how many
            of them near-duplicates of a real set, prompts longer than
            ``length.max_prompt_tokens`` dropped, split sizes).

    Raises:
        UserError: an unknown ``data.source``, a set that cannot be read,
            ``model.chat_template`` without a tokenizer that has a template, or a synthetic
            split left empty by the prompt-length limit.
    """
    source = recipe.data.source
    if source == "synthetic:arithmetic":
        train, held_out = _synthetic(recipe, tokenizer, log)
        if recipe.model.think_tags:
            train, held_out = ([replace(p, answer=Gold((p.answer,), think_tags=True)) for p in split]
                               for split in (train, held_out))
        return train, held_out
    if source.startswith("synthetic:"):
        raise UserError(f"data.source = {source!r} is not one of: synthetic:arithmetic, "
                        "a .jsonl/.json/.parquet file, hf:NAME")
    from scalectl.rl.data.files import load_problems

    if tokenizer is None:
        tokenizer = policy_tokenizer(recipe.model)
    if recipe.model.chat_template and tokenizer is None:
        raise UserError(f"model.chat_template = true needs the tokenizer of model.path = {recipe.model.path!r}, "
                        "which is not a checkpoint folder here")
    d = recipe.data
    train, held_out, info = load_problems(
        source, held_out=recipe.eval.prompts, seed=d.seed, train_size=d.train_size, split=d.split,
        subset=d.subset, prompt_key=d.prompt_key, answer_key=d.answer_key, tokenizer=tokenizer,
        chat_template=recipe.model.chat_template, max_prompt_tokens=recipe.length.max_prompt_tokens,
        think_tags=recipe.model.think_tags, answer_format=recipe.reward.format,
        instruction=recipe.reward.instruction, keep_fields=recipe.reward.function != BUILTIN_REWARD)
    if log is not None:
        log(prompt_set_line(source, info, recipe.length.max_prompt_tokens))
    return train, held_out


def prompt_set_line(source: str, info: dict, max_prompt_tokens: int) -> str:
    """What reading a prompt set kept and dropped (``info`` of
    :func:`scalectl.rl.data.files.load_problems`), as the run log and ``scalectl validate`` say it."""
    longest = (f" (the longest {info['longest']:,} tokens: --set length.max_prompt_tokens={info['longest']} keeps "
               "them)" if info["too_long"] and info.get("longest") else "")
    return (f"prompt set {source}: {info['rows']} rows, {info['duplicates']} duplicates "
            f"({info['near_duplicates']} near-duplicates), {info['too_long']} longer than {max_prompt_tokens} "
            f"tokens{longest}; {info['train']} training, {info['held_out']} held-out prompts")
