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


class RichReporter:
    """Progress (step, pass rate, truncation, reward, ETA) on stderr.

    On a terminal: a rich progress bar.  Otherwise: one plain line at most every
    ``interval`` seconds (and at the last step), never cut to a terminal width,
    plus a line per evaluation.
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
        if self.plain:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=self.console, transient=False)
        self.task = self.progress.add_task("train", total=total_steps, completed=first_step, info="")
        self.progress.start()

    def _info(self, metrics=None):
        parts = []
        if self.last_eval is not None:
            parts.append(f"pass rate {self.last_eval['pass_rate']:.3f}")
            parts.append(f"trunc {self.last_eval['truncation_rate']:.2f}")
        if metrics:
            parts.append(f"reward {metrics['reward']:+.2f}")
        return "  ".join(parts)

    def _plain_line(self, step, metrics) -> str:
        now = self.clock()
        done = step - self.first
        total = f"/{self.total}" if self.total else ""
        line = f"step {step}{total}"
        if self.total:
            line += f" ({100 * step / self.total:.0f}%)"
        info = self._info(metrics)
        if info:
            line += "  " + info
        if done > 0:
            per_step = (now - self.t0) / done
            line += f"  {per_step:.2f} s/step  elapsed {_duration(now - self.t0)}"
            if self.total:
                line += f"  ETA {_duration(per_step * max(0, self.total - step))}"
        return line

    def step(self, step, metrics):
        if self.progress:
            self.progress.update(self.task, completed=step, info=self._info(metrics))
        elif self.plain:
            now = self.clock()
            if now - self.last_line >= self.interval or (self.total and step >= self.total):
                self.last_line = now
                self.console.print(self._plain_line(step, metrics), highlight=False, markup=False)

    def eval(self, step, point):
        self.last_eval = point
        msg = (f"eval step {step:>5}: pass rate {point['pass_rate']:.3f}  truncation {point['truncation_rate']:.3f}"
               f"  mean length {point['mean_length']:.1f}  FLOPs {point['flops']:.3g}  ({point['eval_seconds']:.1f} s)")
        (self.progress.console if self.progress else self.console).print(msg, highlight=False)

    def log(self, message):
        (self.progress.console if self.progress else self.console).print(message, highlight=False)

    def stop(self):
        if self.progress:
            self.progress.stop()
            self.progress = None
