"""What each process of a run in processes runs: generators and trainers connected by a rollout stream.

Every multi-process layout runs here: ``pipeline`` (streaming, below), and ``sync`` and
``ppo_off_policy`` beyond 1 generator + 1 trainer (rounds).

PipelineRL-k (Piche et al. 2025, as run by ScaleRL, Khatri et al. 2025,
arXiv 2510.13786, section 3.1): generators sample without stopping and stream
finished groups to the trainer; after every optimiser step the trainer pushes
its weights, which the generators load between two decoding steps
(in-flight update: a completion may hold tokens of several policy versions;
the KV cache computed by older weights is kept).  Every token carries the
version that sampled it and its generator log-prob, which the importance
ratio uses.

The trainer runs the one RL loop (:func:`scalectl.rl.loop.train`); its batch
source is the ``pipeline`` schedule's :class:`~scalectl.rl.schedule.feeder.Feeder`,
which owns the prompt order and requests groups from the generators so that
every trained token is at most k versions old.  The same processes run
``sync`` and ``ppo_off_policy`` beyond 1 generator + 1 trainer, with the
:class:`~scalectl.rl.schedule.feeder.RoundFeeder` as batch source: requests go out a
round at a time, all sampled by the weights pushed before the round.

Evaluation runs in the trainer on its current weights (exactly version v)
while generators keep filling the stream; compute is the trainer's
wall-clock outside evaluation and checkpoints, times the devices.  Processes:
:mod:`scalectl.rl.processes.supervise` (local spawn and supervision); transport:
:mod:`scalectl.rl.transport.stream`.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from scalectl.recipe.schema import Hardware, Recipe
from scalectl.rl.reward.scoring import scorer_for
from scalectl.rl.rollout.groups import score_groups
from scalectl.rl.processes.threads import set_cpu_threads
from scalectl.rl.schedule.feeder import StreamLink
from scalectl.rl.loop import Reporter, load_model, prepare, train
from scalectl.rl.transport.roles import free_port, local_task_env
from scalectl.rl.rollout import make_engine
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.transport.board import TaskLost
from scalectl.rl.transport.stream import BYE, STOP, Channel, Inbox, PeerLost, WeightSlot, send_object, weight_layout


@dataclass
class ProcessSpec:
    """What every process of a run in processes needs, whatever its async mode (picklable)."""

    recipe: dict
    run_dir: str
    sink: object            # picklable ``sink(point)``; it runs in the trainer process
    resume: bool
    train_problems: list
    eval_problems: list
    schedule: object        # the job's :class:`scalectl.rl.schedule.modes.Schedule`


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


#: Seconds a generator leaving on its own waits for each of its last sends to the trainer.
SEND_TIMEOUT_S = 120.0
#: A test hook: ``RANK:SENDS`` makes the generator of global rank RANK stop its loop after SENDS
#: messages of groups, its process and heartbeat alive, until it is told to stop (what a deadlocked
#: engine looks like to the trainer; the no-progress limit's tests use it).
STALL_ENV = "SCALECTL_TEST_STALL_GENERATOR"


def stall_after(rank: int, env=None) -> int | None:
    """The sends after which generator ``rank`` stops its loop (:data:`STALL_ENV`), or None."""
    text = (os.environ if env is None else env).get(STALL_ENV, "")
    who, _, sends = text.partition(":")
    return int(sends or 0) if text and who.strip() == str(rank) else None


def first_trainer_rank(recipe, task) -> int:
    """Global rank of the first trainer (the leader): ranks ``0 .. generators-1`` generate."""
    return recipe.hardware.generators if task.world_size > 1 else 0


def join_trainers(task, channel, device: str, idle_timeout_s: float = 7 * 24 * 3600.0) -> None:
    """Make torch.distributed's default group the trainers alone: DeepSpeed takes it as its
    data-parallel world.  One trainer: a world of one (:func:`scalectl.rl.train.trainer.init_distributed_env`
    makes it).  N trainers: rank = the task's rank among the trainers, world = N, meeting through
    the job's rendezvous store (:class:`~scalectl.rl.transport.stream.Channel`) under a prefix of their own,
    so no second address or port is needed on any launcher; NCCL on GPUs, gloo on CPUs."""
    import torch.distributed as dist

    if task.role_size == 1:
        os.environ.update(local_task_env(0, 1, free_port()))
        return
    os.environ.update(local_task_env(task.role_rank, task.role_size, task.master_port, task.master_addr,
                                     task.local_rank))
    backend = "nccl" if device == "cuda" and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(task.local_rank)
    dist.init_process_group(backend, store=dist.PrefixStore("scalectl/trainers", channel.store),
                            rank=task.role_rank, world_size=task.role_size,
                            timeout=timedelta(seconds=idle_timeout_s))


def run_trainer(spec: ProcessSpec, task, reporter: Reporter, stop: StopFlag) -> dict | None:
    """A trainer task.  The first trainer rank (the leader) runs the RL loop
    (:func:`scalectl.rl.loop.train`) on batches sampled by the generators (the schedule's
    source: :class:`scalectl.rl.schedule.feeder.Feeder` in ``pipeline``, pushing weights after every
    step; :class:`scalectl.rl.schedule.feeder.RoundFeeder` in ``sync``/``ppo_off_policy``, pushing them
    before each round); its steps,
    checkpoint saves and restores span every trainer rank
    (:class:`~scalectl.rl.train.data_parallel.TrainerRanks`).  The other trainer ranks follow it
    (:func:`~scalectl.rl.train.data_parallel.follow`: their share of each step, their part of each
    checkpoint) and return None.

    Returns:
        The loop's summary on the leader, None on a follower.

    Raises:
        KeyboardInterrupt: stopped by a signal (or an interrupted generator), after a checkpoint.
        PeerLost: a generator died.  StalenessError: a token older than the schedule allows.
    """
    from scalectl.rl.train.data_parallel import follow
    from scalectl.rl.loop import build_policy
    from scalectl.rl.policy.model import pad_token_id

    from scalectl.rl.transport.board import is_lost_peer

    recipe, run_dir = Recipe.model_validate(spec.recipe), Path(spec.run_dir)
    channel = Channel.connect(task, trainer=first_trainer_rank(recipe, task), device=recipe.hardware.device)
    channel.board.read_cards()              # every task's card, while the store's host is surely alive
    trainers = list(range(channel.trainer, task.world_size))
    join_trainers(task, channel, recipe.hardware.device)
    if task.role_rank > 0:
        torch.manual_seed(recipe.seed)
        # with its rollout engine, which it never uses: a vLLM engine builds its parallel groups over
        # torch.distributed's default group (the trainers here), a collective every trainer rank joins
        policy = build_policy(recipe, reporter)
        try:
            steps = follow(policy.trainer, recipe.advantage.normalization, pad_token_id(policy.tokenizer))
        except RuntimeError as exc:           # a trainer rank is gone: name it
            instead = channel.board.lost(exc, trainers) if is_lost_peer(exc) else exc
            if instead is exc:
                raise
            raise instead from exc
        reporter.log(f"trainer rank {task.role_rank} followed {steps} step(s)")
        return None
    policy, state = prepare(recipe, run_dir, len(spec.train_problems), reporter, spec.resume)
    policy.ranks.on_lost = lambda exc: channel.board.lost(exc, trainers)   # a follower gone: name it
    gens = list(range(channel.trainer))
    link = StreamLink(channel, gens, Inbox(channel.groups["rollouts"], gens, "rollouts"), stop,
                      gather=policy.ranks.gathered)
    source = spec.schedule.batches(recipe, policy, state, spec.train_problems, link=link)
    try:
        return train(recipe, policy, state, source, schedule=spec.schedule, run_dir=run_dir,
                     eval_problems=spec.eval_problems, sink=spec.sink, reporter=reporter, stop=stop)
    finally:
        try:
            policy.ranks.stop()
        except RuntimeError:   # a follower is gone: its failure is the job's
            pass


# --------------------------------------------------------------------------- a generator


def run_generator(spec: ProcessSpec, task, reporter: Reporter, stop: StopFlag) -> str:
    """A generator task: sample the requested prompts with the newest weights, stream the groups.

    Returns:
        Why it stopped: ``stopped`` (the trainer said so) or ``interrupted`` (a signal).

    Raises:
        PeerLost: the trainer died (a :class:`~scalectl.rl.transport.board.TaskLost` naming it); the generator
            then leaves without waiting for its pending sends.
    """
    recipe = Recipe.model_validate(spec.recipe)
    torch.manual_seed(recipe.seed + 1 + task.rank)
    model, tokenizer = load_model(recipe, reporter)
    engine = make_engine(recipe, model, tokenizer)
    engine.update_weights(None, -1)                    # no weights from the trainer yet
    channel = Channel.connect(task, trainer=first_trainer_rank(recipe, task), device=recipe.hardware.device)
    channel.board.read_cards()              # the trainer's card, while the store's host is surely alive
    trainer, board = channel.trainer, channel.board
    weights = channel.groups["weights"]
    slot = WeightSlot(weights, trainer, engine, weight_layout(model),
                      device="cuda" if weights.backend == "nccl" else "cpu")

    def poll_weights():                    # before every decoding step: progress, then new weights
        board.mark()
        return slot.poll()

    engine.poll_weights = poll_weights
    stall = stall_after(task.rank)
    control = Inbox(channel.groups["control"], [trainer], "control")
    problems, G, params = spec.train_problems, recipe.batch.generations_per_prompt, SamplingParams.for_training(recipe)
    score = scorer_for(recipe)
    requests: deque = deque()
    sends: deque = deque()
    t_start, idle, reason, lost, sent = time.perf_counter(), 0.0, "interrupted", False, 0
    try:
        while not stop.is_set():
            board.mark()
            if stall is not None and sent >= stall:
                reporter.log(f"{STALL_ENV}: generator rank {task.rank} stops its loop after {sent} message(s) "
                             "of groups; its heartbeat goes on")
                while not stop.event.wait(0.5):        # no progress until told to stop
                    pass
                break
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
                raise channel.board.lost_rank(trainer, str(msg))
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
            groups = score_groups(raw, problems, ids, recipe.length, score)
            items = {req: g for (req, _, _), g in zip(chunk, groups)}
            info = {"idle_s": idle, "wall_s": time.perf_counter() - t_start, "loads": slot.loads}
            sends.extend(send_object(channel.groups["rollouts"], ("groups", items, info), trainer))
            sent += 1
            while len(sends) > 4:                      # at most two messages in flight
                sends.popleft().wait()
    except PeerLost as exc:
        lost = True
        if isinstance(exc, TaskLost):
            raise
        raise board.lost_rank(trainer, str(exc)) from exc   # e.g. its weights' flow closed: name it
    finally:
        # A send to a trainer that is gone may never complete (gloo waits for a receive that never
        # comes): without the trainer, leave at once; otherwise wait, but not for ever.
        if not lost:
            try:
                for w in [*sends, *send_object(channel.groups["rollouts"], (BYE, reason), trainer)]:
                    w.wait(timedelta(seconds=SEND_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - the trainer is gone
                pass
    if reason == "stopped":
        slot.drain()                                   # the trainer's last weights follow its stop
        return reason
    # interrupted: wait for the trainer's stop (it checkpoints first), so that neither side sees the
    # other vanish, taking the weights it still pushes meanwhile (a push waits for every generator)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            slot.poll()
        except PeerLost:
            return reason
        try:
            _, msg = control.get(timeout=0.2)
        except queue.Empty:
            continue
        if isinstance(msg, PeerLost):
            return reason
        if msg[0] == STOP:
            slot.drain()
            break
    return reason


def run_role(spec: ProcessSpec, task, reporter: Reporter) -> dict | None:
    """Be ``task`` of a pipeline job (its share of the node's cores as torch threads,
    :func:`scalectl.rl.processes.threads.set_cpu_threads`); stop on SIGINT/SIGTERM/SIGUSR2."""
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
