"""The RL loop: prompts -> rollouts -> rewards -> advantages -> loss -> optimiser step.

One process generates and trains (modes ``sync`` and ``ppo_off_policy``;
the streaming ``pipeline`` mode runs generator and trainer as separate
processes, :mod:`scalectl.rl.pipeline`).  Every ``eval.every_steps`` steps,
and before the first, the held-out prompts are evaluated and the point lands
in the store with the compute spent so far.

* ``sync``: one batch generated with policy version v, one step.
* ``ppo_off_policy`` (k): k batches generated with version v, then k steps on
  them; batch j is trained by version v + j, so the importance ratio
  pi_train / pi_gen corrects up to k - 1 versions of staleness.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scalectl.rl.accounting import ComputeMeter
from scalectl.rl.batch import build_train_batch, keep_groups
from scalectl.rl.cores import set_cpu_threads
from scalectl.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from scalectl.rl.evaluate import evaluate
from scalectl.rl.filters import PromptHistory, PromptSampler, groups_to_refill
from scalectl.rl.groups import rollout_stats, score_groups
from scalectl.rl.model import pad_token_id
from scalectl.rl.rollout.sampling import SamplingParams


class Reporter:
    """What the loop tells its caller; the CLI shows it, tests can record it."""

    def start(self, total_steps: int | None, first_step: int) -> None: ...
    def step(self, step: int, metrics: dict) -> None: ...
    def eval(self, step: int, point: dict) -> None: ...
    def log(self, message: str) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Policy:
    """The model, tokenizer, rollout engine and trainer of one run."""

    model: object
    tokenizer: object
    engine: object
    trainer: object
    n_params: int


@dataclass
class LoopState:
    """Everything a checkpoint must carry besides the engine."""

    step: int
    meter: ComputeMeter
    sampler: PromptSampler
    history: PromptHistory
    pending: list = field(default_factory=list)   # generated batches not yet trained (off-policy)
    evaluated: list = field(default_factory=list)
    last_metrics: dict = field(default_factory=dict)   # what the next point carries of the last step

    def to_dict(self) -> dict:
        return {"step": self.step, "meter": self.meter.to_dict(), "sampler": self.sampler.state_dict(),
                "history": self.history.to_dict(), "pending": self.pending, "evaluated": self.evaluated,
                "last_metrics": self.last_metrics}


def load_model(recipe, reporter: Reporter):
    """The policy's (model, tokenizer) in ``model.dtype``, warm-started first for ``builtin:`` paths."""
    from scalectl.rl.model import load_policy
    from scalectl.rl.warmstart import ensure_warm_start

    path = recipe.model.path
    if path.startswith("builtin:"):
        path = ensure_warm_start(recipe, log=reporter.log)
    return load_policy(path, recipe.model.dtype)


def build_policy(recipe, reporter: Reporter) -> Policy:
    """Load (or build and warm-start) the model, and wrap it in an engine and a trainer."""
    from scalectl.rl.model import n_params
    from scalectl.rl.rollout import make_engine
    from scalectl.rl.trainer import PolicyTrainer

    model, tokenizer = load_model(recipe, reporter)
    head_fp32 = recipe.precision.lm_head == "fp32"
    trainer = PolicyTrainer(model, loss=recipe.loss, optim=recipe.optim, head_fp32=head_fp32,
                            temperature=SamplingParams.for_training(recipe).temperature,
                            micro_batch_size=recipe.batch.micro_batch_size,
                            zero_stage=recipe.hardware.zero_stage, dtype=recipe.model.dtype)
    engine = make_engine(recipe, trainer.model, tokenizer)
    return Policy(trainer.model, tokenizer, engine, trainer, n_params(trainer.model))


def collect_batch(recipe, fetch, state: LoopState) -> tuple[list, dict]:
    """One training batch of scored groups, filtered, with dynamic-sampling refills.

    Args:
        fetch: ``fetch(want, refill_round)`` returns ``want`` more scored groups and
            has counted them (compute meter, prompt history).

    Returns:
        (kept groups, rollout statistics over every fetched group).

    Raises:
        DynamicSamplingExhausted: dynamic sampling used every refill round.
    """
    P, filt = recipe.batch.prompts_per_step, recipe.filter
    kept, generated, want, rounds_done = [], [], P, 0
    while True:
        groups = fetch(want, rounds_done)      # round 0 is the step's own; 1.. are refills
        generated += groups
        kept += keep_groups(groups, filt.zero_variance or filt.dynamic_sampling)
        if not filt.dynamic_sampling:
            break
        want = groups_to_refill(len(kept), P, rounds_done, filt.max_refill_rounds,
                                keep_rate=len(kept) / len(generated))
        if want == 0:
            break
        rounds_done += 1
    if filt.dynamic_sampling:
        kept = kept[:P]
    stats = rollout_stats(generated)
    stats["groups_kept"] = len(kept)
    stats["retired_prompts"] = len(state.history.retired)
    return kept, stats


def count_groups(recipe, groups: list, state: LoopState) -> None:
    """Add generated groups to the compute meter and (when retiring solved prompts) the prompt history."""
    G = recipe.batch.generations_per_prompt
    state.meter.add_generation(sum(len(c.prompt_ids) for g in groups for c in g.completions),
                               sum(len(c.token_ids) for g in groups for c in g.completions),
                               sum(len(g.completions) for g in groups))
    if recipe.filter.retire_solved:
        for g in groups:
            state.history.update(g.prompt_id, g.n_correct, G)


def generate_batch(recipe, policy: Policy, problems: list, state: LoopState, seed: int) -> tuple[list, dict]:
    """One training batch of scored, filtered groups (dynamic-sampling refills included),
    generated here with the engine's current weights; see :func:`collect_batch`."""
    G, params = recipe.batch.generations_per_prompt, SamplingParams.for_training(recipe)

    def fetch(want: int, refill_round: int) -> list:
        retired = state.history.retired if recipe.filter.retire_solved else frozenset()
        ids = state.sampler.next(want, retired)
        raw = policy.engine.generate([problems[i].prompt for i in ids], G, params,
                                     seed=seed * 1009 + refill_round)
        groups = score_groups(raw, problems, ids, recipe.length)
        count_groups(recipe, groups, state)
        return groups

    return collect_batch(recipe, fetch, state)


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
    state.last_metrics = saved.get("last_metrics", {})   # absent from checkpoints of older versions
    reporter.log(f"resumed from {ckpt.name} (step {state.step})")
    return True


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
    """One optimiser step on the kept groups (none: a step without gradient); returns the step's metrics."""
    metrics = dict(stats)
    if groups:
        batch = build_train_batch(groups, recipe.advantage.normalization, pad_token_id(policy.tokenizer))
        metrics.update(policy.trainer.train_step(batch))
        meter.add_training(int(batch.attention_mask.sum()))
    else:
        metrics["skipped"] = True   # every group filtered: no gradient this step
    return metrics


def eval_point(recipe, engine, eval_problems: list, state: LoopState, last_metrics: dict) -> dict:
    """Evaluate the engine's current weights on the held-out prompts: the store's point for
    ``state.step`` with the compute spent so far (and ``eval_seconds``, not stored)."""
    t0 = time.perf_counter()
    result = evaluate(engine, eval_problems, SamplingParams.for_evaluation(recipe),
                      samples_per_prompt=recipe.eval.samples_per_prompt, seed=recipe.seed * 7919 + 17)
    point = {"step": state.step, "gpu_hours": state.meter.gpu_hours, "flops": state.meter.flops,
             "tokens": state.meter.tokens, "samples": state.meter.samples,
             "retired_prompts": len(state.history.retired), "wall_seconds": state.meter.seconds,
             **result, **last_metrics}
    return {**point, "eval_seconds": time.perf_counter() - t0}


def append_step(run_dir: Path, metrics: dict) -> dict:
    """Append one step's metrics to ``RUN_DIR/steps.jsonl``; return what evaluation points carry of them."""
    with (Path(run_dir) / "steps.jsonl").open("a") as fh:
        fh.write(json.dumps(metrics) + "\n")
    return {"train_reward": metrics["reward"], "entropy": metrics.get("entropy"),
            "logprob_mismatch": metrics.get("logprob_gap")}


def run_training(recipe, run_dir: Path, store, run_id: int, *, train_problems: list, eval_problems: list,
                 reporter: Reporter | None = None, resume: bool = False) -> dict:
    """Train until the budget is spent, storing evaluation points as they come.

    Args:
        recipe: the validated :class:`~scalectl.recipe.Recipe`.
        run_dir: the run folder (checkpoints, ``steps.jsonl``).
        store: an open :class:`~scalectl.store.Store`; points go to ``run_id``.
        train_problems, eval_problems: disjoint prompt sets.
        reporter: progress sink.
        resume: continue from the latest checkpoint in ``run_dir``.

    Returns:
        A summary: steps, first and last pass rate, compute.

    Raises:
        KeyboardInterrupt: after saving a checkpoint, when interrupted.
    """
    if recipe.async_.mode == "pipeline":
        from scalectl.rl.pipeline import run_pipeline

        return run_pipeline(recipe, run_dir, store, run_id, train_problems=train_problems,
                            eval_problems=eval_problems, reporter=reporter, resume=resume)
    reporter = reporter or Reporter()
    set_cpu_threads(recipe.hardware, processes=1)   # one process generates and trains: every core
    torch.manual_seed(recipe.seed)
    policy = build_policy(recipe, reporter)
    state = new_state(recipe, policy.n_params, len(train_problems))
    if resume:
        restore_state(run_dir, policy.trainer, state, reporter)
    policy.engine.update_weights(None, state.step)

    k = recipe.async_.k if recipe.async_.mode == "ppo_off_policy" else 1

    def do_eval() -> None:
        point = eval_point(recipe, policy.engine, eval_problems, state, state.last_metrics)
        store.add_point(run_id, {k: v for k, v in point.items() if k != "eval_seconds"})
        state.evaluated.append(state.step)
        reporter.eval(state.step, point)

    def done() -> bool:
        return budget_spent(recipe.budget, state)

    reporter.start(recipe.budget.steps, state.step)
    try:
        if eval_due_on_start(recipe, state):
            do_eval()
        while not done():
            with state.meter.timer():
                if not state.pending:
                    state.pending = [generate_batch(recipe, policy, train_problems, state,
                                                    seed=recipe.seed * 100003 + state.step + j)
                                     for j in range(k)]
                groups, stats = state.pending.pop(0)
                metrics = train_on_groups(recipe, policy, groups, stats, state.meter)
                state.step += 1
                policy.engine.update_weights(None, state.step)
            metrics.update(step=state.step, gpu_hours=state.meter.gpu_hours, flops=state.meter.flops)
            state.last_metrics = append_step(run_dir, metrics)
            reporter.step(state.step, metrics)
            if state.step % recipe.eval.every_steps == 0 or done():
                do_eval()
            if state.step % recipe.checkpoint.every_steps == 0 and not done():
                save_checkpoint(run_dir, state.step, policy.trainer, state.to_dict(), recipe.checkpoint.keep)
    except KeyboardInterrupt:
        reporter.log(f"interrupted at step {state.step}: saving a checkpoint")
        save_checkpoint(run_dir, state.step, policy.trainer, state.to_dict(), recipe.checkpoint.keep)
        raise
    finally:
        reporter.stop()
    return summary(store, run_id, state)


def summary(store, run_id: int, state: LoopState) -> dict:
    """What :func:`run_training` returns: steps, first and last pass rate, compute."""
    points = store.points(run_id)
    return {"steps": state.step, "first_pass_rate": points[0]["pass_rate"] if points else None,
            "last_pass_rate": points[-1]["pass_rate"] if points else None,
            "gpu_hours": state.meter.gpu_hours, "flops": state.meter.flops,
            "retired_prompts": len(state.history.retired)}
