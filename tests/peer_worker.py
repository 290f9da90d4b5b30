"""One peer of a job in processes, for tests/test_transport_waits.py: it joins the job's rendezvous
on loopback as a real task (its :class:`~scalectl.rl.transport.stream.Channel`, card and heartbeat)
and behaves as MODE says, so that the test, the other side, can stop it (``kill -STOP``) or kill it
(``kill -9``) at a moment it chooses.

``python tests/peer_worker.py ROLE RANK WORLD TRAINER PORT MODE FOLDER``

* a generator (``ROLE = generator``):
  ``takes``: receives requests and weights (a :class:`~scalectl.rl.transport.stream.WeightSlot`), marks
  progress, answers nothing; ``deaf``: posts no receive and marks no progress, its heartbeat going on.
* the trainer (``ROLE = trainer``): sends 8 requests (of version -1) to generator 0, then takes no
  rollouts; states a no-progress limit of :data:`LIMIT_S`; ``marks`` marks progress meanwhile,
  ``deaf`` does not; ``evaluates`` sends no requests but pushes the weights of the policy saved in
  the folder named by ``FOLDER/policy`` as version 0 to evaluate, then marks progress and takes
  nothing (the generator's evaluation send waits).

Once it is ready (its groups built, its requests sent), it writes ``FOLDER/ready-RANK``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

#: The no-progress limit the trainer peer states (seconds); the tests' runs use the same.
LIMIT_S = 3.0
#: The weights both sides hold: 16 MiB, more than a loopback socket buffers, so that a push to a
#: stopped generator waits.
SIDE = 2048


def model() -> torch.nn.Module:
    """The weights the test's trainer pushes and a generator peer receives."""
    return torch.nn.Linear(SIDE, SIDE, bias=False)


class Engine:
    """What a :class:`~scalectl.rl.transport.stream.WeightSlot` loads the weights into."""

    version = -1

    def update_weights(self, state_dict, version):
        self.version = version


def main(role: str, rank: int, world: int, trainer: int, port: int, mode: str, folder: Path) -> None:
    from scalectl.rl.transport.roles import Task
    from scalectl.rl.transport.stream import STOP, Channel, Inbox, WeightSlot, send_object, weight_layout

    torch.set_num_threads(1)
    generators = trainer
    role_rank = rank if role == "generator" else rank - generators
    role_size = generators if role == "generator" else world - generators
    task = Task(role, rank, world, rank, role_rank, role_size, "127.0.0.1", port, "env")
    if mode == "evaluates":              # loaded first: its board then marks progress without a pause
        from scalectl.rl.policy.model import load_policy

        policy, _ = load_policy((folder / "policy").read_text(), "fp32")
    channel = Channel.connect(task, timeout_s=120, trainer=trainer)
    channel.board.read_cards()
    ready = folder / f"ready-{rank}"
    if role == "trainer":
        channel.board.limit_s = LIMIT_S
        sends = []                       # held: a send whose work is dropped never reaches its receiver
        if mode == "evaluates":
            from scalectl.rl.transport.stream import push_weights

            push_weights(channel.groups["weights"], policy, 0, evaluate=True)
            channel.board.mark()
        else:
            for req in range(8):
                sends.extend(send_object(channel.groups["control"], ("requests", [(req, req, -1)]), 0))
        ready.write_text("ready")
        while True:
            if mode in ("marks", "evaluates"):
                channel.board.mark()
            time.sleep(0.1)
    if mode == "deaf":
        ready.write_text("ready")
        while True:
            time.sleep(1.0)
    slot = WeightSlot(channel.groups["weights"], channel.seats["weights"].leader, Engine(), weight_layout(model()))
    control = Inbox(channel.groups["control"], [trainer], "control")
    ready.write_text("ready")
    while True:
        channel.board.mark()
        slot.poll()
        try:
            _, msg = control.get(timeout=0.05)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing came
            continue
        if isinstance(msg, tuple) and msg[0] == STOP:
            return


if __name__ == "__main__":
    role, rank, world, trainer, port, mode, folder = sys.argv[1:8]
    main(role, int(rank), int(world), int(trainer), int(port), mode, Path(folder))
