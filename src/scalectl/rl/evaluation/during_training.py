"""A running loop's held-out evaluations: in the loop's thread, or overlapped with training.

An evaluation of step v samples every held-out prompt k times with the weights of
version v and a fixed seed (:func:`scalectl.rl.evaluation.pass_rate.evaluate`; the CPU engine
draws from a generator of its own, seeded per call), so where and when it runs
does not change its point.  In the background (``eval.background``), a second
copy of the policy with its own CPU rollout engine receives the weights of
version v when the evaluation starts (a copy taken in the loop's thread, so later
steps cannot reach it) and a thread samples with it while the loop trains on.

Where that pays: the trainer process of a pipeline on CPU cores.  There the
generator process waits whenever the stream is k versions ahead, and it does so
during every evaluation the trainer runs in its own thread; overlapped, the
evaluation's work fills the generator's idle share of the cores instead of
stopping the trainer.  ``eval.background = "auto"`` turns it on there (a CPU
rollout engine on CPU devices, a run in processes) and off elsewhere (a
single-process run already uses every core it is given; vLLM engines hold their
own weights on GPUs and cannot be copied cheaply).

One evaluation runs at a time: starting the next waits for the previous one, and
points leave in step order from the loop's thread (one thread writes the store).
The loop's compute meter does not run while an evaluation is only waited for,
so the compute axis (FLOPs, device-hours) of every point is the same either way.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from scalectl.points import EvalPoint
from scalectl.rl.evaluation.pass_rate import evaluate
from scalectl.rl.reward.scoring import scorer_for
from scalectl.rl.rollout.sampling import SamplingParams


def eval_seed(recipe) -> int:
    """The sampling seed of every evaluation of a run (the same at every step, so points
    of one run differ by their weights alone)."""
    return recipe.seed * 7919 + 17


def runs_in_background(recipe, in_processes: bool) -> bool:
    """Whether the evaluations of ``recipe`` overlap with training (``eval.background``).

    Args:
        recipe: the validated :class:`~scalectl.recipe.schema.Recipe`.
        in_processes: the run's generators and trainers are processes of their own
            (:meth:`scalectl.rl.schedule.modes.Schedule.in_processes`).

    Returns:
        ``on``: True; ``off``: False; ``auto``: True for a CPU rollout engine on CPU
        devices in a run in processes (a pipeline's trainer process), else False.
    """
    choice = recipe.eval.background
    if choice != "auto":
        return choice == "on"
    hw = recipe.hardware
    return in_processes and hw.device == "cpu" and hw.rollout_engine == "cpu"


@dataclass
class _Pending:
    """An evaluation under way: the point's compute fields as of its step, its thread."""

    fields: dict
    started: float
    thread: threading.Thread | None = None
    result: dict | None = None
    error: BaseException | None = None
    seconds: float = 0.0


class Evaluations:
    """The held-out evaluations of one run, each of the weights of the step it is started at.

    Args:
        recipe: the validated :class:`~scalectl.recipe.schema.Recipe` (``eval``, ``seed``).
        engine: the policy's rollout engine (its weights are the trainer's current ones);
            used in the loop's thread.
        problems: the held-out prompts.
        background: None to evaluate in the loop's thread; else a
            :class:`~scalectl.rl.rollout.cpu.CPURolloutEngine` over a model of its own
            (the same architecture and dtype as the policy), which evaluations started
            with :meth:`start` sample with in a thread, after loading the weights.
        load_weights: ``load_weights(engine, version)`` copies the policy's current
            weights into the background engine (e.g. through
            :meth:`~scalectl.rl.train.data_parallel.TrainerRanks.gathered` under ZeRO-3).
        threads: torch threads of the background thread (None: torch's setting here).
    """

    def __init__(self, recipe, engine, problems: list, *, background=None, load_weights=None,
                 threads: int | None = None):
        self.recipe, self.engine, self.problems = recipe, engine, problems
        self.background, self.load_weights, self.threads = background, load_weights, threads
        self.params = SamplingParams.for_evaluation(recipe)
        self.score = scorer_for(recipe)                 # the run's reward, as in its rollouts
        self._pending: _Pending | None = None

    def _evaluate(self, engine) -> dict:
        return evaluate(engine, self.problems, self.params, samples_per_prompt=self.recipe.eval.samples_per_prompt,
                        seed=eval_seed(self.recipe), score=self.score)

    def start(self, fields: dict, *, wait: bool = False) -> list[tuple[EvalPoint, float]]:
        """Evaluate the current weights for the point whose compute fields are ``fields``
        (``step``, ``flops``, ``gpu_hours``, ... as of now).

        In the loop's thread (no background engine, or ``wait``) the evaluation runs now.
        In the background it waits for the previous one, copies the weights and returns at once.

        Returns:
            The (point, seconds the evaluation took) pairs finished by now, in step order: this
            one when it ran here, the previous one's when it was waited for.

        Raises:
            Whatever a background evaluation raised (re-raised here, in the loop's thread).
        """
        done = self.wait()
        if self.background is None or wait:
            t0 = time.perf_counter()
            result = self._evaluate(self.engine)
            return done + [(EvalPoint(**fields, **result), time.perf_counter() - t0)]
        self.load_weights(self.background, fields["step"])
        pending = _Pending(fields=dict(fields), started=time.perf_counter())
        pending.thread = threading.Thread(target=self._run, args=(pending,), daemon=True,
                                          name=f"evaluation-{fields['step']}")
        self._pending = pending
        pending.thread.start()
        return done

    def _run(self, pending: _Pending) -> None:
        import torch

        if self.threads is not None:
            torch.set_num_threads(self.threads)     # a new thread does not inherit the caller's setting
        try:
            pending.result = self._evaluate(self.background)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop's thread
            pending.error = exc
        pending.seconds = time.perf_counter() - pending.started

    def pending_step(self) -> int | None:
        """The step of the evaluation under way in the background (None: none)."""
        return None if self._pending is None else self._pending.fields["step"]

    def finished(self) -> list[tuple[EvalPoint, float]]:
        """The background evaluation's (point, seconds) if it has finished, without waiting."""
        if self._pending is None or self._pending.thread.is_alive():
            return []
        return self.wait()

    def wait(self) -> list[tuple[EvalPoint, float]]:
        """Wait for the evaluation under way (if any) and return its (point, seconds).

        Raises:
            Whatever the background evaluation raised.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        pending.thread.join()
        if pending.error is not None:
            raise pending.error
        return [(EvalPoint(**pending.fields, **pending.result), pending.seconds)]


def background_engine(recipe, model, tokenizer):
    """A CPU rollout engine over a model of its own, built like ``model`` (config, dtype),
    for :class:`Evaluations` in the background; its weights are loaded at each start.

    Raises:
        ValueError: ``hardware.rollout_engine`` is not ``cpu`` (a background evaluation
            copies the policy into a CPU engine).
    """
    from transformers import AutoModelForCausalLM

    from scalectl.rl.rollout.cpu import CPURolloutEngine

    if recipe.hardware.rollout_engine != "cpu":
        raise ValueError(f"eval.background = 'on' needs hardware.rollout_engine = 'cpu', "
                         f"not {recipe.hardware.rollout_engine!r}")
    # the weights follow at each start (under ZeRO-3 this rank's parameters are partitions)
    copy = AutoModelForCausalLM.from_config(model.config, dtype=next(model.parameters()).dtype,
                                            attn_implementation=model.config._attn_implementation)
    copy.generation_config = model.generation_config          # its EOS ids: the stop set
    return CPURolloutEngine(copy.eval(), tokenizer, head_fp32=recipe.precision.lm_head == "fp32",
                            max_prompt_tokens=recipe.length.max_prompt_tokens,
                            kv_memory_mib=recipe.hardware.decode_memory_mib)
