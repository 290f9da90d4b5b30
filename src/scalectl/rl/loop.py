"""The RL loop: prompts -> rollouts -> rewards -> advantages -> loss -> optimiser step.

One loop (:func:`train`) for every ``async.mode``: the mode's schedule
(:mod:`scalectl.rl.schedule.modes`) supplies each batch, generated in this process
(``sync``, ``ppo_off_policy``) or streamed by generator processes
(``pipeline``, :mod:`scalectl.rl.processes.bodies`).  Every ``eval.every_steps``
steps, and before the first, the held-out prompts are evaluated and the
point (:class:`~scalectl.points.EvalPoint`) goes to the run's sink with the
compute spent so far.  :mod:`scalectl.rl.run` starts a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scalectl.errors import UserError
from scalectl.rl.accounting import ComputeMeter
from scalectl.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from scalectl.rl.batches.filters import PromptHistory, PromptSampler, pool_warning
from scalectl.rl.policy.model import pad_token_id
from scalectl.rl.rollout.sampling import SamplingParams


class NoLearningSignal(UserError):
    """The first ``budget.no_signal_steps`` steps of a run had no learning signal (:func:`without_signal`)."""


def without_signal(metrics: dict) -> bool:
    """Whether a step's metrics show no learning signal: every group's completions got one reward
    (``zero_variance_share`` 1, so every advantage is 0) and no gradient (``grad_norm`` 0, or no
    step taken: every group filtered)."""
    return metrics.get("zero_variance_share", 0.0) >= 1.0 and not metrics.get("grad_norm")


def no_signal_message(recipe, name: str, steps: list[dict]) -> str:
    """Why a run stops for want of a learning signal, and what to try (``steps``: the metrics of
    the steps without one)."""
    reward = sum(m.get("reward", 0.0) for m in steps) / len(steps)
    truncated = sum(m.get("truncation_rate", 0.0) for m in steps) / len(steps)
    G = recipe.batch.generations_per_prompt
    return (f"no learning signal in the first {len(steps)} steps: in each, every group's {G} completions got one "
            f"reward (mean reward {reward:.2f}, truncation rate {truncated:.2f}), so every advantage and the "
            "gradient norm were 0 and the policy cannot learn from its rollouts. Try a model that solves some "
            "prompts already (warm-start it by a supervised stage: docs/real-data.md, 'Your own model'), easier "
            "prompts, more completions per prompt (batch.generations_per_prompt), a larger length.max_new_tokens "
            "when completions are cut, or a reward with partial credit. A checkpoint is saved: `scalectl run "
            f"--resume {name} --set budget.no_signal_steps=0` trains on regardless.")


class Reporter:
    """What the loop tells its caller; the CLI shows it, tests can record it."""

    def start(self, total_steps: int | None, first_step: int) -> None: ...
    def step(self, step: int, metrics: dict) -> None: ...
    def eval(self, step: int, point: dict) -> None: ...
    def log(self, message: str) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Policy:
    """The model, tokenizer, rollout engine and trainer of one run.

    ``ranks`` is the :class:`~scalectl.rl.train.data_parallel.TrainerRanks` over every trainer
    rank (``trainer`` alone when there is one): steps, checkpoints and restores go through it."""

    model: object
    tokenizer: object
    engine: object
    trainer: object
    n_params: int
    ranks: object = None


@dataclass
class LoopState:
    """Everything a checkpoint must carry besides the engine."""

    step: int
    meter: ComputeMeter
    sampler: PromptSampler
    history: PromptHistory
    pending: list = field(default_factory=list)   # generated batches not yet trained (off-policy)
    requests: list = field(default_factory=list)  # prompts requested from generators, not consumed (pipeline)
    evaluated: list = field(default_factory=list)
    last_metrics: dict = field(default_factory=dict)   # what the next point carries of the last step

    def to_dict(self) -> dict:
        return {"step": self.step, "meter": self.meter.to_dict(), "sampler": self.sampler.state_dict(),
                "history": self.history.to_dict(), "pending": self.pending, "requests": list(self.requests),
                "evaluated": self.evaluated, "last_metrics": self.last_metrics}


def load_model(recipe, reporter: Reporter):
    """The policy's (model, tokenizer) in ``model.dtype``, warm-started first for ``builtin:`` paths."""
    from scalectl.rl.policy.model import load_policy
    from scalectl.rl.train.warmstart import ensure_warm_start

    path = recipe.model.path
    if path.startswith("builtin:"):
        path = ensure_warm_start(recipe, log=reporter.log)
    return load_policy(path, recipe.model.dtype)


def build_policy(recipe, reporter: Reporter, *, engine: bool = True) -> Policy:
    """Load (or build and warm-start) the model, and wrap it in an engine and a trainer.

    Args:
        engine: False: the policy holds no rollout engine (a trainer process whose run evaluates
            on the generators): :class:`~scalectl.rl.rollout.base.NoRolloutEngine` in its place.

    With ``hardware.gradient_checkpointing`` the model recomputes each layer's activations in
    the backward pass (transformers' non-reentrant checkpointing; the same gradients).
    """
    from scalectl.rl.policy.model import n_params
    from scalectl.rl.rollout import make_engine
    from scalectl.rl.rollout.base import NoRolloutEngine
    from scalectl.rl.train.trainer import PolicyTrainer

    model, tokenizer = load_model(recipe, reporter)
    if recipe.hardware.gradient_checkpointing:   # named activation checkpointing from transformers 5.24
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    head_fp32 = recipe.precision.lm_head == "fp32"
    trainer = PolicyTrainer(model, loss=recipe.loss, optim=recipe.optim, head_fp32=head_fp32,
                            temperature=SamplingParams.for_training(recipe).temperature,
                            micro_batch_size=recipe.batch.micro_batch_size,
                            zero_stage=recipe.hardware.zero_stage, dtype=recipe.model.dtype)
    reporter.log(f"training pass: {trainer.packing.reason}")
    from scalectl.rl.train.data_parallel import TrainerRanks

    engine = make_engine(recipe, trainer.model, tokenizer) if engine else NoRolloutEngine()
    ranks = TrainerRanks(trainer, recipe.advantage.normalization, pad_token_id(tokenizer))
    return Policy(trainer.model, tokenizer, engine, trainer, n_params(trainer.model), ranks)


def new_state(recipe, n_params: int, n_train: int) -> LoopState:
    """A run's state before its first step."""
    return LoopState(step=0, meter=ComputeMeter(devices=recipe.hardware.devices, n_params=n_params),
                     sampler=PromptSampler(n_train, recipe.seed),
                     history=PromptHistory(threshold=recipe.filter.retire_threshold,
                                           rule=recipe.filter.retire_rule))


def restore_state(run_dir: Path, trainer, state: LoopState, reporter: Reporter) -> bool:
    """Load the latest checkpoint of ``run_dir`` into ``trainer`` and ``state``; False if there is none."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return False
    saved = load_checkpoint(ckpt, trainer)
    state.step, state.meter = saved["step"], ComputeMeter.from_dict(saved["meter"])
    state.sampler.load_state_dict(saved["sampler"])
    state.history = PromptHistory.from_dict(saved["history"])
    state.pending, state.evaluated = saved["pending"], saved["evaluated"]
    state.requests = saved.get("requests", [])           # absent from checkpoints of older versions
    state.last_metrics = saved.get("last_metrics", {})   # absent from checkpoints of older versions
    trim_steps(run_dir, state.step)
    reporter.log(f"resumed from {ckpt.name} (step {state.step})")
    return True


def trim_steps(run_dir: Path, step: int) -> None:
    """Drop the lines of ``RUN_DIR/steps.jsonl`` after ``step``, and those of
    ``RUN_DIR/rollouts.jsonl`` trained by a step after it (their ``step`` is the trainer
    version before the step: >= ``step``): steps a crash lost after the checkpoint, which
    the resumed run takes again.  Every step is logged once."""
    for name, last in (("steps.jsonl", step), ("rollouts.jsonl", step - 1)):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= last]
        if len(kept) != len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(kept))
            tmp.replace(path)


def budget_spent(budget, state: LoopState) -> bool:
    """Whether ``budget.steps`` or ``budget.gpu_hours`` is reached."""
    return ((budget.steps is not None and state.step >= budget.steps)
            or (budget.gpu_hours is not None and state.meter.gpu_hours >= budget.gpu_hours))


def eval_due_on_start(recipe, state: LoopState) -> bool:
    """At the start of a run or a resume: evaluate when this step's scheduled point
    is missing (R0 at step 0, or a point a crash lost); a run stopped between two
    evaluation steps gets no extra point."""
    if state.step in state.evaluated:
        return False
    return (state.step % recipe.eval.every_steps == 0) or budget_spent(recipe.budget, state)


def train_on_groups(recipe, policy: Policy, groups: list, stats: dict, meter: ComputeMeter) -> dict:
    """One optimiser step on the kept groups over every trainer rank (none: a step without
    gradient); returns the step's metrics."""
    metrics = dict(stats)
    if groups:
        metrics.update(policy.ranks.step(groups))
        meter.add_training(sum(len(c.prompt_ids) + len(c.token_ids) for g in groups for c in g.completions))
    else:
        metrics["skipped"] = True   # every group filtered: no gradient this step
    return metrics


def point_fields(state: LoopState) -> dict:
    """The fields of ``state.step``'s evaluation point that are not the evaluation's own:
    the compute spent so far and what the last step carried."""
    return dict(step=state.step, gpu_hours=state.meter.gpu_hours, flops=state.meter.flops,
                tokens=state.meter.tokens, samples=state.meter.samples,
                retired_prompts=len(state.history.retired), wall_seconds=state.meter.seconds,
                **state.last_metrics)


def evaluations_for(recipe, policy: Policy, eval_problems: list, in_processes: bool):
    """The run's :class:`~scalectl.rl.evaluation.during_training.Evaluations`: in the background
    (:func:`~scalectl.rl.evaluation.during_training.runs_in_background`, which depends on whether
    the run is ``in_processes``) on a copy of the policy that takes the trainer's weights
    (gathered first under ZeRO-3) at each start, else in the loop's thread on the policy's engine."""
    from scalectl.rl.evaluation.during_training import Evaluations, background_engine, runs_in_background

    if not runs_in_background(recipe, in_processes):
        return Evaluations(recipe, policy.engine, eval_problems)

    def load_weights(engine, version: int) -> None:
        def copy(model) -> None:
            engine.update_weights(model.state_dict(), version)
        policy.ranks.gathered(copy) if policy.ranks is not None else copy(policy.model)

    return Evaluations(recipe, policy.engine, eval_problems, load_weights=load_weights,
                       background=background_engine(recipe, policy.model, policy.tokenizer),
                       threads=torch.get_num_threads())


def append_step(run_dir: Path, metrics: dict) -> dict:
    """Append one step's metrics to ``RUN_DIR/steps.jsonl``; return what evaluation points carry of them."""
    with (Path(run_dir) / "steps.jsonl").open("a") as fh:
        fh.write(json.dumps(metrics) + "\n")
    return {"train_reward": metrics["reward"], "entropy": metrics.get("entropy"),
            "logprob_mismatch": metrics.get("logprob_mismatch")}


def rollout_lines(recipe, policy: Policy, step: int, groups: list) -> list[dict]:
    """The completions trained by the step taken at trainer version ``step``, one dict per
    completion (``logging.rollouts``; a line of ``RUN_DIR/rollouts.jsonl`` each).

    Each holds ``step``, ``prompt_id``, ``prompt_ids`` and ``token_ids`` (token ids),
    ``loss_mask`` (0 on forced interruption tokens), ``versions`` (the policy version that
    sampled each token: its staleness is ``step - version``), ``gen_logprobs`` (the
    generator's log-prob of each token, nats; NaN where it recorded none) and
    ``train_logprobs`` (the trainer's teacher-forced log-prob of each token on its weights
    of version ``step``, before the step: :func:`scalectl.rl.policy.logprobs.token_logprobs` on the
    unpadded prompt + completion, with the loss's LM-head precision and temperature), and
    ``reward`` and ``generator`` (the rank of the generator process that sampled it; None
    in one process).  Under ZeRO-3 every trainer rank gathers its partitions for the pass
    (:meth:`~scalectl.rl.train.data_parallel.TrainerRanks.gathered`).
    """
    from scalectl.rl.policy.logprobs import token_logprobs

    head_fp32 = recipe.precision.lm_head == "fp32"
    temperature = SamplingParams.for_training(recipe).temperature
    completions = [(g, i, c) for g in groups for i, c in enumerate(g.completions)]

    def recompute(model) -> list[list[float]]:
        device = next(model.parameters()).device
        out = []
        with torch.no_grad():
            for _, _, c in completions:
                ids = torch.tensor([list(c.prompt_ids) + list(c.token_ids)], device=device)
                logp, _ = token_logprobs(model, ids, torch.ones_like(ids), head_fp32=head_fp32,
                                         temperature=temperature, start=len(c.prompt_ids) - 1, with_entropy=False)
                out.append(logp[0].float().tolist())
        return out

    train_lp = policy.ranks.gathered(recompute) if policy.ranks is not None else recompute(policy.model)
    return [{"step": step, "prompt_id": g.prompt_id, "prompt_ids": list(c.prompt_ids), "token_ids": list(c.token_ids),
             "loss_mask": list(c.loss_mask), "versions": list(c.versions), "gen_logprobs": list(c.logprobs),
             "train_logprobs": lp, "reward": float(g.rewards[i]), "generator": g.generator}
            for (g, i, c), lp in zip(completions, train_lp)]


def prepare(recipe, run_dir: Path, n_train: int, reporter: Reporter, resume: bool, *,
            engine: bool = True) -> tuple[Policy, LoopState]:
    """The policy and loop state a run starts from: seeded, built (with a rollout engine unless
    ``engine`` is False, :func:`build_policy`), restored from the latest checkpoint of ``run_dir``
    when ``resume``, the engine at the trainer's version."""
    torch.manual_seed(recipe.seed)
    policy = build_policy(recipe, reporter, engine=engine)
    state = new_state(recipe, policy.n_params, n_train)
    if resume:
        restore_state(run_dir, policy.ranks, state, reporter)
    policy.engine.update_weights(None, state.step)
    return policy, state


@dataclass
class _Run:
    """One call of :func:`train`: what its steps share, and the steps' parts."""

    recipe: object
    policy: Policy
    state: LoopState
    source: object
    run_dir: Path
    evals: object
    sink: object
    reporter: Reporter
    boundary: dict | None = None    # while a step is under way: the state saved if it is interrupted
    warned_pool: bool = False       # the warning of a training pool emptied by retirement: once per process
    warned_short: bool = False      # the warning of a dynamic-sampling batch trained short: once per process
    warned_checker: bool = False    # the warning of an answer the checker could not judge: once per process
    quiet: list | None = None       # the metrics of the first steps without a learning signal (None: not checked)

    def done(self) -> bool:
        return budget_spent(self.recipe.budget, self.state)

    def deliver(self, finished: list) -> None:
        for point, seconds in finished:
            self.sink(point)
            self.state.evaluated.append(point.step)
            self.reporter.eval(point.step, {**point.to_dict(), "eval_seconds": seconds})

    def evaluate(self) -> None:
        # the last point is evaluated here: nothing is left to overlap it with, and the
        # final checkpoint then holds it
        self.deliver(self.evals.start(point_fields(self.state), wait=self.done()))

    def snapshot(self) -> dict:
        saved = {**self.state.to_dict(), **self.source.checkpoint_fields()}
        saved["pending"] = list(saved["pending"])      # the source pops from the live list
        return saved

    def checkpoint(self, saved: dict | None = None) -> None:
        # a background evaluation of an earlier step is waited for (its point is then in the
        # checkpoint); one of this step stays under way and is not in it: a run resumed here
        # evaluates the step again, with the same weights and seed
        if self.evals.pending_step() is not None and self.evals.pending_step() < self.state.step:
            self.deliver(self.evals.wait())
        save_checkpoint(self.run_dir, self.state.step, self.policy.ranks, saved or self.snapshot(),
                        self.recipe.checkpoint.keep)

    def take_step(self) -> dict:
        """Fetch a batch, take one optimiser step on it, bring the engine and the source to the
        new version; returns the step's metrics so far."""
        state, source = self.state, self.source
        # An interruption inside a step saves the state as of the step before it: the groups
        # fetched so far (counted in the compute meter and the prompt history, drawn from the
        # sampler) are fetched again on resume, so they must not be in the checkpoint.
        self.boundary = self.snapshot()
        with state.meter.timer():
            groups, stats = source.next_batch(state.step)
        if self.recipe.logging.rollouts and groups:     # a diagnostic: outside the run's compute
            with (Path(self.run_dir) / "rollouts.jsonl").open("a") as fh:
                for line in rollout_lines(self.recipe, self.policy, state.step, groups):
                    fh.write(json.dumps(line) + "\n")
        with state.meter.timer():
            metrics = train_on_groups(self.recipe, self.policy, groups, stats, state.meter)
            state.step += 1
            self.boundary = None
            self.policy.engine.update_weights(None, state.step)
            source.after_step(state.step)
        return metrics

    def record(self, metrics: dict) -> None:
        """The step's finished evaluations, its metrics (``steps.jsonl``, the reporter), a warning."""
        state = self.state
        self.deliver(self.evals.finished())
        metrics.update(self.source.step_metrics(state.step))
        metrics.update(step=state.step, gpu_hours=state.meter.gpu_hours, flops=state.meter.flops)
        state.last_metrics = append_step(self.run_dir, metrics)
        self.reporter.step(state.step, metrics)
        if not self.warned_short and metrics.get("short_batch"):
            self.reporter.log(f"warning: step {state.step}: {metrics['short_batch_reason']} This step trained "
                              f"on its {metrics['groups_kept']} groups; later short steps are counted in "
                              "steps.jsonl (short_batch), not repeated here.")
            self.warned_short = True
        if not self.warned_checker and metrics.get("checker_errors"):
            self.reporter.log(f"warning: step {state.step}: the answer checker could not judge "
                              f"{metrics['checker_errors']} completion(s), scored -1: {metrics.get('checker_error')}; "
                              "later ones are counted in steps.jsonl (checker_errors), not repeated here.")
            self.warned_checker = True
        if not self.warned_pool and (warning := pool_warning(len(state.history.retired), state.sampler.n_prompts)):
            self.reporter.log(f"warning: step {state.step}: {warning}")
            self.warned_pool = True

    def when_due(self) -> None:
        """The evaluation and the checkpoint due after the step just taken."""
        step = self.state.step
        if step % self.recipe.eval.every_steps == 0 or self.done():
            self.evaluate()
        if step % self.recipe.checkpoint.every_steps == 0 or self.done():   # done: a raised budget continues here
            self.checkpoint()

    def check_signal(self, metrics: dict) -> None:
        """Stop (after a checkpoint) when the run's first ``budget.no_signal_steps`` steps all lacked a
        learning signal (:func:`without_signal`); a step with one ends the check, and so does the end
        of the budget (a run of no more steps completes)."""
        if self.quiet is None or self.done():
            return
        if not without_signal(metrics):
            self.quiet = None
            return
        self.quiet.append(metrics)
        if len(self.quiet) >= self.recipe.budget.no_signal_steps:
            message = no_signal_message(self.recipe, Path(self.run_dir).name, self.quiet)
            self.deliver(self.evals.wait())
            self.checkpoint()
            raise NoLearningSignal(message)

    def interrupted(self) -> None:
        """Save a checkpoint as of the last step taken (a background evaluation's point is not lost)."""
        self.reporter.log(f"interrupted at step {self.state.step}: saving a checkpoint")
        self.deliver(self.evals.wait())
        if self.boundary is not None:
            self.boundary["evaluated"] = list(self.state.evaluated)
        self.checkpoint(self.boundary)


def train(recipe, policy: Policy, state: LoopState, source, *, schedule, run_dir: Path, eval_problems: list,
          sink, reporter: Reporter, stop=None, evaluations=None) -> dict:
    """The RL loop, the same for every async mode: train until the budget is spent.

    Each step takes the next batch from ``source`` (the schedule's
    :class:`~scalectl.rl.schedule.modes.BatchSource`), takes one optimiser step, brings the
    engine to the new version and tells the source.  Every ``eval.every_steps`` steps,
    at the end, and at the start when the point is missing, the held-out prompts are
    evaluated and the point goes to ``sink``; every ``checkpoint.every_steps`` steps
    (and when interrupted) a checkpoint is saved.  A run started at step 0 whose first
    ``budget.no_signal_steps`` steps all lack a learning signal (:func:`without_signal`) stops
    after a checkpoint, saying why and what to try.

    Args:
        recipe: the validated :class:`~scalectl.recipe.schema.Recipe`.
        policy, state: from :func:`prepare`.
        source: ``schedule.batches(...)``.
        schedule: the job's :class:`~scalectl.rl.schedule.modes.Schedule` (whether the run is in
            processes decides where evaluations run: :func:`evaluations_for`).
        run_dir: the run folder (checkpoints, ``steps.jsonl``).
        eval_problems: the held-out prompts.
        sink: ``sink(point)`` receives each :class:`~scalectl.points.EvalPoint` (e.g. the store).
        reporter: progress.
        stop: a flag (``is_set()``) checked before each step; set, the loop stops as if interrupted.
        evaluations: where the held-out evaluations run, when not here (e.g. on the generator
            processes, :class:`scalectl.rl.evaluation.on_generators.GeneratorEvaluations`); the
            same interface as :class:`~scalectl.rl.evaluation.during_training.Evaluations`.
            None: :func:`evaluations_for`.

    Returns:
        steps, gpu_hours, flops, retired_prompts at the end.

    Raises:
        KeyboardInterrupt: after saving a checkpoint, when interrupted.
        NoLearningSignal: after saving a checkpoint, when the first steps had no learning signal.
    """
    hw = recipe.hardware
    evals = evaluations or evaluations_for(recipe, policy, eval_problems,
                                           schedule.in_processes(hw.generators, hw.trainers))
    run = _Run(recipe, policy, state, source, run_dir, evals, sink, reporter,
               quiet=[] if state.step == 0 and recipe.budget.no_signal_steps else None)
    reporter.start(recipe.budget.steps, state.step)
    try:
        if eval_due_on_start(recipe, state):
            run.evaluate()
        while not run.done():
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            metrics = run.take_step()
            run.record(metrics)
            run.when_due()
            run.check_signal(metrics)
    except KeyboardInterrupt:
        run.interrupted()
        raise
    finally:
        source.close()
        reporter.stop()
    return {"steps": state.step, "gpu_hours": state.meter.gpu_hours, "flops": state.meter.flops,
            "retired_prompts": len(state.history.retired)}
