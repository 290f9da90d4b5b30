"""The Recipe: every axis of an RL run, validated.

A run is described by two TOML files merged into one :class:`Recipe`:

* a **recipe** (``recipes/*.toml``) says *how to train*: loss, clipping, loss
  aggregation, advantage normalization, LM-head precision, asynchrony, prompt
  filters, length control, optimiser, evaluation protocol;
* a **setup** (``setups/*.toml``) says *where and how big*: model, prompt set,
  hardware, launcher, budget, and the scale-dependent numbers (batch size,
  token budgets, learning rate, held-out size) that differ between a 1 M
  parameter model on a laptop and an 8B model on 80 GPUs.

The setup is applied on top of the recipe, then ``--set key=value`` overrides
on top of both; the merged dictionary is validated once by pydantic.  Files may
``extends = "other.toml"`` (path relative to the file) to inherit and override.

Formulas and defaults: Khatri et al. 2025, "The Art of Scaling Reinforcement
Learning Compute for LLMs" (ScaleRL, arXiv 2510.13786), sections 3-4 and
appendix A; DAPO (Yu et al. 2025); GSPO (Zheng et al. 2025); MiniMax-M1 (2025).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from scalectl.defaults import TRUNCATION_THRESHOLD
from scalectl.recipe.loss_choices import LOSS_CHOICES
from scalectl.recipe.reward_function import BUILTIN_REWARD, check_name

# --------------------------------------------------------------------------- bounds
# Every number has finite bounds that fit where the value goes; values are strict
# (no "yes" for true, no true for 1, no 1.5 for an integer) and finite (no inf/nan).

#: Seeds: numpy's legacy ``RandomState`` and ``random.seed`` users take 0 .. 2**32 - 1
#: (SQLite's signed 64-bit integer holds them).
SEED_MAX = 2**32 - 1
#: Optimiser steps, evaluation/checkpoint intervals: step numbers are stored as SQLite
#: integers and counted in Python ints; 10**9 steps is far beyond any run.
STEPS_MAX = 10**9
#: Tokens of one prompt or completion (2**20 = 1,048,576): beyond any model's context.
TOKENS_MAX = 2**20
#: Prompts per step: one step's batch is held in memory as token tensors.
PROMPTS_MAX = 65_536
#: Completions per prompt (the group size G) and evaluation samples per prompt (k).
GENERATIONS_MAX = 1024
#: Devices (generators, trainers), Slurm nodes and parallel runs.
DEVICES_MAX = 65_536
#: Compute in any fit axis: 1e30 FLOPs is six orders beyond the largest training runs.
COMPUTE_MAX = 1e30
#: GPU-hours of one run's budget.
GPU_HOURS_MAX = 1e9
#: Characters of a one-line string (paths, names, keys).
LINE_MAX = 4096


def _one_line(text: str) -> str:
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"contains the control character {bad!r}: one line of printable text is allowed")
    return text


#: A one-line string (no newline, tab, NUL or other control character), at most LINE_MAX characters.
Line = Annotated[str, Field(max_length=LINE_MAX), AfterValidator(_one_line)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- how to train


class Loss(_Section):
    """Policy loss (docs/recipe-axes.md, "Loss").

    ``ppo_clip``: per-token min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)
    (PPO/GRPO/DAPO).  ``gspo``: the same clip on the sequence-level ratio
    exp(mean_t log rho) (GSPO; clip values of order 1e-3).  ``cispo``:
    sg(min(rho, clip_high)) A log pi (MiniMax-M1; ``clip_low`` unused).
    Defaults for the clip values depend on ``type``
    (:data:`scalectl.recipe.loss_choices.LOSS_CHOICES`): ppo_clip 0.2/0.28 (DAPO),
    gspo 3e-3/5e-3 (ScaleRL's best), cispo eps_max 5.0.
    """

    type: Literal["ppo_clip", "gspo", "cispo"] = "cispo"
    clip_low: float | None = Field(default=None, gt=0, lt=1, description="epsilon-")
    clip_high: float | None = Field(default=None, gt=0, le=100, description="epsilon+ (CISPO: eps_max)")
    aggregation: Literal["sample", "prompt", "token"] = "prompt"

    @model_validator(mode="after")
    def _fill_clip_defaults(self) -> "Loss":
        choice = LOSS_CHOICES[self.type]
        low = choice.clip_low if self.clip_low is None else self.clip_low
        high = choice.clip_high if self.clip_high is None else self.clip_high
        object.__setattr__(self, "clip_low", low)
        object.__setattr__(self, "clip_high", high)
        return self

    @property
    def ratio_level(self) -> Literal["token", "sequence"]:
        """Where the importance ratio lives: per token, or one per completion (GSPO)."""
        return LOSS_CHOICES[self.type].ratio_level  # type: ignore[return-value]


class Advantage(_Section):
    """Group-centred advantage a_i = r_i - mean_group(r), then divided by the
    group's std (``prompt``, GRPO), the batch std (``batch``, ScaleRL) or
    nothing (``none``, Dr. GRPO)."""

    normalization: Literal["prompt", "batch", "none"] = "batch"


class Precision(_Section):
    """``lm_head = "fp32"`` computes the final projection and log-softmax in
    float32 in both the rollout engine and the trainer (ScaleRL section 3.2:
    ceiling 0.52 -> 0.61); ``bf16`` keeps the model dtype."""

    lm_head: Literal["fp32", "bf16"] = "fp32"


class Async(_Section):
    """Asynchrony between generation and training (docs/recipe-axes.md, "Asynchrony").

    ``sync``: on-policy, one batch then one step.  ``ppo_off_policy``: generate
    k batches with one policy, then take k optimiser steps.  ``pipeline``
    (PipelineRL-k): generators stream, trainers push weights after every step
    and wait when more than k steps ahead of the oldest data.
    """

    mode: Literal["sync", "ppo_off_policy", "pipeline"] = "pipeline"
    k: int = Field(default=8, ge=1, le=1024)


class Filter(_Section):
    """Prompt filtering (docs/recipe-axes.md, "Prompt filtering").

    ``zero_variance``: groups whose rewards are all equal are dropped from the
    batch, not replaced.  ``dynamic_sampling`` (DAPO): drop them and draw more
    prompts, at most ``max_refill_rounds`` extra rounds per step.
    ``retire_solved`` (ScaleRL's No-Positive-Resampling): a prompt whose pass
    rate reaches ``retire_threshold`` is never sampled again; ``retire_rule``
    says whether that is the latest epoch's rate or the cumulative one.
    """

    zero_variance: bool = True
    dynamic_sampling: bool = False
    max_refill_rounds: int = Field(default=4, ge=1, le=1000)
    retire_solved: bool = False
    retire_threshold: float = Field(default=0.9, gt=0, le=1)
    retire_rule: Literal["latest", "cumulative"] = "latest"


class Length(_Section):
    """Generation length and its control (docs/recipe-axes.md, "Length control").

    ``max_new_tokens`` caps every completion (tokens); a completion that hits
    it is truncated and counts in the truncation rate.  ``interrupt``: at a
    length drawn uniformly from [interrupt_min, interrupt_max] the
    ``interrupt_phrase`` is appended and the model answers within the cap.
    ``penalty``: DAPO overlong shaping with L_max = ``penalty_max`` (defaults
    to ``max_new_tokens``) and L_cache = ``penalty_cache``.
    """

    max_new_tokens: int = Field(default=14336, ge=1, le=TOKENS_MAX)
    max_prompt_tokens: int = Field(default=2048, ge=1, le=TOKENS_MAX)
    control: Literal["interrupt", "penalty", "none"] = "interrupt"
    interrupt_min: int = Field(default=10000, ge=1, le=TOKENS_MAX)
    interrupt_max: int = Field(default=12000, ge=1, le=TOKENS_MAX)
    interrupt_phrase: str = Field(
        default="Okay, time is up. Let me stop thinking and formulate a final answer now. </think>",
        max_length=LINE_MAX)
    penalty_max: int | None = Field(default=None, ge=1, le=TOKENS_MAX)
    penalty_cache: int = Field(default=2048, ge=1, le=TOKENS_MAX)

    @model_validator(mode="after")
    def _check_ranges(self) -> "Length":
        if self.interrupt_min > self.interrupt_max:
            raise ValueError(
                f"interrupt_min ({self.interrupt_min}) must be <= interrupt_max ({self.interrupt_max})"
            )
        if self.control == "interrupt" and self.interrupt_max >= self.max_new_tokens:
            raise ValueError(
                f"interrupt_max ({self.interrupt_max}) must be < max_new_tokens "
                f"({self.max_new_tokens}) to leave room for the answer"
            )
        lmax = self.penalty_max if self.penalty_max is not None else self.max_new_tokens
        if self.control == "penalty" and self.penalty_cache >= lmax:
            raise ValueError(f"penalty_cache ({self.penalty_cache}) must be < penalty_max ({lmax})")
        return self


class Batch(_Section):
    """Prompts per optimiser step x generations (the group size G) per prompt.
    ScaleRL: 48 x 16 = 768 completions per step."""

    prompts_per_step: int = Field(default=48, ge=1, le=PROMPTS_MAX)
    generations_per_prompt: int = Field(default=16, ge=2, le=GENERATIONS_MAX)
    micro_batch_size: int = Field(default=64, ge=1, le=PROMPTS_MAX,
                                  description="completions per forward/backward")


class Optim(_Section):
    """AdamW with a constant learning rate after linear warm-up (ScaleRL appendix
    A.3: lr 5e-7, 100 warm-up steps, eps 1e-15, weight decay 0.01)."""

    lr: float = Field(default=5e-7, gt=0, le=1)
    warmup_steps: int = Field(default=100, ge=0, le=STEPS_MAX)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.999, ge=0, lt=1)
    eps: float = Field(default=1e-15, gt=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    grad_clip: float | None = Field(default=1.0, gt=0, le=1e6)


class Sampling(_Section):
    """Rollout sampling: temperature 1 and no top-p/top-k, so the generator's
    recorded log-probs are those of the policy itself."""

    temperature: float = Field(default=1.0, gt=0, le=100)
    top_p: float = Field(default=1.0, gt=0, le=1)


class Eval(_Section):
    """Evaluation protocol (docs/method.md, section 5): before the first step and
    every ``every_steps`` steps, ``samples_per_prompt`` completions (k) for each
    of ``prompts`` held-out prompts; the pass rate is mean@k."""

    every_steps: int = Field(default=100, ge=1, le=STEPS_MAX)
    prompts: int = Field(default=1000, ge=1, le=10**6)
    samples_per_prompt: int = Field(default=16, ge=1, le=GENERATIONS_MAX)
    temperature: float = Field(default=1.0, gt=0, le=100)
    background: Literal["auto", "on", "off"] = Field(default="auto", description=(
        "evaluate on a copy of the weights in a thread while training goes on (scalectl.rl.evaluation.during_training): "
        "auto = on in a pipeline's trainer process with the CPU engine on CPUs; the points are the same "
        "either way, so speed only, not part of the content hash"))


class Reward(_Section):
    """How a completion is scored (docs/rewards.md): by the built-in math checker (the last
    ``\\boxed{}``, or another answer ``format``, checked by math-verify: +1 right, -1 wrong),
    or by a function of the user's, named as ``package.module:callable`` and called in every
    process that scores (generators of every async mode, evaluation) as
    ``function(completion, gold, fields)``, returning a float reward (right, for the pass
    rate, when > 0) or a :class:`scalectl.rl.reward.score.Score`.  Part of the content hash
    by ``function`` and ``version``, never by the function's code."""

    function: Annotated[Line, AfterValidator(check_name)] = Field(default=BUILTIN_REWARD, description=(
        "the reward function, 'package.module:callable', found on PYTHONPATH, among the installed packages "
        f"or in the current folder; default the built-in checker, {BUILTIN_REWARD!r}"))
    format: Literal["boxed", "gsm8k", "last_line"] = Field(default="boxed", description=(
        "where the final answer is: the last \\boxed{} (boxed), after the last '####' (gsm8k), or the last "
        "non-empty line (last_line); the built-in checker reads it there, and prompts of a real set are "
        "told so (see instruction)"))
    instruction: bool = Field(default=True, description=(
        "append the format's instruction to each prompt of a real set that does not already ask for it "
        "(boxed: \"... output the final answer within \\boxed{}.\"); false leaves prompts as written"))
    version: Line | None = Field(default=None, max_length=100, description=(
        "a version of the function, for the content hash: change it when the function's code changes, "
        "so that runs before and after are not seeds of one recipe"))
    timeout_s: float = Field(default=5.0, gt=0, le=3600, description=(
        "seconds one call may take, in a process of its own that is killed when it overruns: a function of "
        "the user's that overruns fails the run, naming it; a math-verify comparison of the built-in "
        "checker that overruns scores -1"))


class Fit(_Section):
    """How the sigmoid is fitted to this run's points (docs/method.md, section 2)."""

    min_compute: float = Field(default=1500.0, ge=0, le=COMPUTE_MAX, description="in units of `axis`")
    axis: Literal["gpu_hours", "flops", "tokens", "step"] = "gpu_hours"
    truncation_threshold: float = Field(default=TRUNCATION_THRESHOLD, gt=0, le=1)


class Checkpoint(_Section):
    """Checkpoints in the run folder every ``every_steps`` optimiser steps."""

    every_steps: int = Field(default=50, ge=1, le=STEPS_MAX)
    keep: int = Field(default=2, ge=1, le=1000)


# --------------------------------------------------------------------------- where and how big


class Model(_Section):
    """The policy.  ``path`` names a checkpoint folder (transformers
    ``save_pretrained`` layout) or ``builtin:tiny`` for the project's own ~1 M
    parameter Qwen2 model, built from a config and warm-started by a short SFT
    stage (cached outside the run folders)."""

    path: Line = "builtin:tiny"
    dtype: Literal["fp32", "bf16"] = "fp32"
    chat_template: bool = False
    think_tags: bool = Field(default=False, description=(
        "the model reasons inside <think>...</think> before its answer: only the text after the last "
        "</think> is graded, and a completion whose thinking block is not closed scores -1"))
    warm_start_target: float = Field(default=0.3, gt=0, lt=1, description="held-out pass rate SFT stops at")
    params: float | None = Field(
        default=None, gt=0, le=1e15,
        description="parameter count, for the dry run's memory estimate and weight-sync plan when "
                    "the checkpoint's config.json cannot be read (e.g. 8e9)")


class Data(_Section):
    """The prompt set.  ``source``: ``synthetic:arithmetic`` (generated from
    ``seed`` with ``difficulty``), a ``.jsonl``/``.parquet`` file, or
    ``hf:NAME`` (Hugging Face datasets, by name or local path; ``subset`` is the
    configuration, ``split`` the split read).  The held-out evaluation split
    (``Eval.prompts`` prompts) is drawn by ``seed`` and is disjoint from training.
    ``prompt_key``/``answer_key`` name the columns (dotted for nested fields,
    e.g. ``reward_model.ground_truth``) when they are not a known layout
    (docs/real-data.md)."""

    source: Line = "synthetic:arithmetic"
    train_size: int | None = Field(default=None, ge=1, le=10**9)
    difficulty: int = Field(default=3, ge=1, le=9)
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    split: Line = "train"
    subset: Line | None = None
    prompt_key: Line | None = None
    answer_key: Line | None = None


class Hardware(_Section):
    """What the run runs on.  GPU-hours are comparable only within one hardware
    class (docs/method.md, section 7), so ``name`` is stored with every run."""

    device: Literal["cpu", "cuda"] = "cpu"
    name: Line = "cpu"
    generators: int = Field(default=1, ge=1, le=DEVICES_MAX, description="devices generating rollouts")
    trainers: int = Field(default=1, ge=1, le=DEVICES_MAX, description="devices training (DeepSpeed ranks)")
    zero_stage: int = Field(default=0, ge=0, le=3)
    rollout_engine: Literal["cpu", "vllm"] = "cpu"
    memory_gb: float | None = Field(
        default=None, gt=0, le=1e6,
        description="memory of one device in GB (1e9 bytes): the dry run checks that a trainer's "
                    "parameters, gradients and optimiser states fit at the ZeRO stage")
    threads: int | None = Field(default=None, ge=1, le=1024, description=(
        "torch threads of each process on a CPU (default: the cores the process is given, "
        "shared equally by the processes of a pipeline); speed only, not part of the content hash"))

    @property
    def devices(self) -> int:
        """Devices the run holds: GPU-hours = devices x wall-clock hours."""
        return self.generators + self.trainers


class Slurm(_Section):
    """Slurm resources, passed to submitit's SlurmExecutor."""

    partition: Line | None = None
    account: Line | None = None
    qos: Line | None = None
    nodes: int = Field(default=1, ge=1, le=DEVICES_MAX)
    tasks_per_node: int = Field(default=1, ge=1, le=1024)
    gpus_per_node: int = Field(default=0, ge=0, le=1024)
    cpus_per_task: int = Field(default=1, ge=1, le=4096)
    mem_gb: float | None = Field(default=None, gt=0, le=2**20, description="per node; Slurm takes MB")
    time_min: int = Field(default=60, ge=1, le=366 * 24 * 60, description="Slurm's time limit, minutes")
    additional_parameters: dict[Line, Line] = Field(default_factory=dict, max_length=256)


class Launcher(_Section):
    """Where jobs run: ``local`` (processes on this machine, at most
    ``max_parallel`` runs at once) or ``slurm`` (submitit)."""

    type: Literal["local", "slurm"] = "local"
    max_parallel: int = Field(default=1, ge=1, le=DEVICES_MAX)
    slurm: Slurm = Slurm()


class Budget(_Section):
    """When a run stops: after ``steps`` optimiser steps and/or ``gpu_hours``
    of compute, whichever comes first."""

    steps: int | None = Field(default=None, ge=1, le=STEPS_MAX)
    gpu_hours: float | None = Field(default=None, gt=0, le=GPU_HOURS_MAX)

    @model_validator(mode="after")
    def _some_budget(self) -> "Budget":
        if self.steps is None and self.gpu_hours is None:
            raise ValueError("set budget.steps or budget.gpu_hours (or both)")
        return self


class Logging(_Section):
    """Where per-step metrics and evaluation points go besides the store and
    ``steps.jsonl`` (:mod:`scalectl.job.trackers`): any of ``tensorboard`` (event
    files in ``RUN_DIR/tensorboard``), ``wandb``, ``mlflow`` and ``jsonl``
    (``RUN_DIR/metrics.jsonl``), several at once.  ``project`` is the W&B
    project and the MLflow experiment.  ``wandb_mode`` and
    ``mlflow_tracking_uri`` left unset mean the library's own default
    (``WANDB_MODE``, ``MLFLOW_TRACKING_URI``).  ``rollouts``: every trained
    completion goes to ``RUN_DIR/rollouts.jsonl`` (:func:`scalectl.rl.loop.rollout_lines`)."""

    backends: list[Literal["tensorboard", "wandb", "mlflow", "jsonl"]] = Field(default_factory=list, max_length=4)
    project: Line = Field(default="scalectl", min_length=1)
    wandb_mode: Literal["online", "offline"] | None = None
    wandb_entity: Line | None = None
    mlflow_tracking_uri: Line | None = None
    rollouts: bool = Field(default=False, description=(
        "write every trained completion to RUN_DIR/rollouts.jsonl: tokens, per-token policy versions, "
        "the generator's log-probs and the trainer's recomputation (one extra forward pass per step, "
        "not counted in the run's compute)"))

    @model_validator(mode="after")
    def _no_repeats(self) -> "Logging":
        repeated = sorted({b for b in self.backends if self.backends.count(b) > 1})
        if repeated:
            raise ValueError(f"backends lists {', '.join(repeated)} more than once")
        return self


# --------------------------------------------------------------------------- the whole


RECIPE_SECTIONS = ("loss", "advantage", "precision", "async", "filter", "length",
                   "batch", "optim", "sampling", "eval", "reward", "fit", "checkpoint")
SETUP_SECTIONS = ("model", "data", "hardware", "launcher", "budget", "logging")
#: Keys that do not change what is trained or measured: excluded from the content hash
#: (the seed is stored beside the hash, so repeated runs of one recipe share it).
UNHASHED_KEYS = ("name", "description", "seed", "launcher", "checkpoint", "logging")
#: Keys added after recipe hashes were first stored, with the value that leaves a hash as it
#: was: at that value the key is left out of the content hash, so that stored runs of a recipe
#: are still recognised as its seeds; any other value changes the hash.
HASH_NEUTRAL = {("model", "think_tags"): False, ("reward", "function"): BUILTIN_REWARD, ("reward", "format"): "boxed",
                ("reward", "instruction"): True, ("reward", "version"): None, ("reward", "timeout_s"): 5.0}


class Recipe(_Section):
    """A validated, frozen run description: recipe (how) merged with setup (where).

    Build it with :func:`scalectl.recipe.load.load`; ``content_hash`` identifies
    the training content (everything but name, description, seed, launcher,
    checkpoint frequency and logging), so that
    repeated runs (seeds) of one recipe share a hash.
    """

    name: Line = Field(default="run", max_length=100)
    description: str = Field(default="", max_length=10_000)
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    loss: Loss = Loss()
    advantage: Advantage = Advantage()
    precision: Precision = Precision()
    async_: Async = Field(default=Async(), alias="async")
    filter: Filter = Filter()
    length: Length = Length()
    batch: Batch = Batch()
    optim: Optim = Optim()
    sampling: Sampling = Sampling()
    eval: Eval = Eval()
    reward: Reward = Reward()
    fit: Fit = Fit()
    checkpoint: Checkpoint = Checkpoint()
    model: Model = Model()
    data: Data = Data()
    hardware: Hardware = Hardware()
    launcher: Launcher = Launcher()
    budget: Budget = Budget(steps=100)
    logging: Logging = Logging()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_background_eval(self) -> "Recipe":
        if self.eval.background == "on" and self.hardware.rollout_engine != "cpu":
            raise ValueError("eval.background = 'on' needs hardware.rollout_engine = 'cpu' (a background "
                             "evaluation samples with a copy of the policy in a CPU engine); allowed with "
                             f"{self.hardware.rollout_engine!r}: auto, off")
        return self

    def to_dict(self) -> dict:
        """The normalised recipe as plain JSON-able data (keys as in the TOML files)."""
        return self.model_dump(mode="json", by_alias=True)

    @property
    def content_hash(self) -> str:
        """12 hex digits of SHA-256 over the normalised content, key order
        independent; :data:`UNHASHED_KEYS`, ``hardware.threads`` and ``eval.background``
        (speed only) excluded, and each key of :data:`HASH_NEUTRAL` at its neutral value (a section
        left empty by them, as ``reward`` at its defaults, with it)."""
        data = {k: v for k, v in self.to_dict().items() if k not in UNHASHED_KEYS}
        data["hardware"] = {k: v for k, v in data["hardware"].items() if k != "threads"}
        data["eval"] = {k: v for k, v in data["eval"].items() if k != "background"}
        for (section, key), neutral in HASH_NEUTRAL.items():
            if data[section].get(key, neutral) == neutral:
                data[section].pop(key, None)
        data = {k: v for k, v in data.items() if v != {}}     # a section wholly at its neutral values
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]
