"""Ablation plans (pure), the dry run, and a two-variant forward ablation trained
end to end: interrupted, continued, then reused without training again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import ROOT, SCALECTL, run_cli
from scalectl.ablation import (
    SCALERL_LOO, AblationSpec, VariantSpec, forward_spec, leave_one_out_spec, parse_forward, parse_run_name,
    plan, read_ablation, run_name, with_companions,
)
from scalectl.errors import UserError

LOO_CHANGES = {
    "loo-plan": ["advantage.normalization batch -> prompt"],
    "loo-lp": ["length.control interrupt -> penalty"],
    "loo-batch": ["filter.zero_variance true -> false"],
    "loo-8op": ["async.mode pipeline -> ppo_off_policy"],          # k = 8 in both
    "loo-fp32": ["precision.lm_head fp32 -> bf16"],
    "loo-savg": ["loss.aggregation prompt -> sample"],
    "loo-dapo": ["loss.clip_high 5 -> 0.28", "loss.type cispo -> ppo_clip"],   # clip_low 0.2 in both
}


def test_leave_one_out_plan_reverts_one_choice_each():
    p = plan(leave_one_out_spec(ROOT / "recipes/scalerl.toml"), setup=ROOT / "setups/tiny-cpu.toml")
    assert [v.name for v in p.variants] == ["base", *LOO_CHANGES]
    assert {v.name: [str(c) for c in v.changes] for v in p.variants[1:]} == LOO_CHANGES
    assert [r.name for r in p.runs] == [f"scalerl-loo--{v}--s0" for v in ["base", *LOO_CHANGES]]
    assert len({r.recipe_hash for r in p.runs}) == 8
    fp32 = p.variant("loo-fp32")
    assert fp32.lead == "Removing the FP32 head" and fp32.recipe.precision.lm_head == "bf16"
    assert p.variant("base").recipe.precision.lm_head == "fp32"


def test_forward_plan_one_axis_at_a_time():
    spec = forward_spec([parse_forward("loss.type=ppo_clip,gspo,cispo"), parse_forward("precision.lm_head=bf16")],
                        ROOT / "recipes/scalerl.toml", name="fwd")
    p = plan(spec, setup=ROOT / "setups/tiny-cpu.toml", overrides=("budget.steps=7",))
    assert [v.name for v in p.variants] == ["base", "ppo_clip", "gspo", "bf16"]
    assert p.notes == ("loss.type = cispo is the base's own value: the base stands for it",)
    gspo = p.variant("gspo")
    # a new loss type brings its own default clips (GSPO 3e-3 / 5e-3), not CISPO's eps_max 5
    assert [str(c) for c in gspo.changes] == ["loss.clip_high 5 -> 0.005", "loss.clip_low 0.2 -> 0.003",
                                              "loss.type cispo -> gspo"]
    assert gspo.lead == "Changing loss.type from cispo to gspo"
    assert all(r.recipe.budget.steps == 7 for r in p.runs)
    # the same recipe planned by two ablations has one hash: its runs are shared
    loo = plan(leave_one_out_spec(ROOT / "recipes/scalerl.toml"), setup=ROOT / "setups/tiny-cpu.toml",
               overrides=("budget.steps=7",))
    assert loo.variant("loo-dapo").recipe_hash == p.variant("ppo_clip").recipe_hash
    assert loo.variant("loo-fp32").recipe_hash == p.variant("bf16").recipe_hash
    assert loo.variant("base").recipe_hash == p.variant("base").recipe_hash


def test_companions_and_names():
    assert with_companions(("loss.type=gspo",)) == ("loss.type=gspo", "loss.clip_low=0.003", "loss.clip_high=0.005")
    assert with_companions(("loss.type=ppo_clip", "loss.clip_high=0.26")) == \
        ("loss.type=ppo_clip", "loss.clip_high=0.26", "loss.clip_low=0.2")
    assert parse_forward("filter.zero_variance=true,false") == ("filter.zero_variance", (True, False))
    assert parse_run_name(run_name("scalerl-loo", "loo-fp32", 3)) == ("scalerl-loo", "loo-fp32", 3)
    assert parse_run_name("scalerl-loo--base--s0-2") == ("scalerl-loo", "base", 0)
    assert parse_run_name("grpo-s0") is None
    with pytest.raises(UserError, match="KEY=V1,V2"):
        parse_forward("loss.type")
    with pytest.raises(UserError, match="may not contain '--'"):
        leave_one_out_spec(name="a--b")


def test_ablation_files_plan():
    files = {p.stem: read_ablation(p) for p in (ROOT / "ablations").glob("*.toml")}
    assert set(files) == {"scalerl-loo", "loss-forward", "async-forward", "recipes"}
    plans = {k: plan(s) for k, s in files.items()}
    assert {v.name: [str(c) for c in v.changes] for v in plans["scalerl-loo"].variants[1:]} == LOO_CHANGES
    assert [v.name for v in plans["loss-forward"].variants] == ["base", "ppo_clip", "gspo"]
    assert [v.name for v in plans["async-forward"].variants] == ["base", "ppo_off_policy"]
    rec = plans["recipes"]
    assert rec.baseline == "scalerl" and [v.name for v in rec.variants] == ["scalerl", "grpo", "dapo", "magistral", "minimax"]
    assert rec.variant("grpo").recipe.loss.aggregation == "sample"
    assert all(r.recipe.budget.steps == 150 for p in plans.values() for r in p.runs)
    base_hashes = {p.variant(p.baseline).recipe_hash for p in plans.values()}
    assert len(base_hashes) == 1                          # ScaleRL at 150 steps, everywhere
    assert plans["scalerl-loo"].variant("loo-8op").recipe_hash == plans["async-forward"].variant("ppo_off_policy").recipe_hash
    two = plan(files["loss-forward"], repeats=2)
    assert [r.name for r in two.runs] == [f"loss-forward--{v}--s{s}" for v in ("base", "ppo_clip", "gspo") for s in (0, 1)]
    assert [r.recipe.seed for r in two.runs] == [0, 1] * 3
    assert two.runs[0].recipe_hash == two.runs[1].recipe_hash     # seeds share the hash


def test_bad_ablations(tmp_path):
    def read(text):
        path = tmp_path / "a.toml"
        path.write_text(text)
        return read_ablation(path)

    with pytest.raises(UserError, match="kind = 'sideways' is not one of: forward, leave_one_out, variants"):
        read('kind = "sideways"\nbase = "x.toml"')
    with pytest.raises(UserError, match="unknown key\\(s\\) seeds"):
        read('kind = "forward"\nbase = "x.toml"\nseeds = 3\n[forward]\n"loss.type" = ["gspo"]')
    with pytest.raises(UserError, match="a forward ablation lists its axes in \\[forward\\]"):
        read('kind = "forward"\nbase = "x.toml"')
    with pytest.raises(UserError, match="variants\\[0\\] \\(v\\): unknown key\\(s\\) sets"):
        read(f'kind = "leave_one_out"\nbase = "{ROOT}/recipes/scalerl.toml"\n[[variants]]\nname = "v"\nsets = []')
    spec = AblationSpec("x", "leave_one_out", ROOT / "recipes/scalerl.toml",
                        variants=(VariantSpec("noop", ("advantage.normalization=batch",)),))
    with pytest.raises(UserError, match="variant noop trains exactly what base trains"):
        plan(spec)
    spec = AblationSpec("x", "leave_one_out", ROOT / "recipes/scalerl.toml",
                        variants=(VariantSpec("bad", ("loss.type=cisp",)),))
    with pytest.raises(UserError, match="variant bad: .*loss.type = 'cisp' is not one of: ppo_clip, gspo, cispo"):
        plan(spec)
    assert len(SCALERL_LOO) == 7


def test_leave_one_out_dry_run_prints_eight_runs(tmp_path):
    db = tmp_path / "none.db"
    proc = run_cli("ablate", "--leave-one-out", "--dry-run", "--budget-steps", "40", "--db", str(db),
                   "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    runs = [ln.split()[1] for ln in lines if ln.strip().startswith("run ")]
    assert runs == [f"scalerl-loo--{v}--s0" for v in ["base", *LOO_CHANGES]]
    assert all(ln.rstrip().endswith(": new") for ln in lines if ln.strip().startswith("run "))
    text = "\n".join(" ".join(ln.split()) for ln in lines)
    for variant, changes in LOO_CHANGES.items():
        assert f"\n{variant} {changes[0]}\n" in text
        for change in changes[1:]:
            assert f"\n{change}\n" in text
    assert "8 runs: 8 new, 0 to resume, 0 reused" in proc.stdout
    assert "to train: 320 steps (8 runs)" in proc.stdout
    assert not db.exists() and not (tmp_path / "runs").exists()     # nothing created


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """An untrained tiny policy: the test is about orchestration, not learning."""
    import torch

    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return str(save_policy(build_tiny_model(seed=0), build_tokenizer(),
                               tmp_path_factory.mktemp("policy") / "tiny"))
    finally:
        torch.set_num_threads(threads)


def _rows(db):
    return {r["name"]: r for r in json.loads(run_cli("runs", "--json", db=db, check=True).stdout)}


def _ablate_args(tmp_path, policy, steps: int, every: int) -> list[str]:
    args = ["ablate", "--forward", "precision.lm_head=fp32,bf16", "--name", "fwd", "--runs-dir", str(tmp_path / "runs"),
            "--out", str(tmp_path / "report"), "--budget-steps", str(steps), "--bootstrap", "50", "--poll", "0.3",
            "--json"]
    for s in ("async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=4",
              f"eval.every_steps={every}", "eval.prompts=32", "eval.samples_per_prompt=2",
              f"checkpoint.every_steps={every}", f"model.path={policy}", "launcher.max_parallel=2"):
        args += ["--set", s]
    return args


NAMES = ["fwd--base--s0", "fwd--bf16--s0"]


def _env(db):
    return dict(os.environ, COLUMNS="200", SCALECTL_DB=str(db), OMP_NUM_THREADS="1")


@pytest.mark.long
def test_forward_ablation_end_to_end_then_reused(tmp_path, policy):
    """Two variants (the base, FP32 head; bf16 head) trained as detached local jobs,
    compared; the same command again reuses both runs and creates nothing."""
    db = tmp_path / "s.db"
    args = _ablate_args(tmp_path, policy, steps=4, every=1)
    first = subprocess.run([SCALECTL, *args], cwd=ROOT, env=_env(db), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    expected = plan(forward_spec([("precision.lm_head", ("fp32", "bf16"))], ROOT / "recipes/scalerl.toml", name="fwd"),
                    overrides=tuple(a for a in args[args.index("--set"):] if a != "--set") + ("budget.steps=4",))
    assert {n: a["action"] for n, a in data["actions"].items()} == {n: "new" for n in NAMES}
    assert data["runs"] == {n: "completed" for n in NAMES}
    rows = _rows(db)
    assert sorted(rows) == NAMES
    for r in expected.runs:
        row = rows[r.name]
        assert (row["recipe_hash"], row["seed"], row["n_points"], row["last_step"]) == (r.recipe_hash, 0, 5, 4)
    show = json.loads(run_cli("show", "fwd--bf16--s0", "--json", db=db, check=True).stdout)
    assert show["run"]["recipe"]["precision"]["lm_head"] == "bf16"
    assert [p["step"] for p in show["points"]] == [0, 1, 2, 3, 4]
    assert {v["name"] for v in data["result"]["variants"]} == {"base", "bf16"}
    assert data["result"]["variants"][1]["sentence"].startswith("Changing precision.lm_head from fp32 to bf16")
    assert (tmp_path / "report" / "index.html").exists() and (tmp_path / "report" / "summary.md").exists()
    ids = {n: rows[n]["id"] for n in NAMES}

    second = subprocess.run([SCALECTL, *args], cwd=ROOT, env=_env(db), capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    data = json.loads(second.stdout)
    assert {n: a["action"] for n, a in data["actions"].items()} == {n: "reuse" for n in NAMES}
    assert data["cost"]["steps"] == 0 and "launched" not in second.stderr
    rows = _rows(db)
    assert {n: rows[n]["id"] for n in rows} == ids                     # no new run
    assert all(len(rows[n]["job_ids"]) == 1 for n in NAMES)           # nothing launched again
    manifest = json.loads((tmp_path / "runs" / ".ablations" / "fwd.json").read_text())
    assert [v["runs"] for v in manifest["variants"]] == [[NAMES[0]], [NAMES[1]]]


@pytest.mark.slow
def test_forward_ablation_interrupted_then_continued(tmp_path, policy):
    """Ctrl-C cancels the ablation's jobs (each checkpoints); the same command
    resumes the cancelled runs from their checkpoints and reuses the finished ones.  The first
    command starts as a background shell starts it, SIGINT ignored: scalectl restores it."""
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    args = _ablate_args(tmp_path, policy, steps=10, every=2)
    first = subprocess.Popen([SCALECTL, *args], cwd=ROOT, env=_env(db), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 180
    while not any((runs / n / "checkpoints" / "latest").exists() for n in NAMES):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.1)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    assert "run the same command again to continue" in stderr
    rows = _rows(db)
    assert sorted(rows) == NAMES
    assert "cancelled" in {rows[n]["status"] for n in NAMES}, stderr
    assert all(rows[n]["status"] in ("cancelled", "completed") for n in NAMES)
    ids = {n: rows[n]["id"] for n in NAMES}
    stopped = {n for n in NAMES if rows[n]["status"] == "cancelled"}

    second = subprocess.run([SCALECTL, *args], cwd=ROOT, env=_env(db), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    data = json.loads(second.stdout)
    assert {n: a["action"] for n, a in data["actions"].items()} == \
        {n: "resume" if n in stopped else "reuse" for n in NAMES}
    rows = _rows(db)
    assert {n: (rows[n]["id"], rows[n]["status"]) for n in NAMES} == {n: (ids[n], "completed") for n in NAMES}
    for n in NAMES:
        show = json.loads(run_cli("show", n, "--json", db=db, check=True).stdout)
        steps = [p["step"] for p in show["points"]]
        # exactly the evaluation steps of an uninterrupted run, wherever the stop fell
        assert steps == list(range(0, 11, 2))
        assert len(show["run"]["job_ids"]) == (2 if n in stopped else 1)
    n = next(iter(stopped))
    assert "resumed from step-" in (runs / n / "logs" / "local-1.log").read_text()


@pytest.mark.slow   # 8-22 s (two local jobs start, each importing the trainer): make test-slow
def test_an_ablation_prepared_and_run_from_python(tmp_path):
    """`scalectl ablate` as a notebook calls it (scalectl.ablation.campaign): prepare plans and
    prices without creating a store; run launches the simulated runs (real local jobs), tells
    each look at them to its Progress, and ends with the verdicts, the manifest and the report;
    the same plan again reuses every run."""
    from scalectl.ablation import campaign

    common = "B=2,C_mid=0.1,R0=0.3,hours_per_step=0.001,seconds_per_step=0"
    path = tmp_path / "py.toml"
    path.write_text(f"""
name = "py"
kind = "variants"
base = "{ROOT / 'recipes/scalerl.toml'}"
setup = "{ROOT / 'setups/simulated.toml'}"
baseline = "base"
set = ["model.path='simulated:A=0.6,{common}'", "budget.steps=500"]

[[variants]]
name = "base"

[[variants]]
name = "up"
set = ["model.path='simulated:A=0.7,{common}'"]
""")
    db = tmp_path / "s.db"
    prepared = campaign.prepare(read_ablation(path), db=str(db))
    assert not db.exists() and prepared.counts() == {"new": 2} and prepared.kind == "local"
    assert prepared.cost["steps"] == 1000 and prepared.cost["device_hours"] is None   # no rate measured yet

    class Seen(campaign.Progress):
        def __init__(self):
            self.lines, self.looks, self.last = [], 0, "not called"

        def log(self, message):
            self.lines.append(message)

        def runs(self, rows):
            self.looks += 1

        def watched(self, rows):
            self.last = rows

    seen = Seen()
    outcome = campaign.run(prepared, runs_dir=tmp_path / "runs", out_dir=tmp_path / "rep", bootstrap=100,
                           poll=0.2, progress=seen)
    assert not outcome.interrupted and seen.looks >= 1
    assert seen.lines[0] == "launched 2 run(s) on local (at most 4 at once)"
    assert [(r["name"], r["status"], r["step"]) for r in seen.last] == [("py--base--s0", "completed", 500),
                                                                         ("py--up--s0", "completed", 500)]
    row = outcome.result.comparison.row("up")
    assert row.verdict == "higher ceiling" and 0.05 < row.delta_A < 0.15       # true dA 0.1, seed sd 0.005
    assert outcome.to_dict()["runs"] == {"py--base--s0": "completed", "py--up--s0": "completed"}
    assert outcome.report["html"] == tmp_path / "rep" / "index.html" and outcome.report["html"].exists()
    saved = json.loads((tmp_path / "runs" / ".ablations" / "py.json").read_text())
    assert [v["runs"] for v in saved["variants"]] == [["py--base--s0"], ["py--up--s0"]]
    again = campaign.prepare(read_ablation(path), db=str(db))
    assert again.counts() == {"reuse": 2} and again.cost["steps"] == 0
    assert again.cost["rate"] == pytest.approx(0.001)      # measured on the two completed runs
