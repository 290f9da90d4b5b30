"""Live progress of a training run on stderr: a rich progress bar on a terminal, plain
lines at a steady rate elsewhere (a log file, a CI job, ``| tee``)."""

from __future__ import annotations

import os
import time

from scalectl.present.console import err

#: Seconds between two plain progress lines when stderr is not a terminal
#: (``$SCALECTL_PROGRESS_INTERVAL`` overrides; 0 prints every step).
PLAIN_INTERVAL_S = 10.0


def plain_interval() -> float:
    """``$SCALECTL_PROGRESS_INTERVAL`` (seconds, >= 0) or :data:`PLAIN_INTERVAL_S`."""
    try:
        return max(0.0, float(os.environ.get("SCALECTL_PROGRESS_INTERVAL", PLAIN_INTERVAL_S)))
    except ValueError:
        return PLAIN_INTERVAL_S


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


#: Steps of the recent window the rate per step is measured over.
ETA_WINDOW = 50


class StepClock:
    """Seconds per step from the recent steps, and the time the rest of a run needs.

    What it measures, from the times at which each step ends (:meth:`stepped`):

    * the first step after the start is left out: it carries what only the start does
      (loading the model, starting the generators, and in ``ppo_off_policy`` the
      generation of a whole round of k batches);
    * a step during which an evaluation was reported (:meth:`evaluated`) is left out of
      the rate per step; its time beyond that rate is the cost of one evaluation
      (zero when evaluations overlap training);
    * the rate is the mean over the last ``window`` steps that remain, so that a run
      whose speed changes is followed, and whole rounds of ``ppo_off_policy`` average out.

    The time left (:meth:`eta`) is the steps left times the rate plus the evaluations
    left (every ``eval_every`` steps, read from the steps evaluated so far, and one at
    the end) times their cost.  Times in seconds from any monotonic clock.
    """

    def __init__(self, window: int = ETA_WINDOW):
        self.window = window
        self.intervals: list[tuple[float, bool]] = []     # (seconds, had an evaluation), first left out
        self.last: tuple[int, float] | None = None
        self.first_seconds: float | None = None
        self.eval_steps: list[int] = []
        self._eval_pending = False

    def start(self, step: int, now: float) -> None:
        """The run starts (or resumes) at ``step``."""
        self.last = (step, now)

    def evaluated(self, step: int) -> None:
        """An evaluation of ``step`` was reported: the step under way when it ran is left out."""
        self.eval_steps.append(step)
        self._eval_pending = True

    def stepped(self, step: int, now: float) -> None:
        """Step ``step`` ended at ``now``."""
        if self.last is None:
            self.start(step - 1, now)
        prev_step, prev_t = self.last
        n = max(1, step - prev_step)
        if self.first_seconds is None:
            self.first_seconds = now - prev_t
        else:
            self.intervals.extend([((now - prev_t) / n, self._eval_pending)] * n)
            del self.intervals[:-self.window]
        self._eval_pending = False
        self.last = (step, now)

    def per_step(self) -> float | None:
        """Mean seconds of the recent steps without an evaluation; None before there is one."""
        plain = [dt for dt, ev in self.intervals if not ev]
        return sum(plain) / len(plain) if plain else None

    def per_eval(self) -> float:
        """Seconds an evaluation adds to the step it falls in (0 when none was seen)."""
        rate = self.per_step()
        extra = [dt - rate for dt, ev in self.intervals if ev] if rate is not None else []
        return max(0.0, sum(extra) / len(extra)) if extra else 0.0

    def eval_every(self) -> int | None:
        """Steps between evaluations, from the last two evaluated steps."""
        steps = sorted(set(self.eval_steps))
        return steps[-1] - steps[-2] if len(steps) >= 2 and steps[-1] > steps[-2] else None

    def eta(self, step: int, total: int) -> float | None:
        """Seconds until step ``total`` from step ``step``, or None before a rate is known."""
        rate = self.per_step()
        if rate is None:
            return None
        left = max(0, total - step)
        every = self.eval_every()
        evals = len({s for s in range(step + 1, total + 1) if s % every == 0} | {total}) if every and left else 0
        return left * rate + evals * self.per_eval()


class RichReporter:
    """Progress (step, held-out pass rate and truncation, the training rollouts' pass rate and mean
    reward, ETA) on stderr.  The held-out numbers are the last evaluation's; ``train pass rate`` is
    the share of the step's completions judged correct (0..1), ``mean reward`` the mean of their
    rewards on the reward's own scale (the built-in checker's +-1: -0.32 at a train pass rate of 0.34).

    On a terminal: a rich progress bar.  Otherwise: one plain line at most every
    ``interval`` seconds (and at the last step), never cut to a terminal width,
    plus a line per evaluation.  The rate per step and the ETA are :class:`StepClock`'s
    (the recent steps, the first step and evaluations accounted for apart).
    """

    def __init__(self, console=err, *, interval: float | None = None, clock=time.monotonic):
        self.console = console
        self.progress = None
        self.last_eval = None
        self.plain = not console.is_terminal
        self.interval = plain_interval() if interval is None else interval
        self.clock = clock

    def start(self, total_steps, first_step):
        self.total, self.first = total_steps, first_step
        self.t0 = self.last_line = self.clock()
        self.steps = StepClock()
        self.steps.start(first_step, self.t0)
        if self.plain:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 TextColumn("ETA {task.fields[eta]}"), console=self.console, transient=False)
        self.task = self.progress.add_task("train", total=total_steps, completed=first_step, info="", eta="-")
        self.progress.start()

    def _info(self, metrics=None):
        parts = []
        if self.last_eval is not None:
            parts.append(f"pass rate {self.last_eval['pass_rate']:.3f}")
            parts.append(f"trunc {self.last_eval['truncation_rate']:.2f}")
        if metrics:
            # the training rollouts' share correct (a 0/1 accuracy, as verl logs it), then the mean of
            # their rewards, which is on the reward's own scale (the built-in checker's: +-1)
            if metrics.get("pass_rate") is not None:
                parts.append(f"train pass rate {metrics['pass_rate']:.3f}")
            parts.append(f"mean reward {metrics['reward']:+.2f}")
        return "  ".join(parts)

    def _eta(self, step) -> str:
        left = self.steps.eta(step, self.total) if self.total else None
        return "-" if left is None else _duration(left)

    def _plain_line(self, step, metrics) -> str:
        now = self.clock()
        total = f"/{self.total}" if self.total else ""
        line = f"step {step}{total}"
        if self.total:
            line += f" ({100 * step / self.total:.0f}%)"
        info = self._info(metrics)
        if info:
            line += "  " + info
        rate = self.steps.per_step()
        if rate is not None:
            line += f"  {rate:.2f} s/step"
        elif self.steps.first_seconds is not None:
            line += f"  first step {self.steps.first_seconds:.2f} s"
        line += f"  elapsed {_duration(now - self.t0)}"
        if self.total:
            line += f"  ETA {self._eta(step)}"
        return line

    def step(self, step, metrics):
        now = self.clock()
        self.steps.stepped(step, now)
        if self.progress:
            self.progress.update(self.task, completed=step, info=self._info(metrics), eta=self._eta(step))
        elif self.plain:
            if now - self.last_line >= self.interval or (self.total and step >= self.total):
                self.last_line = now
                self.console.print(self._plain_line(step, metrics), highlight=False, markup=False)

    def eval(self, step, point):
        self.last_eval = point
        self.steps.evaluated(step)
        msg = (f"eval step {step:>5}: pass rate {point['pass_rate']:.3f}  truncation {point['truncation_rate']:.3f}"
               f"  mean length {point['mean_length']:.1f}  FLOPs {point['flops']:.3g}  ({point['eval_seconds']:.1f} s)")
        (self.progress.console if self.progress else self.console).print(msg, highlight=False)

    def log(self, message):
        (self.progress.console if self.progress else self.console).print(message, highlight=False)

    def stop(self):
        if self.progress:
            self.progress.stop()
            self.progress = None
