"""Reward functions written for verl or TRL (``reward.convention``, docs/rewards.md): the
convention recognised from the signature or declared, clear errors for a function that fits
none, what each convention is passed and how its value is read, the content hash, and short
``sync`` and ``pipeline`` runs whose store holds what the function said.

The functions are written here into temporary folders, as a user's own files would be."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT, run_cli
from scalectl.errors import UserError
from scalectl.recipe.load import load
from scalectl.recipe.reward_function import convention_of
from scalectl.rl.data.arithmetic import Problem
from scalectl.rl.reward.conventions import dataset_name, trl_scores, verl_score
from scalectl.rl.reward.gold import Gold
from scalectl.rl.reward.score import RewardFunctionError, Score
from scalectl.rl.reward.scoring import Scorer, scorer_for

LOG_ENV = "SCALECTL_TEST_CONVENTION_LOG"

#: verl's shape: reward = digit share - 0.5, correct by ``acc`` (an odd gold answer), so the
#: pass rate is the share of odd gold answers whatever the completions; every call logged.
VERL_FILE = '''
import json, os

def _log(**entry):
    with open(os.environ["SCALECTL_TEST_CONVENTION_LOG"], "a") as fh:
        fh.write(json.dumps(dict(pid=os.getpid(), ppid=os.getppid(), **entry)) + "\\n")

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    _log(data_source=data_source, extra_info=extra_info, ground_truth=ground_truth)
    share = sum(c.isdigit() for c in solution_str) / len(solution_str) if solution_str else 0.0
    return {"score": share - 0.5, "acc": int(ground_truth) % 2 == 1, "pred": solution_str[-3:]}
'''

#: TRL's shape, over a batch: an odd gold answer scores 1 + the digit share (correct), an even
#: one None (not applicable) when the completion has an even number of tokens, else the digit
#: share - 1 (not > 0: not correct); every call logged with its batch size and keywords.
TRL_FILE = '''
import json, os

def _log(**entry):
    with open(os.environ["SCALECTL_TEST_CONVENTION_LOG"], "a") as fh:
        fh.write(json.dumps(dict(pid=os.getpid(), ppid=os.getppid(), **entry)) + "\\n")

def reward_func(completions, answer, completion_ids, **kwargs):
    _log(n=len(completions), keys=sorted(kwargs), prompts=len(set(kwargs["prompts"])), answers=sorted(set(answer)))
    out = []
    for text, gold, ids in zip(completions, answer, completion_ids):
        share = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        if int(gold) % 2:
            out.append(1.0 + share)
        elif len(ids) % 2 == 0:
            out.append(None)
        else:
            out.append(share - 1.0)
    return out
'''


def _share(text: str) -> float:
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def verl_reward(text: str, gold: str, ids: list[int]) -> tuple[float, bool]:
    """What VERL_FILE gives, computed here."""
    return _share(text) - 0.5, int(gold) % 2 == 1


def trl_reward(text: str, gold: str, ids: list[int]) -> tuple[float, bool]:
    """What TRL_FILE gives, computed here (None read as 0, not correct)."""
    if int(gold) % 2:
        return 1.0 + _share(text), True
    return (0.0 if len(ids) % 2 == 0 else _share(text) - 1.0), False


KINDS = {"verl": ("verl_rewards_mine", VERL_FILE, "compute_score", verl_reward),
         "trl": ("trl_rewards_mine", TRL_FILE, "reward_func", trl_reward)}


@pytest.fixture(autouse=True)
def fresh_workers():
    from scalectl.rl.reward.calls import close_workers

    close_workers()
    yield
    close_workers()


@pytest.fixture
def module_in(tmp_path, monkeypatch):
    """Write a module ``name`` holding ``text`` into a temporary folder on ``sys.path`` (the
    workers get it as their PYTHONPATH); the log file is ``tmp_path / 'log'``."""
    folder = tmp_path / "mine"
    folder.mkdir()
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log"))
    monkeypatch.syspath_prepend(str(folder))
    written = []

    def write(name: str, text: str) -> str:
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
        written.append(name)
        return str(folder)

    yield write
    for name in written:
        sys.modules.pop(name, None)


def _row(prompt: str, answer: str, fields: dict) -> SimpleNamespace:
    """A problem of a real set: its prompt, gold answer and row."""
    return SimpleNamespace(prompt=prompt, answer=answer, fields=fields)


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------- recognising


def _verl(data_source, solution_str, ground_truth, extra_info=None): ...
def _trl(completions, **kwargs): ...
def _trl_ids(completion_ids, **kwargs): ...             # TRL's docs, Example 1
def _trl_columns(prompts, completions, solution, **kw): ...
def _mine(completion, gold, fields): ...
def _mine_keywords(completion, gold, **row): ...
def _anything(*args, **kwargs): ...
def _keywords_only(**kwargs): ...
def _two(completion, gold): ...
def _completions_only(completions): ...


@pytest.mark.parametrize("function,convention", [
    (_verl, "verl"), (_trl, "trl"), (_trl_ids, "trl"), (_trl_columns, "trl"), (_mine, "scalectl"),
    (_mine_keywords, "scalectl"), (_anything, "scalectl"),
])
def test_the_convention_is_recognised_from_the_signature(function, convention):
    assert convention_of(function) == convention


def test_a_declared_convention_overrides_and_is_checked():
    assert convention_of(_anything, "verl") == "verl" and convention_of(_keywords_only, "trl") == "trl"
    assert convention_of(_verl, "scalectl") == "scalectl"       # three positional parameters: it fits
    with pytest.raises(ValueError, match=r"cannot be called as reward.convention = 'trl' calls it, reward_func\("
                                         r".*got an unexpected keyword argument 'prompts'"):
        convention_of(_mine, "trl")
    with pytest.raises(ValueError, match="fits the calls of verl and trl alike; say which with reward.convention = "
                                         "'verl' or 'trl'"):
        convention_of(_keywords_only)


@pytest.mark.parametrize("function,why", [
    (_two, "as scalectl calls it: too many positional arguments"),
    (_completions_only, "as trl calls it: got an unexpected keyword argument 'prompts'"),
])
def test_a_function_that_fits_no_convention_is_told_the_three_shapes(function, why):
    with pytest.raises(ValueError) as err:
        convention_of(function)
    text = str(err.value)
    assert text.startswith("fits none of the three accepted shapes (scalectl: f(completion, gold, fields) or "
                           "f(completion, gold, **fields), returning a float or a Score; verl: compute_score("
                           "data_source, solution_str, ground_truth, extra_info=None), returning a float or a dict "
                           "with a 'score' key; trl: reward_func(completions, **kwargs) over a batch"), text
    assert text.endswith(why)


#: The three shapes, as docs/rewards.md describes the three conventions.
THREE_SHAPES = ("(scalectl: f(completion, gold, fields) or f(completion, gold, **fields), returning a float or a "
                "Score; verl: compute_score(data_source, solution_str, ground_truth, extra_info=None), returning a "
                "float or a dict with a 'score' key; trl: reward_func(completions, **kwargs) over a batch (prompts, "
                "completions, completion_ids and the row's columns as keyword lists), returning a list of floats "
                "or None)")


def test_a_function_of_keywords_only_is_refused_naming_the_three_shapes_as_the_docs_do(tmp_path):
    """``f(**kwargs)`` fits verl's call and TRL's alike: the refusal named the two conventions
    only, where docs/rewards.md describes three and says the refusal names them."""
    with pytest.raises(ValueError) as err:
        convention_of(_keywords_only)
    assert str(err.value) == ("fits the calls of verl and trl alike; say which with reward.convention = 'verl' or "
                              f"'trl', or write it in one of the three accepted shapes {THREE_SHAPES}")
    with pytest.raises(ValueError) as none:
        convention_of(_two)
    assert str(none.value).startswith(f"fits none of the three accepted shapes {THREE_SHAPES[:-1]});")
    docs = (ROOT / "docs" / "rewards.md").read_text()
    quoted = next(line for line in docs.splitlines() if line.startswith("reward.function = 'mypkg.rewards:score' "
                                                                         "(in /home/me/study/mypkg/rewards.py) fits"))
    assert quoted == f"reward.function = 'mypkg.rewards:score' (in /home/me/study/mypkg/rewards.py) {err.value}"
    (tmp_path / "keywords_reward.py").write_text("def score(**kwargs):\n    return 1.0\n")
    out = run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml",
                  "--set", "reward.function=keywords_reward:score", env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert (f"reward.function = 'keywords_reward:score' (in {tmp_path / 'keywords_reward.py'}) {err.value}"
            in " ".join(out.stderr.split()))


def test_validate_refuses_a_function_of_no_shape_naming_the_file(tmp_path):
    (tmp_path / "shapeless_reward.py").write_text("def score(text):\n    return 1.0\n")
    out = run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml",
                  "--set", "reward.function=shapeless_reward:score",
                  env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert (f"reward.function = 'shapeless_reward:score' (in {tmp_path / 'shapeless_reward.py'}) fits none of the "
            "three accepted shapes (scalectl: f(completion, gold, fields)") in out.stderr
    assert "verl: compute_score(" in out.stderr and "trl: reward_func(completions, **kwargs)" in out.stderr
    ok = run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml",
                 "--set", "reward.function=shapeless_reward:score", "--set", "reward.convention=verl",
                 env={"PYTHONPATH": str(tmp_path)})
    assert ok.returncode == 2 and "cannot be called as reward.convention = 'verl' calls it" in ok.stderr


#: A function of each convention as a user writes it, and the call validate says it gets.
VALIDATE_CASES = [
    ("scalectl", "def score(completion, gold, fields):\n    return 1.0\n", "score",
     "f(completion, gold, fields) or f(completion, gold, **fields), returning a float or a Score"),
    ("verl", "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
     "compute_score", "compute_score(data_source, solution_str, ground_truth, extra_info=None), returning a "
     "float or a dict with a 'score' key"),
    ("trl", "def reward_func(completions, **kwargs):\n    return [1.0 for _ in completions]\n", "reward_func",
     "reward_func(completions, **kwargs) over a batch (prompts, completions, completion_ids and the row's columns "
     "as keyword lists), returning a list of floats or None"),
]


@pytest.mark.parametrize("convention,source,attr,call", VALIDATE_CASES)
def test_validate_names_the_convention_it_recognised(tmp_path, convention, source, attr, call):
    (tmp_path / "users_reward.py").write_text(source)
    name = f"users_reward:{attr}"
    for setup in (["--setup", "setups/tiny-cpu.toml"], []):
        args = ("validate", "recipes/scalerl.toml", *setup, "--set", f"reward.function={name}")
        proc = run_cli(*args, env={"PYTHONPATH": str(tmp_path)}, check=True)
        said = [line for line in proc.stdout.splitlines() if line.startswith("# reward: ")]
        assert said == [f"# reward: reward.function = {name!r}: convention {convention} (recognised from its "
                        f"signature), called as {call}"], proc.stdout
        data = json.loads(run_cli(*args, "--json", env={"PYTHONPATH": str(tmp_path)}, check=True).stdout)
        assert data[0]["reward_convention"] == {"convention": convention, "from": "signature"}
    declared = run_cli("validate", "recipes/scalerl.toml", "--set", f"reward.function={name}", "--set",
                       f"reward.convention={convention}", env={"PYTHONPATH": str(tmp_path)}, check=True)
    assert (f"# reward: reward.function = {name!r}: convention {convention} (as reward.convention says), "
            f"called as {call}") in declared.stdout.splitlines()


def test_validate_of_the_built_in_checker_names_no_convention():
    proc = run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml", check=True)
    assert "# reward:" not in proc.stdout
    data = json.loads(run_cli("validate", "recipes/scalerl.toml", "--json", check=True).stdout)
    assert data[0]["reward_convention"] is None


# --------------------------------------------------------------------------- the recipe key


def test_the_convention_key_keeps_stored_hashes_at_its_default_and_is_checked():
    base = "c33f6230083a"                    # scalerl on tiny-cpu (setup of 2026-12-07: reward.truncated = -1, the rest of [reward] at its defaults)
    assert load("scalerl", setup="tiny-cpu").content_hash == base
    assert load("scalerl", setup="tiny-cpu").reward.convention is None
    mine = ["reward.function=custom_rewards:digit_share"]
    hashes = {c: load("scalerl", setup="tiny-cpu", overrides=[*mine, f"reward.convention={c}"]).content_hash
              for c in ("scalectl", "verl", "trl")}
    plain = load("scalerl", setup="tiny-cpu", overrides=mine).content_hash
    assert len({plain, *hashes.values()}) == 4
    with pytest.raises(UserError, match="reward.convention = 'openrlhf' is not one of: scalectl, verl, trl"):
        load("scalerl", setup="tiny-cpu", overrides=["reward.convention=openrlhf"])
    with pytest.raises(UserError, match="reward.convention = 'verl' applies to a function of your own, not the "
                                        "built-in checker"):
        load("scalerl", setup="tiny-cpu", overrides=["reward.convention=verl"])


@pytest.mark.parametrize("source,name", [
    ("hf:openai/gsm8k", "openai/gsm8k"), ("data/math/gsm8k-test.jsonl", "gsm8k-test"),
    ("synthetic:arithmetic", "synthetic:arithmetic"), ("/x/y/dapo.parquet", "dapo"),
])
def test_verls_data_source_defaults_to_the_sets_name(source, name):
    assert dataset_name(source) == name


# --------------------------------------------------------------------------- values


def test_verls_values_are_read_as_verl_reads_them():
    assert verl_score(0.25) == Score(0.25, True) and verl_score(-1) == Score(-1.0, False)
    assert verl_score(True) == Score(1.0, True) and verl_score(False) == Score(0.0, False)
    assert verl_score({"score": 0.5}) == Score(0.5, True)
    assert verl_score({"score": 1.0, "acc": False, "pred": "7"}) == Score(1.0, False)
    assert verl_score({"score": -1.0, "acc": True}) == Score(-1.0, True)
    with pytest.raises(TypeError, match="returned a dict without a 'score' key \\(keys: 'reward'\\)"):
        verl_score({"reward": 1.0})
    with pytest.raises(TypeError, match="'acc' is str 'yes', not a bool or a number"):
        verl_score({"score": 1.0, "acc": "yes"})
    with pytest.raises(ValueError, match="returned the reward nan"):
        verl_score({"score": float("nan")})


def test_trls_values_are_one_per_completion_none_not_applicable():
    assert trl_scores([1.0, None, -0.5, 0], 4) == [Score(1.0, True), Score(0.0, False), Score(-0.5, False),
                                                   Score(0.0, False)]
    assert trl_scores(torch.tensor([0.5, -0.5]), 2) == [Score(0.5, True), Score(-0.5, False)]
    with pytest.raises(TypeError, match="returned 3 value\\(s\\) for a batch of 4 completions"):
        trl_scores([1.0, 1.0, 1.0], 4)
    with pytest.raises(TypeError, match="returned float '1.0': a TRL reward function returns a list"):
        trl_scores(1.0, 1)
    with pytest.raises(TypeError, match="returned str 'x'.*\\(entry 1 of its list\\)"):
        trl_scores([1.0, "x"], 2)


def test_a_verl_function_gets_the_rows_data_source_and_extra_info(module_in, tmp_path):
    module_in("verl_rewards_mine", VERL_FILE)
    score = Scorer("verl_rewards_mine:compute_score", dataset="gsm8k-test")
    verl_row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+2?"}],
                "reward_model": {"ground_truth": "3", "style": "rule"}, "extra_info": {"split": "test", "index": 7}}
    plain_row = {"question": "1+1?", "answer": "#### 2", "level": 3}
    got = [score("12ab", _row("1+2?", "3", verl_row)),
           score("1234", _row("1+1?", "2", plain_row)),
           score("x", Problem(2, "4+4?", "8"))]
    assert got == [Score(0.0, True), Score(0.5, False), Score(-0.5, False)]
    calls = _log(tmp_path / "log")
    assert [(c["data_source"], c["extra_info"], c["ground_truth"]) for c in calls] == [
        ("openai/gsm8k", {"split": "test", "index": 7}, "3"),     # verl's layout: its columns
        ("gsm8k-test", plain_row, "2"),                           # the set's name, the other columns
        ("gsm8k-test", {}, "8")]
    assert {c["ppid"] for c in calls} == {os.getpid()} and {c["pid"] for c in calls} != {os.getpid()}
    several = score("7", Problem(3, "?", Gold(("4", "7"))))       # once per gold answer: the best counts
    assert several == Score(0.5, True) and [c["ground_truth"] for c in _log(tmp_path / "log")[3:]] == ["4", "7"]


def test_a_trl_function_scores_a_group_in_one_call(module_in, tmp_path):
    module_in("trl_rewards_mine", TRL_FILE)
    score = Scorer("trl_rewards_mine:reward_func")
    texts, ids = ["12", "ab", "a1", "3"], [[5, 6], [7, 8], [9], [1]]
    assert score.group(texts, Problem(0, "1+2=", "3"), ids) == [Score(2.0, True), Score(1.0, True),
                                                                  Score(1.5, True), Score(2.0, True)]
    assert score.group(texts, Problem(1, "2+2=", "4"), ids) == [Score(0.0, False), Score(0.0, False),
                                                                  Score(-0.5, False), Score(0.0, False)]
    row = {"question": "5+1?", "answer": "6", "prompt": "ignored", "level": 2}
    assert score.group(["6"], _row("5+1?", "6", row), [[4]]) == [Score(0.0, False)]
    calls = _log(tmp_path / "log")
    assert [(c["n"], c["keys"], c["prompts"], c["answers"]) for c in calls] == [
        (4, ["prompts"], 1, ["3"]), (4, ["prompts"], 1, ["4"]),
        (1, ["level", "prompts", "question"], 1, ["6"])]          # the row's columns, but its prompt


def test_the_shape_score_completion_gold_row_keywords(module_in):
    """``f(completion, gold, **row)``: the row's columns as keywords, but those named as the
    first two parameters (the gold is the second)."""
    module_in("keyword_rewards_mine", """
        def score(completion, gold, **row):
            return float(row.get("level", 0)) + (1.0 if completion == gold else 0.0) + 0.1 * len(row)
    """)
    score = Scorer("keyword_rewards_mine:score")
    row = {"level": 3, "gold": "not passed again", "question": "q"}
    assert score("5", _row("?", "5", row)) == Score(4.0 + 0.1 * 2, True)
    assert score("4", Problem(1, "?", "5")) == Score(0.0, False)


def test_a_failing_foreign_function_is_a_clear_error_naming_it(module_in):
    module_in("bad_trl_mine", """
        def short(completions, **kwargs):
            return [1.0]

        def needs_a_column(completions, solution, **kwargs):
            return [1.0 for _ in completions]
    """)
    module_in("bad_verl_mine", """
        def no_score(data_source, solution_str, ground_truth, extra_info=None):
            return {"reward": 1.0}
    """)
    with pytest.raises(RewardFunctionError) as err:
        Scorer("bad_trl_mine:short").group(["a", "b"], Problem(0, "1+2=", "3"))
    assert str(err.value).startswith("reward.function = 'bad_trl_mine:short' returned 1 value(s) for a batch of 2 "
                                     "completions: a TRL reward function returns one float (or None) per completion, "
                                     "on a batch of 2 completions of the prompt '1+2=' (the first: 'a')"), str(err.value)
    with pytest.raises(RewardFunctionError, match="'bad_trl_mine:needs_a_column' raised TypeError: .*'solution'"):
        Scorer("bad_trl_mine:needs_a_column").group(["a"], Problem(0, "1+2=", "3"))
    with pytest.raises(RewardFunctionError, match="'bad_verl_mine:no_score' returned a dict without a 'score' key"):
        Scorer("bad_verl_mine:no_score")("a", Problem(0, "1+2=", "3"))
    with pytest.raises(RewardFunctionError, match=r"reward.function = 'bad_verl_mine:no_score' \(in .*bad_verl_mine.py\) "
                                                  r"cannot be called as reward.convention = 'trl' calls it"):
        Scorer("bad_verl_mine:no_score", convention="trl")("a", Problem(0, "1+2=", "3"))


def test_scorer_for_names_the_set_and_passes_the_convention_and_the_truncated_reward():
    recipe = load("scalerl", setup="tiny-cpu", overrides=["reward.function=custom_rewards:digit_share",
                                                          "reward.convention=scalectl"])
    # tiny-cpu sets reward.truncated = -1
    assert scorer_for(recipe) == Scorer("custom_rewards:digit_share", "boxed", 5.0, "scalectl", "synthetic:arithmetic",
                                        -1.0)


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: the rewards are what is tested)."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


P, G, STEPS, EVAL_PROMPTS, K = 4, 4, 2, 8, 2
SETS = [f"batch.prompts_per_step={P}", f"batch.generations_per_prompt={G}", f"eval.prompts={EVAL_PROMPTS}",
        f"eval.samples_per_prompt={K}", "eval.every_steps=2", "data.train_size=40", f"budget.steps={STEPS}",
        "length.max_new_tokens=16", "length.control=none", "filter.zero_variance=false", "logging.rollouts=true",
        "checkpoint.every_steps=100", "reward.truncated=as_written"]   # an untrained policy: most completions are cut


def _run(kind: str, mode: list[str], tmp_path: Path, policy: str):
    """Run ``kind``'s function (written into ``tmp_path / 'mine'``) through ``scalectl run``;
    returns the recipe, the run folder, the store's points and the function's calls."""
    from scalectl.store.database import Store

    module, text, attr, _ = KINDS[kind]
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / f"{module}.py").write_text(text)
    sets = [f"model.path={policy}", *SETS, f"reward.function={module}:{attr}", *mode]
    db, log = tmp_path / "s.db", tmp_path / "log"
    env = {LOG_ENV: str(log), "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    run_cli("run", "recipes/scalerl.toml", "--name", kind, "--runs-dir", str(tmp_path / "runs"),
            *[a for s in sets for a in ("--set", s)], db=db, check=True, timeout=600, env=env)
    with Store.open(db) as store:
        points = store.points(store.get_run(kind)["id"])
    recipe = load("recipes/scalerl.toml", "setups/tiny-cpu.toml", sets)
    return recipe, tmp_path / "runs" / kind, points, _log(log)


def _check_store(kind: str, recipe, run_dir: Path, points: list[dict]) -> list[dict]:
    """The store's pass rates are the share of odd gold answers among the held-out prompts (the
    function's correctness), every trained reward in rollouts.jsonl is the function's of its
    completion, and the last point's train_reward is the mean of its step's."""
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.policy.model import build_tokenizer

    train, held = load_prompt_sets(recipe)
    odd = sum(int(p.answer) % 2 for p in held) / len(held)
    assert 0 < odd < 1                                               # both kinds of prompt are held out
    assert [p["step"] for p in points] == [0, STEPS]
    assert [p["pass_rate"] for p in points] == [pytest.approx(odd, abs=1e-12)] * 2
    tok, reward = build_tokenizer(), KINDS[kind][3]
    lines = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == STEPS * P * G
    for x in lines:
        want, _ = reward(tok.decode(x["token_ids"], skip_special_tokens=True), train[x["prompt_id"]].answer,
                         x["token_ids"])
        assert x["reward"] == float(torch.tensor(want)), x
    assert len({x["reward"] for x in lines}) > 2
    last = [x["reward"] for x in lines if x["step"] == STEPS - 1]
    assert points[-1]["train_reward"] == pytest.approx(sum(last) / len(last), rel=1e-6)
    return lines


@pytest.mark.parametrize("kind", ["verl", "trl"])
def test_a_sync_run_stores_what_the_foreign_function_said(kind, tmp_path, policy):
    """sync in one process: the function is called from the run's process for every training
    and every evaluation completion; TRL's once per group (G training completions, k held-out)."""
    recipe, run_dir, points, calls = _run(kind, ["async.mode=sync"], tmp_path, policy)
    assert recipe.reward.convention is None                          # recognised from the signature
    _check_store(kind, recipe, run_dir, points)
    assert len({c["ppid"] for c in calls}) == 1
    evaluated = len(points) * EVAL_PROMPTS * K
    if kind == "verl":
        assert len(calls) == STEPS * P * G + evaluated
        assert {c["data_source"] for c in calls} == {"synthetic:arithmetic"} and all(c["extra_info"] == {}
                                                                                     for c in calls)
    else:
        assert sorted(c["n"] for c in calls) == [K] * (evaluated // K) + [G] * (STEPS * P)
        assert all(c["keys"] == ["prompts"] and c["prompts"] == 1 and len(c["answers"]) == 1 for c in calls)


@pytest.mark.slow   # ~2 min on a busy 2-core machine each: three processes start and import torch
@pytest.mark.parametrize("kind", ["verl", "trl"])
def test_a_pipeline_with_two_generators_stores_what_the_foreign_function_said(kind, tmp_path, policy):
    """pipeline with 2 generator processes: both generators and the evaluating trainer call the
    function (TRL's: the generators once per group of G, the trainer once per held-out prompt)."""
    recipe, run_dir, points, calls = _run(kind, ["hardware.generators=2", "async.k=1"], tmp_path, policy)
    _check_store(kind, recipe, run_dir, points)
    tasks = json.loads((run_dir / "pipeline" / "tasks.json").read_text())["tasks"]
    by_role = {t["pid"]: t["role"] for t in tasks}
    parents = [c["ppid"] for c in calls]
    assert set(parents) == set(by_role)                              # both generators and the trainer
    trainer = next(pid for pid, role in by_role.items() if role == "trainer")
    mine = [c for c in calls if c["ppid"] == trainer]
    generated = [c for c in calls if c["ppid"] != trainer]
    if kind == "verl":
        assert len(mine) == len(points) * EVAL_PROMPTS * K and len(generated) >= STEPS * P * G
    else:
        assert [c["n"] for c in mine] == [K] * (len(points) * EVAL_PROMPTS)
        assert {c["n"] for c in generated} == {G} and len(generated) >= STEPS * P
