"""Streaming RL across processes: generators and a trainer connected by a rollout stream.

PipelineRL-k (Piche et al. 2025, as run by ScaleRL, Khatri et al. 2025,
arXiv 2510.13786, section 3.1): generators sample without stopping and stream
finished groups to the trainer; after every optimiser step the trainer pushes
its weights, which the generators load between two decoding steps
(in-flight update: a completion may hold tokens of several policy versions;
the KV cache computed by older weights is kept).  Every token carries the
version that sampled it and its generator log-prob, which the importance
ratio uses.

The trainer owns the prompt order and requests groups from the generators
on a schedule that keeps every trained token at most k versions old
(:mod:`scalectl.rl.schedule`; ``sync`` and ``ppo_off_policy`` run through
the same processes with their own schedules).

Evaluation runs in the trainer on its current weights (exactly version v)
while generators keep filling the stream; compute is the trainer's
wall-clock outside evaluation and checkpoints, times the devices.  Processes:
:mod:`scalectl.rl.processes` (local spawn and supervision); transport:
:mod:`scalectl.rl.stream`.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from scalectl.rl.checkpoint import save_checkpoint
from scalectl.rl.groups import score_groups
from scalectl.rl.loop import (
    Reporter, append_step, budget_spent, build_policy, eval_due_on_start, collect_batch, eval_point, load_model,
    new_state, restore_state, summary, train_on_groups,
)
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.schedule import Feeder
from scalectl.rl.stream import BYE, STOP, Channel, Inbox, PeerLost, WeightSlot, send_object, weight_layout


@dataclass
class PipelineSpec:
    """What every process of a pipeline job needs (picklable)."""

    recipe: dict
    run_dir: str
    db: str
    run_id: int
    resume: bool
    train_problems: list
    eval_problems: list


class StopFlag:
    """Set by SIGINT, SIGTERM or SIGUSR2: finish the current step, checkpoint (trainer) and exit.

    :meth:`chain` then calls the handler that was installed before (e.g. submitit's
    SIGUSR2 handler, which requeues a Slurm job)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

    def __init__(self):
        self.event = threading.Event()
        self.signum: int | None = None
        self.previous: dict = {}

    def install(self) -> "StopFlag":
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def chain(self) -> None:
        """Restore the previous handlers and pass the received signal (SIGUSR2/SIGTERM) on."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        handler = self.previous.get(self.signum)
        if self.signum in (signal.SIGUSR2, signal.SIGTERM) and callable(handler):
            handler(self.signum, None)


def _trainer_world_env() -> None:
    """DeepSpeed's world is the trainers alone (one here): its own rendezvous, apart from the job's."""
    from scalectl.launch.roles import free_port

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())})


def run_trainer(spec: PipelineSpec, task, reporter: Reporter, stop: StopFlag) -> dict:
    """The trainer task: consume groups, take optimiser steps, push weights, evaluate, checkpoint.

    Returns:
        The run summary (as :func:`scalectl.rl.loop.run_training`).

    Raises:
        KeyboardInterrupt: stopped by a signal (or an interrupted generator), after a checkpoint.
        PeerLost: a generator died.  StalenessError: see the module docstring.
    """
    from scalectl.recipe import Recipe
    from scalectl.store import Store

    recipe, run_dir = Recipe.model_validate(spec.recipe), Path(spec.run_dir)
    torch.manual_seed(recipe.seed)
    _trainer_world_env()
    policy = build_policy(recipe, reporter)
    state = new_state(recipe, policy.n_params, len(spec.train_problems))
    if spec.resume:
        restore_state(run_dir, policy.trainer, state, reporter)
    policy.engine.update_weights(None, state.step)
    channel = Channel.connect(task)
    gens = [r for r in range(task.world_size) if r != channel.trainer]
    feeder = Feeder(recipe, state, channel, gens, Inbox(channel.groups["rollouts"], gens, "rollouts"), stop)
    store = Store.open(spec.db)

    def checkpoint() -> None:
        saved = state.to_dict()
        saved["sampler"] = feeder.consumed_sampler   # as of the last consumed group
        save_checkpoint(run_dir, state.step, policy.trainer, saved, recipe.checkpoint.keep)

    def do_eval() -> None:
        point = eval_point(recipe, policy.engine, spec.eval_problems, state, state.last_metrics)
        store.add_point(spec.run_id, {k: v for k, v in point.items() if k != "eval_seconds"})
        state.evaluated.append(state.step)
        reporter.eval(state.step, point)

    reporter.start(recipe.budget.steps, state.step)
    try:
        if eval_due_on_start(recipe, state):
            do_eval()
        while not budget_spent(recipe.budget, state):
            if stop.is_set():
                raise KeyboardInterrupt
            with state.meter.timer():
                feeder.start_step(policy.model, state.step)
                groups, stats = collect_batch(recipe, feeder.fetch(policy.model, state.step), state)
                metrics = train_on_groups(recipe, policy, groups, stats, state.meter)
                state.step += 1
                policy.engine.update_weights(None, state.step)
                feeder.after_step(policy.model, state.step)
            metrics.update(feeder.step_metrics(state.step))
            metrics.update(step=state.step, gpu_hours=state.meter.gpu_hours, flops=state.meter.flops)
            state.last_metrics = append_step(run_dir, metrics)
            reporter.step(state.step, metrics)
            if state.step % recipe.eval.every_steps == 0 or budget_spent(recipe.budget, state):
                do_eval()
            if state.step % recipe.checkpoint.every_steps == 0 and not budget_spent(recipe.budget, state):
                checkpoint()
        return summary(store, spec.run_id, state)
    except KeyboardInterrupt:
        reporter.log(f"interrupted at step {state.step}: saving a checkpoint")
        checkpoint()
        raise
    finally:
        feeder.close()
        store.close()


# --------------------------------------------------------------------------- a generator


def run_generator(spec: PipelineSpec, task, reporter: Reporter, stop: StopFlag) -> str:
    """A generator task: sample the requested prompts with the newest weights, stream the groups.

    Returns:
        Why it stopped: ``stopped`` (the trainer said so) or ``interrupted`` (a signal).

    Raises:
        PeerLost: the trainer died.
    """
    from scalectl.recipe import Recipe
    from scalectl.rl.rollout import make_engine

    recipe = Recipe.model_validate(spec.recipe)
    torch.manual_seed(recipe.seed + 1 + task.rank)
    model, tokenizer = load_model(recipe, reporter)
    engine = make_engine(recipe, model, tokenizer)
    engine.update_weights(None, -1)                    # no weights from the trainer yet
    channel = Channel.connect(task)
    trainer = channel.trainer
    slot = WeightSlot(channel.groups["weights"], trainer, engine, weight_layout(model))
    engine.poll_weights = slot.poll
    control = Inbox(channel.groups["control"], [trainer], "control")
    problems, G, params = spec.train_problems, recipe.batch.generations_per_prompt, SamplingParams.for_training(recipe)
    requests: deque = deque()
    sends: deque = deque()
    t_start, idle, reason = time.perf_counter(), 0.0, "interrupted"
    try:
        while not stop.is_set():
            slot.poll()
            ready = bool(requests) and requests[0][2] <= engine.version
            t0 = time.perf_counter()
            try:
                _, msg = control.get(timeout=0 if ready else 0.02)
            except queue.Empty:
                msg = None
            if not ready:                              # the stream is full, or weights are on their way
                idle += time.perf_counter() - t0
            if isinstance(msg, PeerLost):
                raise msg
            if msg is not None and msg[0] == STOP:
                reason = "stopped"
                break
            if msg is not None:
                requests.extend(msg[1])
                continue
            if not ready:
                continue
            chunk = []
            while requests and len(chunk) < recipe.batch.prompts_per_step and requests[0][2] <= engine.version:
                chunk.append(requests.popleft())
            ids = [pid for _, pid, _ in chunk]
            raw = engine.generate([problems[i].prompt for i in ids], G, params, seed=recipe.seed * 100003 + chunk[0][0])
            groups = score_groups(raw, problems, ids, recipe.length)
            items = {req: g for (req, _, _), g in zip(chunk, groups)}
            info = {"idle_s": idle, "wall_s": time.perf_counter() - t_start, "loads": slot.loads}
            sends.extend(send_object(channel.groups["rollouts"], ("groups", items, info), trainer))
            while len(sends) > 4:                      # at most two messages in flight
                sends.popleft().wait()
    finally:
        for w in sends:
            w.wait()
        try:
            for w in send_object(channel.groups["rollouts"], (BYE, reason), trainer):
                w.wait()
        except Exception:  # noqa: BLE001 - the trainer is gone
            pass
    if reason == "stopped":
        return reason
    # interrupted: wait for the trainer's stop (it checkpoints first), so that neither side sees the other vanish
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            _, msg = control.get(timeout=0.5)
        except queue.Empty:
            continue
        if isinstance(msg, PeerLost) or msg[0] == STOP:
            break
    return reason


def _task(recipe):
    from scalectl.errors import UserError
    from scalectl.launch.roles import detect

    hw = recipe.hardware
    if hw.trainers != 1:
        raise UserError(f"async.mode = pipeline runs one trainer process; hardware.trainers = {hw.trainers} "
                        "(set it to 1)")
    return detect(hw.generators, hw.trainers)


def run_pipeline(recipe, run_dir: Path, store, run_id: int, *, train_problems: list, eval_problems: list,
                 reporter: Reporter | None = None, resume: bool = False) -> dict | None:
    """Train ``recipe`` with generator and trainer processes (any ``async.mode``; :func:`run_training`
    sends ``pipeline`` here).  Arguments and result as :func:`scalectl.rl.loop.run_training`.

    In a multi-task job (Slurm, or environment ``RANK``/``WORLD_SIZE``) this process is
    the task :mod:`scalectl.launch.roles` names (a generator returns None); otherwise the
    generators and the trainer are spawned here and supervised
    (:func:`scalectl.rl.processes.supervise`).

    Raises:
        KeyboardInterrupt: interrupted, after the trainer checkpointed.
        scalectl.rl.processes.PipelineFailed: a process failed (the message names it and its error).
        UserError: ``hardware.trainers`` is not 1, or the job's tasks do not match ``hardware``.
    """
    from scalectl.rl.processes import supervise

    reporter = reporter or Reporter()
    spec = PipelineSpec(recipe.to_dict(), str(Path(run_dir).resolve()), str(store.path), run_id, resume,
                        train_problems, eval_problems)
    task = _task(recipe)
    if task.world_size > 1:
        return run_role(spec, task, reporter)
    if recipe.model.path.startswith("builtin:"):      # build the warm start once, before the processes
        from scalectl.rl.warmstart import ensure_warm_start

        ensure_warm_start(recipe, log=reporter.log)
    return supervise(spec, recipe.hardware.generators, reporter)


def run_role(spec: PipelineSpec, task, reporter: Reporter) -> dict | None:
    """Be ``task`` of a pipeline job (its share of the node's cores as torch threads,
    :func:`scalectl.rl.cores.set_cpu_threads`); stop on SIGINT/SIGTERM/SIGUSR2."""
    from scalectl.recipe import Hardware
    from scalectl.rl.cores import set_cpu_threads

    set_cpu_threads(Hardware(**spec.recipe["hardware"]), processes=task.world_size)
    stop = StopFlag().install()
    try:
        if task.role == "trainer":
            return run_trainer(spec, task, reporter, stop)
        if run_generator(spec, task, reporter, stop) == "interrupted":
            raise KeyboardInterrupt
        return None
    finally:
        stop.chain()


def generator_task(recipe):
    """This process's task when it is a generator of a multi-task pipeline job, else None."""
    if recipe.async_.mode != "pipeline":
        return None
    task = _task(recipe)
    return task if task.world_size > 1 and task.role == "generator" else None


def run_generator_task(run_dir: Path, job: dict, *, resume: bool = False, reporter: Reporter | None = None) -> None:
    """A generator task of a multi-task job (e.g. Slurm task 0): generate until the trainer
    stops; the run's status is the trainer task's to record.

    Raises:
        KeyboardInterrupt: stopped by a signal.
    """
    from scalectl.recipe import Recipe
    from scalectl.rl.data import load_prompt_sets

    recipe = Recipe.model_validate(job["recipe"])
    train, held_out = load_prompt_sets(recipe)
    spec = PipelineSpec(job["recipe"], str(Path(run_dir).resolve()), job["db"], job["run_id"], resume,
                        train, held_out)
    run_role(spec, _task(recipe), reporter or Reporter())
