"""A run's model and data, checked before the run exists.

What a job would refuse only once it has started (leaving a failed run behind) is checked by
``scalectl validate``, ``scalectl run --dry-run`` and ``scalectl run`` before anything is
stored (:func:`check_inputs`):

* the tokenizer of a checkpoint folder: its files are there (transformers otherwise builds an
  empty tokenizer, whose prompts encode to no token), it loads, it has an EOS (the tokenizer's
  or the generation config's) within the model's embedding rows, and a chat template when
  ``model.chat_template`` asks for one;
* the first :data:`FIRST_ROWS` rows of a prompt file: each has a prompt and a gold answer
  (``data.prompt_key``, ``data.answer_key`` or a known layout), renders (with the chat
  template when asked) and encodes to tokens the model has rows for; how many of them are longer than
  ``length.max_prompt_tokens`` (all of them: refused, some: a warning); a set of fewer rows than
  ``eval.prompts`` held-out prompts need; for ``scalectl validate``, every row as the run reads it:
  the duplicates and the prompts too long it drops, the longest prompt, the split sizes;
* the split sizes of ``synthetic:arithmetic``: ``data.train_size`` within what
  ``data.difficulty`` can generate besides the held-out reserve, ``eval.prompts`` within that
  reserve (:func:`scalectl.rl.data.arithmetic.check_sizes`);
* keys that have no effect for this model or data (``model.warm_start_target`` of a model
  that is not built in, ``data.difficulty`` of a prompt file, ...; :data:`NO_EFFECT`), when a
  file of the user's or ``--set`` sets them (not a packaged preset: the default setup sets both
  for its own model and data): a warning each.

``builtin:tiny`` with a prompt file is refused by :func:`scalectl.recipe.load.check_sources`,
which :func:`scalectl.recipe.load.load` runs with ``check_files``.  Only what the tokenizer
needs is imported (transformers, for a checkpoint folder); the project's own model and the
synthetic prompts themselves are not re-checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from scalectl.errors import UserError

#: Rows of a prompt file read before the run.
FIRST_ROWS = 32
#: Files that hold a tokenizer in a ``save_pretrained`` folder (one is enough).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.tiktoken")
#: How to warm-start a model of one's own (the docs' section).
OWN_MODEL_DOCS = 'docs/real-data.md, "Your own model"'
#: (key, whether it has no effect for a recipe, why): keys a layer may set that this model or data ignores.
NO_EFFECT = (
    ("model.warm_start_target", lambda r: not r.model.path.startswith("builtin:"),
     f"only builtin: models are warm-started here; warm-start your own by a supervised stage first ({OWN_MODEL_DOCS})"),
    ("model.warm_start_greedy", lambda r: not r.model.path.startswith("builtin:"),
     f"only builtin: models are warm-started here; warm-start your own by a supervised stage first ({OWN_MODEL_DOCS})"),
    ("model.warm_start_smoothing", lambda r: not r.model.path.startswith("builtin:"),
     f"only builtin: models are warm-started here; warm-start your own by a supervised stage first ({OWN_MODEL_DOCS})"),
    ("data.difficulty", lambda r: r.data.source != "synthetic:arithmetic",
     "it sets the level of synthetic:arithmetic, not of a prompt file"),
    ("data.prompt_key", lambda r: r.data.source.startswith("synthetic:"), "generated prompts have no columns"),
    ("data.answer_key", lambda r: r.data.source.startswith("synthetic:"), "generated prompts have no columns"),
    ("data.split", lambda r: not r.data.source.startswith("hf:"), "only hf: datasets have splits"),
    ("data.subset", lambda r: not r.data.source.startswith("hf:"), "only hf: datasets have subsets"),
)


@dataclass
class Inputs:
    """What :func:`check_inputs` found.

    Attributes:
        problems: reasons the run would fail at start (empty: none found).
        warnings: what the run would ignore or drop.
        lines: what was checked, one line each (for the dry run).
    """

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    #: The model's embedding rows (``config.json`` ``vocab_size``), when known.
    embedding_rows: int | None = None
    #: The whole prompt set as the run reads it (``whole_set``): what it keeps and drops.
    prompt_set: str | None = None

    def raise_problems(self) -> None:
        """Raises UserError with every problem, one per line, when there is any."""
        if self.problems:
            raise UserError("the run would fail at start:\n  " + "\n  ".join(self.problems))


def _packaged(origin: str) -> bool:
    """Whether ``origin`` (where a key was set) is a preset shipped with scalectl (its file, or the
    checkout's link to it): a key the user did not set."""
    from scalectl import presets

    if origin.startswith("--set"):
        return False
    try:
        return Path(origin).resolve().is_relative_to(presets.root().resolve())
    except OSError:
        return False


def no_effect_warnings(recipe, origins: dict[str, str]) -> list[str]:
    """A warning for each key of :data:`NO_EFFECT` that the user sets (``origins``: where each key
    was set, :func:`scalectl.recipe.load.load`: a ``--set`` or a file of theirs, not a packaged
    preset such as the default setup, which sets ``data.difficulty`` and ``model.warm_start_target``
    for its own model and data) and that has no effect for ``recipe``."""
    out = []
    data = recipe.to_dict()
    for key, idle, why in NO_EFFECT:
        if key in origins and not _packaged(origins[key]) and idle(recipe):
            section, name = key.split(".")
            out.append(f"{key} = {data[section][name]!r} (from {origins[key]}) has no effect for model.path = "
                       f"{recipe.model.path!r} and data.source = {recipe.data.source!r}: {why}")
    return out


def check_tokenizer(recipe, found: Inputs):
    """The tokenizer of a checkpoint folder in ``model.path``, checked (problems into ``found``);
    None when it cannot be used, or the path is not a folder here."""
    folder = Path(recipe.model.path).expanduser()
    if not (folder / "config.json").is_file():
        return None
    where = f"model.path = {recipe.model.path!r}"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
        found.problems.append(f"{where}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); save the "
                              f"tokenizer beside the model (tokenizer.save_pretrained({str(folder)!r}))")
        return None
    from scalectl.rl.data.splits import policy_tokenizer
    from scalectl.rl.policy.model import generation_config_of, stop_token_ids

    try:
        tokenizer = policy_tokenizer(recipe.model)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad folder
        found.problems.append(f"{where}: the tokenizer does not load ({type(exc).__name__}: {exc})")
        return None
    config = json.loads((folder / "config.json").read_text())
    rows = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    found.embedding_rows = rows if isinstance(rows, int) else None
    try:
        stops = stop_token_ids(tokenizer, generation_config_of(folder))
    except ValueError:
        found.problems.append(f"{where}: neither the tokenizer nor generation_config.json names an EOS token, "
                              "which ends completions")
        stops = []
    beyond = [t for t in stops if found.embedding_rows is not None and t >= found.embedding_rows]
    if beyond:
        found.problems.append(f"{where}: EOS id {beyond[0]} is past the model's {found.embedding_rows} embedding "
                              "rows (config.json vocab_size): the tokenizer is not this model's")
    if recipe.model.chat_template and not getattr(tokenizer, "chat_template", None):
        found.problems.append(f"model.chat_template = true, but the tokenizer of {where} has no chat template "
                              "(no chat_template in tokenizer_config.json, no chat_template.jinja): set "
                              "model.chat_template = false, or give the tokenizer a template")
    found.lines.append(f"tokenizer of {recipe.model.path}: {type(tokenizer).__name__}, {len(tokenizer)} ids"
                       + (", chat template" if getattr(tokenizer, "chat_template", None) else ""))
    return tokenizer


def first_rows(source: str, n: int = FIRST_ROWS) -> tuple[list[dict], int | None]:
    """The first ``n`` rows of a ``.jsonl``, ``.json`` or ``.parquet`` prompt file, and how many rows it
    has (None when only reading it all would tell: a JSON-lines file over 64 MiB).

    Raises:
        UserError: a file that cannot be read as such (naming the line or the reason).
    """
    path = Path(source).expanduser()
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
            batch = next(pf.iter_batches(batch_size=n), None)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise UserError(f"data.source = {source!r}: not a readable parquet file ({exc})") from None
        return ([] if batch is None else batch.to_pylist()), pf.metadata.num_rows
    if path.suffix.lower() == ".json" and path.read_text(encoding="utf-8").lstrip().startswith("["):
        from scalectl.rl.data.files import read_rows

        rows = read_rows(source)
        return rows[:n], len(rows)
    rows, total = [], 0
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            total += 1
            if len(rows) < n:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{source}:{number}: invalid JSON line ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise UserError(f"{source}: row {len(rows)} is a {type(row).__name__}, not a JSON object")
                rows.append(row)
            elif path.stat().st_size > 64 << 20:
                return rows, None
    return rows, total


def count_prompts(recipe, tokenizer, found: Inputs) -> None:
    """Read the whole prompt file as the run reads it (:func:`scalectl.rl.data.splits.load_prompt_sets`):
    the rows, duplicates and prompts longer than ``length.max_prompt_tokens`` dropped, the split
    sizes, into ``found.prompt_set``; prompts dropped for their length a warning, a set the run
    could not split a problem."""
    from scalectl.rl.data.splits import load_prompt_sets

    said: list[str] = []
    try:
        load_prompt_sets(recipe, tokenizer, log=said.append)
    except UserError as exc:
        found.problems.append(str(exc))
        return
    found.prompt_set = said[-1] if said else None
    if found.prompt_set and " 0 longer than " not in found.prompt_set:
        found.warnings.append(f"{found.prompt_set}: the run drops the prompts longer than length.max_prompt_tokens "
                              f"= {recipe.length.max_prompt_tokens}")


def check_rows(recipe, tokenizer, found: Inputs, whole_set: bool = False) -> None:
    """The first rows of a prompt file (:func:`first_rows`): prompt and answer columns, rendering,
    tokens, lengths, and the set's size against ``eval.prompts`` (problems into ``found``); with
    ``whole_set``, then every row (:func:`count_prompts`)."""
    from scalectl.rl.data.files import render_prompt, to_record
    from scalectl.rl.policy.model import encode_prompts

    d, source = recipe.data, recipe.data.source
    try:
        rows, total = first_rows(source)
        records = [to_record(r, i, prompt_key=d.prompt_key, answer_key=d.answer_key, source=source)
                   for i, r in enumerate(rows)]
        template = recipe.model.chat_template and bool(getattr(tokenizer, "chat_template", None))  # else said
        texts = [render_prompt(r.messages, tokenizer=tokenizer, chat_template=template,
                               answer_format=recipe.reward.format, instruction=recipe.reward.instruction)
                 for r in records]
    except UserError as exc:
        found.problems.append(str(exc))
        return
    if total is not None and total <= recipe.eval.prompts:
        found.problems.append(f"eval.prompts = {recipe.eval.prompts} held-out prompts need a prompt set of more "
                              f"than {recipe.eval.prompts} prompts; data.source = {source!r} has {total} rows")
    if tokenizer is None or not texts:
        found.lines.append(f"data {source}: first {len(rows)} of {total if total is not None else 'its'} rows "
                           "have a prompt and an answer")
        return
    try:
        encoded = encode_prompts(tokenizer, texts)
    except ValueError as exc:               # a prompt of no token: not this model's tokenizer
        found.problems.append(f"{exc} (model.path = {recipe.model.path!r}: is its tokenizer the model's?)")
        return
    lengths, top = [len(ids) for ids in encoded], max(max(ids) for ids in encoded)
    if found.embedding_rows is not None and top >= found.embedding_rows:
        found.problems.append(f"data.source = {source!r}: its prompts encode to token id {top}, past the model's "
                              f"{found.embedding_rows} embedding rows (config.json vocab_size): the tokenizer of "
                              f"model.path = {recipe.model.path!r} is not its model's")
    limit = recipe.length.max_prompt_tokens
    long = sum(n > limit for n in lengths)
    if long == len(lengths):
        found.problems.append(f"data.source = {source!r}: each of its first {len(lengths)} prompts is longer than "
                              f"length.max_prompt_tokens = {limit} as the tokenizer encodes them (shortest "
                              f"{min(lengths)} tokens): the run would drop them all; raise length.max_prompt_tokens")
    elif long and not whole_set:          # the whole set's count says it for every row
        found.warnings.append(f"{long} of the first {len(lengths)} prompts of {source} are longer than "
                              f"length.max_prompt_tokens = {limit} tokens: the run drops such prompts")
    found.lines.append(f"data {source}: first {len(rows)} of {total if total is not None else 'its'} rows have a "
                       f"prompt and an answer; prompts {min(lengths)}-{max(lengths)} tokens, {long} longer than {limit}")
    if whole_set and not found.problems:
        count_prompts(recipe, tokenizer, found)


def check_inputs(recipe, origins: dict[str, str] | None = None, whole_set: bool = False) -> Inputs:
    """Check the model's tokenizer and the first rows of the prompt set (the module docstring).

    Args:
        recipe: a :class:`scalectl.recipe.schema.Recipe` loaded with ``check_files``.
        origins: where each key was set (:func:`scalectl.recipe.load.load`), for the warnings about
            keys without effect; None: no such warnings.
        whole_set: also read every row of a prompt file as the run does (``scalectl validate``):
            how many prompts the length limit drops (:func:`count_prompts`).

    Returns:
        :class:`Inputs`; ``raise_problems()`` refuses the run.
    """
    found = Inputs()
    if origins is not None:
        found.warnings += no_effect_warnings(recipe, origins)
    path, source = recipe.model.path, recipe.data.source
    if source == "synthetic:arithmetic" and not path.startswith("simulated:"):
        from scalectl.rl.data.arithmetic import check_sizes
        from scalectl.rl.data.splits import DEFAULT_SYNTHETIC_TRAIN

        found.problems += check_sizes(recipe.data.train_size or DEFAULT_SYNTHETIC_TRAIN, recipe.eval.prompts,
                                      recipe.data.difficulty, recipe.data.mix, seed=recipe.data.seed)
    if path.startswith(("simulated:", "builtin:")):
        return found            # a simulated curve reads nothing; builtin:tiny takes synthetic prompts only
    tokenizer = check_tokenizer(recipe, found)
    if Path(source).suffix.lower() in (".jsonl", ".json", ".parquet") and Path(source).expanduser().is_file():
        check_rows(recipe, tokenizer, found, whole_set)
    elif source.startswith("hf:"):
        found.lines.append(f"data {source}: read when the run starts (not checked before)")
    return found
