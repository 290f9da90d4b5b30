"""Which task of a job in processes is gone: cards and heartbeats in the job's rendezvous store."""

from __future__ import annotations

import os
import pickle
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from scalectl.rl.transport.board import Board, TaskLost, is_lost_peer
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
