"""Live progress of a training run on the terminal (stderr), with rich."""

from __future__ import annotations

from scalectl.commands.common import err


class RichReporter:
    """Progress bar (step, pass rate, truncation, reward, ETA) on stderr."""

    def __init__(self, console=err):
        self.console = console
        self.progress = None
        self.last_eval = None

    def start(self, total_steps, first_step):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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

    def step(self, step, metrics):
        if self.progress:
            self.progress.update(self.task, completed=step, info=self._info(metrics))

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
