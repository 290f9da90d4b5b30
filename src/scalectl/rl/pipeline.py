"""Streaming RL across processes: generators and a trainer connected by a rollout stream.

PipelineRL-k (Piche et al. 2025, as run by ScaleRL, Khatri et al. 2025,
arXiv 2510.13786, section 3.1): generators sample without stopping and stream
finished groups to the trainer; after every optimiser step the trainer pushes
its weights, which the generators load between two decoding steps
(in-flight update: a completion may hold tokens of several policy versions;
the KV cache computed by older weights is kept).  Every token carries the
version that sampled it and its generator log-prob, which the importance
ratio uses.

The trainer owns the prompt order: it draws prompts (sampler, retired
prompts) and sends them to the generators as requests tagged with the
oldest weights allowed to sample them; groups come back and are consumed in
request order.  Modes differ only in this schedule (v = trainer version,
P = prompts per step, c_v = groups consumed before step v):

* ``pipeline`` (k): requests are issued up to c_v + (k + 1) P, with
  weights v; weights are pushed after every step.  A group requested at
  version v is consumed by step v + k at the latest (each step consumes at
  least P groups), so staleness = trainer version - token version <= k.
  Generators wait when no request is open: the stream is full.
* ``ppo_off_policy`` (k): when every request is consumed, push weights v and
  request k P groups; staleness <= k - 1.
* ``sync``: the same with k = 1; staleness 0.

The staleness bound is checked on every consumed token (:class:`StalenessError`).

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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scalectl.rl.checkpoint import save_checkpoint
from scalectl.rl.groups import score_groups
from scalectl.rl.loop import (
    Reporter, append_step, budget_spent, build_policy, collect_batch, count_groups, eval_point, interrupt_spec,
    load_model, new_state, restore_state, summary, train_on_groups,
)
from scalectl.rl.stream import (
    BYE, STOP, Channel, Inbox, PeerLost, WeightSlot, end_weights, flatten_weights, send_object, send_weights,
    weight_layout,
)


class StalenessError(RuntimeError):
    """A token older than the mode allows reached the trainer (a scheduling bug, never expected)."""


def staleness_bound(mode: str, k: int) -> int:
    """Most versions a trained token may lag the trainer: k (pipeline), k - 1 (ppo_off_policy), 0 (sync)."""
    return {"pipeline": k, "ppo_off_policy": k - 1, "sync": 0}[mode]


def staleness_stats(trainer_version: int, versions: list[list[int]]) -> dict:
    """Per-token staleness of completions consumed by ``trainer_version``.

    Args:
        versions: one list of token versions per completion.

    Returns:
        staleness_max, staleness_mean (versions behind, over tokens), multi_version_share
        (share of completions whose tokens span more than one version), tokens, completions.
    """
    lags = [trainer_version - v for vs in versions for v in vs]
    spans = [len(set(vs)) > 1 for vs in versions]
    return {"staleness_max": max(lags, default=0), "staleness_mean": sum(lags) / len(lags) if lags else 0.0,
            "multi_version_share": sum(spans) / len(spans) if spans else 0.0,
            "tokens": len(lags), "completions": len(spans)}


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


# --------------------------------------------------------------------------- the trainer's stream


@dataclass
class _Ticket:
    req_id: int
    prompt_id: int
    min_version: int
    sampler_state: dict


@dataclass
class Feeder:
    """The trainer's end of the stream: issues requests by the mode's schedule, consumes groups in order."""

    recipe: object
    state: object
    channel: Channel
    generators: list[int]
    inbox: Inbox
    stop: StopFlag
    tickets: deque = field(default_factory=deque)
    received: dict = field(default_factory=dict)
    next_req: int = 0
    next_gen: int = 0
    consumed: int = 0
    pushed: int = -1
    gen_info: dict = field(default_factory=dict)
    byes: dict = field(default_factory=dict)

    def __post_init__(self):
        a = self.recipe.async_
        self.mode, self.P = a.mode, self.recipe.batch.prompts_per_step
        self.k = a.k if a.mode != "sync" else 1
        self.bound = staleness_bound(a.mode, self.k)
        self.consumed_sampler = self.state.sampler.state_dict()
        self._step = {}
        self._gen_prev = (0.0, 0.0)

    # -- scheduling
    def push(self, model, version: int) -> None:
        """Send weights ``version`` to every generator."""
        flat = flatten_weights(model)
        for g in self.generators:
            for w in send_weights(self.channel.groups["weights"], flat, version, g):
                w.wait()
        self.pushed = version

    def dispatch(self, n: int) -> None:
        """Draw ``n`` prompts and send them as requests (chunks of P prompts, generators in turn)."""
        retired = self.state.history.retired if self.recipe.filter.retire_solved else frozenset()
        new = []
        for _ in range(n):
            pid = self.state.sampler.next(1, retired)[0]
            new.append(_Ticket(self.next_req, pid, self.pushed, self.state.sampler.state_dict()))
            self.next_req += 1
        self.tickets.extend(new)
        for lo in range(0, len(new), self.P):
            chunk = [(t.req_id, t.prompt_id, t.min_version) for t in new[lo:lo + self.P]]
            g = self.generators[self.next_gen % len(self.generators)]
            self.next_gen += 1
            for w in send_object(self.channel.groups["control"], ("requests", chunk), g):
                w.wait()

    def start_step(self, model, version: int) -> None:
        """Before step ``version``: pipeline requests fill the window c_v + (k + 1) P."""
        self._step = {"idle": 0.0, "versions": [], "t0": time.perf_counter()}
        if self.mode == "pipeline":
            if self.pushed < version:
                self.push(model, version)
            self.dispatch((self.k + 1) * self.P - len(self.tickets))

    def after_step(self, model, version: int) -> None:
        """After the step that made ``version``: pipeline pushes the weights at once."""
        if self.mode == "pipeline":
            self.push(model, version)

    def _ensure(self, n: int, model, version: int) -> None:
        if len(self.tickets) >= n:
            return
        if self.mode != "pipeline" and not self.tickets:   # a new round: k P groups with weights v
            if self.pushed < version:
                self.push(model, version)
            self.dispatch(max(n, self.k * self.P))
        else:
            self.dispatch(n - len(self.tickets))

    # -- consuming
    def _pull(self, timeout: float) -> None:
        try:
            src, msg = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        if isinstance(msg, PeerLost):
            raise PeerLost(f"generator rank {src} stopped: {msg}")
        if msg[0] == BYE:
            self.byes[src] = msg[1]
            if msg[1] != "stopped":
                self.stop.event.set()     # a generator was interrupted: the job stops
            return
        _, items, info = msg
        self.received.update(items)
        self.gen_info[src] = info

    def next_group(self, version: int):
        """The next group in request order (waits for it); checks its staleness."""
        ticket = self.tickets.popleft()
        t0 = time.perf_counter()
        while ticket.req_id not in self.received:
            if self.stop.is_set():
                raise KeyboardInterrupt
            self._pull(0.2)
        self._step["idle"] += time.perf_counter() - t0
        group = self.received.pop(ticket.req_id)
        versions = [c.versions for c in group.completions]
        lag = max((version - v for vs in versions for v in vs), default=0)
        if lag > self.bound or min((v for vs in versions for v in vs), default=version) < ticket.min_version:
            raise StalenessError(f"group of prompt {ticket.prompt_id} is {lag} versions behind trainer version "
                                 f"{version} (async.mode = {self.mode}, bound {self.bound})")
        self._step["versions"] += versions
        self.consumed += 1
        self.consumed_sampler = ticket.sampler_state
        return group

    def fetch(self, model, version: int):
        """``fetch(want, refill_round)`` for :func:`scalectl.rl.loop.collect_batch`."""
        def fetch(want: int, refill_round: int) -> list:
            self._ensure(want, model, version)
            groups = [self.next_group(version) for _ in range(want)]
            count_groups(self.recipe, groups, self.state)
            return groups
        return fetch

    def step_metrics(self, version: int) -> dict:
        """Staleness, idle times and throughput of the step just taken (consumed by ``version - 1``)."""
        wall = time.perf_counter() - self._step["t0"]
        st = staleness_stats(version - 1, self._step["versions"])
        idle = sum(i["idle_s"] for i in self.gen_info.values())
        gwall = sum(i["wall_s"] for i in self.gen_info.values())
        prev, self._gen_prev = self._gen_prev, (idle, gwall)
        gen_share = (idle - prev[0]) / (gwall - prev[1]) if gwall > prev[1] else None
        return {"staleness_max": st["staleness_max"], "staleness_mean": st["staleness_mean"],
                "multi_version_share": st["multi_version_share"], "step_seconds": wall,
                "trainer_idle_s": self._step["idle"], "trainer_idle_share": self._step["idle"] / wall,
                "generator_idle_share": gen_share, "generator_idle_s": idle, "generator_wall_s": gwall,
                "samples_per_s": st["completions"] / wall, "tokens_per_s": st["tokens"] / wall}

    def close(self, timeout_s: float = 60.0) -> None:
        """Tell every generator to stop, end the flows to it, and wait for its last word."""
        for g in self.generators:
            try:
                for w in (send_object(self.channel.groups["control"], (STOP,), g)
                          + end_weights(self.channel.groups["weights"], g)):
                    w.wait()
            except Exception:  # noqa: BLE001 - a dead generator has nothing to stop
                self.byes.setdefault(g, "lost")
        deadline = time.monotonic() + timeout_s
        while len(self.byes) < len(self.generators) and time.monotonic() < deadline:
            try:
                self._pull(0.2)
            except PeerLost:
                break


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
    last_metrics: dict = {}

    def checkpoint() -> None:
        saved = state.to_dict()
        saved["sampler"] = feeder.consumed_sampler   # as of the last consumed group
        save_checkpoint(run_dir, state.step, policy.trainer, saved, recipe.checkpoint.keep)

    def do_eval() -> None:
        point = eval_point(recipe, policy.engine, spec.eval_problems, state, last_metrics)
        store.add_point(spec.run_id, {k: v for k, v in point.items() if k != "eval_seconds"})
        state.evaluated.append(state.step)
        reporter.eval(state.step, point)

    reporter.start(recipe.budget.steps, state.step)
    try:
        if state.step not in state.evaluated:
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
            last_metrics = append_step(run_dir, metrics)
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
    problems, G = spec.train_problems, recipe.batch.generations_per_prompt
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
            raw = engine.generate([problems[i].prompt for i in ids], G, max_new_tokens=recipe.length.max_new_tokens,
                                  temperature=recipe.sampling.temperature, top_p=recipe.sampling.top_p,
                                  interrupt=interrupt_spec(recipe.length), seed=recipe.seed * 100003 + chunk[0][0])
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
    if recipe.model.path.startswith("builtin:"):
        load_model(recipe, reporter)                    # build the warm start once, before the processes
    return supervise(spec, recipe.hardware.generators, reporter)


def run_role(spec: PipelineSpec, task, reporter: Reporter) -> dict | None:
    """Be ``task`` of a pipeline job: one thread, stop on SIGINT/SIGTERM/SIGUSR2."""
    torch.set_num_threads(1)
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
