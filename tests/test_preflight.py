"""Traps of a model and data of one's own fail before the run, with the message: `validate`,
`run --dry-run` and `run` refuse them before anything is stored; a run that failed at start
frees its name, `scalectl rm` removes a run; a run without learning signal stops saying why."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT
from scalectl.cli import app
from scalectl.errors import UserError
from scalectl.launch import runs
from scalectl.store.database import Store

GRPO = "recipes/grpo.toml"
GSM8K = ROOT / "tests" / "data" / "math" / "gsm8k-test.jsonl"
#: A run small enough to start in seconds.
SMALL = ["async.mode=sync", "batch.prompts_per_step=2", "batch.generations_per_prompt=2", "eval.prompts=4",
         "eval.samples_per_prompt=1", "length.max_new_tokens=4", "length.max_prompt_tokens=128", "budget.steps=1",
         "data.train_size=50"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny Qwen2 of one's own saved with save_pretrained: with its tokenizer, and without it."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    tmp = tmp_path_factory.mktemp("models")
    model = build_tiny_model(seed=0)
    model.save_pretrained(tmp / "no-tokenizer")
    return {"own": save_policy(model, build_tokenizer(), tmp / "own"), "no-tokenizer": tmp / "no-tokenizer"}


def _validate(*sets: str, setup: str = "tiny-cpu"):
    args = ["validate", GRPO, "--setup", setup, *[a for s in sets for a in ("--set", s)]]
    return CliRunner().invoke(app, args, env={"COLUMNS": "400"})


def _refused_before_the_run(tmp_path: Path, sets: list[str], message: str) -> None:
    """`validate` (exit 2), `run --dry-run` and `run` all refuse with ``message``; `run` stores nothing."""
    checked = _validate(*sets)
    assert checked.exit_code == 2, checked.output
    assert message in " ".join(checked.stderr.split())
    with pytest.raises(UserError) as dry:
        runs.dry_run(GRPO, overrides=sets, runs_dir=tmp_path / "runs")
    assert message in " ".join(str(dry.value).split())
    db = tmp_path / "s.db"
    with pytest.raises(UserError) as ran:
        runs.start(functools.partial(Store.open, db), GRPO, overrides=sets, runs_dir=tmp_path / "runs", name="trap")
    assert message in " ".join(str(ran.value).split())
    assert not db.exists() and not (tmp_path / "runs").exists()      # no failed run keeps the name


def test_a_model_folder_without_tokenizer_files(tmp_path, models):
    sets = [*SMALL, f"model.path={models['no-tokenizer']}", f"data.source={GSM8K}"]
    _refused_before_the_run(tmp_path, sets, f"model.path = '{models['no-tokenizer']}': no tokenizer files "
                                            "(tokenizer.json, tokenizer.model, vocab.json, ...); save the tokenizer "
                                            "beside the model")


def test_a_wrong_prompt_key(tmp_path, models):
    sets = [*SMALL, f"model.path={models['own']}", f"data.source={GSM8K}", "data.prompt_key=questio"]
    _refused_before_the_run(tmp_path, sets, "gsm8k-test.jsonl row 0: no prompt column (tried questio; the row has "
                                            "question, answer); set data.prompt_key")


def test_a_chat_template_the_tokenizer_does_not_have(tmp_path, models):
    sets = [*SMALL, f"model.path={models['own']}", f"data.source={GSM8K}", "model.chat_template=true"]
    _refused_before_the_run(tmp_path, sets, f"model.chat_template = true, but the tokenizer of model.path = "
                                            f"'{models['own']}' has no chat template")


def test_the_builtin_model_with_a_prompt_file(tmp_path):
    """Refused, saying what a CPU user with prompts of their own does instead: a small real
    checkpoint in model.path, and the run's own length limits to raise (128 and 4 here)."""
    sets = [*SMALL, f"data.source={GSM8K}"]
    _refused_before_the_run(tmp_path, sets, "model.path = 'builtin:tiny' is warm-started on data.source = "
                                            f"'synthetic:arithmetic' only, not '{GSM8K}'")
    _refused_before_the_run(tmp_path, sets, "give model.path a small real checkpoint folder (save_pretrained layout "
                                            "with its tokenizer")
    _refused_before_the_run(tmp_path, sets, "length.max_prompt_tokens = 128 now (longer prompts are dropped; "
                                            "`scalectl validate --setup ...` counts them) and length.max_new_tokens = 4")


def test_validate_counts_the_prompts_the_length_limit_drops_in_the_whole_set(models):
    """The first 32 rows of GSM8K test fit a limit set at their longest; the whole set does not:
    validate reads every row as the run does and says how many prompts go, the longest, and the
    split sizes, before any run."""
    from scalectl.rl.data.files import BOXED_INSTRUCTION

    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()]
    # the tiny tokenizer: BOS, a token per byte, "\\boxed{" one token (the instruction holds it once)
    lengths = [1 + len(f"{q.rstrip()} {BOXED_INSTRUCTION}".encode()) - len("\\boxed{") + 1 for q in questions]
    limit = max(lengths[:32])
    dropped, longest = sum(n > limit for n in lengths), max(lengths)
    assert 0 < dropped < 1319 - 54 and longest > limit
    checked = _validate(*SMALL, f"model.path={models['own']}", f"data.source={GSM8K}",
                        f"length.max_prompt_tokens={limit}")
    assert checked.exit_code == 0, checked.output
    said = " ".join(checked.stderr.split())
    assert (f"warning: {GRPO}: prompt set {GSM8K}: 1319 rows, 0 duplicates (0 near-duplicates), {dropped} longer than "
            f"{limit} tokens (the longest {longest:,} tokens: --set length.max_prompt_tokens={longest} keeps them); "
            f"50 training, 4 held-out prompts: the run drops the prompts longer than length.max_prompt_tokens = "
            f"{limit}") in said
    assert "of the first 32 prompts" not in said                    # all 32 first rows fit: only the whole set tells
    whole = _validate(*SMALL, f"model.path={models['own']}", f"data.source={GSM8K}",
                      f"length.max_prompt_tokens={longest}")
    assert whole.exit_code == 0 and "warning" not in whole.stderr
    assert (f"{GRPO}: prompt set {GSM8K}: 1319 rows, 0 duplicates (0 near-duplicates), 0 longer than {longest} "
            "tokens; 50 training, 4 held-out prompts") in " ".join(whole.stderr.split())


def test_prompts_all_longer_than_the_limit(tmp_path, models):
    from scalectl.rl.data.files import BOXED_INSTRUCTION

    # the tiny tokenizer: BOS, a token per byte, "\boxed{" one token (the instruction holds it once)
    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[:32]]
    shortest = min(1 + len(f"{q.rstrip()} {BOXED_INSTRUCTION}".encode()) - len("\\boxed{") + 1 for q in questions)
    sets = [*SMALL, f"model.path={models['own']}", f"data.source={GSM8K}", "length.max_prompt_tokens=40"]
    _refused_before_the_run(tmp_path, sets, "each of its first 32 prompts is longer than length.max_prompt_tokens "
                                            f"= 40 as the tokenizer encodes them (shortest {shortest} tokens)")


def test_a_set_too_small_for_its_held_out_prompts(tmp_path, models):
    data = tmp_path / "ten.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(10)))
    sets = [*SMALL, f"model.path={models['own']}", f"data.source={data}", "eval.prompts=100"]
    _refused_before_the_run(tmp_path, sets, "eval.prompts = 100 held-out prompts need a prompt set of more than "
                                            f"100 prompts; data.source = '{data}' has 10 rows")


def test_keys_without_effect_are_warned_about_where_the_user_set_them(tmp_path, models):
    """A setup of one's own that extends tiny-cpu (which sets model.warm_start_target and
    data.difficulty for its tiny model and generated prompts) and names its own model and prompt
    file: the keys tiny-cpu set are not the user's, and nothing is said about them; a key the
    setup itself or a --set gives, which does nothing there, is warned about, naming where it was set."""
    setup = tmp_path / "mine.toml"
    setup.write_text(f'extends = "tiny-cpu"\n\n[model]\npath = "{models["own"]}"\n')
    data = [f"data.source={GSM8K}", "length.max_prompt_tokens=2000"]
    inherited = _validate(*SMALL, *data, setup=str(setup))
    assert inherited.exit_code == 0, inherited.output
    assert "warm_start_target" not in inherited.stderr and "data.difficulty" not in inherited.stderr
    assert "warning" not in inherited.stderr
    logged: list[str] = []
    runs.dry_run(GRPO, setup=setup, overrides=[*SMALL, *data], runs_dir=tmp_path / "runs", log=logged.append)
    assert not any("warm_start_target" in line or "data.difficulty" in line for line in logged)
    assert any(line.startswith(f"tokenizer of {models['own']}: Qwen2Tokenizer, 261 ids") for line in logged)
    # the default setup (no --setup file of the user's) with --set model.path and data.source: not the user's either
    default = _validate(*SMALL, *data, f"model.path={models['own']}")
    assert default.exit_code == 0 and "warning" not in default.stderr
    # set by the user's own setup, and by --set: warned about, each naming where
    setup.write_text(f'extends = "tiny-cpu"\n\n[model]\npath = "{models["own"]}"\nwarm_start_target = 0.5\n')
    own = _validate(*SMALL, *data, "data.difficulty=5", setup=str(setup))
    said = " ".join(own.stderr.split())
    assert (f"model.warm_start_target = 0.5 (from {setup}) has no effect for model.path = '{models['own']}'" in said
            and "warm-start your own by a supervised stage first" in said)
    assert ("data.difficulty = 5 (from --set data.difficulty) has no effect" in said
            and "it sets the level of synthetic:arithmetic, not of a prompt file" in said)
    builtin = _validate(*SMALL)
    assert builtin.exit_code == 0 and "warning" not in builtin.stderr   # builtin:tiny takes it


def test_a_run_that_fails_at_start_frees_its_name(tmp_path, models):
    """Row 40 of the set (past the rows read before the run) has no answer: the run fails at start.
    The next run of that name replaces it instead of being refused."""
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(60)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r if i != 40 else {"question": "x", "answer": None}) + "\n"
                           for i, r in enumerate(rows)))
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = functools.partial(Store.open, db)
    sets = [*SMALL, f"model.path={models['own']}"]
    with pytest.raises(UserError, match="bad.jsonl row 40: no answer column"):
        runs.start(stores, GRPO, overrides=[*sets, f"data.source={bad}"], runs_dir=folder, name="mine")
    with Store.open(db) as store:
        assert store.get_run("mine")["status"] == "failed" and runs.failed_at_start(store, store.get_run("mine"))
    said: list[str] = []
    again = runs.start(stores, GRPO, overrides=[*sets, f"data.source={good}"], runs_dir=folder, name="mine",
                       log=said.append)
    assert again.outcome == runs.COMPLETED
    assert any(line.startswith("note: run mine failed at start (") and "its name taken again" in line
               for line in said)
    with Store.open(db) as store:
        (row,) = store.list_runs()
        assert (row["name"], row["status"], row["id"], row["n_points"]) == ("mine", "completed", again.run_id, 2)
        # a run that stored points does not give its name up
        store.update_run(again.run_id, status="failed")
        assert not runs.failed_at_start(store, store.get_run("mine"))


def test_rm_removes_a_run_its_points_and_its_folder(tmp_path):
    db, folder = tmp_path / "s.db", tmp_path / "runs"
    sim = ["budget.steps=4", "eval.every_steps=2", "model.path=simulated:seconds_per_step=0"]
    for name in ("gone", "kept"):        # two runs of one recipe and seed: the second on purpose (--new-run)
        runs.start(functools.partial(Store.open, db), "grpo", setup="simulated", overrides=sim, runs_dir=folder,
                   name=name, new_run=True)
    runner = CliRunner()
    asked = runner.invoke(app, ["rm", "gone", "--db", str(db)], input="n\n")
    assert asked.exit_code == 2 and "add --yes to remove without asking" in asked.stderr
    assert (folder / "gone").is_dir()
    removed = runner.invoke(app, ["rm", "gone", "--yes", "--json", "--db", str(db)])
    assert removed.exit_code == 0, removed.output
    (done,) = json.loads(removed.stdout)
    assert done["rows"]["eval_points"] == 3 and done["rows"]["runs"] == 1
    assert done["folder"] == str((folder / "gone").resolve())
    assert not (folder / "gone").exists() and (folder / "kept" / "job.json").is_file()
    with Store.open(db) as store:
        assert [r["name"] for r in store.list_runs()] == ["kept"]
        store.update_run(store.get_run("kept")["id"], status="running")
    busy = runner.invoke(app, ["rm", "kept", "--yes", "--db", str(db)])
    assert busy.exit_code == 2 and "cancel it first" in busy.stderr
    again = runs.start(functools.partial(Store.open, db), "grpo", setup="simulated", overrides=sim, runs_dir=folder,
                       name="gone", new_run=True)                    # the name is free again
    assert again.outcome == runs.COMPLETED


def test_a_run_without_learning_signal_stops_saying_why(tmp_path, models, one_torch_thread):
    """A freshly initialised policy solves nothing: every group's completions get -1, every
    advantage and the gradient are 0.  With budget.no_signal_steps = 2 the run stops after step 2
    with the reason and a checkpoint; resumed with the check off, it trains on."""
    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = functools.partial(Store.open, db)
    sets = [*SMALL, f"model.path={models['own']}", "budget.steps=5", "budget.no_signal_steps=2", "eval.every_steps=1"]
    with pytest.raises(UserError, match=r"no learning signal in the first 2 steps: in each, every group's 2 "
                                        r"completions got one reward \(mean reward -1.00"):
        runs.start(stores, GRPO, overrides=sets, runs_dir=folder, name="flat")
    steps = [json.loads(line) for line in (folder / "flat" / "steps.jsonl").read_text().splitlines()]
    assert [(s["step"], s["zero_variance_share"], s["grad_norm"]) for s in steps] == [(1, 1.0, 0.0), (2, 1.0, 0.0)]
    with Store.open(db) as store:
        run = store.get_run("flat")
        assert run["status"] == "failed" and "budget.no_signal_steps=0" in run["error"]
    assert (folder / "flat" / "checkpoints" / "step-000002" / "state.pt").is_file()
    resumed = runs.resume(stores, "flat", overrides=["budget.no_signal_steps=0"])
    assert resumed.outcome == runs.COMPLETED and resumed.summary["steps"] == 5


def test_a_run_whose_budget_ends_within_the_no_signal_steps_completes(tmp_path, models, one_torch_thread):
    """The check stops a run that would train on; one whose budget is spent at that step is done."""
    sets = [*SMALL, f"model.path={models['own']}", "budget.no_signal_steps=1"]
    done = runs.start(functools.partial(Store.open, tmp_path / "s.db"), GRPO, overrides=sets, runs_dir=tmp_path / "runs",
                      name="short")
    assert done.outcome == runs.COMPLETED and done.summary["steps"] == 1
    (step,) = [json.loads(line) for line in (tmp_path / "runs" / "short" / "steps.jsonl").read_text().splitlines()]
    assert (step["zero_variance_share"], step["grad_norm"]) == (1.0, 0.0)        # a step without signal all the same


def test_a_held_out_split_the_length_limit_empties_says_what_was_dropped(models):
    """At run time (past the first rows read before it), a limit that leaves fewer prompts than
    eval.prompts needs says how many rows, duplicates and prompts too long went."""
    from scalectl.recipe.load import load
    from scalectl.rl.data.files import BOXED_INSTRUCTION
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.policy.model import build_tokenizer

    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()]
    # the tiny tokenizer: BOS, a token per byte, "\\boxed{" one token
    lengths = sorted(1 + len(f"{q.rstrip()} {BOXED_INSTRUCTION}".encode()) - len("\\boxed{") + 1 for q in questions)
    limit = lengths[1]                                            # two prompts fit (ties aside)
    kept = sum(n <= limit for n in lengths)
    recipe = load(GRPO, "tiny-cpu", [f"data.source={GSM8K}", f"model.path={models['own']}", "eval.prompts=100",
                                     f"length.max_prompt_tokens={limit}"])
    with pytest.raises(UserError) as refused:
        load_prompt_sets(recipe, build_tokenizer())
    assert str(refused.value) == (
        f"data.source = '{GSM8K}': eval.prompts = 100 held-out prompts need a prompt set of more than 100 prompts; "
        f"this one has {kept} (1319 rows, 0 duplicates, {1319 - kept} longer than length.max_prompt_tokens = {limit} "
        f"dropped); --set length.max_prompt_tokens={lengths[-1]} keeps them all (the longest prompt has {lengths[-1]} "
        "tokens)")
