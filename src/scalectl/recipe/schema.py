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

Every field's ``description`` says what it means, its unit and its source
(``scalectl validate --explain KEY`` prints it with the declared type, bounds and
default).  The allowed values of ``loss.type`` and ``launcher.type`` are the keys of
the torch-free tables :data:`~scalectl.recipe.loss_choices.LOSS_CHOICES` and
:data:`~scalectl.recipe.launcher_choices.LAUNCHER_CHOICES`.

Formulas and defaults: Khatri et al. 2025, "The Art of Scaling Reinforcement
Learning Compute for LLMs" (ScaleRL, arXiv 2510.13786), sections 3-4 and
appendix A; DAPO (Yu et al. 2025, arXiv 2503.14476); GSPO (Zheng et al. 2025,
arXiv 2507.18071); MiniMax-M1 (2025, arXiv 2506.13585).
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from scalectl.defaults import TRUNCATION_THRESHOLD
from scalectl.recipe.launcher_choices import DEFAULT_LAUNCHER, LAUNCHER_NAMES
from scalectl.recipe.loss_choices import COMPANIONS, DEFAULT_LOSS, LOSS_CHOICES, LOSS_NAMES, companion_defaults
from scalectl.recipe.async_modes import ASYNC_MODE_NAMES, PIPELINE_SCHEDULES
from scalectl.recipe.reward_function import ANSWER_FORMATS, BUILTIN_REWARD, CONVENTIONS, MAX_ABS_REWARD, check_name

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


def _control_character(text: str, allowed: str = "") -> str | None:
    """Why ``text`` is refused, or None: its first control (Unicode category Cc: NUL, ESC, DEL,
    the C1 controls) or format character (Cf: the bidirectional overrides such as U+202E, which
    show text in another order than it is stored, zero-width characters), other than those in
    ``allowed``, named with its code point and where it is (1 = the first character)."""
    for i, c in enumerate(text, start=1):
        if c not in allowed and unicodedata.category(c) in ("Cc", "Cf"):
            name = unicodedata.name(c, "")
            return f"contains the control character {c!r} (U+{ord(c):04X}{' ' + name if name else ''}) at character {i}"
    return None


def _one_line(text: str) -> str:
    bad = _control_character(text)
    if bad is not None:
        raise ValueError(f"{bad}: one line of printable text is allowed")
    return text


def _free_text(text: str) -> str:
    bad = _control_character(text, allowed="\t\n")
    if bad is not None:
        raise ValueError(f"{bad}: printable text, tabs and newlines are allowed")
    return text


#: A one-line string (no newline, tab, NUL, bidirectional override or other control or format
#: character: Unicode categories Cc and Cf), at most LINE_MAX characters.
Line = Annotated[str, Field(max_length=LINE_MAX), AfterValidator(_one_line)]
#: Free text of several lines: printable text, tabs and newlines (no NUL, carriage return,
#: bidirectional override or other Cc/Cf character).
Text = Annotated[str, AfterValidator(_free_text)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- how to train
# Every field says what it means, its unit and where it comes from in ``description``
# (``scalectl validate --explain KEY`` prints it with the type, bounds and default, which
# come from the declaration itself); its first sentence is the summary shown in lists.

_SCALERL = "ScaleRL, arXiv 2510.13786"
_DAPO = "DAPO, arXiv 2503.14476"


class Loss(_Section):
    """Policy loss (docs/recipe-axes.md, "Loss").

    ``ppo_clip``: per-token min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)
    (PPO/GRPO/DAPO).  ``gspo``: the same clip on the sequence-level ratio
    exp(mean_t log rho) (GSPO; clip values of order 1e-3).  ``cispo``:
    sg(min(rho, clip_high)) A log pi (MiniMax-M1; ``clip_low`` unused).
    Unset clip values take the defaults of ``type``
    (:data:`scalectl.recipe.loss_choices.LOSS_CHOICES`,
    :func:`~scalectl.recipe.loss_choices.companion_defaults`).
    """

    type: Literal[LOSS_NAMES] = Field(default=DEFAULT_LOSS, description=(
        "Policy loss: the objective each completion token contributes, maximised "
        f"(docs/recipe-axes.md, \"Loss\"; the forward ablation of {_SCALERL}, Sec. 3.2)."))
    clip_low: float | None = Field(default=None, gt=0, lt=1, description=(
        "Lower clip epsilon- of the importance ratio (dimensionless). ppo_clip and gspo clip the ratio "
        "at 1 - clip_low. Unset: the default of loss.type; cispo has no lower clip and ignores it "
        f"({_DAPO}, Sec. 3.1)."))
    clip_high: float | None = Field(default=None, gt=0, le=100, description=(
        "Upper clip epsilon+ of the importance ratio (dimensionless; cispo: eps_max). ppo_clip and gspo "
        "clip the ratio at 1 + clip_high, cispo truncates the token weight at clip_high. Unset: the "
        f"default of loss.type ({_DAPO}, Sec. 3.1, clip-higher; MiniMax-M1, arXiv 2506.13585, Sec. 3.1)."))
    aggregation: Literal["sample", "prompt", "token"] = Field(default="prompt", description=(
        "How token losses are averaged into the batch loss (docs/recipe-axes.md, \"Loss aggregation\"). "
        "sample: the mean over each completion's tokens, then over completions (GRPO); prompt: over the "
        f"tokens of each prompt's group, then over prompts ({_DAPO}, Sec. 3.3; {_SCALERL}, Sec. 3); "
        "token: over all the batch's tokens."))

    @model_validator(mode="after")
    def _fill_companions(self) -> "Loss":
        table = {key: getattr(self, key) for key in ("type", *COMPANIONS)}
        for key, value in companion_defaults(table).items():
            object.__setattr__(self, key, value)
        return self

    @property
    def ratio_level(self) -> Literal["token", "sequence"]:
        """Where the importance ratio lives: per token, or one per completion (GSPO)."""
        return LOSS_CHOICES[self.type].ratio_level  # type: ignore[return-value]


class Advantage(_Section):
    """Group-centred advantage a_i = r_i - mean_group(r), then divided by the
    group's std (``prompt``, GRPO), the batch std (``batch``, ScaleRL) or
    nothing (``none``, Dr. GRPO)."""

    normalization: Literal["prompt", "batch", "none"] = Field(default="batch", description=(
        "What the group-centred advantage r_i - mean_group(r) is divided by (docs/recipe-axes.md, "
        "\"Advantage normalization\"). prompt: the std of the prompt's group (GRPO, DeepSeekMath "
        f"arXiv 2402.03300, Sec. 4.1.2); batch: the std of all the batch's centred advantages ({_SCALERL}, "
        "Sec. 3); none: nothing (Dr. GRPO, arXiv 2503.20783, Sec. 3.1)."))


class Precision(_Section):
    """Numerical precision of the LM head (ScaleRL section 3.2)."""

    lm_head: Literal["fp32", "bf16"] = Field(default="fp32", description=(
        "Precision of the LM head's projection and log-softmax, in the generators and the trainers "
        f"alike ({_SCALERL}, Sec. 3.2; docs/recipe-axes.md, \"LM-head precision\"). fp32: computed in "
        "float32 (the paper's ceiling rose from 0.52 to 0.61); bf16: in the model dtype."))


class Async(_Section):
    """Asynchrony between generation and training (docs/recipe-axes.md, "Asynchrony").

    ``sync``: on-policy, one batch then one step.  ``ppo_off_policy``: generate
    k batches with one policy, then take k optimiser steps.  ``pipeline``
    (PipelineRL-k): generators stream, trainers push weights after every step
    and wait when more than k steps ahead of the oldest data.  The allowed modes,
    their staleness bounds, rounds and layouts are those of
    :data:`scalectl.recipe.async_modes.ASYNC_MODES`.
    """

    mode: Literal[ASYNC_MODE_NAMES] = Field(default="pipeline", description=(
        "When batches are generated, and by which weights. sync: on-policy; ppo_off_policy: k batches "
        "with one policy, then k steps; pipeline: PipelineRL-k, streaming with in-flight weight updates "
        f"({_SCALERL}, Sec. 3.1; docs/recipe-axes.md, \"Asynchrony\")."))
    k: int = Field(default=8, ge=1, le=1024, description=(
        "How far generation may run ahead of training, in optimiser steps (policy versions). "
        "ppo_off_policy generates k batches with one policy, then takes k steps on them; pipeline lets "
        "trainers run at most k steps ahead of the oldest data they train on; sync ignores it "
        f"({_SCALERL}, Sec. 3.1; docs/recipe-axes.md, \"Asynchrony\")."))
    schedule: Literal[PIPELINE_SCHEDULES] = Field(default="streaming", description=(
        "Which policy version samples each batch of async.mode = pipeline. streaming: generators sample "
        "without stopping and take the weights as they come, so the versions depend on the machine's "
        "timing; fixed_lag: batch v is sampled whole by version max(0, v - k), in one process on 1 "
        "generator + 1 trainer, so a run's curve does not depend on the machine's load "
        "(docs/recipe-axes.md, \"Asynchrony\")."))

    @model_validator(mode="after")
    def _check_schedule(self) -> "Async":
        if self.schedule != "streaming" and self.mode != "pipeline":
            raise ValueError(f"async.schedule = {self.schedule!r} applies to async.mode = 'pipeline' only, not "
                             f"{self.mode!r}; allowed with {self.mode!r}: streaming (the default)")
        return self


class Filter(_Section):
    """Prompt filtering (docs/recipe-axes.md, "Prompt filtering"): zero-variance groups,
    DAPO's dynamic sampling, ScaleRL's No-Positive-Resampling."""

    zero_variance: bool = Field(default=True, description=(
        "Drop the groups whose G rewards are all equal from the batch, without replacing them. Their "
        f"advantages are all 0 ({_SCALERL}, Sec. 3; docs/recipe-axes.md, \"Prompt filtering\")."))
    dynamic_sampling: bool = Field(default=False, description=(
        "Drop the zero-variance groups and generate for more prompts until the batch is full. The "
        f"batch holds batch.prompts_per_step groups ({_DAPO}, Sec. 3.2); a step still short after "
        "filter.max_refill_rounds refills trains on the groups it kept (its metrics say short_batch, "
        "the run log says what to change once)."))
    max_refill_rounds: int = Field(default=4, ge=1, le=1000, description=(
        "Most refill rounds of dynamic sampling per optimiser step. Each round generates for the "
        "prompts still missing, scaled up by the share of groups kept so far."))
    retire_solved: bool = Field(default=False, description=(
        "Never sample again a prompt whose pass rate reached filter.retire_threshold (No-Positive-"
        f"Resampling, {_SCALERL}, Sec. 3)."))
    retire_threshold: float = Field(default=0.9, gt=0, le=1, description=(
        "Pass rate at which filter.retire_solved retires a prompt. A pass rate is the share of the "
        "prompt's completions that are correct, 0 to 1."))
    retire_rule: Literal["latest", "cumulative"] = Field(default="latest", description=(
        "Which pass rate filter.retire_solved compares with the threshold. latest: that of the "
        "prompt's latest group; cumulative: correct completions over all its completions so far. The "
        "paper does not say (docs/recipe-axes.md, \"Prompt filtering\")."))


class Length(_Section):
    """Generation length and its control (docs/recipe-axes.md, "Length control")."""

    max_new_tokens: int = Field(default=14336, ge=1, le=TOKENS_MAX, description=(
        "Most tokens of one completion, thinking and answer. A completion that reaches it is "
        "truncated and counts in the truncation rate (docs/recipe-axes.md, \"Length control\")."))
    max_prompt_tokens: int = Field(default=2048, ge=1, le=TOKENS_MAX, description=(
        "Most tokens of one prompt; longer prompts of a prompt file are dropped when the set is read "
        "(docs/real-data.md, \"Prompt sets\")."))
    control: Literal["interrupt", "penalty", "none"] = Field(default="interrupt", description=(
        "How completions are kept short (docs/recipe-axes.md, \"Length control\"). interrupt: "
        "length.interrupt_phrase is appended at a random length and the model answers "
        f"({_SCALERL}, Sec. 3); penalty: DAPO's overlong reward shaping ({_DAPO}, Sec. 3.4, Eq. 13); "
        "none: truncated completions are scored as they are."))
    interrupt_min: int = Field(default=10000, ge=1, le=TOKENS_MAX, description=(
        "Shortest interruption length, in generated tokens (length.control = interrupt). Each "
        "completion's length is drawn uniformly from the integers in [interrupt_min, interrupt_max]."))
    interrupt_max: int = Field(default=12000, ge=1, le=TOKENS_MAX, description=(
        "Longest interruption length, in generated tokens (length.control = interrupt). It must "
        "stay below length.max_new_tokens, to leave room for the answer."))
    interrupt_phrase: Text = Field(
        default="Okay, time is up. Let me stop thinking and formulate a final answer now. </think>",
        max_length=LINE_MAX, description=(
            "Text appended at the interruption length to close the thinking section. The model then "
            f"answers within length.max_new_tokens ({_SCALERL}, Sec. 3)."))
    penalty_max: int | None = Field(default=None, ge=1, le=TOKENS_MAX, description=(
        "L_max of the overlong penalty, in tokens: a completion this long gets -1 added to its reward. "
        f"Unset: length.max_new_tokens (length.control = penalty; {_DAPO}, Sec. 3.4, Eq. 13)."))
    penalty_cache: int = Field(default=2048, ge=1, le=TOKENS_MAX, description=(
        "L_cache of the overlong penalty, in tokens. Over this window before L_max the penalty "
        f"falls linearly from 0 to -1 ({_DAPO}, Sec. 3.4, Eq. 13)."))

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
    """Prompts per optimiser step x generations (the group size G) per prompt."""

    prompts_per_step: int = Field(default=48, ge=1, le=PROMPTS_MAX, description=(
        "Prompts per optimiser step (P), each with batch.generations_per_prompt completions "
        f"({_SCALERL}, App. A.3; docs/recipe-axes.md, \"Batch\")."))
    generations_per_prompt: int = Field(default=16, ge=2, le=GENERATIONS_MAX, description=(
        "Completions sampled per prompt: the group size G that rewards are centred in "
        "(docs/recipe-axes.md, \"Advantage normalization\")."))
    micro_batch_size: int = Field(default=64, ge=1, le=PROMPTS_MAX, description=(
        "Completions per forward/backward pass of the trainer. A step accumulates its micro-batches, "
        "so this changes memory and speed, not the loss (docs/recipe-axes.md, \"Loss aggregation\")."))


class Optim(_Section):
    """AdamW with a constant learning rate after linear warm-up (ScaleRL appendix
    A.3: lr 5e-7, 100 warm-up steps, eps 1e-15, weight decay 0.01)."""

    lr: float = Field(default=5e-7, gt=0, le=1, description=(
        f"AdamW learning rate, constant after the warm-up ({_SCALERL}, App. A.3)."))
    warmup_steps: int = Field(default=100, ge=0, le=STEPS_MAX, description=(
        "Optimiser steps of linear learning-rate warm-up; 0: none. Step s (from 0) uses "
        f"lr x min(1, (s + 1) / warmup_steps) ({_SCALERL}, App. A.3)."))
    beta1: float = Field(default=0.9, ge=0, lt=1, description=(
        "AdamW's decay rate of the gradient's running mean (beta_1)."))
    beta2: float = Field(default=0.999, ge=0, lt=1, description=(
        "AdamW's decay rate of the squared gradient's running mean (beta_2)."))
    eps: float = Field(default=1e-15, gt=0, le=1, description=(
        f"AdamW's epsilon, added to the root of the second moment ({_SCALERL}, App. A.3)."))
    weight_decay: float = Field(default=0.01, ge=0, le=1, description=(
        "AdamW's decoupled weight decay: each step scales the weights by 1 - lr x weight_decay "
        f"({_SCALERL}, App. A.3)."))
    grad_clip: float | None = Field(default=1.0, gt=0, le=1e6, description=(
        "Largest global L2 norm of the gradient; a larger gradient is scaled down to it. Unset: no "
        "clipping (the norm is still measured)."))


class Sampling(_Section):
    """Rollout sampling: temperature 1 and no top-p/top-k, so the generator's
    recorded log-probs are those of the policy itself."""

    temperature: float = Field(default=1.0, gt=0, le=100, description=(
        "Sampling temperature of the training rollouts; the trainer's log-probs use the same "
        "temperature (docs/real-data.md, \"Sampling settings\")."))
    top_p: float = Field(default=1.0, gt=0, le=1, description=(
        "Nucleus-sampling probability mass of the training rollouts. 1 samples the whole distribution, "
        "so the recorded log-probs are the policy's own (docs/real-data.md, \"Sampling settings\")."))


class Eval(_Section):
    """Evaluation protocol (docs/method.md, section 5): before the first step and
    every ``every_steps`` steps, ``samples_per_prompt`` completions (k) for each
    of ``prompts`` held-out prompts; the pass rate is mean@k."""

    every_steps: int = Field(default=100, ge=1, le=STEPS_MAX, description=(
        "Optimiser steps between evaluations; one is also taken before the first step "
        "(docs/method.md, section 5)."))
    prompts: int = Field(default=1000, ge=1, le=10**6, description=(
        "Held-out prompts per evaluation, drawn by data.seed and disjoint from the training prompts "
        "(docs/method.md, section 5)."))
    samples_per_prompt: int = Field(default=16, ge=1, le=GENERATIONS_MAX, description=(
        "Completions per held-out prompt (k); the pass rate is the mean correctness of all of them "
        "(mean@k; docs/method.md, section 5)."))
    temperature: float = Field(default=1.0, gt=0, le=100, description=(
        "Sampling temperature of the evaluation completions."))
    background: Literal["auto", "on", "off"] = Field(default="auto", description=(
        "Whether to evaluate on a copy of the weights in a thread while training goes on. "
        "See scalectl.rl.evaluation.during_training; auto: on in a pipeline's trainer process with the "
        "CPU engine on CPUs; the points are the same either way, so speed only, not part of the "
        "content hash."))


class Reward(_Section):
    """How a completion is scored (docs/rewards.md): by the built-in math checker (the last
    ``\\boxed{}``, or another answer ``format``, checked by math-verify: +1 right, -1 wrong),
    or by a function of the user's, named as ``package.module:callable`` and called in every
    process that scores (generators of every async mode, evaluation) as
    ``function(completion, gold, fields)``, returning a float reward (right, for the pass
    rate, when > 0) or a :class:`scalectl.rl.reward.score.Score`; or as verl or TRL call
    theirs (``convention``, :data:`scalectl.recipe.reward_function.CONVENTIONS`).  Part of the content hash
    by ``function`` and ``version``, never by the function's code; the allowed formats are
    :data:`scalectl.recipe.reward_function.ANSWER_FORMATS`."""

    function: Annotated[Line, AfterValidator(check_name)] = Field(default=BUILTIN_REWARD, description=(
        "The reward function as package.module:callable, called in every process that scores. It is "
        "called as f(completion, gold, fields) and found on PYTHONPATH, among the installed packages or "
        "in the current folder; the built-in one is the math checker (docs/rewards.md, \"Your own "
        "function\")."))
    format: Literal[ANSWER_FORMATS] = Field(default="boxed", description=(
        "Where the final answer is: the last \\boxed{} (boxed), after the last #### (gsm8k), or the last "
        "line. The built-in checker reads it there, and prompts of a real set are told so unless "
        "reward.instruction is false (docs/rewards.md, \"Answer formats\")."))
    instruction: bool = Field(default=True, description=(
        "Append the format's instruction to each prompt of a real set that does not ask for it yet. "
        "False leaves the prompts as written (docs/rewards.md)."))
    version: Line | None = Field(default=None, max_length=100, description=(
        "A version of the reward function, part of the content hash. Change it when the function's code "
        "changes, so that runs before and after are not seeds of one recipe. Unset: the name alone."))
    timeout_s: float = Field(default=5.0, gt=0, le=3600, description=(
        "Seconds one call of the reward function may take, in a process of its own. A function of the "
        "user's that overruns fails the run, naming it; a math-verify comparison of the built-in checker "
        "that overruns scores -1; a TRL-shaped function, called once per group, may take this times the "
        "group's completions."))
    convention: Literal[CONVENTIONS] | None = Field(default=None, description=(
        "How reward.function is called: as scalectl, verl or TRL calls a reward function. scalectl: "
        "f(completion, gold, fields); verl: compute_score(data_source, solution_str, ground_truth, extra_info), "
        "its custom_reward_function; trl: reward_func(prompts, completions, completion_ids, **columns) over "
        "a group, as TRL's GRPOTrainer. Unset: recognised from the function's signature (docs/rewards.md, "
        "\"Functions written for verl or TRL\")."))
    truncated: float | Literal["as_written"] = Field(default="as_written", description=(
        "The reward of a completion cut at length.max_new_tokens, which then counts as not correct. "
        "Such a completion has not ended its answer (no stop token); it scores this number in training "
        "and counts as wrong in the held-out pass rate. as_written: it is scored as written, an answer "
        "before the cut counting (docs/rewards.md, \"Truncated completions\")."))

    @field_validator("truncated", mode="before")
    @classmethod
    def _truncated_is_a_finite_number_or_as_written(cls, value):
        if value == "as_written":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or abs(value) > MAX_ABS_REWARD:
            raise ValueError(f"must be a finite number from -{MAX_ABS_REWARD:g} to {MAX_ABS_REWARD:g} (the reward; "
                             f"the advantages are computed in float32) or 'as_written', not {value!r}")
        return value

    @model_validator(mode="after")
    def _convention_needs_a_function(self) -> "Reward":
        if self.function == BUILTIN_REWARD and self.convention not in (None, "scalectl"):
            raise ValueError(f"reward.convention = {self.convention!r} applies to a function of your own, not the "
                             f"built-in checker {BUILTIN_REWARD!r} (a scalectl one); set reward.function too")
        return self


class Fit(_Section):
    """How the sigmoid is fitted to this run's points (docs/method.md, section 2)."""

    min_compute: float = Field(default=1500.0, ge=0, le=COMPUTE_MAX, description=(
        "Start of the fit window, in units of fit.axis: points below it are left out of the fit "
        f"(about one epoch in the paper; {_SCALERL}, App. A.5; docs/method.md, section 2)."))
    axis: Literal["gpu_hours", "flops", "tokens", "step"] = Field(default="gpu_hours", description=(
        "Compute axis C of the fitted curve R(C): GPU-hours, FLOPs, tokens or optimiser steps "
        "(docs/method.md, section 1)."))
    r0: Literal["auto", "measured", "fit"] = Field(default="auto", description=(
        "How the curve's R0 (its value as compute tends to 0) is found. auto: the measured pass rate "
        "of the step-0 evaluation, fitted where a run has none; measured: that evaluation, required; "
        "fit: a parameter of the curve, for a window that leaves out an early rise the sigmoid does "
        f"not follow ({_SCALERL}, App. A.5; docs/fitting.md, \"The window and R0\")."))
    truncation_threshold: float = Field(default=TRUNCATION_THRESHOLD, gt=0, le=1, description=(
        "Truncation rate above which the fit flags the run as unstable. The rate is the share of "
        "evaluation completions cut at length.max_new_tokens, 0 to 1 "
        f"({_SCALERL}, Sec. 3; docs/method.md, section 5)."))


class Checkpoint(_Section):
    """Checkpoints in the run folder."""

    every_steps: int = Field(default=50, ge=1, le=STEPS_MAX, description=(
        "Optimiser steps between checkpoints in the run folder, which run --resume starts from "
        "(docs/launching.md, \"Resuming\")."))
    keep: int = Field(default=2, ge=1, le=1000, description=(
        "Checkpoints kept in the run folder; older ones are deleted."))


# --------------------------------------------------------------------------- where and how big


class Model(_Section):
    """The policy: a checkpoint folder or the project's own tiny model."""

    path: Line = Field(default="builtin:tiny", description=(
        "The policy: a checkpoint folder, builtin:tiny, or simulated:KEY=VALUE,... A checkpoint "
        "folder has the transformers save_pretrained layout; builtin:tiny is the project's ~1 M-parameter "
        "Qwen2 model, warm-started by a short SFT stage cached outside the run folders; simulated: "
        "draws a curve and trains nothing (docs/ablations.md)."))
    dtype: Literal["fp32", "bf16"] = Field(default="fp32", description=(
        "Dtype of the policy's weights in the trainers (bf16: mixed precision) and the generators."))
    chat_template: bool = Field(default=False, description=(
        "Render each prompt of a prompt file with the tokenizer's chat template instead of as plain "
        "text (docs/real-data.md, \"Prompt sets\")."))
    think_tags: bool = Field(default=False, description=(
        "Grade only the text after the last </think>; an unclosed thinking block scores -1. For models "
        "that reason inside <think>...</think> before their answer (training and held-out evaluation "
        "alike; docs/real-data.md)."))
    warm_start_target: float = Field(default=0.3, gt=0, lt=1, description=(
        "Held-out pass rate (0 to 1) at which the SFT warm start of builtin:tiny stops."))
    warm_start_greedy: float | None = Field(default=None, gt=0, lt=1, description=(
        "Greedy pass rate (0 to 1) at which the SFT warm start of builtin:tiny stops. Its LM head is "
        "then scaled down until its sampled pass rate is model.warm_start_target (a policy that knows "
        "more answers than it samples). Unset: stop when the sampled pass rate reaches the target."))
    warm_start_problems: int | None = Field(default=None, ge=64, le=1_000_000, description=(
        "Problems the builtin:tiny warm start is SFT'd on: a prefix of data.difficulty's training split. "
        "A level with many distinct problems needs many to be learned. Unset: min(data.train_size, 4000)."))
    warm_start_smoothing: float = Field(default=0.0, ge=0, lt=0.5, description=(
        "Label smoothing of the SFT warm start of builtin:tiny, 0 to 0.5 (0: none). The policy then "
        "knows more answers than it samples, as a language model's pass@k is above its pass@1."))
    params: float | None = Field(default=None, gt=0, le=1e15, description=(
        "Parameter count (for example 8e9), for the dry run when config.json cannot be read. The dry "
        "run estimates memory and the weight-sync plan from it. Unset: read from the checkpoint's "
        "config.json."))
    config: dict[Line, int] = Field(default_factory=dict, max_length=64, description=(
        "The architecture's config.json entries, for the dry run's memory plan. Used when model.path "
        "has no config.json; Hugging Face names: num_hidden_layers, num_key_value_heads, head_dim, "
        "hidden_size, num_attention_heads, vocab_size. Unset: read from the checkpoint; "
        "describes the checkpoint, so not part of the content hash."))


class Data(_Section):
    """The prompt set (docs/real-data.md).  The held-out evaluation split
    (``Eval.prompts`` prompts) is drawn by ``seed`` and is disjoint from training."""

    source: Line = Field(default="synthetic:arithmetic", description=(
        "The prompt set: synthetic:arithmetic, a .jsonl/.json/.parquet file, or hf:NAME. "
        "synthetic:arithmetic is generated from data.seed at data.difficulty; hf:NAME is a Hugging Face "
        "dataset by name or local path (docs/real-data.md, \"Prompt sets\")."))
    train_size: int | None = Field(default=None, ge=1, le=10**9, description=(
        "Training prompts: generated ones, or the first of the set's training split. "
        "Unset: every prompt of a file or dataset, a fixed number of generated ones "
        "(scalectl.rl.data.splits)."))
    difficulty: int = Field(default=3, ge=1, le=9, description=(
        "Difficulty level of synthetic:arithmetic: more digits, then more terms "
        "(scalectl.rl.data.arithmetic)."))
    mix: dict[str, float] = Field(default_factory=dict, max_length=8, description=(
        "Levels of synthetic:arithmetic mixed in: level -> share of prompts, e.g. {8 = 0.4}. "
        "data.difficulty takes the rest of the training and held-out prompts; each level keeps its own "
        "held-out reserve (scalectl.rl.data.arithmetic). Empty: data.difficulty alone."))
    seed: int = Field(default=0, ge=0, le=SEED_MAX, description=(
        "Seed of the prompt set: the generated problems and the held-out split."))
    split: Line = Field(default="train", description=(
        "Split read from an hf: dataset (docs/real-data.md, \"Prompt sets\")."))
    subset: Line | None = Field(default=None, description=(
        "Configuration (subset) of an hf: dataset. Unset: the dataset's default."))
    prompt_key: Line | None = Field(default=None, description=(
        "Column holding the prompt, dotted for nested fields. Unset: a known layout "
        "(GSM8K, verl, MATH; docs/real-data.md, \"Prompt sets\")."))
    answer_key: Line | None = Field(default=None, description=(
        "Column holding the reference answer, dotted for nested fields (e.g. "
        "reward_model.ground_truth). Unset: a known layout (docs/real-data.md, \"Prompt sets\")."))


    @model_validator(mode="after")
    def _check_mix(self) -> "Data":
        for name, share in self.mix.items():
            if name not in {str(d) for d in range(1, 10)}:
                raise ValueError(f"data.mix level {name!r} is not one of 1-9")
            level = int(name)
            if level == self.difficulty:
                raise ValueError(f"data.mix names data.difficulty = {level}: give the other levels only")
            if not 0 < share < 1:
                raise ValueError(f"data.mix share of level {level} is {share}, not in (0, 1)")
        if self.mix and sum(self.mix.values()) >= 1:
            raise ValueError(f"data.mix shares add up to {sum(self.mix.values()):g}, leaving nothing for "
                             f"data.difficulty = {self.difficulty}")
        return self

class Hardware(_Section):
    """What the run runs on.  GPU-hours are comparable only within one hardware
    class (docs/method.md, section 7), so ``name`` is stored with every run."""

    device: Literal["cpu", "cuda"] = Field(default="cpu", description=(
        "Device type of the trainers and generators."))
    name: Line = Field(default="cpu", description=(
        "Hardware class, stored with every run: GPU-hours compare only within one class "
        "(docs/method.md, section 7)."))
    generators: int = Field(default=1, ge=1, le=DEVICES_MAX, description=(
        "Devices generating rollouts (docs/launching.md, \"Roles in a multi-task job\")."))
    trainers: int = Field(default=1, ge=1, le=DEVICES_MAX, description=(
        "Devices training: DeepSpeed data-parallel ranks led by the first (docs/launching.md, \"Scale\")."))
    zero_stage: int = Field(default=0, ge=0, le=3, description=(
        "DeepSpeed ZeRO stage of the trainers; 0: none. Stage 1 shards optimiser states, 2 also "
        "gradients, 3 also parameters (docs/launching.md, \"Scale\")."))
    rollout_engine: Literal["cpu", "vllm"] = Field(default="cpu", description=(
        "Engine that generates rollouts: cpu (the project's own, for tiny models) or vllm "
        "(docs/real-data.md, \"The vLLM engine\")."))
    memory_gb: float | None = Field(default=None, gt=0, le=1e6, description=(
        "Memory of one device, in GB (1e9 bytes). The dry run checks that a trainer's parameters, "
        "gradients and optimiser states fit at the ZeRO stage. Unset: not checked."))
    threads: int | None = Field(default=None, ge=1, le=1024, description=(
        "Torch threads of each process on a CPU. Unset: the cores the process is given, shared "
        "equally by the processes of a pipeline; speed only, not part of the content hash."))
    compile: bool = Field(default=False, description=(
        "Compile the decoding step of the CPU rollout engine with torch.compile. Inductor builds C++ "
        "with the machine's compiler, cached in ~/.cache/scalectl/inductor; where none is found the "
        "step runs eagerly, with a warning. Same log-probs up to float rounding; speed only, not part "
        "of the content hash."))
    gpus_per_generator: int = Field(default=1, ge=1, le=64, description=(
        "GPUs of one generator: the tensor-parallel size of its vLLM engine. Its workers receive "
        "the broadcast weights themselves. The run holds generators x gpus_per_generator + trainers "
        "devices; above 1 needs rollout_engine = vllm (docs/launching.md, \"Scale\")."))
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description=(
        "Share of each generator GPU's memory its vLLM engine takes for weights and KV cache. This is "
        "vLLM's gpu_memory_utilization. The dry run checks that one step's completions fit; speed only, "
        "not part of the content hash."))
    max_num_seqs: int = Field(default=256, ge=1, le=65_536, description=(
        "Most completions one vLLM generator decodes at once (vLLM's max_num_seqs). Speed only, not "
        "part of the content hash."))
    decode_memory_mib: float = Field(default=192.0, gt=0, le=1e7, description=(
        "Memory for the keys and values of one decoding batch of the CPU rollout engine, in MiB. A "
        "batch holds as many rows as fit: 2 x layers x key/value heads x head dim x (longest prompt "
        "+ max_new_tokens) x bytes per value each (192 MiB: about 1,100 rows of the tiny model, "
        "where its rate peaked; benchmarks/README.md). Speed only, not part of the content hash."))
    evaluation: Literal["auto", "trainer", "generators", "dedicated"] = Field(default="auto", description=(
        "Where held-out evaluation samples. trainer: the first trainer rank's own engine; generators: "
        "the generators, each a share of the prompts, from the weights of the point's version; "
        "dedicated: the last generator, which then samples no training rollouts. auto: generators "
        "in a run in processes with vLLM or on CUDA (trainers then hold no rollout engine), else "
        "trainer. The points are the same; not part of the content hash (docs/launching.md, "
        "\"Evaluation\")."))
    gradient_checkpointing: bool = Field(default=False, description=(
        "Recompute each transformer layer's activations in the backward pass instead of keeping them. "
        "This is transformers' gradient checkpointing: about one layer's activations held instead of "
        "all. The dry run's trainer memory counts it; the same gradients, so not part of the "
        "content hash."))

    @model_validator(mode="after")
    def _tensor_parallel_needs_vllm(self) -> "Hardware":
        if self.gpus_per_generator > 1 and self.rollout_engine != "vllm":
            raise ValueError(f"gpus_per_generator = {self.gpus_per_generator} needs rollout_engine = 'vllm' "
                             f"(a tensor-parallel generator is a vLLM engine), not {self.rollout_engine!r}")
        return self

    @property
    def devices(self) -> int:
        """Devices the run holds: GPU-hours = devices x wall-clock hours; a generator holds
        ``gpus_per_generator`` of them."""
        return self.generators * self.gpus_per_generator + self.trainers

    def evaluation_place(self, in_processes: bool) -> Literal["trainer", "generators", "dedicated"]:
        """Where held-out evaluation samples (``evaluation``; ``auto`` resolved).

        Args:
            in_processes: the run's generators and trainers are processes of their own
                (:meth:`scalectl.recipe.async_modes.AsyncMode.in_processes`).

        Returns:
            ``trainer`` in one process (it is the generator too) and for ``auto`` with the CPU
            engine on CPUs; ``generators`` for ``auto`` with vLLM or CUDA in processes; else the
            setting.
        """
        if not in_processes:
            return "trainer"
        if self.evaluation == "auto":
            return "generators" if (self.rollout_engine == "vllm" or self.device == "cuda") else "trainer"
        return self.evaluation


class Slurm(_Section):
    """Slurm resources, passed to submitit's SlurmExecutor (docs/launching.md, "Slurm")."""

    partition: Line | None = Field(default=None, description=(
        "Slurm partition (sbatch --partition). Unset: the cluster's default."))
    account: Line | None = Field(default=None, description=(
        "Slurm account charged (sbatch --account). Unset: the user's default."))
    qos: Line | None = Field(default=None, description=(
        "Slurm quality of service (sbatch --qos). Unset: the default."))
    nodes: int = Field(default=1, ge=1, le=DEVICES_MAX, description="Nodes per job (sbatch --nodes).")
    tasks_per_node: int = Field(default=1, ge=1, le=1024, description=(
        "Tasks per node (sbatch --ntasks-per-node); each task is a generator or a trainer "
        "(docs/launching.md, \"Roles in a multi-task job\")."))
    gpus_per_node: int = Field(default=0, ge=0, le=1024, description=(
        "GPUs per node (sbatch --gpus-per-node)."))
    cpus_per_task: int = Field(default=1, ge=1, le=4096, description=(
        "CPUs per task (sbatch --cpus-per-task)."))
    mem_gb: float | None = Field(default=None, gt=0, le=2**20, description=(
        "Memory per node, in GB (sbatch --mem, which takes MB). Unset: the partition's default."))
    time_min: int = Field(default=60, ge=1, le=366 * 24 * 60, description=(
        "Time limit of one job, in minutes (sbatch --time). Before it the job is requeued and resumes "
        "from its latest checkpoint, after each of the first three hits; at the fourth the run is timed_out "
        "(docs/launching.md, \"Pre-emption, time limits, requeue\")."))
    additional_parameters: dict[Line, Line] = Field(default_factory=dict, max_length=256, description=(
        "Further sbatch options, name = value (submitit's slurm_additional_parameters)."))
    generator_nodes: int = Field(default=0, ge=0, le=DEVICES_MAX, description=(
        "Nodes of the job that run generators only; the job's other nodes run trainers only. Inference "
        "nodes and training nodes can so be told apart. The generators are spread over their "
        "nodes and the trainers over theirs as evenly as they go (srun --distribution=arbitrary), at "
        "most tasks_per_node on a node. 0: the roles share nodes, ranks filling the nodes in order "
        "(docs/launching.md, \"Placement by role\")."))
    generator_nodelist: Line | None = Field(default=None, description=(
        "Which hosts run the generators, as a Slurm host list (e.g. inf[01-04]). As many hosts as "
        "generator_nodes, asked for with sbatch --nodelist. Unset: the first generator_nodes nodes of "
        "the job (docs/launching.md, \"Placement by role\")."))
    trainer_nodelist: Line | None = Field(default=None, description=(
        "Which hosts run the trainers, as a Slurm host list (e.g. trn[01-02]). As many hosts as nodes - "
        "generator_nodes, asked for with sbatch --nodelist. Unset: the job's nodes that do not "
        "generate (docs/launching.md, \"Placement by role\")."))


class Launcher(_Section):
    """Where jobs run (docs/launching.md)."""

    type: Literal[LAUNCHER_NAMES] = Field(default=DEFAULT_LAUNCHER, description=(
        "Where jobs run (docs/launching.md); scalectl run --launcher overrides it."))
    max_parallel: int = Field(default=1, ge=1, le=DEVICES_MAX, description=(
        "Most detached local runs of one runs folder that train at once; the others wait as pending "
        "(docs/launching.md, \"Local\")."))
    slurm: Slurm = Field(default=Slurm(), description=(
        "Slurm resources of each job, passed to submitit (launcher.type = slurm)."))
    stall_timeout_s: float | None = Field(default=None, ge=1, le=7 * 24 * 3600, description=(
        "Seconds a generator may make no progress before the run fails naming it, as for a lost task. "
        "No progress: no decoding step, no turn of its loop, while its process and heartbeat live and "
        "the first trainer rank waits on it for rollouts or for it to take weights (docs/launching.md, \"A "
        "task that hangs\"). Unset: 5 x the slowest step seen so far (from one batch to the next: "
        "generation, training, evaluation, checkpoint), at least 300 s."))


class Budget(_Section):
    """When a run stops: after ``steps`` optimiser steps and/or ``gpu_hours``
    of compute, whichever comes first."""

    steps: int | None = Field(default=None, ge=1, le=STEPS_MAX, description=(
        "Optimiser steps after which the run stops. Unset: budget.gpu_hours alone decides."))
    gpu_hours: float | None = Field(default=None, gt=0, le=GPU_HOURS_MAX, description=(
        "GPU-hours (devices x wall-clock hours) after which the run stops. Unset: budget.steps "
        "alone decides."))
    no_signal_steps: int = Field(default=10, ge=0, le=STEPS_MAX, description=(
        "Steps without learning signal at the start of a run after which it stops (0: never). A step has "
        "none when every group's completions got one reward, so every advantage and the gradient are 0; the "
        "run saves a checkpoint and says why and what to try (scalectl.rl.loop). Not part of the content hash."))

    @model_validator(mode="after")
    def _some_budget(self) -> "Budget":
        if self.steps is None and self.gpu_hours is None:
            raise ValueError("set budget.steps or budget.gpu_hours (or both)")
        return self


class Logging(_Section):
    """Where per-step metrics and evaluation points go besides the store and
    ``steps.jsonl`` (:mod:`scalectl.job.trackers`; README, "Metrics in TensorBoard, W&B,
    MLflow")."""

    backends: list[Literal["tensorboard", "wandb", "mlflow", "jsonl"]] = Field(
        default_factory=list, max_length=4, description=(
            "Trackers that receive every step's metrics and every evaluation point, several at once. "
            "tensorboard writes RUN_DIR/tensorboard, jsonl RUN_DIR/metrics.jsonl."))
    project: Line = Field(default="scalectl", min_length=1, description=(
        "The W&B project and the MLflow experiment."))
    wandb_mode: Literal["online", "offline"] | None = Field(default=None, description=(
        "Whether W&B syncs as it logs (online) or writes files to sync later (offline). Unset: W&B's "
        "own default ($WANDB_MODE)."))
    wandb_entity: Line | None = Field(default=None, description=(
        "W&B entity (user or team). Unset: W&B's own default."))
    mlflow_tracking_uri: Line | None = Field(default=None, description=(
        "MLflow tracking URI. Unset: MLflow's own default ($MLFLOW_TRACKING_URI)."))
    rollouts: bool = Field(default=False, description=(
        "Write every trained completion to RUN_DIR/rollouts.jsonl. Each line holds its tokens, per-token "
        "policy versions, the generator's log-probs and the trainer's recomputation (one extra forward "
        "pass per step, not counted in the run's compute; scalectl.rl.loop.rollout_lines)."))

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
HASH_NEUTRAL = {("model", "think_tags"): False, ("async", "schedule"): "streaming", ("data", "mix"): {},
                ("model", "warm_start_smoothing"): 0.0, ("model", "warm_start_greedy"): None,
                ("model", "warm_start_problems"): None,
                ("hardware", "gpus_per_generator"): 1,
                ("reward", "function"): BUILTIN_REWARD, ("reward", "format"): "boxed",
                ("reward", "instruction"): True, ("reward", "version"): None, ("reward", "timeout_s"): 5.0,
                ("reward", "convention"): None, ("reward", "truncated"): "as_written",
                ("fit", "r0"): "auto"}
#: Keys that change speed, memory or where work runs, never what is trained or measured (or
#: that only describe the checkpoint for the dry run, or stop a run that has no learning
#: signal): excluded from the content hash.
SPEED_ONLY_KEYS = (("hardware", "threads"), ("hardware", "compile"), ("hardware", "gpu_memory_utilization"),
                   ("hardware", "max_num_seqs"), ("hardware", "decode_memory_mib"), ("hardware", "evaluation"),
                   ("hardware", "gradient_checkpointing"), ("eval", "background"), ("model", "config"),
                   ("budget", "no_signal_steps"))


class Recipe(_Section):
    """A validated, frozen run description: recipe (how) merged with setup (where).

    Build it with :func:`scalectl.recipe.load.load`; ``content_hash`` identifies
    the training content (everything but name, description, seed, launcher,
    checkpoint frequency and logging), so that
    repeated runs (seeds) of one recipe share a hash.
    """

    name: Line = Field(default="run", max_length=100, description=(
        "Name of the recipe, leading its runs' names (NAME-sSEED). A recipe file that sets none is "
        "named for its file's stem."))
    description: Text = Field(default="", max_length=10_000, description=(
        "What the recipe is, in words (shown by scalectl recipes); not part of the content hash."))
    seed: int = Field(default=0, ge=0, le=SEED_MAX, description=(
        "Seed of the run (scalectl run --seed). Not part of the content hash: the runs of one recipe "
        "with different seeds are its repeats."))
    loss: Loss = Field(default=Loss(), description=(
        "Policy loss, its clip values and the loss aggregation (docs/recipe-axes.md, \"Loss\")."))
    advantage: Advantage = Field(default=Advantage(), description=(
        "Advantage normalization (docs/recipe-axes.md, \"Advantage normalization\")."))
    precision: Precision = Field(default=Precision(), description=(
        f"LM-head precision ({_SCALERL}, Sec. 3.2)."))
    async_: Async = Field(default=Async(), alias="async", description=(
        "Asynchrony between generation and training (docs/recipe-axes.md, \"Asynchrony\")."))
    filter: Filter = Field(default=Filter(), description=(
        "Prompt filters: zero-variance groups, dynamic sampling, retiring solved prompts "
        "(docs/recipe-axes.md, \"Prompt filtering\")."))
    length: Length = Field(default=Length(), description=(
        "Generation length and its control (docs/recipe-axes.md, \"Length control\")."))
    batch: Batch = Field(default=Batch(), description=(
        "Prompts per step, completions per prompt, micro-batches (docs/recipe-axes.md, \"Batch\")."))
    optim: Optim = Field(default=Optim(), description=(
        f"The AdamW optimiser and its warm-up ({_SCALERL}, App. A.3)."))
    sampling: Sampling = Field(default=Sampling(), description="Sampling settings of the training rollouts.")
    eval: Eval = Field(default=Eval(), description=(
        "Evaluation protocol: when, on how many held-out prompts, with how many samples "
        "(docs/method.md, section 5)."))
    reward: Reward = Field(default=Reward(), description=(
        "How completions are scored: the built-in checker or a function of the user's, and the answer "
        "format (docs/rewards.md)."))
    fit: Fit = Field(default=Fit(), description=(
        "How the sigmoid is fitted to the run's points (docs/method.md, section 2)."))
    checkpoint: Checkpoint = Field(default=Checkpoint(), description=(
        "Checkpoints in the run folder; not part of the content hash."))
    model: Model = Field(default=Model(), description="The policy model (setup).")
    data: Data = Field(default=Data(), description=(
        "The prompt set and its held-out split (setup; docs/real-data.md)."))
    hardware: Hardware = Field(default=Hardware(), description=(
        "What the run runs on: devices, roles, ZeRO stage, rollout engine (setup; docs/launching.md, "
        "\"Scale\")."))
    launcher: Launcher = Field(default=Launcher(), description=(
        "Where jobs run: this machine or Slurm (setup; docs/launching.md); not part of the content hash."))
    budget: Budget = Field(default=Budget(steps=100), description=(
        "When a run stops: optimiser steps and/or GPU-hours, whichever comes first (setup)."))
    logging: Logging = Field(default=Logging(), description=(
        "Trackers besides the store: TensorBoard, W&B, MLflow, JSON lines; not part of the content hash."))

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_background_eval(self) -> "Recipe":
        if self.eval.background == "on" and self.hardware.rollout_engine != "cpu":
            raise ValueError("eval.background = 'on' needs hardware.rollout_engine = 'cpu' (a background "
                             "evaluation samples with a copy of the policy in a CPU engine); allowed with "
                             f"{self.hardware.rollout_engine!r}: auto, off")
        if self.eval.background == "on" and self.hardware.evaluation in ("generators", "dedicated"):
            raise ValueError(f"eval.background = 'on' overlaps an evaluation on the trainer, but "
                             f"hardware.evaluation = {self.hardware.evaluation!r} evaluates on the generators; "
                             "use eval.background = auto or off, or hardware.evaluation = trainer")
        return self

    def to_dict(self) -> dict:
        """The normalised recipe as plain JSON-able data (keys as in the TOML files)."""
        return self.model_dump(mode="json", by_alias=True)

    @property
    def content_hash(self) -> str:
        """12 hex digits of SHA-256 over the normalised content, key order
        independent; :data:`UNHASHED_KEYS` and :data:`SPEED_ONLY_KEYS` excluded, and each key
        of :data:`HASH_NEUTRAL` at its neutral value (a section left empty by them, as ``reward``
        at its defaults, with it)."""
        data = {k: v for k, v in self.to_dict().items() if k not in UNHASHED_KEYS}
        for section, key in SPEED_ONLY_KEYS:
            data[section].pop(key, None)
        for (section, key), neutral in HASH_NEUTRAL.items():
            if data[section].get(key, neutral) == neutral:
                data[section].pop(key, None)
        data = {k: v for k, v in data.items() if v != {}}     # a section wholly at its neutral values
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: The budget every recipe is given by :func:`training_key` before hashing.
_KEY_BUDGET = {"steps": 1, "gpu_hours": None}


def hash_at_budget(recipe: "Recipe | dict | None", steps: int) -> str | None:
    """The content hash the same recipe has with ``budget.steps = steps`` (and no
    ``budget.gpu_hours``): the recipe of a run read up to that step, as a run extended past its
    budget still holds the shorter run's points.  None as :func:`training_key` says."""
    data = recipe.to_dict() if isinstance(recipe, Recipe) else dict(recipe or {})
    if not data:
        return None
    data["budget"] = dict(data.get("budget") or {}, steps=int(steps), gpu_hours=None)
    try:
        return Recipe.model_validate(data).content_hash
    except (ValueError, TypeError):
        return None


def training_key(recipe: "Recipe | dict | None") -> str | None:
    """The content hash of a recipe with its budget left out: what two runs share when one is
    the other trained further (the budget only says when the loop stops, :mod:`scalectl.rl.loop`),
    as seeds of one recipe trained to different budgets do.

    Args:
        recipe: a :class:`Recipe`, or a stored run's recipe as a dict.

    Returns:
        12 hex digits (:attr:`Recipe.content_hash` of the recipe with ``budget.steps = 1`` and no
        ``budget.gpu_hours``), or None for an empty dict or a stored dict that no longer
        validates (a recipe of an older scalectl with a key since removed).
    """
    data = recipe.to_dict() if isinstance(recipe, Recipe) else dict(recipe or {})
    if not data:
        return None
    data["budget"] = dict(data.get("budget") or {}, **_KEY_BUDGET)
    try:
        return Recipe.model_validate(data).content_hash
    except (ValueError, TypeError):
        return None
