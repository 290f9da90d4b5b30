"""Progress where people look: `scalectl status --watch`, and plain lines instead of a bar off a terminal."""

from __future__ import annotations

import io
import json
import re

import pytest

from rich.console import Console

from conftest import run_cli
from scalectl.present.progress import RichReporter


def _simulated(tmp_path, name: str, steps: int) -> None:
    """A detached run of the simulated backend (points from a sigmoid, 0.2 s per step)."""
    run_cli("run", "grpo", "--detach", "--name", name, "--runs-dir", str(tmp_path / "runs"),
            "--set", "model.path=simulated:seconds_per_step=0.2", "--set", f"budget.steps={steps}",
            "--set", "eval.every_steps=2", db=tmp_path / "s.db", cwd=tmp_path, check=True)


def test_status_watch_prints_each_change_until_the_runs_end(tmp_path):
    _simulated(tmp_path, "w1", 8)
    proc = run_cli("status", "--watch", "--interval", "0.2", db=tmp_path / "s.db", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("w1: ") for line in lines)
    assert len(lines) == len(set(lines))                       # a line only when something changed
    assert lines[-1].startswith("w1: completed, evaluated at step 8, pass rate ")   # the last point's step
    steps = [int(m.group(1)) for line in lines if (m := re.search(r"step (\d+)", line))]
    assert steps == sorted(steps) and steps[-1] == 8
    final = json.loads(run_cli("status", "w1", "--json", db=tmp_path / "s.db", check=True).stdout)[0]
    assert lines[-1] == (f"w1: completed, evaluated at step {final['last_step']}, pass rate {final['last_pass_rate']:.3f}, "
                         "truncation -")
    assert "\x1b[" not in proc.stdout                          # no terminal control codes in a pipe


def test_status_watch_with_nothing_running_returns_at_once(tmp_path):
    from scalectl.store.database import Store

    Store.open(tmp_path / "s.db").close()                       # an empty store
    proc = run_cli("status", "--watch", db=tmp_path / "s.db", cwd=tmp_path, check=True)
    assert proc.stdout.strip() == "no active runs to watch"
    proc = run_cli("status", "--watch", "--json", db=tmp_path / "s.db", cwd=tmp_path)
    assert proc.returncode == 2 and "does not combine with --json" in proc.stderr


class _Clock:
    """Seconds set by the test: the reporter's steady rate is checked without waiting."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_is_plain_lines_at_a_steady_rate():
    buf = io.StringIO()
    console = Console(file=buf, width=40, soft_wrap=True)      # not a terminal, and narrow
    assert not console.is_terminal
    clock = _Clock()
    rep = RichReporter(console, interval=5.0, clock=clock)
    rep.start(10, 0)
    rep.eval(0, {"pass_rate": 0.25, "truncation_rate": 0.1, "mean_length": 12.0, "flops": 1e9, "eval_seconds": 1.0})
    for step in range(1, 11):                                   # 2 s per step
        clock.now += 2.0
        rep.step(step, {"reward": -0.32, "pass_rate": 0.34})
    rep.stop()
    lines = buf.getvalue().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    # a line once 5 s have passed since the last one (steps 3, 6, 9: 6 s each), and at the last step
    assert [s.split()[1] for s in steps] == ["3/10", "6/10", "9/10", "10/10"]
    # the training rollouts' 0/1 pass rate beside their mean reward (+-1 each: 2 x 0.34 - 1 = -0.32)
    assert steps[0] == ("step 3/10 (30%)  pass rate 0.250  trunc 0.10  train pass rate 0.340  mean reward -0.32  "
                        "2.00 s/step  elapsed 0:00:06  ETA 0:00:14")
    assert steps[-1].endswith("elapsed 0:00:20  ETA 0:00:00")    # whole, not cut at 40 columns
    assert "━" not in buf.getvalue()


def test_one_watch_helper_prints_a_line_per_change_and_follows_until_no_run_is_alive():
    """present.watch, behind `status --watch` and `ablate`'s live table: off a terminal a line per
    run whose state changed (never again for an unchanged look), looks every `interval` until no
    run is alive; on a terminal one live table, redrawn, and no lines."""
    from rich.table import Table

    from scalectl.present.watch import LiveRows, follow

    looks = [[{"id": 1, "status": "pending", "step": None}, {"id": 2, "status": "completed", "step": 8}],
             [{"id": 1, "status": "running", "step": 0}, {"id": 2, "status": "completed", "step": 8}],
             [{"id": 1, "status": "running", "step": 0}, {"id": 2, "status": "completed", "step": 8}],
             [{"id": 1, "status": "completed", "step": 10}, {"id": 2, "status": "completed", "step": 8}]]

    def table(rows):
        t = Table(title="runs")
        t.add_column("id")
        t.add_column("status")
        for r in rows:
            t.add_row(str(r["id"]), r["status"])
        return t

    def watch(console):
        it, slept = iter(looks), []
        with LiveRows(console, table, lambda r: f"run {r['id']}: {r['status']} at {r['step']}",
                      lambda r: (r["id"], (r["status"], r["step"]))) as view:
            last = follow(lambda: next(it), view.show, 0.5, sleep=slept.append)
        return last, slept

    buf = io.StringIO()
    last, slept = watch(Console(file=buf, width=40))
    assert last == looks[-1] and slept == [0.5, 0.5, 0.5]      # three waits between four looks
    assert buf.getvalue().splitlines() == ["run 1: pending at None", "run 2: completed at 8",
                                           "run 1: running at 0", "run 1: completed at 10"]
    term = io.StringIO()
    last, _ = watch(Console(file=term, width=40, force_terminal=True))
    assert last == looks[-1]
    text = term.getvalue()
    assert "runs" in text and "completed" in text and "run 1:" not in text


def test_the_eta_leaves_out_the_first_step_and_accounts_for_evaluations():
    """A ppo_off_policy-like run of 60 steps: the first step takes 145 s (the model load and a whole
    round of generation), each later step 0.75 s, and an evaluation every 10 steps adds 5 s to the
    step it falls in.  The old estimate, elapsed / steps done, said ETA 2:23:12 after step 1 for a
    run that then needed about a minute; the estimate now waits for a second step, then gives the
    steps left at 0.75 s plus the evaluations left at 5 s each."""
    buf = io.StringIO()
    clock = _Clock()
    rep = RichReporter(Console(file=buf, width=200), interval=0.0, clock=clock)
    rep.start(60, 0)
    point = {"pass_rate": 0.3, "truncation_rate": 0.0, "mean_length": 10.0, "flops": 1.0, "eval_seconds": 5.0}
    rep.eval(0, point)
    etas = {}
    for step in range(1, 61):
        clock.now += 145.0 if step == 1 else 0.75 + (5.0 if (step - 1) % 10 == 0 and step > 1 else 0.0)
        rep.step(step, {"reward": 0.0})
        if step % 10 == 0:
            rep.eval(step, point)
        etas[step] = rep.steps.eta(step, 60)
    lines = [line for line in buf.getvalue().splitlines() if line.startswith("step ")]
    assert lines[0] == ("step 1/60 (2%)  pass rate 0.300  trunc 0.00  mean reward +0.00  first step 145.00 s  "
                        "elapsed 0:02:25  ETA -")
    assert etas[1] is None
    assert rep.steps.per_step() == pytest.approx(0.75)
    assert rep.steps.eval_every() == 10 and rep.steps.per_eval() == pytest.approx(5.0)
    # after step 25: 35 steps x 0.75 s + evaluations at 30, 40, 50, 60 x 5 s
    assert etas[25] == pytest.approx(35 * 0.75 + 4 * 5.0)
    # the fake clock then spends 35 x 0.75 s + 3 x 5 s on steps 26-60, the last evaluation follows
    assert clock.now - 100.0 - (145.0 + 24 * 0.75 + 2 * 5.0) == pytest.approx(etas[25] - 5.0)
    assert lines[24].endswith("0.75 s/step  elapsed 0:02:53  ETA 0:00:46")
    assert etas[60] == 0.0
