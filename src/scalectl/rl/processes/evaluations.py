"""Held-out evaluation sampled by the generator processes, requested and recorded by the leader.

Where a run evaluates is ``hardware.evaluation`` (:meth:`scalectl.recipe.schema.Hardware.evaluation_place`):
on the trainer (:class:`scalectl.rl.evaluation.during_training.Evaluations`), on the
generators, or on a dedicated evaluation generator.  On the generators the trainer processes
hold no rollout engine at all.

How a point's version is guaranteed while weights keep arriving (``pipeline``): the request
*is* a push of the weights.  To evaluate step v the leader pushes the weights of version v
with the evaluate bit set in the push's header (:func:`scalectl.rl.transport.stream.push_weights`);
a generator loads that push between two decoding steps like any other, and then holds it
(:attr:`scalectl.rl.transport.stream.WeightSlot.hold`): it loads no later version until it has
sampled its share of the held-out prompts.  A later push lands in its receive buffers meanwhile
(the engine's weights are separate), and the push after that waits for this generator, as every
push waits for every generator to have taken the previous one.  So every completion of the point
has the weights the point names; each generator reports every completion's token versions, and
the leader checks them (:class:`scalectl.rl.evaluation.shares.PointParts`) and writes them to
``RUN_DIR/evaluations.jsonl``.  A training chunk under way when the hold starts finishes with
version v (its tokens are no older than its request allows, so the staleness bound holds).

With ``hardware.evaluation = dedicated`` the last generator samples every evaluation and no
training rollout; it has a weights' group of its own with the leader (``eval_weights``), which
receives only the versions to evaluate, so the training generators never wait for it.

With at least 64 held-out prompts per evaluating generator, the chunks of an evaluation and
their seeds are those of an evaluation on one engine, so the point is the one the trainer would
compute with the same weights (the CPU engine is deterministic:
``tests/test_evaluation_on_generators.py`` compares the two).
"""

from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass
from pathlib import Path

from scalectl.points import EvalPoint
from scalectl.rl.evaluation.during_training import eval_seed
from scalectl.rl.evaluation.shares import PointParts, assign_chunks, evaluate_share
from scalectl.rl.reward.scoring import scorer_for
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.transport.stream import BYE, STOP, PeerLost, end_weights, push_weights, send_waiting, weight_layout

#: The first element of a generator's message holding its chunks of an evaluation.
EVAL = "eval"


@dataclass
class _Pending:
    fields: dict
    parts: PointParts
    started: float


class GeneratorEvaluations:
    """The leader's side: request an evaluation of the current version, collect the generators'
    chunks, hand back the point.  The interface of
    :class:`scalectl.rl.evaluation.during_training.Evaluations` (``start``, ``finished``, ``wait``,
    ``pending_step``), so the loop does not know where evaluations sample.

    Args:
        recipe: the validated recipe (``eval``).
        n_prompts: held-out prompts.
        evaluators: the generator ranks that sample evaluations.
        push: ``push(version)``: broadcast the weights of ``version`` with the evaluate bit to the
            evaluators (the training generators' weights' group, or the dedicated evaluator's).
        receive: ``receive(timeout)`` -> ``(src, message)``, raising ``queue.Empty`` after
            ``timeout`` seconds: the evaluators' ``(EVAL, step, chunks)`` messages, their last
            words ``(BYE, reason)`` and :class:`~scalectl.rl.transport.stream.PeerLost`.
        run_dir: where ``evaluations.jsonl`` goes (None: no record).
        lost: ``lost(rank, detail)`` -> the exception naming a generator gone (its card).
        close: called by :meth:`close` (the dedicated evaluator's stop), or None.
        check: ``check()``, called at every turn of :meth:`wait`: raises when an evaluator is lost or
            stuck for the run's no-progress limit (the feeder's look at its generators), or None.
    """

    def __init__(self, recipe, n_prompts: int, evaluators: list[int], push, receive, *,
                 run_dir: Path | None = None, lost=None, close=None, check=None):
        self.check = check or (lambda: None)
        self.recipe, self.evaluators, self.push, self.receive = recipe, list(evaluators), push, receive
        self.chunks = {g: len(c) for g, c in assign_chunks(n_prompts, self.evaluators).items() if c}
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.lost = lost or (lambda rank, detail: PeerLost(detail))
        self.close_evaluator = close
        self._pending: _Pending | None = None
        self.byes: dict[int, str] = {}

    def start(self, fields: dict, *, wait: bool = False) -> list[tuple[EvalPoint, float]]:
        """Ask the generators to evaluate the current weights (version ``fields["step"]``) for the
        point whose compute fields are ``fields``; with ``wait``, wait for it.

        Returns:
            The (point, seconds) pairs finished by now: the previous evaluation's (waited for
            first: one at a time), and this one's with ``wait``.

        Raises:
            PeerLost: an evaluating generator is gone.  EvaluationVersionError: a completion
                sampled by weights of another version.
        """
        done = self.wait()
        step = fields["step"]
        self._pending = _Pending(dict(fields), PointParts(step, dict(self.chunks)), time.perf_counter())
        self.push(step)
        return done + (self.wait() if wait else [])

    def pending_step(self) -> int | None:
        """The step of the evaluation under way (None: none)."""
        return None if self._pending is None else self._pending.parts.step

    def take(self, src: int, msg) -> None:
        """Take one message of an evaluator (chunks, last word, or its loss).

        Raises:
            PeerLost: the evaluator is gone.  ValueError: chunks nobody asked for.
        """
        if isinstance(msg, PeerLost):
            raise self.lost(src, f"generator rank {src} stopped during an evaluation: {msg}")
        if msg[0] == BYE:
            self.byes[src] = msg[1]
            return
        _, step, chunks = msg
        if self._pending is None or step != self._pending.parts.step:
            raise ValueError(f"evaluation chunks of step {step} from generator {src}, none asked")
        self._pending.parts.add(src, chunks)

    def finished(self) -> list[tuple[EvalPoint, float]]:
        """The evaluation's (point, seconds) if every chunk is in, without waiting."""
        while self._pending is not None and not self._pending.parts.complete:
            try:
                self.take(*self.receive(0))
            except queue.Empty:
                break
        if self._pending is not None and self._pending.parts.complete:
            return self.wait()
        return []

    def wait(self) -> list[tuple[EvalPoint, float]]:
        """Wait for the evaluation under way (if any) and return its (point, seconds); its
        chunks' token versions are appended to ``RUN_DIR/evaluations.jsonl``.

        An evaluating generator interrupted (a signal, its last word ``interrupted``) before it
        sampled its share drops the evaluation: none is returned, and a run resumed at that step
        evaluates it again (as with an evaluation on the trainer under way at a checkpoint).

        Raises:
            PeerLost: an evaluating generator is gone, or left otherwise without its chunks.
        """
        pending = self._pending
        if pending is None:
            return []
        while not pending.parts.complete:
            gone = [g for g in pending.parts.expected if g in self.byes and g not in pending.parts.arrived]
            if gone and all(self.byes[g] == "interrupted" for g in gone):
                self._pending = None
                return []
            if gone:
                raise self.lost(gone[0], f"generator rank {gone[0]} left ({self.byes[gone[0]]}) before its "
                                         f"share of the step-{pending.parts.step} evaluation")
            try:
                self.take(*self.receive(0.2))
            except queue.Empty:
                self.check()
        self._pending = None
        if self.run_dir is not None:
            with (self.run_dir / "evaluations.jsonl").open("a") as fh:
                for line in pending.parts.record():
                    fh.write(json.dumps(line) + "\n")
        point = EvalPoint(**pending.fields, **pending.parts.result(self.recipe.eval.samples_per_prompt))
        return [(point, time.perf_counter() - pending.started)]

    def close(self) -> None:
        """Release what the evaluations hold (the dedicated evaluator: its stop and last weights)."""
        if self.close_evaluator is not None:
            self.close_evaluator()


def evaluation_tap(results: queue.Queue):
    """A tap for the generators' rollouts inbox (:class:`scalectl.rl.transport.stream.Inbox`): it
    takes the evaluation messages into ``results`` and copies each generator's last word and
    loss there too (they still reach the feeder)."""
    def tap(src: int, obj) -> bool:
        if isinstance(obj, tuple) and obj and obj[0] == EVAL:
            results.put((src, obj))
            return True
        if isinstance(obj, PeerLost) or (isinstance(obj, tuple) and obj and obj[0] == BYE):
            results.put((src, obj))
        return False
    return tap


def on_training_generators(recipe, n_prompts: int, feeder, link, results: queue.Queue,
                           run_dir: Path) -> GeneratorEvaluations:
    """Evaluations sampled by the training generators (``hardware.evaluation = generators``): each
    request is ``feeder.push(version, evaluate=True)`` on their weights' group; their chunks come
    on the rollouts flow, taken into ``results`` by :func:`evaluation_tap`."""
    def receive(timeout: float):
        return results.get(timeout=timeout) if timeout > 0 else results.get_nowait()

    return GeneratorEvaluations(recipe, n_prompts, link.generators, lambda v: feeder.push(v, evaluate=True),
                                receive, run_dir=run_dir, lost=link.lost, check=getattr(feeder, "_still_waiting", None))


def on_dedicated_generator(recipe, n_prompts: int, evaluator: int, channel, link, model,
                           run_dir: Path, stall=None) -> GeneratorEvaluations:
    """Evaluations sampled by generator ``evaluator`` alone (``hardware.evaluation = dedicated``):
    requests are pushes on its own weights' group (``eval_weights``, gathered under ZeRO-3 by
    ``link.with_weights``), its messages come on an inbox of its own;
    :meth:`GeneratorEvaluations.close` sends it the stop and the weights' last word, and waits
    for its own last word.  Every wait on it looks at its beats and ends on the no-progress limit
    ``stall`` (the feeder's :class:`~scalectl.rl.schedule.feeder.StallLimit`; default
    ``launcher.stall_timeout_s`` or its floor)."""
    from scalectl.rl.schedule.feeder import StallLimit
    from scalectl.rl.transport.board import Watch
    from scalectl.rl.transport.stream import Inbox, keep_until_exit
    from scalectl.rl.transport.waits import wait_collective

    inbox = Inbox(channel.groups["rollouts"], [evaluator], "evaluations")
    group = channel.groups["eval_weights"]
    layout: list = []
    stall = stall or StallLimit(recipe.launcher.stall_timeout_s)
    watch = Watch(channel.board, [evaluator]) if getattr(channel, "board", None) is not None else None

    def check() -> None:
        if watch is not None:
            try:
                watch.check(stall.seconds)
            except Exception:
                keep_until_exit(channel)          # a send or a push to it is left pending
                raise

    sliced = (lambda work: wait_collective(work, check)) if getattr(group, "backend", "gloo") == "gloo" else None

    def push(version: int) -> None:
        def send(m):
            layout[:] = weight_layout(m)
            return push_weights(group, m, version, evaluate=True, wait=sliced)
        link.with_weights(model, send)

    def close() -> None:
        try:
            send_waiting(channel.groups["control"], (STOP,), evaluator, check)
            end_weights(group, layout or link.with_weights(model, weight_layout), next(model.parameters()).device,
                        wait=sliced)
        except Exception:  # noqa: BLE001 - the evaluator is gone: nothing to stop
            return
        deadline = time.monotonic() + 60
        while evaluator not in evals.byes and time.monotonic() < deadline:
            try:
                evals.take(*inbox.get(timeout=0.2))
            except (queue.Empty, PeerLost):
                pass

    evals = GeneratorEvaluations(recipe, n_prompts, [evaluator], push, lambda t: inbox.get(timeout=t),
                                 run_dir=run_dir, lost=link.lost, close=close, check=check)
    return evals


# --------------------------------------------------------------------------- a generator's side


def serve_evaluation(recipe, engine, slot, problems: list, rank: int, evaluators: list[int], channel,
                     trainer: int, check=None) -> bool:
    """If ``slot`` holds a version to evaluate: sample this generator's chunks of the held-out
    ``problems`` with it, send them to the trainer (calling ``check()`` every second until the
    trainer takes them: it raises when the trainer is lost or stuck), and release the hold.

    Returns:
        Whether an evaluation was served.
    """
    step = slot.hold
    if step is None:
        return False
    chunks = assign_chunks(len(problems), evaluators).get(rank, [])
    if not chunks:                    # fewer chunks than generators: nothing asked of this one
        slot.release()
        return True
    parts = evaluate_share(engine, problems, chunks, SamplingParams.for_evaluation(recipe),
                           samples_per_prompt=recipe.eval.samples_per_prompt, seed=eval_seed(recipe),
                           score=scorer_for(recipe))
    send_waiting(channel.groups["rollouts"], (EVAL, step, parts), trainer, check)
    slot.release()
    return True
