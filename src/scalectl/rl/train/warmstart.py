"""The SFT warm start of the built-in tiny model (``model.path = "builtin:tiny"``).

RL needs a policy that already solves some prompts (a group whose rewards are
all -1 has zero advantage).  A freshly built tiny model solves none, so a short
supervised stage trains it on reference completions (:func:`scalectl.rl.data.arithmetic.sft_target`)
and stops at the first check whose held-out pass rate (mean@k, sampled at
temperature 1 with the CPU engine and scored by :func:`scalectl.rl.reward.checker.check`)
reaches ``model.warm_start_target``.  The SFT pass rate jumps suddenly, so checks
are frequent and cheap (a small held-out subset every few steps).

The warm start of the default setup is **shipped in the package**
(``scalectl/presets/warmstarts/<name>/``: the weights, the tokenizer and ``warmstart.json``
with the settings, the command and commit that made it, and the SHA-256 of every file), so
every machine starts its runs from the same bits: the SFT's arithmetic differs between CPU
kinds (AVX-512 and AVX2 kernels round differently) and its stopping check is noisy, so a warm
start trained on each machine was another policy on each.  A setup whose warm-start settings
(:func:`settings_key`) match a shipped one's uses it, after checking its checksums
(:func:`shipped_warm_start`); ``make warm-start`` rebuilds it (``scripts/build_warm_start.py``).

Any other setting is trained here and cached outside run folders, in
``$SCALECTL_CACHE/models/<key>`` (default ``~/.cache/scalectl/models/<key>``), where the key
hashes everything that determines the weights (model config, task, target, SFT settings,
this module's version, torch's version); every run of the same setup reuses it and a cache
hit costs only a directory check.  It is written to a temporary folder and renamed into
place, so a crash never leaves a half-written cache; a lock file keeps two processes from
training the same key at once.  Deterministic: same key, same weights (on one machine kind
and thread count).

Every run records the warm start it started from (:func:`warm_start_record`: where it came
from, the weights' SHA-256, its SFT steps and check pass rate) in the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from scalectl.rl.policy.model import TINY_CONFIG, build_tiny_model, build_tokenizer, encode_prompt, eos_token_id, pad_token_id, save_policy
from scalectl.rl.policy.logprobs import token_logprobs
from scalectl.rl.data.splits import DEFAULT_SYNTHETIC_TRAIN
from scalectl.rl.evaluation.pass_rate import evaluate
from scalectl.rl.reward.scoring import Scorer
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.data.arithmetic import Problem, eval_problems, sft_target, train_problems

#: Bump when the SFT procedure changes: old cache entries are then ignored.
WARMSTART_VERSION = 1
#: The SFT set: the first this many problems of the training split (fewer when
#: ``data.train_size`` is smaller), so that a larger RL pool starts from the same weights.
SFT_PROBLEMS = DEFAULT_SYNTHETIC_TRAIN
BUILTIN_TINY = "builtin:tiny"


@dataclass(frozen=True)
class SFTConfig:
    """SFT settings (all part of the cache key).

    ``lr``/``warmup_steps``/``batch_size``: AdamW (betas 0.9/0.95, no weight decay),
    linear warm-up then constant.  ``label_smoothing`` (``model.warm_start_smoothing``): the
    cross-entropy's label smoothing (Szegedy et al. 2016), which keeps a share of each
    completion token's probability spread over the vocabulary: the policy then knows more
    answers than it samples (its greedy pass rate well above its sampled one), as a language
    model's pass@k is above its pass@1.  Every ``check_every`` steps, ``check_samples``
    completions for each of the first ``check_prompts`` held-out prompts; stop at
    the first check >= target, or fail after ``max_steps``.
    """

    lr: float = 3e-3
    label_smoothing: float = 0.0
    greedy_target: float | None = None
    warmup_steps: int = 20
    batch_size: int = 64
    check_every: int = 10
    check_prompts: int = 128
    check_samples: int = 4
    max_steps: int = 3000
    seed: int = 0


# ------------------------------------------------------------------------------------ SFT


def sft_batch(problems: list[Problem], tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded (input_ids, attention_mask, target_mask), each (N, L): prompt (with
    BOS), reference completion and EOS; ``target_mask`` (N, L-1) is 1 where the
    predicted token belongs to the completion (EOS included)."""
    seqs, n_prompt = [], []
    for p in problems:
        prompt = encode_prompt(tokenizer, p.prompt)
        completion = tokenizer.encode(sft_target(p.prompt), add_special_tokens=False) + [eos_token_id(tokenizer)]
        seqs.append(prompt + completion)
        n_prompt.append(len(prompt))
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad_token_id(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    target = torch.zeros((len(seqs), L - 1), dtype=torch.float32)
    for r, (s, npr) in enumerate(zip(seqs, n_prompt)):
        ids[r, L - len(s):], mask[r, L - len(s):] = torch.tensor(s), 1
        target[r, L - len(s) + npr - 1:] = 1.0  # targets are tokens 1..L-1
    return ids, mask, target


def sft_loss(model, ids: torch.Tensor, mask: torch.Tensor, tmask: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """The SFT loss: cross-entropy of the completion tokens, averaged over them.

    Args:
        ids, mask: (N, L) left-padded tokens and attention mask (:func:`sft_batch`).
        tmask: (N, L-1) 1 where the predicted token belongs to the completion.
        smoothing: label smoothing epsilon: the target distribution is (1 - epsilon) on the
            token plus epsilon / V on every token of the vocabulary (V entries), so the loss is
            (1 - epsilon) (-log p(token)) + epsilon mean_v (-log p(v)) (torch's
            ``cross_entropy(label_smoothing=...)``).  0: -log p(token), through the RL's own
            log-prob function (:func:`token_logprobs`, fp32 head).

    Returns:
        The scalar loss (nats per completion token).
    """
    if smoothing == 0:
        logp, _ = token_logprobs(model, ids, mask, head_fp32=True, with_entropy=False)
        return -(logp * tmask).sum() / tmask.sum()
    import torch.nn.functional as F

    from scalectl.rl.policy.logprobs import head_logits, position_ids_from_mask

    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                         use_cache=False).last_hidden_state[:, :-1]
    logits = head_logits(model, hidden, head_fp32=True)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none",
                         label_smoothing=smoothing).view_as(tmask)
    return (ce * tmask).sum() / tmask.sum()


def _log(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(msg)


#: A progress line every this many checks (a warm start to 0.45 runs about 90 checks).
LOG_EVERY_CHECKS = 10


def train_sft(model, tokenizer, train: list[Problem], check_set: list[Problem], target: float,
              cfg: SFTConfig, *, max_new_tokens: int, log=_log) -> dict:
    """Supervised fine-tuning until the held-out pass rate on ``check_set`` reaches ``target``.

    Cross-entropy on the completion tokens, with the same log-prob function as RL
    (:func:`token_logprobs`, fp32 head).  Checks every ``cfg.check_every`` steps
    (and before the first step); ``log`` gets every :data:`LOG_EVERY_CHECKS`-th check.

    Returns:
        {"steps", "pass_rate" (of the stopping check), "seconds", "history": [(step, loss, pass_rate)]}.

    Raises:
        RuntimeError: target not reached within ``cfg.max_steps``.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    engine = CPURolloutEngine(model, tokenizer, head_fp32=True)
    history, t0, loss_val = [], time.perf_counter(), float("nan")
    greedy = cfg.greedy_target is not None
    goal, kind = (cfg.greedy_target, "greedy") if greedy else (target, "held-out")
    for step in range(cfg.max_steps + 1):
        if step % cfg.check_every == 0:
            model.eval()
            rate = check_pass_rate(engine, check_set, cfg, max_new_tokens, seed=cfg.seed + step, greedy=greedy)
            history.append((step, loss_val, rate))
            if step % (LOG_EVERY_CHECKS * cfg.check_every) == 0:   # every check is in the history
                trained = f"loss {loss_val:.3f}" if step else "before training"
                log(f"[dim]warm start[/] step {step:5d}  {trained}  {kind} pass rate "
                    f"{rate:.3f} (target {goal})  {time.perf_counter() - t0:.0f}s")
            if rate >= goal:
                done = {"steps": step, "pass_rate": rate, "seconds": time.perf_counter() - t0, "history": history}
                if greedy:
                    scale, sampled = flatten_head(model, engine, check_set, target, cfg, max_new_tokens)
                    log(f"[dim]warm start[/] greedy pass rate {rate:.3f} at step {step}; LM head scaled by "
                        f"{scale:.4f}: sampled pass rate {sampled:.3f} (target {target})")
                    done.update(greedy_pass_rate=rate, head_scale=scale, pass_rate=sampled,
                                seconds=time.perf_counter() - t0)
                return done
        if step == cfg.max_steps:
            break
        model.train()
        idx = torch.randint(len(train), (cfg.batch_size,), generator=gen).tolist()
        ids, mask, tmask = sft_batch([train[i] for i in idx], tokenizer)
        loss = sft_loss(model, ids, mask, tmask, cfg.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
    model.eval()
    raise RuntimeError(
        f"warm start: {kind} pass rate {history[-1][2]:.3f} after {cfg.max_steps} SFT steps, below "
        f"{'model.warm_start_greedy' if greedy else 'model.warm_start_target'} = {goal}; lower it or the data.difficulty"
    )


#: Top-p of a greedy check: only the most likely token survives the nucleus (ties aside).
GREEDY_TOP_P = 1e-6
#: Bisection steps of :func:`flatten_head` (the scale to 2^-12 of its range).
FLATTEN_STEPS = 12


def check_pass_rate(engine, check_set: list[Problem], cfg: SFTConfig, max_new_tokens: int, *, seed: int,
                    greedy: bool = False) -> float:
    """The warm start's check: mean@``cfg.check_samples`` at temperature 1 of ``check_set``
    (scored by the built-in checker), or with ``greedy`` one completion per prompt of the most
    likely tokens (top-p :data:`GREEDY_TOP_P`)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, top_p=GREEDY_TOP_P if greedy else 1.0)
    return evaluate(engine, check_set, params, samples_per_prompt=1 if greedy else cfg.check_samples,
                    seed=seed, score=Scorer(), chunk_prompts=len(check_set), seed_prompts=None)["pass_rate"]


def flatten_head(model, engine, check_set: list[Problem], target: float, cfg: SFTConfig,
                 max_new_tokens: int) -> tuple[float, float]:
    """Scale the LM head's weights (untied from the embeddings) by s in (0, 1] so that the sampled
    check pass rate (:func:`check_pass_rate`, one fixed seed) is at most ``target``: the logits
    W h become s W h, as sampling at temperature 1/s, the most likely token unchanged.  s is the
    largest such scale found by :data:`FLATTEN_STEPS` steps of bisection.

    Returns:
        (s, the sampled check pass rate at s).

    Raises:
        ValueError: the model ties its LM head to its embeddings (scaling it would scale them).
    """
    if getattr(model.config, "tie_word_embeddings", False):
        raise ValueError("flatten_head needs an LM head untied from the embeddings")
    weight = model.lm_head.weight
    original = weight.detach().clone()
    lo, hi, best = 0.0, 1.0, None
    for _ in range(FLATTEN_STEPS):
        mid = (lo + hi) / 2
        with torch.no_grad():
            weight.copy_(original * mid)
        rate = check_pass_rate(engine, check_set, cfg, max_new_tokens, seed=cfg.seed)
        if rate > target:
            hi = mid
        else:
            lo, best = mid, (mid, rate)
    if best is None:                       # every scale tried samples above the target: the smallest
        best = (mid, rate)
    with torch.no_grad():
        weight.copy_(original * best[0])
    return best


# ------------------------------------------------------------------------------------ cache


def cache_root() -> Path:
    """``$SCALECTL_CACHE`` or ``~/.cache/scalectl``; warm starts live in its ``models/``."""
    return Path(os.environ.get("SCALECTL_CACHE") or Path.home() / ".cache" / "scalectl")


def _settings(model_overrides: dict, difficulty: int, data_seed: int, train_size: int, target: float,
              max_new_tokens: int, sft: SFTConfig, mix: dict | None = None) -> dict:
    task = ["arithmetic", difficulty, data_seed, train_size]     # the SFT set: data.difficulty alone
    settings = dataclasses.asdict(sft)
    for key in ("label_smoothing", "greedy_target"):   # unset, they keep the keys made before them
        if not settings[key]:
            del settings[key]
    return {"version": WARMSTART_VERSION, "arch": {**TINY_CONFIG, **model_overrides},
            "tokenizer": len(build_tokenizer()), "task": task,
            "target": target, "max_new_tokens": max_new_tokens, "sft": settings}


def settings_key(model_overrides: dict, difficulty: int, data_seed: int, train_size: int, target: float,
                 max_new_tokens: int, sft: SFTConfig, mix: dict | None = None) -> str:
    """16 hex digits of SHA-256 over the settings that define a warm start (model config, task,
    target, SFT settings, this module's version): a shipped warm start serves every setup whose
    settings key is its own, whatever the machine or the torch release."""
    blob = json.dumps(_settings(model_overrides, difficulty, data_seed, train_size, target, max_new_tokens, sft, mix),
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_key(model_overrides: dict, difficulty: int, data_seed: int, train_size: int, target: float,
              max_new_tokens: int, sft: SFTConfig, mix: dict | None = None) -> str:
    """16 hex digits of SHA-256 over everything that determines the weights of a warm start
    trained here: :func:`settings_key`'s settings and torch's version."""
    blob = json.dumps({**_settings(model_overrides, difficulty, data_seed, train_size, target, max_new_tokens, sft, mix),
                       "torch": torch.__version__.split("+")[0]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------ shipped


#: The files of a warm start's folder whose SHA-256 ``warmstart.json`` records (``files``).
CHECKED_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")


def shipped_root() -> Path:
    """The package's folder of shipped warm starts (``scalectl/presets/warmstarts``)."""
    import importlib.resources

    return Path(str(importlib.resources.files("scalectl.presets") / "warmstarts"))


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_folder(folder: Path, meta: dict) -> None:
    """Check every file ``meta["files"]`` lists (name -> SHA-256) against its bytes in ``folder``.

    Raises:
        UserError: a file missing or whose SHA-256 differs, naming it and both sums, and how to
            rebuild the warm start.
    """
    from scalectl.errors import UserError

    files = meta.get("files") or {}
    if not files:
        raise UserError(f"{folder / 'warmstart.json'}: no checksums (key 'files'); rebuild it with `make warm-start`")
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise UserError(f"{path}: missing from the warm start (warmstart.json lists it); "
                            "reinstall scalectl or rebuild it with `make warm-start`")
        got = file_sha256(path)
        if got != expected:
            raise UserError(f"{path}: SHA-256 {got} is not the {expected} that warmstart.json records: the "
                            "warm start is damaged or was changed; reinstall scalectl or rebuild it with "
                            "`make warm-start`")


def shipped_warm_start(key: str, root: Path | None = None) -> Path | None:
    """The shipped warm start whose settings key is ``key`` (:func:`settings_key`), its checksums
    verified, or None when none is shipped for it.

    Raises:
        UserError: the shipped folder fails its checksums (:func:`verify_folder`) or its
            ``warmstart.json`` does not parse.
    """
    from scalectl.errors import UserError

    root = shipped_root() if root is None else Path(root)
    if not root.is_dir():
        return None
    for meta_path in sorted(root.glob("*/warmstart.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{meta_path}: not a readable warm-start description ({exc})") from None
        if meta.get("settings_key") == key:
            verify_folder(meta_path.parent, meta)
            return meta_path.parent
    return None


def save_shipped(folder: str | Path, model, tokenizer, meta: dict, key: str, provenance: dict) -> Path:
    """Write a warm start to ship in the package: the ``save_pretrained`` folder and its
    ``warmstart.json`` (``meta`` of :func:`train_warm_start` without its history, the
    ``settings_key`` ``key``, ``provenance`` (the command, commit, machine that made it) and
    the SHA-256 of every file of :data:`CHECKED_FILES`).  Written beside ``folder`` and renamed
    into place: an interrupted build leaves the old one.

    Returns:
        The folder.
    """
    folder = Path(folder)
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(model, tokenizer, tmp)
    for extra in tmp.iterdir():           # only what a run loads and the checksums cover
        if extra.name not in CHECKED_FILES:
            extra.unlink()
    files = {name: file_sha256(tmp / name) for name in CHECKED_FILES}
    history = meta.get("history") or []
    described = {k: v for k, v in meta.items() if k != "history"}
    first = [None if isinstance(x, float) and x != x else x for x in history[0]] if history else None   # NaN: null
    described.update(settings_key=key, files=files, provenance=provenance, checks=len(history), first_check=first)
    (tmp / "warmstart.json").write_text(json.dumps(described, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def warm_start_record(path: str | Path) -> dict:
    """What a run records of the checkpoint it started from (the store's ``runs.warm_start``).

    Returns:
        ``{"source": "shipped" | "trained" | "checkpoint", "path", "sha256"}`` (the SHA-256 of
        ``model.safetensors``, None where the folder has none) and, for a warm start, its
        ``name`` (shipped), ``key``, SFT ``steps`` and check ``pass_rate``.
    """
    path = Path(path)
    weights = path / "model.safetensors"
    record = {"source": "checkpoint", "path": str(path),
              "sha256": file_sha256(weights) if weights.is_file() else None}
    meta_path = path / "warmstart.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        shipped = "settings_key" in meta and "files" in meta
        record.update(source="shipped" if shipped else "trained",
                      key=meta.get("settings_key") if shipped else meta.get("key"),
                      steps=meta.get("steps"), pass_rate=meta.get("pass_rate"))
        if shipped:
            record["name"] = path.name
    return record


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_warm_start(recipe=None, *, model_cfg=None, data_cfg=None, max_new_tokens: int | None = None,
                      cache_dir: str | Path | None = None, sft: SFTConfig = SFTConfig(),
                      model_overrides: dict | None = None, log=_log) -> Path:
    """The checkpoint folder a run starts from.

    For ``model.path == "builtin:tiny"``: the cached SFT warm start of the tiny model
    on the run's synthetic task, trained (once per key) until the held-out pass rate
    reaches ``model.warm_start_target``.  For any other path: that path.

    The warm start depends only on the setup (model, data, ``length.max_new_tokens``),
    never on the recipe's training choices, so that every variant of an ablation starts
    from the same weights.  It trains on the first ``min(data.train_size, SFT_PROBLEMS)``
    problems of the training split (the split is prefix-stable), so pools of 4,000
    prompts or more share one warm start; ``model.warm_start_problems`` sets another size
    (:func:`sft_set_size`).  Its checks sample without interruption.

    Args:
        recipe: a :class:`~scalectl.recipe.schema.Recipe`; or give ``model_cfg``, ``data_cfg`` and
            ``max_new_tokens`` (its ``model`` and ``data`` sections and ``length.max_new_tokens``).
        cache_dir: where the warm starts live; default :func:`cache_root` ``/ "models"``.
        sft: SFT settings.
        model_overrides: ``Qwen2Config`` fields over :data:`TINY_CONFIG`.
        log: progress messages (rich markup); default: stderr.

    Returns:
        The folder (``save_pretrained`` layout, plus ``warmstart.json`` with the
        pass rate reached, steps and wall time): the shipped one when its settings are these
        (:func:`shipped_warm_start`; not with an explicit ``cache_dir``), else the cached one.

    Raises:
        UserError: the shipped warm start for these settings fails its checksums.
        FileNotFoundError: a non-builtin path that does not exist.
        ValueError: builtin model with a data source other than ``synthetic:arithmetic``,
            or neither a recipe nor the three sections.
        RuntimeError: the target was not reached (see :func:`train_sft`).
    """
    if recipe is not None:
        model_cfg, data_cfg, max_new_tokens = recipe.model, recipe.data, recipe.length.max_new_tokens
    if model_cfg is None or data_cfg is None or max_new_tokens is None:
        raise ValueError("ensure_warm_start needs a recipe, or model_cfg, data_cfg and max_new_tokens")
    if model_cfg.path != BUILTIN_TINY:
        path = Path(model_cfg.path).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"model.path = {model_cfg.path!r}: no checkpoint folder there")
        return path
    if data_cfg.source != "synthetic:arithmetic":
        raise ValueError(
            f"model.path = {BUILTIN_TINY!r} is warm-started on data.source = 'synthetic:arithmetic' only, "
            f"got {data_cfg.source!r}; give a checkpoint folder in model.path instead"
        )
    overrides = dict(model_overrides or {})
    sft = sft_settings(model_cfg, sft)
    train_size = sft_set_size(model_cfg, data_cfg)
    target = model_cfg.warm_start_target
    settings = (overrides, data_cfg.difficulty, data_cfg.seed, train_size, target, max_new_tokens, sft,
                dict(getattr(data_cfg, "mix", None) or {}))
    if cache_dir is None and (shipped := shipped_warm_start(settings_key(*settings))) is not None:
        return shipped
    key = cache_key(*settings)
    models = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    final = models / key
    if (final / "warmstart.json").is_file():
        return final
    with _locked(models / f".{key}.lock"):
        if (final / "warmstart.json").is_file():  # another process finished it meanwhile
            return final
        log(f"[bold]warm start[/] {key}: SFT of the tiny model to held-out pass rate {target} "
            f"(difficulty {data_cfg.difficulty}); cached in {final}")
        model, tokenizer, meta = train_warm_start(*settings, log=log)
        meta = {"key": key, **meta}
        tmp = models / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_policy(model, tokenizer, tmp)
        (tmp / "warmstart.json").write_text(json.dumps(meta, indent=1))
        shutil.rmtree(final, ignore_errors=True)  # a folder without warmstart.json is not a cache entry
        os.replace(tmp, final)
        log(f"[bold]warm start[/] done: pass rate {meta['pass_rate']:.3f} after {meta['steps']} steps "
            f"({meta['seconds']:.0f}s)")
        return final


def sft_set_size(model_cfg, data_cfg) -> int:
    """How many problems the SFT set holds: ``model.warm_start_problems`` when set, else the
    first ``min(data.train_size, SFT_PROBLEMS)`` (a larger RL pool shares the warm start).  The
    set is a prefix of the level's training split, so it never meets the held-out split."""
    if getattr(model_cfg, "warm_start_problems", None):
        return int(model_cfg.warm_start_problems)
    return min(data_cfg.train_size or DEFAULT_SYNTHETIC_TRAIN, SFT_PROBLEMS)


#: Steps between two greedy checks, and the most SFT steps, of a greedy warm start: it runs to a
#: higher pass rate, for longer.
GREEDY_CHECK_EVERY, GREEDY_MAX_STEPS = 50, 8000


def sft_settings(model_cfg, sft: SFTConfig = SFTConfig()) -> SFTConfig:
    """``sft`` with what the recipe's ``model`` section sets of it: ``warm_start_smoothing``
    (label smoothing) and ``warm_start_greedy`` (the greedy target, checked every
    :data:`GREEDY_CHECK_EVERY` steps)."""
    if getattr(model_cfg, "warm_start_smoothing", 0.0):
        sft = dataclasses.replace(sft, label_smoothing=model_cfg.warm_start_smoothing)
    if getattr(model_cfg, "warm_start_greedy", None) is not None:
        sft = dataclasses.replace(sft, greedy_target=model_cfg.warm_start_greedy, check_every=GREEDY_CHECK_EVERY,
                                  max_steps=GREEDY_MAX_STEPS)
    return sft


def train_warm_start(model_overrides: dict, difficulty: int, data_seed: int, train_size: int, target: float,
                     max_new_tokens: int, sft: SFTConfig, mix: dict | None = None, *, log=_log):
    """Build the tiny model and SFT it to ``target`` (:func:`train_sft`) on the first
    ``train_size`` problems of the arithmetic training split at ``difficulty``.  The levels
    ``data.mix`` adds (``mix``) are not in the SFT set nor in its checks: the warm start knows the
    setup's own level, and meets the mixed-in ones first in RL (the default setup's level 8 needs
    more tokens than a rollout gets); ``mix`` is recorded in its description only.

    Returns:
        (model, tokenizer, meta): ``meta`` describes it for ``warmstart.json`` (the settings,
        SFT steps, check pass rate, wall time, history, python and torch versions).

    Raises:
        RuntimeError: the target was not reached (see :func:`train_sft`).
    """
    tokenizer = build_tokenizer()
    model = build_tiny_model(seed=sft.seed, **model_overrides)
    train = train_problems(train_size, seed=data_seed, difficulty=difficulty)
    check_set = eval_problems(sft.check_prompts, seed=data_seed, difficulty=difficulty)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sft.seed)
        result = train_sft(model, tokenizer, train, check_set, target, sft, max_new_tokens=max_new_tokens, log=log)
    meta = {"target": target, "difficulty": difficulty, "mix": {str(k): v for k, v in (mix or {}).items()},
            "data_seed": data_seed,
            "train_size": train_size, "max_new_tokens": max_new_tokens, "sft": dataclasses.asdict(sft),
            "model_overrides": dict(model_overrides), "steps": result["steps"], "pass_rate": result["pass_rate"],
            "seconds": round(result["seconds"], 1), "history": result["history"],
            "python": sys.version.split()[0], "torch": torch.__version__,
            **{k: result[k] for k in ("greedy_pass_rate", "head_scale") if k in result}}
    return model, tokenizer, meta
