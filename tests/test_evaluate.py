"""A run's checkpoints after the fact: `scalectl evaluate` (the run's protocol on any prompt set,
stored as a named series), `scalectl export` (a transformers folder with the same log-probs)."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalectl.cli import app
from scalectl.store.database import Store

GRPO = "recipes/grpo.toml"


def _sets(policy: Path, steps: int) -> list[str]:
    return ["async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=2", "eval.every_steps=2",
            "eval.prompts=8", "eval.samples_per_prompt=2", "checkpoint.every_steps=2", "checkpoint.keep=10",
            f"model.path={policy}", f"budget.steps={steps}", "length.max_new_tokens=6", "length.max_prompt_tokens=96",
            "budget.no_signal_steps=0", "data.train_size=200",
            # no completion of a fresh policy is right (no gradient): weight decay alone moves the weights
            "optim.lr=0.01", "optim.weight_decay=1.0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_torch_thread):
    """A 4-step run of a freshly initialised tiny policy (a folder of its own), checkpoints at
    steps 2 and 4: (store, runs folder, the run's row, the policy folder)."""
    from scalectl.launch import runs
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    tmp = tmp_path_factory.mktemp("evaluate")
    policy = save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp / "policy")
    db = tmp / "s.db"
    started = runs.start(functools.partial(Store.open, db), GRPO, overrides=_sets(policy, 4), runs_dir=tmp / "runs",
                         name="base")
    assert started.outcome == runs.COMPLETED
    with Store.open(db) as store:
        info = store.get_run("base")
    return db, tmp, info, policy


def _cli(db: Path, *args: str):
    result = CliRunner().invoke(app, [*args, "--db", str(db)], env={"COLUMNS": "200"})
    return result


def test_a_checkpoint_evaluated_on_a_second_set_is_stored_as_a_series(trained, tmp_path):
    db, tmp, info, _ = trained
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in ((1, 2), (3, 4), (5, 6), (7, 1), (2, 2))]
    data = tmp_path / "second.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _cli(db, "evaluate", "base", "--step", "4", "--data", str(data), "--samples", "3", "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert (done["series"], done["source"], done["prompts"]) == ("second", str(data), 5)
    (point,) = done["points"]
    with Store.open(db) as store:
        run_points = {p["step"]: p for p in store.points(info["id"])}
        (stored,) = store.points(info["id"], "second")
        listed = store.series(info["id"])
    # the checkpoint's compute is the run's at that step: the series lies on the run's own axes
    for key in ("step", "gpu_hours", "flops", "tokens", "samples"):
        assert stored[key] == run_points[4][key], key
    assert (stored["samples_per_prompt"], len(stored["correct_counts"])) == (3, 5)
    assert stored["pass_rate"] == sum(stored["correct_counts"]) / 15 == point["pass_rate"]
    assert 0 <= stored["truncation_rate"] <= 1 and stored["mean_length"] <= 6
    assert listed == [{"series": "second", "source": str(data), "prompts": 5, "samples_per_prompt": 3, "points": 1,
                       "first_step": 4, "last_step": 4}]
    shown = _cli(db, "show", "base")
    assert shown.exit_code == 0 and f"series second: 5 prompts of {data}, mean@3" in shown.stdout


def test_a_series_is_scored_by_the_runs_own_reward_function(trained, tmp_path, monkeypatch):
    """A run whose recipe names a reward function of the user's: evaluation calls it once per
    completion, from the evaluating process, and its ``correct`` is what the pass rate counts
    (right when the gold answer is odd: 3 of the 5 prompts, whatever the completions)."""
    from series_rewards import CALLS_ENV

    from scalectl.job.checkpoints import evaluate_checkpoints, pick_checkpoints
    from scalectl.recipe.schema import Recipe

    _, tmp, info, _ = trained
    golds = [3, 7, 11, 8, 4]
    data = tmp_path / "odd.jsonl"
    data.write_text("".join(json.dumps({"question": f"{g - 1}+1=", "answer": str(g)}) + "\n" for g in golds))
    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    # scored as written: the trained tiny policy's completions are cut at the length limit
    reward = {**info["recipe"].get("reward", {}), "function": "series_rewards:right_if_gold_is_odd", "truncated": "as_written"}
    raw = dict(info["recipe"], reward=reward)
    recipe = Recipe.model_validate(raw)
    found = evaluate_checkpoints(recipe, info["run_dir"], pick_checkpoints("base", info["run_dir"], 4), data=str(data),
                                 samples=3)
    (point,) = found.points
    assert (found.name, found.prompts, point.correct_counts, point.pass_rate) == ("odd", 5, [3, 3, 3, 0, 0], 9 / 15)
    lines = [line.split() for line in calls.read_text().splitlines()]
    assert sorted(int(g) for _, _, g in lines) == sorted(golds * 3)          # once per completion
    assert {int(parent) for _, parent, _ in lines} == {os.getpid()}


def test_held_out_evaluation_reproduces_the_runs_own_points(trained):
    """On its own held-out prompts, with its own k and seed, each checkpoint gives exactly the
    point the run stored at its step (the run's protocol, not an approximation of it)."""
    db, _, info, _ = trained
    result = _cli(db, "evaluate", "base", "--all", "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert done["series"] == "held-out" and [p["step"] for p in done["points"]] == [2, 4]
    with Store.open(db) as store:
        run_points = {p["step"]: p for p in store.points(info["id"])}
        series = store.points(info["id"], "held-out")
    for p in series:
        own = run_points[p["step"]]
        for key in ("pass_rate", "correct_counts", "truncation_rate", "mean_length", "samples_per_prompt", "flops"):
            assert p[key] == own[key], (p["step"], key)


def test_evaluate_refuses_what_it_cannot_evaluate(trained):
    db, _, _, _ = trained
    missing = _cli(db, "evaluate", "base", "--step", "3")
    assert missing.exit_code == 2 and "run base has no checkpoint at step 3; kept: 2, 4" in missing.stderr
    both = _cli(db, "evaluate", "base", "--step", "2", "--all")
    assert both.exit_code == 2 and "give --step N or --all, not both" in both.stderr
    no_series = _cli(db, "fit", "base", "--series", "aime")
    assert no_series.exit_code == 2 and "run 'base' has no evaluation series 'aime'" in no_series.stderr


def test_evaluate_set_changes_the_prompt_length_and_the_columns_read(trained, tmp_path):
    """Prompts longer than the run's length.max_prompt_tokens (96): refused, naming the value that
    keeps them all; `evaluate --set length.max_prompt_tokens=N` (parsed as `run --set`) evaluates
    every one of them, and --set data.prompt_key / data.answer_key read a set's own columns.  The
    model is not the evaluation's to change."""
    from scalectl.rl.data.files import BOXED_INSTRUCTION

    db, _, _, _ = trained
    words = "Add the two numbers below and give the sum as a whole number, nothing else. " * 2
    rows = [{"q": f"{words}{a}+{b}=", "a": str(a + b)} for a, b in ((1, 2), (13, 4), (125, 6), (7, 1))]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the tiny tokenizer: BOS, a token per byte, "\\boxed{" one token (the instruction holds it once)
    longest = max(1 + len(f"{r['q']} {BOXED_INSTRUCTION}".encode()) - len("\\boxed{") + 1 for r in rows)
    assert longest > 96
    columns = ["--set", "data.prompt_key=q", "--set", "data.answer_key=a"]
    refused = _cli(db, "evaluate", "base", "--data", str(data), *columns)
    assert refused.exit_code == 2
    assert (f"no usable prompt (4 rows, 0 duplicates, 4 longer than length.max_prompt_tokens = 96); --set "
            f"length.max_prompt_tokens={longest} keeps them all") in " ".join(refused.stderr.split())
    done = _cli(db, "evaluate", "base", "--data", str(data), *columns, "--set", f"length.max_prompt_tokens={longest}",
                "--json")
    assert done.exit_code == 0, done.output
    found = json.loads(done.stdout)
    assert (found["series"], found["prompts"], [p["step"] for p in found["points"]]) == ("long", 4, [4])
    assert len(found["points"][0]["correct_counts"]) == 4
    # one prompt token short of the longest: that prompt is dropped, the other three stay
    three = _cli(db, "evaluate", "base", "--data", str(data), *columns, "--set",
                 f"length.max_prompt_tokens={longest - 1}", "--series", "three", "--json")
    assert three.exit_code == 0, three.output
    kept = sum(1 + len(f"{r['q']} {BOXED_INSTRUCTION}".encode()) - len("\\boxed{") + 1 <= longest - 1 for r in rows)
    assert json.loads(three.stdout)["prompts"] == kept == 3
    model = _cli(db, "evaluate", "base", "--set", "model.path=elsewhere")
    assert model.exit_code == 2 and ("--set model.path: evaluate keeps the run's model and weights; only the keys of "
                                     "length.*, eval.*, reward.* and data.prompt_key") in " ".join(model.stderr.split())
    bad = _cli(db, "evaluate", "base", "--set", "length.max_prompt_tokens")
    assert bad.exit_code == 2 and "--set 'length.max_prompt_tokens': expected KEY=VALUE" in bad.stderr
    invalid = _cli(db, "evaluate", "base", "--set", "length.max_prompt_tokens=0")
    assert invalid.exit_code == 2 and "max_prompt_tokens" in invalid.stderr and ">= 1" in invalid.stderr


def test_export_loads_with_transformers_and_gives_the_checkpoints_log_probs(trained, tmp_path):
    """The exported folder, loaded by plain transformers, against the trainer restored from the same
    DeepSpeed checkpoint (the path a resumed run takes): the same log-probs of a sequence."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalectl.recipe.schema import Recipe
    from scalectl.rl.checkpoint import load_checkpoint
    from scalectl.rl.loop import Reporter, build_policy
    from scalectl.rl.policy.logprobs import token_logprobs

    db, tmp, info, policy = trained
    result = _cli(db, "export", "base", str(tmp_path / "exported"), "--step", "4")
    assert result.exit_code == 0, result.output
    again = _cli(db, "export", "base", str(tmp_path / "exported"))
    assert again.exit_code == 2 and "exists and is not an empty folder" in again.stderr

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "exported")
    ids = torch.tensor([tokenizer("12+7=\\boxed{19}")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    exported = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]

    recipe = Recipe.model_validate(info["recipe"])
    restored = build_policy(recipe, Reporter())
    load_checkpoint(Path(info["run_dir"]) / "checkpoints" / "step-000004", restored.ranks)
    with torch.no_grad():
        trainer, _ = token_logprobs(restored.model, ids, torch.ones_like(ids), head_fp32=True, with_entropy=False)
    initial = AutoModelForCausalLM.from_pretrained(policy).eval()
    with torch.no_grad():
        base = torch.log_softmax(initial(ids).logits[0, :-1].double(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    # float32 weights alike; two attention kernels (sdpa, eager) and the float32 head differ by rounding:
    # |d logp| <= ~1e-6 for log-probs of |logp| < 10 (float32 eps 1.2e-7 x 10); 4 steps of decay moved them more
    assert torch.allclose(exported, trainer[0].double(), atol=1e-5, rtol=0)
    assert (exported - base).abs().max() > 1e-3


def test_rm_removes_the_series_with_the_run(trained):
    db, _, info, _ = trained
    with Store.open(db) as store:
        assert store.series(info["id"])
    copy = db.with_name("copy.db")
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with Store.open(copy) as store:
        removed = store.delete_run(info["id"])
        assert removed["series_points"] >= 1 and store.list_runs() == []
        assert store.conn.execute("SELECT COUNT(*) FROM series_points").fetchone()[0] == 0


@pytest.mark.slow     # a short SFT stage (20 s of CPU) and a 6-step run: make test-slow
def test_a_learning_runs_checkpoints_reproduce_its_points_and_fit_as_a_series(tmp_path, one_torch_thread):
    """A policy that solves some prompts (test_loop_points' short SFT stage): every checkpoint
    evaluated on the held-out prompts gives the run's own point at its step, pass rates above 0
    included; the series fits and plots (`fit --series`, `compare --series`)."""
    from test_loop_points import build_policy

    from scalectl.launch import runs

    policy = build_policy(tmp_path / "policy")
    db = tmp_path / "s.db"
    sets = [s for s in _sets(policy, 6) if not s.startswith(("optim.", "length.max_new_tokens", "checkpoint.every"))]
    sets += ["length.max_new_tokens=10", "data.difficulty=1", "data.train_size=40", "checkpoint.every_steps=1",
             "eval.prompts=16", "seed=3"]
    started = runs.start(functools.partial(Store.open, db), GRPO, overrides=sets, runs_dir=tmp_path / "runs",
                         name="learns")
    assert started.outcome == runs.COMPLETED
    result = _cli(db, "evaluate", "learns", "--all", "--json")
    assert result.exit_code == 0, result.output
    with Store.open(db) as store:
        own = {p["step"]: p for p in store.points(store.get_run("learns")["id"])}
        series = store.points(store.get_run("learns")["id"], "held-out")
    assert [p["step"] for p in series] == [1, 2, 3, 4, 5, 6]
    matched = [p for p in series if p["step"] in own]
    assert [p["step"] for p in matched] == [2, 4, 6]
    assert any(p["pass_rate"] > 0 for p in matched)
    for p in matched:
        assert (p["pass_rate"], p["correct_counts"], p["mean_length"]) == \
            (own[p["step"]]["pass_rate"], own[p["step"]]["correct_counts"], own[p["step"]]["mean_length"])
    fitted = _cli(db, "fit", "learns", "--series", "held-out", "--bootstrap", "0", "--plot", str(tmp_path / "f.png"),
                  "--json")
    assert fitted.exit_code == 0, fitted.output
    assert json.loads(fitted.stdout)["fits"][0]["key"].endswith("/series=held-out")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    compared = _cli(db, "compare", "learns", "--series", "held-out", "--bootstrap", "0", "--plot",
                    str(tmp_path / "c.png"))
    assert compared.exit_code == 0, compared.output
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
