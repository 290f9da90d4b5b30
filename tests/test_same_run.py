"""A recipe content and seed is trained once, whatever path trains it and whatever the run is called.

Every path that trains a run (``scalectl run``, ``ablate``, ``ablate --until-decided``, the
study script) finds the stored run of the same recipe content hash and seed under any name:
a completed one is reused, a stopped one resumed, and where the path extends runs, one trained
to a smaller budget is extended.  Simulated runs (``setups/simulated.toml``) in real SQLite
stores, trained in this process or by the local launcher's jobs."""

from __future__ import annotations

import functools
import json

import pytest

from conftest import ROOT
from scalectl.launch import runs
from scalectl.store.database import Store

#: The simulated default curve (A 0.6, B 2, C_mid 0.1 device-hours, 0.001 per step: 100 steps
#: = 1 x C_mid), drawn without sleeping; an evaluation every 10 steps.
FAST = ["model.path=simulated:seconds_per_step=0", "eval.every_steps=10"]


def _stores(db):
    return functools.partial(Store.open, db)


def _runs(db) -> dict[str, dict]:
    with Store.open(db, create=False) as store:
        return {r["name"]: r for r in store.list_runs()}


def _steps(db, name: str) -> list[int]:
    with Store.open(db, create=False) as store:
        return [p["step"] for p in store.points(store.get_run(name)["id"])]


def test_run_reuses_resumes_and_extends_the_stored_run_of_the_same_recipe_and_seed(tmp_path):
    """`scalectl run` (scalectl.launch.runs.start): a completed run is reused under any --name,
    nothing trained; a larger budget extends it (its earlier points kept); a stopped run of the
    same recipe and seed is resumed; --new-run trains a second run; another seed trains anew."""
    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = _stores(db)

    def start(steps: int, **kw):
        said: list[str] = []
        started = runs.start(stores, "grpo", setup="simulated", overrides=[f"budget.steps={steps}", *FAST],
                             runs_dir=folder, log=said.append, **kw)
        return started, said

    first, _ = start(40)
    assert (first.outcome, first.name) == (runs.COMPLETED, "grpo-s0")
    before = _steps(db, "grpo-s0")
    assert before == [0, 10, 20, 30, 40]

    again, said = start(40, name="another-name")
    assert (again.outcome, again.run_id, again.name) == (runs.REUSED, first.run_id, "grpo-s0")
    assert ("note: run grpo-s0 has this recipe and seed and completed at step 40: reused, nothing trained "
            "(`scalectl show grpo-s0`; --new-run trains another)") in said
    rows = _runs(db)
    assert list(rows) == ["grpo-s0"] and len(rows["grpo-s0"]["job_ids"]) == 1     # nothing launched

    longer, said = start(70)
    assert (longer.outcome, longer.run_id) == (runs.COMPLETED, first.run_id)
    assert ("note: run grpo-s0 has this recipe and seed and was trained to a smaller budget (completed at "
            "step 40): extending it to 70 steps instead of training from step 0") in said
    rows = _runs(db)
    assert list(rows) == ["grpo-s0"] and rows["grpo-s0"]["recipe"]["budget"]["steps"] == 70
    assert rows["grpo-s0"]["recipe_hash"] == longer.recipe.content_hash
    assert _steps(db, "grpo-s0") == before + [50, 60, 70]

    # a stopped run of the same recipe and seed 1, under a name of its own: resumed, not trained anew
    from scalectl.recipe.load import load

    recipe = load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "simulated.toml",
                  ["budget.steps=70", *FAST, "seed=1"])
    with Store.open(db) as store:
        stopped_id, _ = runs.create_run(store, recipe, "mine", folder)
        store.add_points(stopped_id, [{"step": s, "gpu_hours": 0.001 * s, "pass_rate": 0.3} for s in (0, 10, 20)])
        store.update_run(stopped_id, status="cancelled")
    said = []
    resumed = runs.start(stores, "grpo", setup="simulated", overrides=["budget.steps=70", *FAST, "seed=1"],
                         runs_dir=folder, log=said.append)
    assert (resumed.outcome, resumed.run_id, resumed.name) == (runs.COMPLETED, stopped_id, "mine")
    assert "note: run mine has this recipe and seed and stopped (cancelled) at step 20: resuming it" in said
    assert sorted(_runs(db)) == ["grpo-s0", "mine"] and _runs(db)["mine"]["status"] == "completed"
    assert _steps(db, "mine") == [0, 10, 20, 30, 40, 50, 60, 70]

    forced, said = start(70, new_run=True)
    assert forced.outcome == runs.COMPLETED and forced.run_id not in (first.run_id, stopped_id)
    assert ("note: run grpo-s0 has this recipe and seed (completed at step 70); --new-run: training a new run"
            in said)
    assert sorted(_runs(db)) == ["grpo-s0", "grpo-s0-2", "mine"]


def test_training_key_leaves_out_the_budget_only():
    from scalectl.recipe.load import load

    def key(*sets):
        return runs.training_key(load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "simulated.toml", list(sets)))

    assert key("budget.steps=40") == key("budget.steps=400") == key("budget.gpu_hours=2")
    assert key("budget.steps=40") != key("budget.steps=40", "optim.lr=1e-3")
    assert key("budget.steps=40") == key("budget.steps=40", "seed=3")          # the seed is stored beside it
    assert runs.training_key({}) is None and runs.training_key({"budget": {"steps": 1}, "loss": 3}) is None


@pytest.fixture
def forward(tmp_path):
    """A forward ablation of scalerl (loss.type ppo_clip) on the simulated setup, and the overrides
    a `scalectl run` of its base uses to train the same content."""
    from scalectl.ablation.planner import forward_spec

    return forward_spec([("loss.type", ("ppo_clip",))], ROOT / "recipes" / "scalerl.toml", name="cvd")


def _store_base_and_variant(db, folder, steps: int = 100, variant_status: str = "completed"):
    """`scalerl-s0`, the forward ablation's base trained by `scalectl run` (same hash and seed), and
    `mine`, its ppo_clip variant under a name of its own: completed, or stopped at step 20."""
    from scalectl.recipe.load import load

    sets = [f"budget.steps={steps}", *FAST]
    base = runs.start(_stores(db), "scalerl", setup="simulated", overrides=sets, runs_dir=folder)
    assert (base.outcome, base.name) == (runs.COMPLETED, "scalerl-s0")
    variant = load(ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "simulated.toml",
                   [*sets, "loss.type=ppo_clip", "loss.clip_low=0.2", "loss.clip_high=0.28"])
    if variant_status == "completed":
        mine = runs.start(_stores(db), "scalerl", setup="simulated", name="mine", runs_dir=folder,
                          overrides=[*sets, "loss.type=ppo_clip", "loss.clip_low=0.2", "loss.clip_high=0.28"])
        assert (mine.outcome, mine.name, mine.recipe.content_hash) == (runs.COMPLETED, "mine", variant.content_hash)
    else:
        with Store.open(db) as store:
            vid, _ = runs.create_run(store, variant, "mine", folder)
            store.add_points(vid, [{"step": s, "gpu_hours": 0.001 * s, "pass_rate": 0.3} for s in (0, 10, 20)])
            store.update_run(vid, status=variant_status)
    return tuple(sets), base


def test_ablate_reuses_and_resumes_stored_runs_of_other_names(tmp_path, forward):
    """Plain `ablate`: the base is `scalerl-s0`, trained by `scalectl run` (same hash and seed): reused;
    the variant's run `mine`, cancelled at step 20, is resumed (the plan prices its 80 steps left).
    Once `mine` has completed, `ablate` trains nothing: no run of the ablation's own names is
    created, nothing is launched, and the manifest and the verdict name the runs that stood for them."""
    from scalectl.ablation import campaign

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    sets, base = _store_base_and_variant(db, folder, variant_status="cancelled")
    setup = ROOT / "setups" / "simulated.toml"
    prepared = campaign.prepare(forward, db=str(db), setup=setup, overrides=sets)
    actions = {n: (a, row and row["name"]) for n, (a, row) in prepared.actions.items()}
    assert actions == {"cvd--base--s0": ("reuse", "scalerl-s0"), "cvd--ppo_clip--s0": ("resume", "mine")}
    assert prepared.cost["steps"] == 80                                       # the rest of mine only

    resumed = runs.resume(_stores(db), "mine")                              # as the ablation's job would
    assert resumed.outcome == runs.COMPLETED and _steps(db, "mine") == list(range(0, 101, 10))
    prepared = campaign.prepare(forward, db=str(db), setup=setup, overrides=sets)
    assert prepared.counts() == {"reuse": 2} and prepared.cost["steps"] == 0
    before = _runs(db)
    outcome = campaign.run(prepared, runs_dir=folder, out_dir=tmp_path / "rep", bootstrap=50, poll=0.2)
    assert not outcome.interrupted
    after = _runs(db)
    assert sorted(after) == ["mine", "scalerl-s0"] and after["scalerl-s0"]["id"] == base.run_id
    assert {n: r["job_ids"] for n, r in after.items()} == {n: r["job_ids"] for n, r in before.items()}
    assert [v["runs"] for v in outcome.manifest["variants"]] == [["scalerl-s0"], ["mine"]]
    assert outcome.result.comparison.row("ppo_clip") is not None


def test_until_decided_takes_runs_of_other_names(tmp_path, forward):
    """`ablate --until-decided --max-budget 100 --max-seeds 1`: stage 0 finds the base
    (`scalerl-s0`, `scalectl run`'s) and the variant (`mine`) already trained, says so, trains
    nothing and creates no run of the ablation's names; the manifest names the runs used."""
    from scalectl.ablation import until_decided

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    sets, _ = _store_base_and_variant(db, folder)
    before = _runs(db)
    staged = until_decided.prepare(forward, db=str(db), setup=ROOT / "setups" / "simulated.toml", overrides=sets,
                                   max_budget=100, max_seeds=1)
    said: list[str] = []
    outcome = until_decided.run(staged, runs_dir=folder, out_dir=tmp_path / "rep", bootstrap=50, poll=0.2,
                                log=said.append)
    assert outcome.ended == "out of options"                   # 1 x C_mid, and --max-budget 100
    after = _runs(db)
    assert sorted(after) == ["mine", "scalerl-s0"]
    assert {n: (r["id"], r["job_ids"], r["recipe_hash"]) for n, r in after.items()} == \
        {n: (r["id"], r["job_ids"], r["recipe_hash"]) for n, r in before.items()}
    assert "stage 0: nothing to train, deciding again on base 100 steps x1, ppo_clip 100 steps x1" in said
    assert any(line.startswith("base seed 0: run scalerl-s0 of the store trains the same recipe and seed "
                               "(completed, 100 steps trained)") for line in said)
    assert any(line.startswith("ppo_clip seed 0: run mine of the store") for line in said)
    with Store.open(db, create=False) as store:
        assert [(r["stage"], r["variant"], r["budget"]) for r in store.stages("cvd")] == [
            (0, "base", 100), (0, "ppo_clip", 100)]
    manifest = json.loads((folder / ".ablations" / "cvd.json").read_text())
    assert [v["runs"] for v in manifest["variants"]] == [["scalerl-s0"], ["mine"]]


@pytest.mark.slow   # 15-30 s (two local jobs start, each importing the trainer): make test-slow
def test_until_decided_extends_a_run_of_another_name(tmp_path, forward):
    """`--until-decided --max-budget 300`: at 100 steps (1 x C_mid) no ceiling is identified, so
    stage 0 extends both arms; stage 1 extends `scalerl-s0` and `mine` themselves to 300 steps,
    their first points kept: no run of the ablation's names is ever created."""
    from scalectl.ablation import until_decided

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    sets, base = _store_base_and_variant(db, folder)
    first = _steps(db, "scalerl-s0")
    staged = until_decided.prepare(forward, db=str(db), setup=ROOT / "setups" / "simulated.toml", overrides=sets,
                                   max_budget=300, max_seeds=1)
    said: list[str] = []
    outcome = until_decided.run(staged, runs_dir=folder, out_dir=tmp_path / "rep", bootstrap=50, poll=0.2,
                                log=said.append)
    assert outcome.ended == "out of options"
    rows = _runs(db)
    assert sorted(rows) == ["mine", "scalerl-s0"] and rows["scalerl-s0"]["id"] == base.run_id
    for name in ("mine", "scalerl-s0"):
        assert rows[name]["recipe"]["budget"]["steps"] == 300 and rows[name]["status"] == "completed"
        assert len(rows[name]["job_ids"]) == 2                 # trained here first, then the extension's job
        assert _steps(db, name) == list(range(0, 301, 10))
    assert _steps(db, "scalerl-s0")[:11] == first
    with Store.open(db, create=False) as store:
        stages = [(r["stage"], r["variant"], r["budget"], r["action"]) for r in store.stages("cvd")]
    assert stages[:2] == [(0, "base", 100, "extend"), (0, "ppo_clip", 100, "extend")]
    assert (1, "base", 300, "stop") in stages
    assert "  scalerl-s0: extended from 100 to 300 steps (100 trained)" in said


def test_study_seed_runs_take_the_stored_run_of_the_same_recipe_and_seed(tmp_path, monkeypatch):
    """scripts/study.py step 1: seed 0 of ScaleRL is already stored as `scalerl-s0` (same recipe and
    seed, trained by `scalectl run`): the study's `scalectl run` reuses it instead of training
    `study-scalerl-b40-s0`, and the margin is measured from the runs that stand for the seeds."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    sets = ["budget.steps=40"]
    for seed, name in ((0, None), (1, "study-scalerl-b40-s1"), (2, "study-scalerl-b40-s2")):
        runs.start(_stores(db), "scalerl", setup="simulated", overrides=[*sets, f"seed={seed}"], runs_dir=folder,
                   name=name)
    parsed = type("Args", (), {"seeds": 3, "budget_steps": 40, "setup": "simulated", "db": str(db),
                               "runs_dir": str(folder)})()
    monkeypatch.chdir(tmp_path)
    names = study.seed_runs(parsed)
    assert names == ["scalerl-s0", "study-scalerl-b40-s1", "study-scalerl-b40-s2"]
    assert sorted(_runs(db)) == ["scalerl-s0", "study-scalerl-b40-s1", "study-scalerl-b40-s2"]
    assert all(len(r["job_ids"]) == 1 for r in _runs(db).values())            # none trained again
