"""The trainer's end of the rollout stream (``pipeline`` schedule): requests out, groups in.

The trainer owns the prompt order: it draws prompts (sampler, retired
prompts) and sends them to the generators as requests tagged with the oldest
policy version allowed to sample them (the weights it last pushed); groups
come back and are consumed in request order.  A checkpoint holds the sampler
as of the last request and the prompts requested but not consumed; a resumed
run requests those prompts again first, so it consumes the prompts the
uninterrupted run would have (drawing them again would skip the prompts
retired since they were requested, and change the prompt order).  With trainer version v, P
prompts per step and c_v groups consumed before step v, requests are issued
up to c_v + (k + 1) P and weights are pushed after every step.  Each step
consumes at least P groups, so a group requested at version v is consumed by
step v + k at the latest: staleness = trainer version - token version <= k.
Generators wait when no request is open (the stream is full).  The bound and the
window are the async mode's (:class:`scalectl.recipe.async_modes.AsyncMode`), and every
consumed token is checked against the bound
(:func:`scalectl.rl.batches.collect.check_staleness`).

Every wait of the trainer on its generators (for the next group, for a generator to take its
requests or its stop, for every generator to take its weights) is bounded by the run's
no-progress limit (:class:`StallLimit`): while it waits, it reads the generators' beats
(:class:`scalectl.rl.transport.board.Watch`), and a generator whose loop has marked no progress
for that long, its heartbeat going on, fails the run, named
(:class:`~scalectl.rl.transport.board.TaskStuck`), as one whose heartbeat stood still does
(stopped by a signal, its node cut off: :class:`~scalectl.rl.transport.board.TaskLost`), and one
whose connection closed.  The trainer marks its own progress on its board at every turn of its
waits and every batch, and states its limit there, for the generators' watch on it.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass, field

from scalectl.rl.batches.collect import StalenessError, check_staleness, collect_batch, count_groups
from scalectl.rl.transport import waits
from scalectl.rl.transport.board import JOB_ENDING, is_lost_peer
from scalectl.rl.transport.stream import (
    BYE, STOP, Channel, Inbox, PeerLost, end_weights, keep_until_exit, push_weights, send_waiting, weight_layout,
)


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


#: The no-progress limit when ``launcher.stall_timeout_s`` is unset: this many times the slowest
#: step seen so far (from one batch request to the next: generation wait, training, evaluation and
#: checkpoint included), and never less than :data:`STALL_FLOOR_S` seconds.
STALL_STEPS = 5.0
#: The least no-progress limit when it is derived from the step time (seconds); also the limit
#: before the first step has been timed (start-up, the first evaluation).
STALL_FLOOR_S = 300.0
#: Seconds between two looks at the generators while the trainer waits on a weights push.
WAIT_SLICE_S = waits.WAIT_SLICE_S


@dataclass
class StallLimit:
    """How long a generator may make no progress while the trainer waits on it, in seconds.

    ``fixed_s`` (``launcher.stall_timeout_s``) when set; otherwise ``max(floor_s, steps x`` the
    slowest step seen so far ``)`` (:data:`STALL_STEPS`, :data:`STALL_FLOOR_S`): a step's wall
    clock bounds how long one chunk of rollouts can legitimately take, and a generator marks
    progress at every decoding step, so a healthy one is never near the limit.

    Attributes:
        slowest_s: the slowest step seen so far (seconds; 0 before the first).
    """

    fixed_s: float | None = None
    floor_s: float = STALL_FLOOR_S
    steps: float = STALL_STEPS
    slowest_s: float = 0.0

    def observe(self, step_s: float) -> None:
        """One step took ``step_s`` seconds."""
        self.slowest_s = max(self.slowest_s, step_s)

    @property
    def seconds(self) -> float:
        """The limit now."""
        if self.fixed_s is not None:
            return float(self.fixed_s)
        return max(self.floor_s, self.steps * self.slowest_s)


@dataclass
class StreamLink:
    """The trainer's connection to its generators.

    Attributes:
        channel: the job's :class:`~scalectl.rl.transport.stream.Channel`; generators: their ranks;
        inbox: the ``rollouts`` flow from them; stop: a stop flag (``is_set``, ``event``).
        gather: ``gather(fn)`` -> ``fn(model)`` called with the full weights on this rank
            (every trainer rank gathers its ZeRO-3 partitions for it:
            :meth:`scalectl.rl.train.data_parallel.TrainerRanks.gathered`); None: ``fn(model)`` on
            the model as it is (one process, or weights not partitioned).
    """

    channel: Channel
    generators: list[int]
    inbox: Inbox
    stop: object
    gather: object = None

    def watch(self):
        """A :class:`~scalectl.rl.transport.board.Watch` over the generators (None when the channel
        has no board, e.g. in a test's hand-made channel)."""
        from scalectl.rl.transport.board import Watch

        board = getattr(self.channel, "board", None)
        return Watch(board, self.generators) if board is not None else None

    def with_weights(self, model, fn):
        """``fn(model)`` with the full weights (see ``gather``)."""
        return self.gather(fn) if self.gather is not None else fn(model)

    def lost(self, rank: int, detail: str) -> PeerLost:
        """The error for generator ``rank`` gone: named by its card (pid, host, log) when the
        channel has a :class:`~scalectl.rl.transport.board.Board`."""
        board = getattr(self.channel, "board", None)
        return board.lost_rank(rank, detail) if board is not None else PeerLost(detail)


@dataclass
class _Ticket:
    req_id: int
    prompt_id: int
    min_version: int


@dataclass
class Feeder:
    """A :class:`~scalectl.rl.schedule.modes.BatchSource` fed by generator processes.

    Args:
        model: the trainer's model (its weights are pushed).
        mode: the run's :class:`~scalectl.recipe.async_modes.AsyncMode`: its staleness bound
            (``bound``) and its request window (``window``, requests kept open ahead of consumption).
    """

    recipe: object
    state: object
    model: object
    link: StreamLink
    mode: object
    tickets: deque = field(default_factory=deque)
    received: dict = field(default_factory=dict)
    next_req: int = 0
    next_gen: int = 0
    consumed: int = 0
    pushed: int = -1
    gen_info: dict = field(default_factory=dict)
    byes: dict = field(default_factory=dict)

    def __post_init__(self):
        self.P = self.recipe.batch.prompts_per_step
        self.bound, self.window = self.mode.staleness_bound, self.mode.request_window(self.P)
        self.channel, self.generators = self.link.channel, self.link.generators
        self.inbox, self.stop = self.link.inbox, self.link.stop
        self.replay = deque(self.state.requests)     # requested before the checkpoint, not consumed
        self._step = {}
        self._gen_prev = (0.0, 0.0)
        self._layout = None
        self.stall = StallLimit(self.recipe.launcher.stall_timeout_s)
        self._watch = self.link.watch()
        self._batch_at: float | None = None
        self._mark()

    def _mark(self) -> None:
        """The trainer's loop turned: say so on its board, with the limit it holds itself to (the
        generators watching it judge it by that limit)."""
        board = getattr(self.channel, "board", None)
        if board is not None:
            board.limit_s = self.stall.seconds
            board.mark()

    def _still_waiting(self) -> None:
        """Called while the trainer waits on its generators: raises when one is stuck or lost
        (:meth:`scalectl.rl.transport.board.Watch.check` against :attr:`stall`)."""
        self._mark()
        if self._watch is None:
            return
        try:
            self._watch.check(self.stall.seconds)
        except JOB_ENDING as exc:
            self.byes[exc.card.rank] = "lost"     # close() then neither waits for it nor pushes to it
            keep_until_exit(self.channel)         # a push to it may be pending: never destroy its group
            raise

    def _timed(self) -> None:
        """A batch is requested: the loop since the last request was one step (timed for :attr:`stall`)."""
        now = time.monotonic()
        if self._batch_at is not None:
            self.stall.observe(now - self._batch_at)
        self._batch_at = now
        self._mark()

    def _wait_work(self, work) -> None:
        """Wait for one bucket of a weights push, looking at the generators every
        :data:`WAIT_SLICE_S` seconds (a generator that stopped taking weights holds the push)."""
        waits.wait_collective(work, self._still_waiting, WAIT_SLICE_S)

    def send(self, g: int, obj) -> None:
        """Send ``obj`` to generator ``g`` on the control flow and wait until it is taken, looking at
        the generators meanwhile (a generator stopped, deadlocked or not reading holds the send).

        Raises:
            TaskLost: ``g`` closed its connection (named by its card), or a generator's heartbeat
                stood still for the run's limit.  TaskStuck: a generator marked no progress for it.
        """
        try:
            send_waiting(self.channel.groups["control"], obj, g, self._still_waiting)
        except JOB_ENDING:
            raise
        except RuntimeError as exc:
            if not is_lost_peer(exc):
                raise
            self.byes[g] = "lost"
            keep_until_exit(self.channel)
            raise self.link.lost(g, f"generator rank {g} stopped taking messages: {exc}") from exc

    # -- scheduling
    def push(self, version: int, evaluate: bool = False) -> None:
        """Broadcast weights ``version`` to every generator (gathered under ZeRO-3); the push's
        time and bytes go into the step's metrics.  ``evaluate``: the generators are to evaluate
        this version (:func:`~scalectl.rl.transport.stream.push_weights`).

        Raises:
            PeerLost: a generator (or a trainer rank) is gone, named by its card.
            TaskStuck: a generator took no weights and marked no progress for the run's limit.
        """
        group = self.channel.groups["weights"]

        def send(model):
            self._layout = weight_layout(model)
            # gloo: wait in slices, looking at the generators between them (an NCCL wait with a
            # timeout would abort the communicator)
            sliced = self._wait_work if getattr(group, "backend", "gloo") == "gloo" else None
            return push_weights(group, model, version, wait=sliced, evaluate=evaluate)

        try:
            stats = self.link.with_weights(self.model, send)
        except JOB_ENDING:                    # a generator found stuck or lost while the push waited
            raise
        except RuntimeError as exc:           # a generator gone: name it
            board = getattr(self.channel, "board", None)
            instead = board.lost(exc, self.generators) if board is not None else exc
            if instead is exc:
                raise
            raise instead from exc
        self._step.setdefault("pushes", []).append(stats)
        self.pushed = version

    def dispatch(self, n: int) -> None:
        """Send ``n`` prompts as requests, generators in turn, in the chunks of :meth:`chunks`.
        The prompts requested before a resume and not consumed go first, then prompts drawn
        from the sampler."""
        retired = self.state.history.retired if self.recipe.filter.retire_solved else frozenset()
        new = []
        for _ in range(n):
            pid = self.replay.popleft() if self.replay else self.state.sampler.next(1, retired)[0]
            new.append(_Ticket(self.next_req, pid, self.pushed))
            self.next_req += 1
        self.tickets.extend(new)
        for share in self.chunks(len(new)):
            chunk = [(t.req_id, t.prompt_id, t.min_version) for t in new[share.start:share.stop]]
            g = self.generators[self.next_gen % len(self.generators)]
            self.next_gen += 1
            self.send(g, ("requests", chunk))

    def chunks(self, n: int) -> list[range]:
        """How ``n`` new requests are cut for the generators: chunks of ceil(P / M) prompts
        (M generators), so that every generator has its share of each step's prompts."""
        size = -(-self.P // len(self.generators))
        return [range(lo, min(lo + size, n)) for lo in range(0, n, size)]

    def next_batch(self, version: int) -> tuple[list, dict]:
        """Before step ``version``: fill the request window, then consume one batch."""
        self._step = {"idle": 0.0, "versions": [], "t0": time.perf_counter()}
        self._timed()
        if self.pushed < version:
            self.push(version)
        self.dispatch(self.window - len(self.tickets))
        return collect_batch(self.recipe, self._fetch(version), self.state)

    def after_step(self, version: int) -> None:
        """After the step that made ``version``: push its weights at once."""
        self.push(version)

    def checkpoint_fields(self) -> dict:
        """The sampler as of the last request, and the prompts requested and not consumed (in
        request order), which a resumed run requests again before drawing more."""
        return {"sampler": self.state.sampler.state_dict(),
                "requests": [t.prompt_id for t in self.tickets] + list(self.replay)}

    # -- consuming
    def _pull(self, timeout: float) -> None:
        try:
            src, msg = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        if isinstance(msg, PeerLost):
            self.byes[src] = "lost"
            raise self.link.lost(src, f"generator rank {src} stopped: {msg}")
        if msg[0] == BYE:
            self.byes[src] = msg[1]
            if msg[1] != "stopped":
                self.stop.event.set()     # a generator was interrupted: the job stops
            return
        _, items, info = msg
        for group in items.values():
            group.generator = src
        self.received.update(items)
        self.gen_info[src] = info

    def next_group(self, version: int):
        """The next group in request order (waits for it); checks its staleness.

        Raises:
            TaskStuck, TaskLost: while it waited, a generator marked no progress (or its heartbeat
                stood still) for the run's no-progress limit (:attr:`stall`).
        """
        ticket = self.tickets.popleft()
        t0 = time.perf_counter()
        while ticket.req_id not in self.received:
            if self.stop.is_set():
                raise KeyboardInterrupt
            self._pull(0.2)
            self._still_waiting()
        self._step["idle"] += time.perf_counter() - t0
        group = self.received.pop(ticket.req_id)
        versions = check_staleness(self.mode, version, [group], f"a token of prompt {ticket.prompt_id}")
        oldest = min((v for vs in versions for v in vs), default=version)
        if oldest < ticket.min_version:
            raise StalenessError(f"a token of prompt {ticket.prompt_id} has version {oldest}, older than the "
                                 f"weights {ticket.min_version} its request asked for")
        self._step["versions"] += versions
        self.consumed += 1
        return group

    def _fetch(self, version: int):
        """``fetch(want, refill_round)`` for :func:`scalectl.rl.batches.collect.collect_batch`."""
        def fetch(want: int, refill_round: int) -> list:
            if len(self.tickets) < want:
                self.dispatch(want - len(self.tickets))
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
        pushes = self._step.get("pushes", [])
        push_s, push_bytes = sum(p.seconds for p in pushes), sum(p.bytes for p in pushes)
        return {"weights_push_s": push_s if pushes else None,
                "weights_push_bytes_per_s": push_bytes / push_s if pushes and push_s > 0 else None,
                "staleness_max": st["staleness_max"], "staleness_mean": st["staleness_mean"],
                "multi_version_share": st["multi_version_share"], "step_seconds": wall,
                "trainer_idle_s": self._step["idle"], "trainer_idle_share": self._step["idle"] / wall,
                "generator_idle_share": gen_share, "generator_idle_s": idle, "generator_wall_s": gwall,
                "samples_per_s": st["completions"] / wall, "tokens_per_s": st["tokens"] / wall}

    def close(self, timeout_s: float = 60.0) -> None:
        """Tell every generator to stop, end the weights' flow (unless a generator is gone), and
        wait for every last word; every wait bounded as the run's are (a generator found lost or
        stuck meanwhile is left alone)."""
        for g in self.generators:
            if self.byes.get(g) == "lost":       # gone or stuck: a send to it may never complete
                continue
            try:
                self.send(g, (STOP,))
            except Exception:  # noqa: BLE001 - a dead generator has nothing to stop
                self.byes.setdefault(g, "lost")
                keep_until_exit(self.channel)
        if "lost" not in self.byes.values():      # a broadcast to a generator gone would wait for it
            group = self.channel.groups["weights"]
            sliced = self._wait_work if getattr(group, "backend", "gloo") == "gloo" else None
            try:
                layout = self._layout or self.link.with_weights(self.model, weight_layout)
                device = next(self.model.parameters()).device
                end_weights(group, layout, device, wait=sliced)
            except Exception:  # noqa: BLE001 - a generator (or a trainer rank) is gone; it has no weights to end
                keep_until_exit(self.channel)
        deadline = time.monotonic() + timeout_s
        while len(self.byes) < len(self.generators) and time.monotonic() < deadline:
            try:
                self._pull(0.2)
            except PeerLost:
                break


@dataclass
class RoundFeeder(Feeder):
    """A :class:`~scalectl.rl.schedule.modes.BatchSource` for ``sync`` and ``ppo_off_policy`` over
    generator processes: rounds of ``rounds`` batches sampled by one policy version.

    When no batch of the current round is left (``state.pending``), the trainer at version
    v pushes weights v, requests ``rounds`` x P prompts at once (the mode's request window; a
    near-equal share per generator, :func:`scalectl.rl.train.sharding.split_groups`), each
    tagged with version v, and collects the round's ``rounds`` batches in order (filters and
    dynamic-sampling refills as in one process, :func:`scalectl.rl.batches.collect.collect_batch`;
    refills are sampled by the same weights).  Weights are pushed only at the start of a round, so every token of the
    round is version v, and batch j of the round is trained by version v + j: staleness
    j <= rounds - 1 (0 for ``sync``), checked for every trained token (the step metrics'
    staleness and throughput are over the tokens the step trained).  The round's
    batches wait in ``state.pending``, so a checkpoint between two steps of a round holds
    them and a resumed run trains on them as the uninterrupted run would (as
    :class:`~scalectl.rl.schedule.modes.LocalBatches` does); a round interrupted while being
    collected is sampled again from the sampler as of its start.  ``rounds`` is the mode's
    :attr:`~scalectl.recipe.async_modes.AsyncMode.steps_per_round` (1 for ``sync``, k for
    ``ppo_off_policy``).
    """

    def chunks(self, n: int) -> list[range]:
        """A round's ``n`` requests in M near-equal contiguous shares (M generators), so that
        every generator samples its share of the round at once."""
        from scalectl.rl.train.sharding import split_groups

        return [share for share in split_groups(n, len(self.generators)) if len(share)]

    def next_batch(self, version: int) -> tuple[list, dict]:
        """Before step ``version``: the next batch of the round, collecting a new round first
        when none is left.

        Raises:
            StalenessError: a trained token older than ``bound`` versions.
        """
        state = self.state
        self._step = {"idle": 0.0, "versions": [], "t0": time.perf_counter()}
        self._timed()
        if not state.pending:
            if self.pushed < version:
                self.push(version)
            self.dispatch(self.window - len(self.tickets))
            fetch = self._fetch(version)
            state.pending = [collect_batch(self.recipe, fetch, state) for _ in range(self.mode.steps_per_round)]
        kept, stats = state.pending.pop(0)
        self._step["versions"] = check_staleness(self.mode, version, kept)
        return kept, stats

    def after_step(self, version: int) -> None:
        """Nothing: the weights of ``version`` are pushed when the next round starts."""
