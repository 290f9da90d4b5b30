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

Evaluation of version v samples where ``hardware.evaluation`` says
(:meth:`scalectl.recipe.schema.Hardware.evaluation_place`): in the first trainer rank on
its current weights (exactly version v) while generators keep filling the stream, or on
the generators (all of them, or a dedicated one), which hold version v until their share
is sampled (:mod:`scalectl.rl.processes.evaluations`); the trainer processes then hold no
rollout engine.  Compute is the trainer's wall-clock outside evaluation and checkpoints,
times the devices.  Processes: :mod:`scalectl.rl.processes.supervise` (local spawn and
supervision); transport: :mod:`scalectl.rl.transport.stream`.
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
from scalectl.rl.processes.evaluations import (evaluation_tap, on_dedicated_generator, on_training_generators,
                                               serve_evaluation)
from scalectl.rl.processes.threads import set_cpu_threads
from scalectl.rl.schedule.feeder import StallLimit, StreamLink
from scalectl.rl.loop import Reporter, load_model, prepare, train
from scalectl.rl.transport.roles import free_port, local_task_env, pin_gpus
from scalectl.rl.rollout import make_engine
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.transport.board import JOB_ENDING, TaskLost, Watch, is_lost_peer
from scalectl.rl.transport.stream import (BYE, STOP, Channel, Inbox, PeerLost, WeightSlot, keep_until_exit, send_object,
                                          weight_layout)
from scalectl.rl.transport.waits import wait_works


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


#: Seconds a generator leaving on its own waits at most for its last sends to the trainer (less when
#: the trainer is found lost or stuck first).
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


@dataclass(frozen=True)
class Evaluators:
    """Where a run in processes evaluates (:meth:`scalectl.recipe.schema.Hardware.evaluation_place`).

    Attributes:
        place: ``trainer``, ``generators`` or ``dedicated``.
        ranks: the generator ranks that sample evaluations (none on the trainer).
        dedicated: the dedicated evaluation generator's rank, or None.
        training: the generator ranks that sample training rollouts.
    """

    place: str
    ranks: tuple
    dedicated: int | None
    training: tuple

    @classmethod
    def of(cls, recipe) -> "Evaluators":
        hw = recipe.hardware
        place = hw.evaluation_place(True)
        dedicated = hw.generators - 1 if place == "dedicated" else None
        training = tuple(g for g in range(hw.generators) if g != dedicated)
        ranks = {"trainer": (), "generators": training, "dedicated": (dedicated,)}[place]
        return cls(place, ranks, dedicated, training)


def connect(recipe, task) -> Channel:
    """This task's :class:`~scalectl.rl.transport.stream.Channel`: a vLLM generator's engine workers
    take its seats in the weights' group (one per GPU of the generator), a dedicated evaluation
    generator has a weights' group of its own."""
    hw = recipe.hardware
    vllm = hw.rollout_engine == "vllm"
    return Channel.connect(task, trainer=first_trainer_rank(recipe, task), device=hw.device,
                           seats_per_generator=hw.gpus_per_generator if vllm else 1,
                           workers_join=vllm and task.role == "generator", evaluator=Evaluators.of(recipe).dedicated)


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


class MarkingReporter(Reporter):
    """A :class:`~scalectl.rl.loop.Reporter` that passes every call on to ``inner`` and marks
    progress on ``board`` (:meth:`scalectl.rl.transport.board.Board.mark`) first: the loop's
    steps, points and messages (a checkpoint saved, an evaluation) are the trainer's progress, as
    the generators watching it read it."""

    def __init__(self, inner, board):
        self.inner, self.board = inner, board

    def start(self, total_steps, first_step):
        self.board.mark()
        self.inner.start(total_steps, first_step)

    def step(self, step, metrics):
        self.board.mark()
        self.inner.step(step, metrics)

    def eval(self, step, point):
        self.board.mark()
        self.inner.eval(step, point)

    def log(self, message):
        self.board.mark()
        self.inner.log(message)

    def stop(self):
        self.inner.stop()


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
    evaluators = Evaluators.of(recipe)
    channel = connect(recipe, task)
    channel.board.read_cards()              # every task's card, while the store's host is surely alive
    trainers = list(range(channel.trainer, task.world_size))
    join_trainers(task, channel, recipe.hardware.device)
    # a rollout engine only where the leader evaluates with it; a follower then builds the leader's
    # kind of engine only for vLLM, which forms its parallel groups over torch.distributed's default
    # group (the trainers here), a collective every trainer rank joins
    on_trainer = evaluators.place == "trainer"
    if not on_trainer:
        reporter.log(f"trainer rank {task.role_rank}: no rollout engine (evaluation on the generators)")
    if task.role_rank > 0:
        torch.manual_seed(recipe.seed)
        policy = build_policy(recipe, reporter, engine=on_trainer and recipe.hardware.rollout_engine == "vllm")
        try:
            steps = follow(policy.trainer, recipe.advantage.normalization, pad_token_id(policy.tokenizer))
        except RuntimeError as exc:           # a trainer rank is gone: name it
            instead = channel.board.lost(exc, trainers) if is_lost_peer(exc) else exc
            if instead is exc:
                raise
            raise instead from exc
        reporter.log(f"trainer rank {task.role_rank} followed {steps} step(s)")
        return None
    reporter = MarkingReporter(reporter, channel.board)
    policy, state = prepare(recipe, run_dir, len(spec.train_problems), reporter, spec.resume, engine=on_trainer)
    policy.ranks.on_lost = lambda exc: channel.board.lost(exc, trainers)   # a follower gone: name it
    gens = list(evaluators.training)
    results: queue.Queue = queue.Queue()
    tap = evaluation_tap(results) if evaluators.place == "generators" else None
    link = StreamLink(channel, gens, Inbox(channel.groups["rollouts"], gens, "rollouts", tap=tap), stop,
                      gather=policy.ranks.gathered)
    source = spec.schedule.batches(recipe, policy, state, spec.train_problems, link=link)
    n_eval = len(spec.eval_problems)
    evals = (on_training_generators(recipe, n_eval, source, link, results, run_dir)
             if evaluators.place == "generators" else
             on_dedicated_generator(recipe, n_eval, evaluators.dedicated, channel, link, policy.model, run_dir,
                                    stall=getattr(source, "stall", None))
             if evaluators.place == "dedicated" else None)
    try:
        return train(recipe, policy, state, source, schedule=spec.schedule, run_dir=run_dir,
                     eval_problems=spec.eval_problems, sink=spec.sink, reporter=reporter, stop=stop,
                     evaluations=evals)
    finally:
        try:
            if evals is not None:
                evals.close()
            policy.ranks.stop()
        except RuntimeError:   # a follower is gone: its failure is the job's
            pass


# --------------------------------------------------------------------------- a generator


def _weight_slot(recipe, task, channel, engine, model):
    """The generator's end of its weights' group: the engine's workers' seats (vLLM:
    :class:`~scalectl.rl.transport.vllm_worker.WorkerWeightSlot`) or this process's
    (:class:`~scalectl.rl.transport.stream.WeightSlot`)."""
    name = "eval_weights" if task.rank == Evaluators.of(recipe).dedicated else "weights"
    seats = channel.seats[name]
    if recipe.hardware.rollout_engine == "vllm":
        from scalectl.rl.transport.vllm_worker import WorkerWeightSlot

        return WorkerWeightSlot.join(engine, channel.address, seats, weight_layout(model))
    group = channel.groups[name]
    return WeightSlot(group, seats.leader, engine, weight_layout(model),
                      device="cuda" if group.backend == "nccl" else "cpu")


def run_generator(spec: ProcessSpec, task, reporter: Reporter, stop: StopFlag) -> str:
    """A generator task: sample the requested prompts with the newest weights, stream the groups,
    and sample its share of every evaluation it is asked for (with the weights of that version,
    held meanwhile: :func:`scalectl.rl.processes.evaluations.serve_evaluation`).

    Returns:
        Why it stopped: ``stopped`` (the trainer said so) or ``interrupted`` (a signal).

    Every wait on the trainer (a send of groups, of an evaluation's chunks or of its last word, the
    weights after its stop, requests that do not come) looks at the beats of every trainer rank
    (:class:`~scalectl.rl.transport.board.Watch`) and ends on the run's no-progress limit: a rank's
    heartbeat still for ``launcher.stall_timeout_s`` (or :data:`~scalectl.rl.schedule.feeder.STALL_FLOOR_S`;
    a rank after the first one so stopped holds the first one inside a trainers' collective), or
    no progress of the first rank for the limit it states on its board.  A connection to it that
    closes, whichever call sees it, names it too.

    Raises:
        PeerLost: the trainer died (a :class:`~scalectl.rl.transport.board.TaskLost` naming it); the generator
            then leaves without waiting for its pending sends.  TaskStuck: the trainer made no progress.
    """
    recipe = Recipe.model_validate(spec.recipe)
    torch.manual_seed(recipe.seed + 1 + task.rank)
    if recipe.hardware.device == "cuda":      # this generator's GPUs only (a vLLM engine's workers: all of them)
        pin_gpus(task)
    model, tokenizer = load_model(recipe, reporter)
    if recipe.hardware.device == "cuda" and recipe.hardware.rollout_engine == "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(0)
        model = model.to("cuda:0")
    engine = make_engine(recipe, model, tokenizer)
    engine.update_weights(None, -1)                    # no weights from the trainer yet
    channel = connect(recipe, task)
    channel.board.read_cards()              # the trainer's card, while the store's host is surely alive
    trainer, board = channel.trainer, channel.board
    slot = _weight_slot(recipe, task, channel, engine, model)

    def poll_weights():                    # before every decoding step: progress, then new weights
        board.mark()
        return slot.poll()

    engine.poll_weights = poll_weights
    stall = stall_after(task.rank)
    evaluators = list(Evaluators.of(recipe).ranks)
    # every trainer rank: the first one's stated limit judges it stuck; a rank whose heartbeat stands
    # still (stopped, cut off) holds the first one inside a trainers' collective, and is named lost
    trainers = list(range(trainer, task.world_size))
    watch, limit = Watch(board, trainers, stated=True), StallLimit(recipe.launcher.stall_timeout_s)

    def check() -> None:                   # while waiting on the trainer: it is lost or stuck, or not yet
        board.mark()
        try:
            watch.check(limit.seconds)
        except JOB_ENDING:
            keep_until_exit(channel)       # a send to it stays pending
            raise

    def evaluate() -> bool:
        return serve_evaluation(recipe, engine, slot, spec.eval_problems, task.rank, evaluators, channel, trainer,
                                check=check)

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
            if evaluate():
                continue
            ready = bool(requests) and requests[0][2] <= engine.version
            t0 = time.perf_counter()
            try:
                _, msg = control.get(timeout=0 if ready else 0.02)
            except queue.Empty:
                msg = None
            if not ready:                              # the stream is full, or weights are on their way
                idle += time.perf_counter() - t0
                check()
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
                wait_works([sends.popleft(), sends.popleft()], check)
        evaluate()                                     # one asked for before the stop is still owed
    except JOB_ENDING:                                 # the trainer found lost or stuck while waited on
        lost = True
        raise
    except PeerLost as exc:
        lost = True
        raise board.lost_rank(trainer, str(exc)) from exc   # e.g. its weights' flow closed: name it
    except RuntimeError as exc:                        # a send (or a broadcast) whose peer closed
        if not is_lost_peer(exc):
            raise
        lost = True
        keep_until_exit(channel)
        named = board.lost(exc)                        # the task whose heartbeat stopped, else the trainer
        raise (named if named is not exc else board.lost_rank(trainer, str(exc))) from exc
    finally:
        # A send to a trainer that is gone may never complete (gloo waits for a receive that never
        # comes): without the trainer, leave at once; otherwise wait, but not for ever.
        if not lost:
            deadline = time.monotonic() + SEND_TIMEOUT_S

            def last_check() -> None:
                check()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the trainer took none of the last sends in {SEND_TIMEOUT_S:.0f} s")
            try:
                wait_works([*sends, *send_object(channel.groups["rollouts"], (BYE, reason), trainer)], last_check)
            except Exception:  # noqa: BLE001 - the trainer is gone
                keep_until_exit(channel)
    if reason == "stopped":
        slot.drain(check)                              # the trainer's last weights follow its stop
        return reason
    return _wait_for_stop(slot, control, reason, check)


def _wait_for_stop(slot, control, reason: str, check=None) -> str:
    """Interrupted: wait for the trainer's stop (it checkpoints first), so that neither side sees
    the other vanish, taking the weights it still pushes meanwhile (a push waits for every
    generator); an evaluation asked for meanwhile is released unsampled (the trainer, stopping,
    waits for none it has not asked for before its checkpoint)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            slot.poll()
            slot.release()
        except PeerLost:
            return reason
        try:
            _, msg = control.get(timeout=0.2)
        except queue.Empty:
            continue
        if isinstance(msg, PeerLost):
            return reason
        if msg[0] == STOP:
            try:
                slot.drain(check)
            except JOB_ENDING:          # the trainer stopped pushing: leave without its last weights
                pass
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
