"""Which task of a job in processes is gone: cards and heartbeats in the job's rendezvous store."""

from __future__ import annotations

import os
import pickle
import socket
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from scalectl.rl.transport.board import JOB_ENDING, PREFIX, Board, TaskLost, TaskStuck, Watch, is_lost_peer
from scalectl.rl.transport.roles import Task, free_port
from scalectl.rl.transport.stream import PeerLost


def _task(rank: int, role: str, role_rank: int) -> Task:
    return Task(role, rank, 3, rank, role_rank, 2 if role == "trainer" else 1, "127.0.0.1", 0, "env")


def test_a_task_whose_heartbeat_stops_is_named_with_its_pid_host_and_log():
    """Three tasks of one job write their cards in a real TCPStore; the one whose heartbeat stops is
    named (role, ranks, pid, host, log) when a trainers' collective fails, and only a lost connection
    is turned into TaskLost."""
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=10))
    boards = [Board(store, _task(0, "generator", 0), log="/runs/x/0.log", interval_s=0.25),
              Board(store, _task(1, "trainer", 0), log="/runs/x/1.log", interval_s=0.25),
              Board(store, _task(2, "trainer", 1), log="", interval_s=0.25)]
    leader = boards[1]
    try:
        # 2 s is 8 heartbeat intervals: a beating thread moves its counter in that time even on a
        # loaded machine; close() returns after the last beat, so the stopped one stays still
        assert leader.gone(wait_s=2.0) == []                         # everyone beating
        boards[2].close()                                            # the second trainer stops beating
        host, pid = socket.gethostname(), os.getpid()
        assert [c.rank for c in leader.gone(wait_s=2.0)] == [2]
        closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242")
        lost = leader.lost(closed, [1, 2])
        assert isinstance(lost, TaskLost) and isinstance(lost, PeerLost) and is_lost_peer(lost)
        assert str(lost) == f"trainer task 2 (trainer rank 1, pid {pid} on {host}) stopped answering"
        assert lost.card.rank == 2 and not lost.leader and leader.lost_rank(1, "x").leader
        assert str(pickle.loads(pickle.dumps(lost))) == str(lost)
        other = ValueError("a bug, not a lost peer")
        assert leader.lost(other, [1, 2]) is other
        assert leader.lost(closed, [0]) is closed                     # the generator still beats: nobody named
        assert str(leader.lost_rank(0, "rollouts flow closed")) == (
            f"generator task 0 (generator rank 0, pid {pid} on {host}) stopped answering (log: /runs/x/0.log)")
        assert type(leader.lost_rank(7, "rank 7 closed")) is PeerLost  # no card: the plain error
    finally:
        for b in boards:
            b.close()


@pytest.mark.parametrize("text, lost", [("Connection closed by peer [1.2.3.4]:5", True),
                                        ("Connection reset by peer", True), ("CUDA out of memory", False)])
def test_lost_peer_is_read_from_the_error(text, lost):
    assert is_lost_peer(RuntimeError(text)) is lost


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _until(predicate, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_generator_whose_loop_stops_while_its_heartbeat_goes_on_is_named_stuck():
    """Two generators and the first trainer rank beat in a real TCPStore.  Progress is counted on a
    clock the test moves: the generator that stops marking progress for the limit, its heartbeat
    going on, is named stuck (with how long); one whose heartbeat stops for the limit is named lost;
    within the limit nobody is named."""
    clock = FakeClock()
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=10))
    tasks = [_task(0, "generator", 0), _task(1, "generator", 1), _task(2, "trainer", 0)]
    boards = [Board(store, t, log=f"/runs/x/{t.rank}.log", interval_s=0.05, clock=clock) for t in tasks]
    watch = Watch(boards[2], [0, 1], every_s=0.0, clock=clock)
    host, pid = socket.gethostname(), os.getpid()

    def beat(rank: int) -> tuple[int, float]:
        counter, idle, limit = store.get(f"{PREFIX}/beat/{rank}").decode().split()
        assert limit == "-"                              # no limit stated
        return int(counter), float(idle)

    try:
        watch.check(limit_s=30.0)                        # everyone fresh
        clock.now += 29.0                                # nobody marks progress for 29 s
        _until(lambda: beat(0)[1] == beat(1)[1] == 29.0, "beats that say 29 s")
        watch.check(limit_s=30.0)                        # within the limit: nobody named
        boards[1].mark()                                 # generator 1 makes progress
        clock.now += 2.0                                 # generator 0 has been still for 31 s
        _until(lambda: beat(0)[1] == 31.0 and beat(1)[1] == 2.0, "beats that say 31 s and 2 s")
        with pytest.raises(TaskStuck) as stuck:
            watch.check(limit_s=30.0)
        assert str(stuck.value) == (f"generator task 0 (generator rank 0, pid {pid} on {host}) made no progress for "
                                    f"31 s while its heartbeat went on (limit 30 s, launcher.stall_timeout_s) "
                                    f"(log: /runs/x/0.log)")
        assert (stuck.value.card.rank, stuck.value.idle_s, stuck.value.leader) == (0, 31.0, False)
        assert not is_lost_peer(stuck.value) and isinstance(stuck.value, JOB_ENDING)
        assert str(pickle.loads(pickle.dumps(stuck.value))) == str(stuck.value)

        boards[0].mark()
        boards[1].close()                                # generator 1's heartbeat stops for good
        frozen = beat(1)[0]
        _until(lambda: beat(0)[1] == 0.0, "generator 0's beat after its progress")
        watch.check(limit_s=30.0)                        # generator 1's counter seen standing from now on
        seen = beat(0)[0]
        clock.now += 30.0
        boards[0].mark()
        _until(lambda: beat(0)[1] == 0.0 and beat(0)[0] > seen, "a fresh beat of generator 0")
        with pytest.raises(TaskLost) as lost:
            watch.check(limit_s=30.0)
        assert str(lost.value) == (f"generator task 1 (generator rank 1, pid {pid} on {host}) stopped answering "
                                   f"(its heartbeat stood still for 30 s, limit 30 s, launcher.stall_timeout_s: its process is "
                                   f"stopped or its node cut off) (log: /runs/x/1.log)")
        assert beat(1)[0] == frozen
    finally:
        for b in boards:
            b.close()
