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
from scalectl.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from scalectl.rl.evaluate import evaluate
from scalectl.rl.filters import PromptHistory, PromptSampler, groups_to_refill
from scalectl.rl.groups import rollout_stats, score_groups


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

    def to_dict(self) -> dict:
        return {"step": self.step, "meter": self.meter.to_dict(), "sampler": self.sampler.state_dict(),
                "history": self.history.to_dict(), "pending": self.pending, "evaluated": self.evaluated}


def interrupt_spec(length):
    """(lo, hi, phrase) for the rollout engine, or None unless ``control = "interrupt"``."""
    if length.control != "interrupt":
        return None
    return (length.interrupt_min, length.interrupt_max, length.interrupt_phrase)


def build_policy(recipe, reporter: Reporter) -> Policy:
    """Load (or build and warm-start) the model, and wrap it in an engine and a trainer."""
    from scalectl.rl.model import load_policy, n_params
    from scalectl.rl.rollout import make_engine
    from scalectl.rl.trainer import PolicyTrainer
    from scalectl.rl.warmstart import ensure_warm_start

    path = recipe.model.path
    if path.startswith("builtin:"):
        path = ensure_warm_start(recipe, log=reporter.log)
    model, tokenizer = load_policy(path, recipe.model.dtype)
    head_fp32 = recipe.precision.lm_head == "fp32"
    trainer = PolicyTrainer(model, loss=recipe.loss, optim=recipe.optim, head_fp32=head_fp32,
                            temperature=recipe.sampling.temperature,
                            micro_batch_size=recipe.batch.micro_batch_size,
                            zero_stage=recipe.hardware.zero_stage, dtype=recipe.model.dtype)
    engine = make_engine(recipe, trainer.model, tokenizer)
    return Policy(trainer.model, tokenizer, engine, trainer, n_params(trainer.model))


def generate_batch(recipe, policy: Policy, problems: list, state: LoopState, seed: int) -> tuple[list, dict]:
    """One training batch of scored, filtered groups (dynamic-sampling refills included).

    Returns:
        (kept groups, rollout statistics over every generated group).
    """
    P, G = recipe.batch.prompts_per_step, recipe.batch.generations_per_prompt
    filt = recipe.filter
    kept, generated, want, refill_round = [], [], P, 0
    while want > 0:
        retired = state.history.retired if filt.retire_solved else frozenset()
        ids = state.sampler.next(want, retired)
        raw = policy.engine.generate([problems[i].prompt for i in ids], G,
                                     max_new_tokens=recipe.length.max_new_tokens,
                                     temperature=recipe.sampling.temperature,
                                     interrupt=interrupt_spec(recipe.length),
                                     seed=seed * 1009 + refill_round)
        groups = score_groups(raw, problems, ids, recipe.length)
        state.meter.add_generation(sum(len(c.prompt_ids) for g in groups for c in g.completions),
                                   sum(len(c.token_ids) for g in groups for c in g.completions),
                                   len(groups) * G)
        for g in groups:
            if filt.retire_solved:
                state.history.update(g.prompt_id, g.n_correct, G)
        generated += groups
        kept += keep_groups(groups, filt.zero_variance or filt.dynamic_sampling)
        if not filt.dynamic_sampling:
            break
        keep_rate = len(kept) / len(generated)
        refill_round += 1
        want = groups_to_refill(len(kept), P, refill_round, filt.max_refill_rounds, keep_rate=keep_rate)
    if filt.dynamic_sampling:
        kept = kept[:P]
    stats = rollout_stats(generated)
    stats["groups_kept"] = len(kept)
    stats["retired_prompts"] = len(state.history.retired)
    return kept, stats


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
    reporter = reporter or Reporter()
    torch.manual_seed(recipe.seed)
    policy = build_policy(recipe, reporter)
    hw = recipe.hardware
    state = LoopState(step=0, meter=ComputeMeter(devices=hw.devices, n_params=policy.n_params),
                      sampler=PromptSampler(len(train_problems), recipe.seed),
                      history=PromptHistory(threshold=recipe.filter.retire_threshold,
                                            rule=recipe.filter.retire_rule))
    if resume and (ckpt := latest_checkpoint(run_dir)) is not None:
        saved = load_checkpoint(ckpt, policy.trainer)
        state.step, state.meter = saved["step"], ComputeMeter.from_dict(saved["meter"])
        state.sampler.load_state_dict(saved["sampler"])
        state.history = PromptHistory.from_dict(saved["history"])
        state.pending, state.evaluated = saved["pending"], saved["evaluated"]
        reporter.log(f"resumed from {ckpt.name} (step {state.step})")
    policy.engine.update_weights(None, state.step)

    k = recipe.async_.k if recipe.async_.mode == "ppo_off_policy" else 1
    budget = recipe.budget
    steps_log = Path(run_dir) / "steps.jsonl"

    def done() -> bool:
        return ((budget.steps is not None and state.step >= budget.steps)
                or (budget.gpu_hours is not None and state.meter.gpu_hours >= budget.gpu_hours))

    def do_eval() -> None:
        t0 = time.perf_counter()
        result = evaluate(policy.engine, eval_problems, samples_per_prompt=recipe.eval.samples_per_prompt,
                          max_new_tokens=recipe.length.max_new_tokens, temperature=recipe.eval.temperature,
                          interrupt=interrupt_spec(recipe.length), seed=recipe.seed * 7919 + 17)
        point = {"step": state.step, "gpu_hours": state.meter.gpu_hours, "flops": state.meter.flops,
                 "tokens": state.meter.tokens, "samples": state.meter.samples,
                 "retired_prompts": len(state.history.retired), "wall_seconds": state.meter.seconds,
                 **result, **last_metrics}
        store.add_point(run_id, point)
        state.evaluated.append(state.step)
        reporter.eval(state.step, {**point, "eval_seconds": time.perf_counter() - t0})

    last_metrics: dict = {}
    first_step = state.step
    reporter.start(budget.steps, first_step)
    try:
        if state.step not in state.evaluated:
            do_eval()                     # R0 (or the point a crash lost)
        while not done():
            with state.meter.timer():
                if not state.pending:
                    state.pending = [generate_batch(recipe, policy, train_problems, state,
                                                    seed=recipe.seed * 100003 + state.step + j)
                                     for j in range(k)]
                groups, stats = state.pending.pop(0)
                metrics = dict(stats)
                if groups:
                    batch = build_train_batch(groups, recipe.advantage.normalization,
                                              policy.tokenizer.pad_token_id)
                    metrics.update(policy.trainer.train_step(batch))
                    state.meter.add_training(int(batch.attention_mask.sum()))
                else:
                    metrics["skipped"] = True   # every group filtered: no gradient this step
                state.step += 1
                policy.engine.update_weights(None, state.step)
            metrics.update(step=state.step, gpu_hours=state.meter.gpu_hours, flops=state.meter.flops)
            last_metrics = {"train_reward": metrics["reward"], "entropy": metrics.get("entropy"),
                            "logprob_mismatch": metrics.get("logprob_gap")}
            with steps_log.open("a") as fh:
                fh.write(json.dumps(metrics) + "\n")
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
    points = store.points(run_id)
    return {"steps": state.step, "first_pass_rate": points[0]["pass_rate"] if points else None,
            "last_pass_rate": points[-1]["pass_rate"] if points else None,
            "gpu_hours": state.meter.gpu_hours, "flops": state.meter.flops,
            "retired_prompts": len(state.history.retired)}
