"""``scalectl run`` gives the evaluation points recorded in ``tests/data/loop_points.json``
for a fixed seed, in ``sync`` and in ``ppo_off_policy``.

The recorded points guard the training loop's order of work (which prompts, which
seeds, which weights sample which batch, when points are taken and what they
carry) across changes to the loop's structure.  ``tests/data/loop_points.json``
says how it was made; to record it again (only when the numbers are meant to
change, e.g. a new sampler), run ``.venv/bin/python tests/test_loop_points.py``
and say why in the commit.

Tolerances:

* counts and everything derived from counts are compared exactly: step, tokens,
  samples, samples_per_prompt, correct_counts, retired_prompts, pass_rate,
  truncation_rate, mean_length (ratios of small integers, exact in float64),
  and flops (2N or 6N times a token count: integers below 2^53, exact);
* train_reward is a float32 mean of rewards in {-1, +1}: exact as well;
* entropy and logprob_mismatch are float32 means of values that depend on the
  weights, and the weights depend on the CPU's float kernels: the recorded
  policy comes out of up to 400 AdamW steps of SFT (``build_policy``), and a CPU
  whose matmul and exp kernels round differently (the fixture was recorded on an
  AMD EPYC; an Intel Xeon with AVX-512 drifts from it) ends with slightly other
  weights.  The sampled tokens, hence every count above, stayed the same there,
  while these means moved by up to 8.2e-3 relative (logprob_mismatch of
  ppo_off_policy at step 6; entropy by 4e-4).  On one machine they repeat to
  float32 summation order (~160 x 2^-24 ~ 1e-5); across machines they are
  compared to 2e-2 relative (and 1e-6 absolute, for values near 0): the counts
  guard the order of work, these guard against a wrong quantity;
* gpu_hours and wall_seconds are wall-clock measurements: only their order is checked.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import ROOT, run_cli  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "loop_points.json"
MODES = {"sync": ["async.mode=sync"], "ppo_off_policy": ["async.mode=ppo_off_policy", "async.k=2"]}
EXACT = ("step", "tokens", "samples", "samples_per_prompt", "correct_counts", "retired_prompts", "pass_rate",
         "truncation_rate", "mean_length", "flops", "train_reward")
FLOAT32_MEANS = ("entropy", "logprob_mismatch")
REL, ABS = 2e-2, 1e-6


def build_policy(folder: Path) -> Path:
    """The cheap policy of the recorded runs: the tiny model after a short SFT stage on 40
    one-operation problems (it stops at the first check with held-out pass rate >= 0.05), so
    that it has learnt some of its training prompts: rollouts are partly correct, advantages
    are non-zero and the weights move between points."""
    from types import SimpleNamespace as NS

    import torch

    from scalectl.rl.train.warmstart import SFTConfig, ensure_warm_start

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return ensure_warm_start(
            model_cfg=NS(path="builtin:tiny", warm_start_target=0.05),
            data_cfg=NS(source="synthetic:arithmetic", difficulty=1, seed=0, train_size=40),
            max_new_tokens=10, cache_dir=folder,
            sft=SFTConfig(check_every=10, check_prompts=16, check_samples=2, max_steps=400), log=lambda m: None)
    finally:
        torch.set_num_threads(threads)


def run_args(policy: Path, runs: Path, mode: str, name: str) -> list[str]:
    sets = MODES[mode] + [
        "batch.prompts_per_step=4", "batch.generations_per_prompt=4", "eval.every_steps=2", "eval.prompts=16",
        "eval.samples_per_prompt=2", "checkpoint.every_steps=100", f"model.path={policy}", "budget.steps=6",
        "length.max_new_tokens=10", "data.difficulty=1", "data.train_size=40", "seed=3",
        "data.mix={}", "optim.lr=1e-4"]     # as recorded (the default setup mixes a level in since)
    return ["run", "recipes/grpo.toml", "--runs-dir", str(runs), "--name", name] + [a for s in sets for a in ("--set", s)]


def points_of(policy: Path, tmp: Path, mode: str, extra: tuple[str, ...] = ()) -> list[dict]:
    db = tmp / f"{mode}.db"
    extra_args = [a for s in extra for a in ("--set", s)]
    run_cli(*run_args(policy, tmp / "runs", mode, mode), *extra_args, db=db, check=True, timeout=600)
    points = json.loads(run_cli("show", mode, "--json", db=db, check=True).stdout)["points"]
    keep = EXACT + FLOAT32_MEANS + ("gpu_hours",)
    return [{k: p[k] for k in keep} for p in points]


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return build_policy(tmp_path_factory.mktemp("policy"))


@pytest.mark.parametrize("mode, background", [pytest.param("sync", "off", marks=pytest.mark.slow),
                                              ("ppo_off_policy", "off"), ("sync", "on")])
def test_run_gives_the_recorded_points(policy, tmp_path, mode, background):
    """``eval.background = "on"`` evaluates each step on a copy of its weights in a thread
    while the loop trains on (scalectl.rl.evaluation.during_training): the points must be the recorded ones,
    which were evaluated in the loop's thread."""
    recorded = json.loads(FIXTURE.read_text())["modes"][mode]
    got = points_of(policy, tmp_path, mode, (f"eval.background={background}",))
    assert [p["step"] for p in got] == [p["step"] for p in recorded] == [0, 2, 4, 6]
    assert any(p["train_reward"] not in (None, -1.0) for p in recorded), "the recorded run never saw a reward"
    for want, have in zip(recorded, got):
        for key in EXACT:
            assert have[key] == want[key], f"{mode} step {want['step']}: {key} {have[key]!r} != {want[key]!r}"
        for key in FLOAT32_MEANS:
            if want[key] is None:
                assert have[key] is None
            else:
                assert math.isclose(have[key], want[key], rel_tol=REL, abs_tol=ABS), \
                    f"{mode} step {want['step']}: {key} {have[key]!r} != {want[key]!r}"
    hours = [p["gpu_hours"] for p in got]
    assert hours == sorted(hours) and hours[0] == 0


def record() -> None:
    """Write :data:`FIXTURE` from runs of the current code."""
    import platform
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        policy = build_policy(tmp / "policy")
        modes = {mode: points_of(policy, tmp, mode) for mode in MODES}
    for pts in modes.values():
        for p in pts:
            p.pop("gpu_hours")
    FIXTURE.write_text(json.dumps({
        "how": ("Made by `python tests/test_loop_points.py` (the function `record`): the tiny model after the "
                "fixed SFT stage of `build_policy`, then `scalectl run` with the arguments of `run_args` for "
                "each mode; the points as `scalectl show --json` gives them, wall-clock fields left out."),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "modes": modes}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    record()


@pytest.mark.slow
def test_a_run_retiring_half_its_pool_is_warned(policy, tmp_path):
    """Sixteen training prompts the warm-started policy partly solves, retired at a pass rate of
    1/4: the run retires at least half of them within its 3 steps, and its log says so once, at
    the step the eighth is retired (filters.pool_warning)."""
    sets = ["async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=4", "eval.every_steps=100",
            "eval.prompts=16", "eval.samples_per_prompt=2", "checkpoint.every_steps=100", f"model.path={policy}",
            "budget.steps=3", "length.max_new_tokens=10", "data.difficulty=1", "data.train_size=16", "seed=3",
            "filter.retire_solved=true", "filter.retire_threshold=0.25", "filter.zero_variance=false"]
    db = tmp_path / "s.db"
    proc = run_cli("run", "recipes/grpo.toml", "--runs-dir", str(tmp_path / "runs"), "--name", "pool",
                   *[a for s in sets for a in ("--set", s)], db=db, check=True, timeout=600)
    steps = [json.loads(x) for x in (tmp_path / "runs" / "pool" / "steps.jsonl").read_text().splitlines()]
    first = next(s["step"] for s in steps if s["retired_prompts"] >= 8)
    log = " ".join((proc.stdout + proc.stderr).split())
    assert log.count("training prompts are retired") == 1
    assert f"warning: step {first}: " in log


@pytest.mark.slow
def test_a_fixed_lag_pipeline_run_repeats_its_points_exactly(policy, tmp_path):
    """``async.schedule = fixed_lag`` samples batch v with version max(0, v - k) in one process:
    two runs of one seed give the same points in every field but the wall-clock ones, floats
    included (the same machine, the same kernels; docs/study.md repeats a 500-step run so)."""
    fixed = ("async.mode=pipeline", "async.k=2", "async.schedule=fixed_lag")
    runs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        runs.append([{k: v for k, v in p.items() if k != "gpu_hours"}
                     for p in points_of(policy, tmp_path / name, "sync", fixed)])
    assert [p["step"] for p in runs[0]] == [0, 2, 4, 6]
    assert any(p["train_reward"] not in (None, -1.0) for p in runs[0]), "the run never saw a reward"
    assert runs[0] == runs[1]
    steps = [json.loads(line) for line in (tmp_path / "first" / "runs" / "sync" / "steps.jsonl").read_text().splitlines()]
    assert [s["staleness_max"] for s in steps] == [0, 1, 2, 2, 2, 2]      # k = 2 behind from step 2 on
