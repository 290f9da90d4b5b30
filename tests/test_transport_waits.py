"""Every wait of the trainer and of a generator on the other side ends on the run's no-progress
limit, or at once when the other side's connection closes, with the other side named by what was
seen: real tasks on loopback (tests/peer_worker.py), stopped (``kill -STOP``) or killed
(``kill -9``) while the side under test sends to it, receives from it, or pushes weights to it.

The limit is ``launcher.stall_timeout_s = 3``; every wait here is on a state (a file the peer
writes, a pending send), and the operation under test runs in a thread joined with a generous bound
that only keeps a broken build from hanging the suite."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalectl.recipe.load import load
from scalectl.rl.schedule.feeder import Feeder, StreamLink
from scalectl.rl.schedule.modes import schedule_for
from scalectl.rl.transport.board import TaskLost, TaskStuck
from scalectl.rl.transport.roles import Task, free_port
from scalectl.rl.transport.stream import Channel, Inbox, keep_until_exit
from scalectl.rl.transport.waits import wait_works

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "peer_worker.py"
sys.path.insert(0, str(ROOT / "tests"))
from peer_worker import LIMIT_S, model  # noqa: E402

HOST = socket.gethostname()
#: Only a broken build gets near it: every operation here ends within the 3 s limit plus reads.
BOUND_S = 300.0


def _until(predicate, what: str, timeout_s: float = 300.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _outcome(fn) -> BaseException | None:
    """What ``fn()`` raised (None if it returned), run in a thread joined within :data:`BOUND_S`."""
    box: dict = {}

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), "the wait did not end"
    return box.get("exc")


def _pending_send() -> bool:
    return any(t.name == "wait-works" and t.is_alive() for t in threading.enumerate())


class Peers:
    """Peer processes started by a test, each killed (and continued) at its end."""

    def __init__(self, folder: Path):
        self.folder, self.procs = folder, {}

    def start(self, role: str, rank: int, world: int, trainer: int, port: int, mode: str) -> subprocess.Popen:
        log = (self.folder / f"peer-{rank}.log").open("w")
        self.procs[rank] = subprocess.Popen(
            [sys.executable, str(WORKER), role, str(rank), str(world), str(trainer), str(port), mode, str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT)
        return self.procs[rank]

    def ready(self, *ranks: int) -> None:
        for r in ranks:
            _until(lambda: (self.folder / f"ready-{r}").exists() or self.procs[r].poll() is not None,
                   f"peer {r} to be ready")
            assert self.procs[r].poll() is None, (self.folder / f"peer-{r}.log").read_text()

    def stop(self, rank: int) -> None:
        os.kill(self.procs[rank].pid, signal.SIGSTOP)

    def kill(self, rank: int) -> None:
        self.procs[rank].kill()
        self.procs[rank].wait()

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                os.kill(p.pid, signal.SIGCONT)
                p.wait()


@pytest.fixture
def peers(tmp_path):
    out = Peers(tmp_path)
    yield out
    out.close()


def _connect(task: Task, trainer: int) -> Channel:
    channel = Channel.connect(task, timeout_s=120, trainer=trainer)
    channel.board.read_cards()
    keep_until_exit(channel)             # sends to a stopped peer stay pending until it is killed
    return channel


def _feeder(peers: Peers, mode_of_1: str) -> Feeder:
    """The trainer (this process, rank 2) of 2 generators (peers 0 and 1; peer 0 hosts the store)."""
    port = free_port()
    peers.start("generator", 0, 3, 2, port, "takes")
    peers.start("generator", 1, 3, 2, port, mode_of_1)
    channel = _connect(Task("trainer", 2, 3, 2, 0, 1, "127.0.0.1", port, "env"), trainer=2)
    peers.ready(0, 1)
    recipe = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                  ["async.mode=pipeline", "hardware.generators=2", "batch.prompts_per_step=2",
                   f"launcher.stall_timeout_s={LIMIT_S:g}", "filter.retire_solved=false"])
    link = StreamLink(channel, [0, 1], Inbox(channel.groups["rollouts"], [0, 1], "rollouts"),
                      SimpleNamespace(is_set=lambda: False, event=threading.Event()))
    return Feeder(recipe, SimpleNamespace(requests=list(range(64))), model(), link, schedule_for(recipe.async_).mode)


#: A request message of 32 MiB: more than loopback sockets buffer, so its send waits for the reader.
BIG = ("requests", [], b"x" * (32 << 20))


def _named(exc, role: str, rank: int, pid: int) -> str:
    return f"{role} task {rank} ({role} rank {rank if role == 'generator' else 0}, pid {pid} on {HOST})"


@pytest.mark.parametrize("moment", ["send", "push", "receive", "evaluation"])
def test_a_stopped_generator_is_named_lost_within_the_limit_whatever_the_trainer_waits_for(peers, moment):
    """Generator 1 is stopped (kill -STOP) while the trainer sends it a request, pushes weights,
    waits for its rollouts, or waits for its share of an evaluation (both took the evaluation's
    weights): the wait ends once its heartbeat has stood still for the limit, naming it (pid, host)
    and saying what was seen."""
    from scalectl.rl.processes.evaluations import on_training_generators

    feeder = _feeder(peers, "takes")
    pid = peers.procs[1].pid
    evals = on_training_generators(feeder.recipe, 8, feeder, feeder.link, queue.Queue(), None)
    if moment == "receive":
        feeder.dispatch(2)                      # one request each; they answer none
    if moment == "evaluation":
        assert evals.start({"step": 0}) == [] and evals.pending_step() == 0    # pushed, taken by both
    peers.stop(1)
    action = {"send": lambda: feeder.send(1, BIG), "push": lambda: feeder.push(1),
              "receive": lambda: feeder.next_group(0), "evaluation": evals.wait}[moment]
    exc = _outcome(action)
    assert isinstance(exc, TaskLost), repr(exc)
    assert str(exc) == (f"{_named(exc, 'generator', 1, pid)} stopped answering (its heartbeat stood still for "
                        f"{exc.detail.split(' for ')[1].split(' s,')[0]} s, limit 3 s, launcher.stall_timeout_s: "
                        "its process is stopped or its node cut off)")
    assert exc.card.rank == 1 and feeder.byes[1] == "lost"


def test_a_generator_that_reads_nothing_while_its_heartbeat_goes_on_is_named_stuck(peers):
    """Generator 1 lives and beats but posts no receive and marks no progress: the trainer's send to it
    ends on the limit, naming it stuck (its heartbeat went on)."""
    feeder = _feeder(peers, "deaf")
    exc = _outcome(lambda: feeder.send(1, ("requests", [(0, 0, -1)])))
    assert isinstance(exc, TaskStuck), repr(exc)
    assert str(exc).startswith(f"{_named(exc, 'generator', 1, peers.procs[1].pid)} made no progress for ")
    assert str(exc).endswith("s while its heartbeat went on (limit 3 s, launcher.stall_timeout_s)")
    assert exc.idle_s >= LIMIT_S


def test_the_stopped_host_of_the_store_is_named_when_the_store_does_not_answer(peers):
    """Generator 0 hosts the job's store: stopped, it answers neither the send nor the reads of its
    beats; the send ends on the limit naming it by the store's silence."""
    feeder = _feeder(peers, "takes")
    pid = peers.procs[0].pid
    peers.stop(0)
    exc = _outcome(lambda: feeder.send(0, BIG))
    assert isinstance(exc, TaskLost), repr(exc)
    assert str(exc).startswith(f"{_named(exc, 'generator', 0, pid)} stopped answering (the job's store, which it "
                               "hosts, did not answer for ")
    assert "limit 3 s, launcher.stall_timeout_s: its process is stopped or its node cut off)" in str(exc)


@pytest.mark.parametrize("moment", ["send", "push", "receive"])
def test_a_generator_killed_while_the_trainer_waits_on_it_is_named_at_once(peers, moment):
    """Generator 1 is killed -9 while a send or a push to it is pending (it was stopped first, so
    that the wait had begun), or while the trainer waits for its rollouts: the connection closes and
    the trainer names it lost (no limit to wait for)."""
    feeder = _feeder(peers, "takes")
    pid = peers.procs[1].pid
    if moment == "receive":
        feeder.dispatch(2)
        peers.kill(1)
        exc = _outcome(lambda: feeder.next_group(0))
    else:
        peers.stop(1)
        result = {}
        action = {"send": lambda: feeder.send(1, BIG), "push": lambda: feeder.push(1)}[moment]
        thread = threading.Thread(target=lambda: result.update(exc=_outcome(action)), daemon=True)
        thread.start()
        _until(_pending_send if moment == "send" else lambda: feeder._layout is not None, f"the {moment} to wait")
        peers.kill(1)
        thread.join(BOUND_S)
        exc = result["exc"]
    assert isinstance(exc, TaskLost) and exc.card.rank == 1, repr(exc)
    if moment == "push":       # stopped first: its heartbeat may have stood still past the limit already
        assert str(exc).startswith(f"{_named(exc, 'generator', 1, pid)} stopped answering")
    else:
        assert str(exc) == f"{_named(exc, 'generator', 1, pid)} stopped answering" and exc.detail == ""


# --------------------------------------------------------------------------- the generator's side


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


def _generator(peers: Peers, policy: str, trainer_mode: str, tmp_path: Path, *extra: str):
    """Run the real generator body (this process, rank 0, host of the store) against a trainer peer
    (rank 1) that sends 8 requests and takes no rollouts; returns (thread, result box)."""
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.loop import Reporter
    from scalectl.rl.processes.bodies import ProcessSpec, StopFlag, run_generator

    port = free_port()
    recipe = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                  [f"model.path={policy}", "async.mode=pipeline", "hardware.generators=1", "hardware.trainers=1",
                   "batch.prompts_per_step=1", "batch.generations_per_prompt=2", "data.train_size=20",
                   "eval.prompts=4", f"launcher.stall_timeout_s={LIMIT_S:g}", "hardware.threads=1", *extra])
    train, held_out = load_prompt_sets(recipe)
    spec = ProcessSpec(recipe.to_dict(), str(tmp_path), None, False, train, held_out, schedule_for(recipe.async_))
    (peers.folder / "policy").write_text(policy)
    peers.start("trainer", 1, 2, 1, port, trainer_mode)
    box: dict = {}

    def run():
        try:
            box["result"] = run_generator(spec, Task("generator", 0, 2, 0, 0, 1, "127.0.0.1", port, "env"),
                                          Reporter(), StopFlag())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            box["exc"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    peers.ready(1)
    return thread, box


def _ended(thread, box) -> BaseException:
    thread.join(BOUND_S)
    assert not thread.is_alive(), "the generator did not end"
    return box.get("exc")


def test_a_generator_whose_trainer_takes_nothing_and_marks_nothing_names_it_stuck(peers, policy, tmp_path):
    """The trainer peer beats but takes no rollouts and marks no progress past the limit it states:
    the generator's send ends on that limit, naming the trainer stuck."""
    exc = _ended(*_generator(peers, policy, "deaf", tmp_path))
    assert isinstance(exc, TaskStuck), repr(exc)
    assert str(exc).startswith(f"{_named(exc, 'trainer', 1, peers.procs[1].pid)} made no progress for ")
    assert str(exc).endswith("while its heartbeat went on (limit 3 s, launcher.stall_timeout_s)")
    assert exc.leader


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_generator_whose_trainer_stops_or_dies_during_a_send_names_it(peers, policy, tmp_path, how):
    """The trainer peer marks progress but takes no rollouts, so the generator's sends wait; once one
    is pending the trainer is stopped (its heartbeat stands still: named after the limit) or killed -9
    (its connection closes: named at once, as the trainer of a node that dies), and the generator
    fails with a TaskLost naming it, the error the job body records and ends the job on."""
    thread, box = _generator(peers, policy, "marks", tmp_path)
    pid = peers.procs[1].pid
    _until(_pending_send, "a send of rollouts to wait")
    peers.stop(1) if how == "stop" else peers.kill(1)
    exc = _ended(thread, box)
    assert isinstance(exc, TaskLost) and exc.leader, repr(exc)
    if how == "stop":
        assert str(exc).startswith(f"{_named(exc, 'trainer', 1, pid)} stopped answering (its heartbeat stood still")
    else:
        assert str(exc) == f"{_named(exc, 'trainer', 1, pid)} stopped answering" and exc.detail == ""


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_generator_whose_trainer_stops_or_dies_while_it_sends_an_evaluation_names_it(peers, policy, tmp_path,
                                                                                      how):
    """The trainer peer pushes version 0 to be evaluated, sends no requests and takes nothing: the
    generator samples its share of the held-out prompts and its send of them waits; the trainer is
    then stopped or killed -9, and the generator fails naming it (after the limit, or at once)."""
    thread, box = _generator(peers, policy, "evaluates", tmp_path, "hardware.evaluation=generators")
    pid = peers.procs[1].pid
    _until(lambda: _pending_send() or not thread.is_alive(), "the evaluation's send to wait")
    assert thread.is_alive(), repr(box)
    peers.stop(1) if how == "stop" else peers.kill(1)
    exc = _ended(thread, box)
    assert isinstance(exc, TaskLost) and exc.leader, repr(exc)
    if how == "stop":
        assert str(exc).startswith(f"{_named(exc, 'trainer', 1, pid)} stopped answering (its heartbeat stood still")
    else:
        assert str(exc) == f"{_named(exc, 'trainer', 1, pid)} stopped answering" and exc.detail == ""


def test_wait_works_passes_on_the_check_and_the_peer_error():
    """Without a peer to wait for, a work that fails hands its error over; a check that raises ends the wait."""
    class Failing:
        def wait(self):
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1")

    class Never:
        def __init__(self):
            self.released = threading.Event()

        def wait(self):
            self.released.wait()

    with pytest.raises(RuntimeError, match="closed by peer"):
        wait_works([Failing()], check=lambda: None, slice_s=0.01)
    calls = []

    class Enough(Exception):
        pass

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise Enough
    never = Never()
    with pytest.raises(Enough):
        wait_works([never], check=check, slice_s=0.01)
    assert len(calls) == 3
    never.released.set()
