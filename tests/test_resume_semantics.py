"""What --resume may do: a completed run is extended only by a raised budget, one process
trains a run folder at a time, a run that cannot get its folder leaves no row behind, and
`runs` and `status` tell the same status."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, SCALECTL, run_cli
from scalectl.job.lock import run_folder_lock


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy: these tests are about resuming, not learning."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


def _args(policy: str, runs: Path, steps: int = 4) -> list[str]:
    sets = ["async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=4",
            "eval.every_steps=2", "eval.prompts=16", "eval.samples_per_prompt=2", "checkpoint.every_steps=2",
            f"model.path={policy}", f"budget.steps={steps}", "length.max_new_tokens=8"]
    return ["run", "recipes/grpo.toml", "--runs-dir", str(runs)] + [a for s in sets for a in ("--set", s)]


def _show(db: Path, name: str) -> dict:
    return json.loads(run_cli("show", name, "--json", db=db, check=True).stdout)


def _steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "steps.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_completed_run_is_extended_only_by_a_raised_budget(tmp_path, policy):
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    first = run_cli(*_args(policy, runs), "--name", "done", db=db, check=True, timeout=300)
    # the run log says what the prompt set gave and which training pass is used
    assert ("prompt set synthetic:arithmetic: 0 longer than 32 tokens dropped; 20000 training, 16 held-out prompts"
            in first.stderr)
    assert "training pass: packed rows where they take fewer rows" in first.stderr
    before = _show(db, "done")
    assert before["run"]["status"] == "completed"
    assert [p["step"] for p in before["points"]] == [0, 2, 4]

    refused = run_cli("run", "--resume", "done", db=db)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "run done is completed (budget.steps = 4 reached)" in refused.stderr
    assert "--set budget.steps=" in refused.stderr                         # says how to extend it
    same = run_cli("run", "--resume", "done", "--set", "budget.steps=4", db=db)
    assert same.returncode == 2 and "budget.steps = 4 must be above the 4 steps" in same.stderr
    other = run_cli("run", "--resume", "done", "--set", "loss.type=gspo", db=db)
    assert other.returncode == 2 and "--set loss.type: a resumed run keeps its recipe" in other.stderr
    assert _show(db, "done") == before                                      # nothing changed meanwhile

    run_cli("run", "--resume", "done", "--set", "budget.steps=6", db=db, check=True, timeout=300)
    after = _show(db, "done")
    assert after["run"]["status"] == "completed"
    assert after["run"]["recipe"]["budget"]["steps"] == 6
    assert [p["step"] for p in after["points"]] == [0, 2, 4, 6]
    assert after["points"][:3] == before["points"]                         # every earlier point kept as it was
    assert after["points"][3]["gpu_hours"] > before["points"][2]["gpu_hours"]
    assert _steps_logged(runs / "done") == [1, 2, 3, 4, 5, 6]               # each step logged once
    job = json.loads((runs / "done" / "job.json").read_text())
    assert job["recipe"]["budget"]["steps"] == 6


@pytest.mark.slow
def test_a_run_folder_trains_in_one_process_at_a_time(tmp_path, policy):
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    run_cli(*_args(policy, runs, steps=2), "--name", "busy", db=db, check=True, timeout=300)
    before = _show(db, "busy")
    # another process holds the folder (as a training job does): the resume is refused before it reads anything
    with run_folder_lock(runs / "busy", "busy"):
        held = run_cli("run", "--resume", "busy", "--set", "budget.steps=4", db=db)
    assert held.returncode == 2 and "Traceback" not in held.stderr
    assert f"run busy is being trained by pid {os.getpid()}" in held.stderr
    assert _show(db, "busy") == before

    # two resumes started together: exactly one trains, the other is refused
    env = dict(os.environ, SCALECTL_DB=str(db), COLUMNS="200")
    cmd = [SCALECTL, "run", "--resume", "busy", "--set", "budget.steps=6"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 2], results
    refusal = next(err for rc, err in results if rc == 2)
    # refused by the lock while the other trains, or (had the other finished first) as completed
    assert "is being trained by pid" in refusal or "budget.steps = 6 must be above the 6 steps" in refusal
    assert "Traceback" not in refusal
    after = _show(db, "busy")
    assert [p["step"] for p in after["points"]] == [0, 2, 4, 6]
    assert _steps_logged(runs / "busy") == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow   # 10-25 s: make test-slow (the default suite keeps under 10 minutes)
def test_a_run_whose_folder_cannot_be_written_leaves_no_row(tmp_path, policy):
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    runs.write_text("a file where the runs folder should be\n")
    bad = run_cli(*_args(policy, runs), "--name", "nowhere", db=db)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "cannot write the run folder" in bad.stderr
    assert json.loads(run_cli("runs", "--json", db=db, check=True).stdout) == []
    runs.unlink()                                                          # the name is free for a real run
    ok = run_cli(*_args(policy, runs, steps=2), "--name", "nowhere", db=db, timeout=300)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_a_new_store_never_takes_over_another_stores_run_folder(tmp_path):
    """A second store beside the same runs folder: `run` names its run past the folder the
    first store's run holds (it resumed that run's checkpoint and overwrote its job.json);
    an explicit --name of that folder is refused, and the first run's folder is untouched."""
    runs = tmp_path / "runs"
    sim = ["grpo", "--setup", "simulated", "--runs-dir", str(runs), "--set", "budget.steps=4",
           "--set", "eval.every_steps=2"]
    run_cli("run", *sim, db=tmp_path / "first.db", cwd=tmp_path, check=True, timeout=300)
    first = _show(tmp_path / "first.db", "grpo-s0")
    job_before = (runs / "grpo-s0" / "job.json").read_text()
    assert [p["step"] for p in first["points"]] == [0, 2, 4]

    second = tmp_path / "second.db"
    run_cli("run", *sim, "--set", "budget.steps=2", db=second, cwd=tmp_path, check=True, timeout=300)
    rows = json.loads(run_cli("runs", "--json", db=second, check=True).stdout)
    assert [(r["name"], r["status"], r["n_points"]) for r in rows] == [("grpo-s0-2", "completed", 2)]
    assert json.loads((runs / "grpo-s0-2" / "job.json").read_text())["db"] == str(second.resolve())

    named = run_cli("run", *sim, "--name", "grpo-s0", db=second, cwd=tmp_path)
    assert named.returncode == 2 and "Traceback" not in named.stderr
    assert f"the run folder {(runs / 'grpo-s0').resolve()} holds another run (run id 1 of the store " \
           f"{(tmp_path / 'first.db').resolve()})" in " ".join(named.stderr.split())
    assert [r["name"] for r in json.loads(run_cli("runs", "--json", db=second, check=True).stdout)] == ["grpo-s0-2"]
    assert (runs / "grpo-s0" / "job.json").read_text() == job_before
    assert _show(tmp_path / "first.db", "grpo-s0") == first

    # the same recipe and seed again in the first store: reused, and a note that says so; --new-run
    # trains a new one, named past the second store's folder
    again = run_cli("run", *sim, db=tmp_path / "first.db", cwd=tmp_path, check=True, timeout=300)
    assert ("note: run grpo-s0 has this recipe and seed and completed at step 4: reused, nothing trained"
            in " ".join(again.stderr.split()))
    assert "reused run grpo-s0: 4 steps, 3 points" in again.stdout
    assert _show(tmp_path / "first.db", "grpo-s0") == first
    forced = run_cli("run", *sim, "--new-run", db=tmp_path / "first.db", cwd=tmp_path, check=True, timeout=300)
    assert "--new-run: training a new run" in " ".join(forced.stderr.split())
    assert "run grpo-s0-3 (id 2)" in forced.stderr            # grpo-s0-2 is the second store's folder


def test_run_resumes_a_stopped_run_of_the_same_recipe_and_seed(tmp_path):
    """A failed run of the same recipe content and seed (as a killed `make run` leaves): `run`
    resumes it, says so, and trains no second run."""
    from scalectl.recipe.load import load
    from scalectl.launch.runs import create_run
    from scalectl.store.database import Store

    runs, db = tmp_path / "runs", tmp_path / "s.db"
    sets = ["budget.steps=4", "eval.every_steps=2"]
    recipe = load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "simulated.toml", sets)
    with Store.open(db) as store:
        run_id, _ = create_run(store, recipe, "grpo-s0", runs)
        store.add_point(run_id, {"step": 2, "pass_rate": 0.4})
        store.update_run(run_id, status="failed")
    done = run_cli("run", "grpo", "--setup", "simulated", "--runs-dir", str(runs), "--json",
                   *[a for s in sets for a in ("--set", s)], db=db, cwd=tmp_path, check=True, timeout=300)
    assert ("note: run grpo-s0 has this recipe and seed and stopped (failed) at step 2: resuming it"
            in " ".join(done.stderr.split()))
    assert json.loads(done.stdout)["run"] == "grpo-s0" and json.loads(done.stdout)["run_id"] == run_id
    with Store.open(db, create=False) as store:
        rows = store.list_runs()
        assert [(r["name"], r["status"]) for r in rows] == [("grpo-s0", "completed")]
        assert [p["step"] for p in store.points(run_id)] == [0, 2, 4]   # the simulated points go on after step 2


def test_a_run_started_and_extended_from_python(tmp_path):
    """`scalectl run` as a notebook calls it (scalectl.launch.runs): start trains a simulated run
    in this process into a real store and says what it did; resume extends it, keeping its
    points; a dry run touches neither the store nor a run folder; bad input is a UserError."""
    import functools

    from scalectl.errors import UserError
    from scalectl.launch import runs
    from scalectl.store.database import Store

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = functools.partial(Store.open, db)
    sets = ["budget.steps=4", "eval.every_steps=2", "model.path=simulated:seconds_per_step=0"]
    planned = runs.dry_run("grpo", setup="simulated", overrides=sets, runs_dir=folder, name="x")
    assert planned.to_dict()["run_name"] == "x" and planned.to_dict()["run_dir"] == str((folder / "x").resolve())
    assert planned.launcher == "local" and not db.exists() and not folder.exists()

    said: list[str] = []
    started = runs.start(stores, "grpo", setup="simulated", overrides=sets, runs_dir=folder, log=said.append)
    assert (started.outcome, started.name, started.launcher) == (runs.COMPLETED, "grpo-s0", "local")
    assert started.summary["steps"] == 4 and started.recipe.budget.steps == 4
    assert said[0] == "override: budget.steps = 4 from --set budget.steps overrides 100 from setups/simulated.toml"
    assert next(line for line in said if line.startswith("recipe ")).startswith(
        f"recipe grpo (hash {started.recipe.content_hash}, seed 0) on setup simulated")
    assert said[-1] == f"run grpo-s0 (id {started.run_id}), folder {started.run_dir}"
    with Store.open(db, create=False) as store:
        before = store.points(started.run_id)
        assert store.get_run(started.run_id)["status"] == "completed"
    assert [p["step"] for p in before] == [0, 2, 4]
    assert started.summary["last_pass_rate"] == before[-1]["pass_rate"]

    with pytest.raises(UserError, match=r"run grpo-s0 is completed \(budget.steps = 4 reached\)"):
        runs.resume(stores, "grpo-s0")
    extended = runs.resume(stores, "grpo-s0", overrides=["budget.steps=6"], log=said.append)
    assert (extended.outcome, extended.run_id, extended.recipe.budget.steps) == (runs.COMPLETED, started.run_id, 6)
    assert said[-2:] == ["run grpo-s0: budget steps=6 (was steps=4)", f"resuming run grpo-s0 from {started.run_dir}"]
    with Store.open(db, create=False) as store:
        after = store.points(started.run_id)
    assert [p["step"] for p in after] == [0, 2, 4, 6] and after[:3] == before
    with pytest.raises(UserError, match="--launcher 'nowhere' is not one of: local, slurm"):
        runs.start(stores, "grpo", launcher="nowhere")
