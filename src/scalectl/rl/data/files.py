"""Real prompt sets: read rows, normalise gold answers, render prompts, split off the held-out set.

``data.source`` names where the rows come from (:func:`read_rows`):

* a ``.jsonl`` file (one JSON object per line; a ``.json`` file holding a list also works);
* a ``.parquet`` file, in the layout RL trainers such as verl use for Polaris-53K and
  similar sets: ``prompt`` (a list of chat messages ``{"role", "content"}``) and
  ``reward_model.ground_truth``;
* ``hf:NAME``: a Hugging Face ``datasets`` set, by hub name (``data.subset`` is the
  configuration, ``data.split`` the split) or a local folder (``save_to_disk`` layout,
  or files ``load_dataset`` reads).

Each row becomes a :class:`Record` (:func:`to_record`): the prompt as chat messages, and
the gold answers as strings (one, or several where the row lists acceptable answers).
Known layouts are recognised without configuration (:data:`PROMPT_KEYS`,
:data:`ANSWER_KEYS`): GSM8K (``question`` + ``answer`` ending in ``#### <number>``), the
verl RL layout, MATH-style ``problem`` + ``solution`` (last ``\\boxed{}``); other layouts
name their columns with ``data.prompt_key`` / ``data.answer_key`` (dotted for nested fields).

Prompts are rendered (:func:`render_prompt`) with the tokenizer's chat template when
``model.chat_template`` is true, otherwise as plain text; either way a prompt that does
not already ask for the recipe's answer format (``reward.format``; by default a
``\\boxed{}`` answer) gets that format's instruction (:data:`BOXED_INSTRUCTION` by
default; :mod:`scalectl.rl.reward.formats`) appended to its last message, unless
``reward.instruction`` is false.  Each problem keeps its row (``fields``) for the reward.  Duplicated prompts are kept once, near-duplicates included (one
:func:`scalectl.rl.data.duplicates.prompt_key`: equal up to whitespace, the case of words and
surrounding punctuation); prompts longer than ``length.max_prompt_tokens`` are dropped (when
a tokenizer is at hand).  The held-out split (``eval.prompts`` prompts, paper: 1,000) is
drawn by ``data.seed`` from what remains and is disjoint from training (:func:`split_indices`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalectl.errors import UserError
from scalectl.rl.data.arithmetic import Problem
from scalectl.rl.data import duplicates as near
from scalectl.rl.reward.formats import BOXED_INSTRUCTION, INSTRUCTIONS, asks_for  # noqa: F401 - a public name here
from scalectl.rl.reward.gold import Gold
#: Columns tried, in order, for the prompt when ``data.prompt_key`` is not set.
PROMPT_KEYS = ("prompt", "question", "problem", "query", "messages")
#: Columns tried, in order, for the gold answer when ``data.answer_key`` is not set.
ANSWER_KEYS = ("reward_model.ground_truth", "ground_truth", "final_answer", "answer", "solution")


@dataclass(frozen=True)
class Record:
    """One usable row: ``messages`` (chat messages, dicts with ``role`` and ``content``),
    the gold ``answers`` (strings without ``\\boxed{}``: one, or every acceptable answer the
    row lists) and its ``row`` index in the source."""

    messages: tuple
    answers: tuple[str, ...]
    row: int


@dataclass(frozen=True)
class SourcedProblem(Problem):
    """A :class:`~scalectl.rl.data.arithmetic.Problem` (``id`` = index in its split, rendered
    ``prompt``) whose ``answer`` is a :class:`~scalectl.rl.reward.gold.Gold` (every gold
    answer of its row, and whether completions think in tags), and that knows its ``row``
    in the source and the row's columns as read (``fields``, what a reward function
    receives; not compared)."""

    answer: Gold
    row: int = -1
    fields: dict = field(default_factory=dict, compare=False, repr=False)


# --------------------------------------------------------------------------- reading


def read_rows(source: str, *, split: str = "train", subset: str | None = None) -> list[dict]:
    """All rows of ``source`` as dicts (see the module docstring for the sources).

    Raises:
        UserError: unknown kind of source, missing file, malformed JSON (with the line),
            the ``datasets`` package missing for ``hf:``, or a set it cannot load.
    """
    if source.startswith("hf:"):
        return _hf_rows(source[3:], split=split, subset=subset)
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise UserError(f"data.source = {source!r} is not one of: synthetic:arithmetic, "
                        "a .jsonl/.json/.parquet file, hf:NAME")
    if not path.is_file():
        raise UserError(f"data.source = {source!r}: no such file")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise UserError(f"data.source = {source!r}: not a readable parquet file ({exc})") from exc
    text = path.read_text(encoding="utf-8")
    if suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{source}: invalid JSON ({exc})") from exc
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UserError(f"{source}:{n}: invalid JSON line ({exc.msg})") from exc
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise UserError(f"{source}: row {bad} is a {type(rows[bad]).__name__}, not a JSON object")
    return rows


def _hf_rows(name: str, *, split: str, subset: str | None) -> list[dict]:
    try:
        import datasets
    except ImportError as exc:
        raise UserError(f"data.source = 'hf:{name}' needs the Hugging Face datasets package "
                        "(pip install datasets), or convert the set to .parquet/.jsonl") from exc
    path = Path(name)
    try:
        if path.is_dir() and any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise UserError(f"data.split = {split!r} is not one of: {', '.join(ds)} (in {name})")
                ds = ds[split]
        else:
            ds = datasets.load_dataset(name, subset, split=split)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - network, missing split, bad config: all user-facing
        raise UserError(f"data.source = 'hf:{name}' (subset {subset!r}, split {split!r}) "
                        f"could not be loaded: {exc}") from exc
    return [dict(r) for r in ds]


# --------------------------------------------------------------------------- one row


def lookup(row: dict, key: str):
    """``row[key]``, following dots into nested dicts (``"reward_model.ground_truth"``);
    a key that is present as written wins over the dotted path.  Missing: KeyError."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def _first_present(row: dict, keys) -> tuple[str, object] | None:
    for key in keys:
        try:
            value = lookup(row, key)
        except KeyError:
            continue
        if value is not None:
            return key, value
    return None


def normalize_answer(value) -> str:
    """The gold answer as the checker's string.

    * a worked solution: the part after the last ``####`` (GSM8K), or the content of the
      last ``\\boxed{}`` (MATH);
    * a number with thousands separators loses them (``"2,125"``, ``"2{,}125"``,
      ``"2 125"`` -> ``"2125"``; :func:`scalectl.rl.reward.checker.without_thousands`, which the
      checker applies to the model's answers too);
    * an integral float is written as an integer (``142.0`` -> ``"142"``);
    * a one-element list is its element (several: :func:`normalize_answers`).

    Raises:
        ValueError: None, a boolean, an empty answer, a list of several answers, or a
            solution with an unclosed ``\\boxed{``.
    """
    from scalectl.rl.reward.checker import last_boxed, without_thousands

    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f"a list of {len(value)} answers (one expected)")
        value = value[0]
    if value is None or isinstance(value, bool):
        raise ValueError(f"no answer ({value!r})")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not np.isfinite(value):
            raise ValueError(f"answer {value!r} is not a finite number")
        return str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    elif "\\boxed{" in text:
        boxed = last_boxed(text)
        if boxed is None:
            raise ValueError("the solution's \\boxed{ is not closed")
        text = boxed.strip()
    text = without_thousands(text)
    if not text:
        raise ValueError("empty answer")
    return text


def normalize_answers(value) -> tuple[str, ...]:
    """Every gold answer of a row, as the checker's strings: a list (a JSON list, a Parquet
    list column, verl's ``reward_model.ground_truth`` as a list) gives each element by
    :func:`normalize_answer`, in order, repeats dropped; anything else its one answer.

    Raises:
        ValueError: an empty list, or an element :func:`normalize_answer` refuses (naming it).
    """
    if not isinstance(value, (list, tuple)):
        return (normalize_answer(value),)
    if not value:
        raise ValueError("an empty list of answers")
    answers = []
    for i, element in enumerate(value):
        try:
            answer = normalize_answer(element)
        except ValueError as exc:
            raise ValueError(f"answer {i} of {len(value)}: {exc}") from None
        if answer not in answers:
            answers.append(answer)
    return tuple(answers)


def _messages(value) -> tuple:
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
            for m in value):
        return tuple({"role": m["role"], "content": m["content"]} for m in value)
    raise ValueError("a prompt must be a string or a non-empty list of {role, content} messages")


def to_record(row: dict, index: int, *, prompt_key: str | None = None, answer_key: str | None = None,
              source: str = "") -> Record:
    """The :class:`Record` of one row.

    Raises:
        UserError: no prompt or answer column (naming the columns the row has and the
            keys tried), or a value that is not a prompt / an answer (naming the row).
    """
    where = f"{source} row {index}" if source else f"row {index}"
    found = {}
    for what, key, keys in (("prompt", prompt_key, PROMPT_KEYS), ("answer", answer_key, ANSWER_KEYS)):
        tried = (key,) if key else keys
        hit = _first_present(row, tried)
        if hit is None:
            setting = f"data.{what}_key"
            raise UserError(f"{where}: no {what} column (tried {', '.join(tried)}; the row has "
                            f"{', '.join(map(str, row)) or 'no columns'}); set {setting}")
        found[what] = hit
    try:
        messages = _messages(found["prompt"][1])
    except ValueError as exc:
        raise UserError(f"{where}: {found['prompt'][0]}: {exc}") from exc
    try:
        answers = normalize_answers(found["answer"][1])
    except ValueError as exc:
        raise UserError(f"{where}: {found['answer'][0]}: {exc}") from exc
    return Record(messages, answers, index)


# --------------------------------------------------------------------------- prompts


def with_instruction(messages: tuple, answer_format: str = "boxed") -> tuple:
    """``messages`` with the instruction of ``answer_format``
    (:data:`scalectl.rl.reward.formats.INSTRUCTIONS`; boxed: :data:`BOXED_INSTRUCTION`)
    appended to the last user message, unless some message already asks for that format
    (:func:`scalectl.rl.reward.formats.asks_for`: it mentions ``\\boxed``, ``####`` or
    "last line")."""
    if asks_for(messages, answer_format):
        return tuple(messages)
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m["role"] == "user"), default=len(out) - 1)
    out[last]["content"] = out[last]["content"].rstrip() + " " + INSTRUCTIONS[answer_format]
    return tuple(out)


def render_prompt(messages: tuple, *, tokenizer=None, chat_template: bool = False,
                  answer_format: str = "boxed", instruction: bool = True) -> str:
    """The prompt text the policy sees (the rollout engines add the tokenizer's BOS, if
    it has one, :func:`scalectl.rl.policy.model.encode_prompt`).

    ``chat_template``: ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``,
    without a leading BOS string (the engines add BOS themselves); else the messages'
    contents joined by blank lines.  Both after :func:`with_instruction` of
    ``answer_format`` when ``instruction`` (``reward.format``, ``reward.instruction``).

    Raises:
        UserError: ``chat_template`` without a tokenizer, or with one that has no template.
    """
    if instruction:
        messages = with_instruction(messages, answer_format)
    if not chat_template:
        return "\n\n".join(m["content"] for m in messages)
    if tokenizer is None:
        raise UserError("model.chat_template = true needs the model's tokenizer")
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                             add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises ValueError or jinja errors
        raise UserError(f"model.chat_template = true, but the tokenizer cannot apply a chat template: {exc}") from exc
    bos = getattr(tokenizer, "bos_token", None)
    return text[len(bos):] if bos and text.startswith(bos) else text


# --------------------------------------------------------------------------- the split


def split_indices(n: int, held_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) positions in [0, n): a permutation drawn by ``seed``; its first
    ``held_out`` entries are the held-out split, the rest (in permuted order) training.

    Disjoint by construction, together all of [0, n); the held-out split depends only on
    (n, seed), not on how much of the rest is used.

    Raises:
        UserError: ``held_out`` < 1 or >= n (no prompt left for training).
    """
    if not 1 <= held_out < n:
        raise UserError(f"eval.prompts = {held_out} held-out prompts need a prompt set of more than "
                        f"{held_out} prompts; this one has {n}")
    perm = np.random.default_rng(seed).permutation(n)
    return perm[held_out:], perm[:held_out]


def load_problems(source: str, *, held_out: int, seed: int = 0, train_size: int | None = None,
                  split: str = "train", subset: str | None = None, prompt_key: str | None = None,
                  answer_key: str | None = None, tokenizer=None, chat_template: bool = False,
                  max_prompt_tokens: int | None = None, think_tags: bool = False, answer_format: str = "boxed",
                  instruction: bool = True,
                  keep_fields: bool = True) -> tuple[list[SourcedProblem], list[SourcedProblem], dict]:
    """Training and held-out problems of a real prompt set, and what was dropped.

    Rows -> records (:func:`to_record`) -> rendered prompts (:func:`render_prompt`, with
    the instruction of ``answer_format`` when ``instruction``) ->
    first occurrence of each prompt kept, near-duplicates included (one
    :func:`~scalectl.rl.data.duplicates.prompt_key`, every format's instruction left out)
    -> prompts of more than ``max_prompt_tokens`` tokens as the engines encode them
    (:func:`scalectl.rl.policy.model.encode_prompts`, BOS included when the tokenizer has
    one) dropped when ``tokenizer`` is given -> :func:`split_indices` -> the first
    ``train_size`` training prompts (all by default).

    Returns:
        (train, held_out, info); problem ids are indices in their split, answers a
        :class:`~scalectl.rl.reward.gold.Gold` of the row's answers with ``think_tags``,
        ``fields`` the row (``{}`` unless ``keep_fields``: the built-in checker reads none,
        and every process of a run holds the problems);
        ``info`` counts ``rows``, ``duplicates`` (all dropped as a copy of an earlier
        prompt), ``near_duplicates`` (those among them whose rendered text differs from
        it), ``too_long``, ``longest`` (tokens of the longest prompt left after the duplicates; None
        without a tokenizer), ``train``, ``held_out``.

    Raises:
        UserError: see :func:`read_rows`, :func:`to_record`, :func:`render_prompt`,
            :func:`split_indices`.
    """
    rows = read_rows(source, split=split, subset=subset)
    records = [to_record(r, i, prompt_key=prompt_key, answer_key=answer_key, source=source)
               for i, r in enumerate(rows)]
    texts = [render_prompt(r.messages, tokenizer=tokenizer, chat_template=chat_template,
                           answer_format=answer_format, instruction=instruction) for r in records]
    keys = [near.prompt_key(r.messages, drop=tuple(INSTRUCTIONS.values())) for r in records]
    keep = near.first_of_each(keys)
    duplicates = len(records) - len(keep)
    kept_text = {keys[i]: texts[i] for i in keep}
    near_duplicates = sum(text != kept_text[key] for key, text in zip(keys, texts))
    too_long, longest = 0, None
    if tokenizer is not None and max_prompt_tokens is not None and keep:
        from scalectl.rl.policy.model import encode_prompts

        lengths = [len(ids) for ids in encode_prompts(tokenizer, [texts[i] for i in keep])]
        kept = [i for i, n in zip(keep, lengths) if n <= max_prompt_tokens]
        too_long, longest = len(keep) - len(kept), max(lengths)
        keep = kept
    # what to do about prompts too long: the value that keeps them all
    raise_it = ("" if not too_long else f"; --set length.max_prompt_tokens={longest} keeps them all (the longest "
                f"prompt has {longest} tokens)")
    if not keep:
        raise UserError(f"data.source = {source!r}: no usable prompt ({len(records)} rows, {duplicates} duplicates, "
                        f"{too_long} longer than length.max_prompt_tokens = {max_prompt_tokens}){raise_it}")
    try:
        train_pos, held_pos = split_indices(len(keep), held_out, seed)
    except UserError as exc:          # say what the rows lost on the way: duplicates, prompts too long
        raise UserError(f"data.source = {source!r}: {exc} ({len(records)} rows, {duplicates} duplicates, "
                        f"{too_long} longer than length.max_prompt_tokens = {max_prompt_tokens} dropped)"
                        f"{raise_it}") from None
    if train_size is not None:
        train_pos = train_pos[:train_size]

    def problems(positions) -> list[SourcedProblem]:
        return [SourcedProblem(id=j, prompt=texts[keep[p]], answer=Gold(records[keep[p]].answers, think_tags),
                               row=records[keep[p]].row, fields=rows[records[keep[p]].row] if keep_fields else {})
                for j, p in enumerate(positions)]

    train, held = problems(train_pos), problems(held_pos)
    info = {"rows": len(records), "duplicates": duplicates, "near_duplicates": near_duplicates, "too_long": too_long,
            "longest": longest, "train": len(train), "held_out": len(held)}
    return train, held, info
