"""The precedence of a run's layers: setup < recipe file (with extends) < --set, everywhere
recipes are merged, and every override of another layer's value named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from scalectl import presets
from scalectl.ablation.planner import AblationSpec, VariantSpec, plan, read_ablation
from scalectl.errors import UserError
from scalectl.recipe.layers import Layer
from scalectl.recipe.layers import overridden as find_overridden
from scalectl.recipe.load import flatten, load, read_layered

TINY = ROOT / "setups" / "tiny-cpu.toml"

#: The presets' hashes on every packaged setup, computed before the recipe layer won over
#: the setup's (tiny-cpu's as of 2026-12-07, its fit window and R0 rule): the presets set no key a setup sets, so none may change.
PRESET_HASHES = {
    ("dapo", "paper-8b"): "dfb195763591", ("dapo", "simulated"): "3e24a24818a9",
    ("dapo", "tiny-cpu"): "5dec8927b562", ("grpo", "paper-8b"): "500062dd6b3f",
    ("grpo", "simulated"): "82e99b2a232a", ("grpo", "tiny-cpu"): "0ff0b1a33475",
    ("magistral", "paper-8b"): "900247e1d00f", ("magistral", "simulated"): "02f0197c1d26",
    ("magistral", "tiny-cpu"): "16d45f77699a", ("minimax", "paper-8b"): "85933c424e22",
    ("minimax", "simulated"): "1b1ffe22eacf", ("minimax", "tiny-cpu"): "d0a02d518a99",
    ("scalerl", "paper-8b"): "fdfd9973b9e2", ("scalerl", "simulated"): "872de0243297",
    ("scalerl", "tiny-cpu"): "c33f6230083a",
}


@pytest.fixture
def study(tmp_path) -> Path:
    """A folder with recipes/lr.toml (scalerl with lr 0.5), batch.toml (64 prompts per step)
    and data.toml (its own prompt file)."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "lr.toml").write_text('extends = "scalerl"\n[optim]\nlr = 0.5\n')
    (recipes / "batch.toml").write_text('extends = "scalerl"\n[batch]\nprompts_per_step = 64\n')
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (recipes / "data.toml").write_text(f'extends = "scalerl"\n[data]\nsource = "{tmp_path / "prompts.jsonl"}"\n')
    return tmp_path


def test_a_key_the_recipe_sets_wins_over_the_setup(study):
    overridden: list = []
    lr = load(study / "recipes/lr.toml", TINY, overridden=overridden)
    assert lr.optim.lr == 0.5                               # was 2e-4, the setup's, in silence
    assert lr.optim.warmup_steps == 5                       # what the recipe leaves unset: the setup's
    assert lr.content_hash != load("scalerl", "tiny-cpu").content_hash == "c33f6230083a"
    assert [str(o) for o in overridden] == [
        f"optim.lr = 0.5 from {study / 'recipes/lr.toml'} overrides 0.0002 from setups/tiny-cpu.toml"]
    assert load(study / "recipes/batch.toml", TINY).batch.prompts_per_step == 64     # setup: 32
    data = load(study / "recipes/data.toml", TINY)
    assert data.data.source == str(study / "prompts.jsonl")                        # setup: synthetic
    assert data.data.difficulty == 3                                                # the setup's own


def test_set_wins_over_both_and_names_every_layer_it_replaced(study):
    overridden: list = []
    r = load(study / "recipes/lr.toml", TINY, ["optim.lr=3e-5", "batch.prompts_per_step=16"],
             overridden=overridden)
    assert (r.optim.lr, r.batch.prompts_per_step) == (3e-5, 16)
    assert [str(o) for o in overridden] == [
        "batch.prompts_per_step = 16 from --set batch.prompts_per_step overrides 32 from setups/tiny-cpu.toml",
        (f"optim.lr = 3e-05 from --set optim.lr overrides 0.5 from {study / 'recipes/lr.toml'} "
         "and 0.0002 from setups/tiny-cpu.toml")]
    same: list = []
    load(study / "recipes/lr.toml", TINY, ["optim.lr=0.5"], overridden=same)
    assert [o.key for o in same] == ["optim.lr"] and [s for _, s in same[0].replaced] == [str(TINY)]
    # a file over the one it extends is the recipe's own layer, not an override
    alone: list = []
    assert load(study / "recipes/lr.toml", overridden=alone).optim.lr == 0.5 and alone == []


def test_presets_set_no_key_a_setup_sets_so_their_hashes_stay():
    for (recipe, setup), digest in PRESET_HASHES.items():
        r_keys = set(flatten(read_layered(presets.packaged("recipes", recipe))[0]))
        s_keys = set(flatten(read_layered(presets.packaged("setups", setup))[0])) - {"name", "description"}
        assert r_keys & s_keys == set(), (recipe, setup)
        overridden: list = []
        assert load(recipe, setup, overridden=overridden).content_hash == digest, (recipe, setup)
        assert overridden == []


def test_validate_keeps_the_recipe_value_and_names_the_override(study):
    proc = run_cli("validate", "recipes/lr.toml", "--setup", "tiny-cpu", cwd=study, check=True)
    assert "# override: optim.lr = 0.5 from recipes/lr.toml overrides 0.0002 from setups/tiny-cpu.toml" \
        in proc.stdout.splitlines()
    assert "lr = 0.5" in proc.stdout.splitlines() and "lr = 0.0002" not in proc.stdout
    assert "c33f6230083a" not in proc.stdout
    data = json.loads(run_cli("validate", "recipes/lr.toml", "--setup", "tiny-cpu", "--json",
                              cwd=study, check=True).stdout)
    assert data[0]["recipe"]["optim"]["lr"] == 0.5
    assert data[0]["overridden"] == [{"key": "optim.lr", "value": 0.5, "from": "recipes/lr.toml",
                                      "overrides": [{"value": 0.0002, "from": "setups/tiny-cpu.toml"}]}]
    explained = run_cli("validate", "--explain", "optim", "recipes/lr.toml", "--setup", "tiny-cpu",
                        cwd=study, check=True).stdout
    assert "lr = 0.5            (set in recipes/lr.toml; overrides 0.0002 from setups/tiny-cpu.toml)" in explained
    assert "warmup_steps = 5    (set in setups/tiny-cpu.toml)" in explained


def test_run_says_which_value_overrode_which(study):
    proc = run_cli("run", "recipes/lr.toml", "--dry-run", "--set", "budget.steps=10", cwd=study)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "override: optim.lr = 0.5 from recipes/lr.toml overrides 0.0002 from setups/tiny-cpu.toml" in lines
    assert "override: budget.steps = 10 from --set budget.steps overrides 1000 from setups/tiny-cpu.toml" in lines
    assert any("lr 0.5 (warm-up 5)" in ln for ln in lines)


#: (command, --setup given, --set values) -> the override lines it prints, each naming where the
#: replaced value was set: the recipe file (0.5), the setup (0.0002 and 750), or nowhere (a
#: schema default: no line).  ``run`` merges the default setup when --setup is not given.
OVERRIDE_CASES = [
    ("validate", False, ["optim.lr=3e-5"],
     ["optim.lr = 3e-05 from --set optim.lr overrides 0.5 from recipes/lr.toml"]),
    ("validate", False, ["budget.steps=10"], []),
    ("validate", False, [], []),
    ("validate", True, [], ["optim.lr = 0.5 from recipes/lr.toml overrides 0.0002 from setups/tiny-cpu.toml"]),
    ("validate", True, ["optim.lr=3e-5"],
     ["optim.lr = 3e-05 from --set optim.lr overrides 0.5 from recipes/lr.toml and 0.0002 from setups/tiny-cpu.toml"]),
    ("validate", True, ["budget.steps=10"],
     ["budget.steps = 10 from --set budget.steps overrides 1000 from setups/tiny-cpu.toml",
      "optim.lr = 0.5 from recipes/lr.toml overrides 0.0002 from setups/tiny-cpu.toml"]),
    ("run", False, ["optim.lr=3e-5"],
     ["optim.lr = 3e-05 from --set optim.lr overrides 0.5 from recipes/lr.toml and 0.0002 from setups/tiny-cpu.toml"]),
    ("run", True, ["optim.lr=3e-5", "budget.steps=10"],
     ["budget.steps = 10 from --set budget.steps overrides 1000 from setups/tiny-cpu.toml",
      "optim.lr = 3e-05 from --set optim.lr overrides 0.5 from recipes/lr.toml and 0.0002 from setups/tiny-cpu.toml"]),
]


@pytest.mark.parametrize("command,with_setup,sets,expected", OVERRIDE_CASES)
def test_an_override_line_names_where_the_replaced_value_was_set(study, command, with_setup, sets, expected):
    """Without --setup, validate named a value the recipe file set as set by --set
    (``overrides 0.5 from --set optim.lr``): the recipe layer shared the loader's origin table."""
    args = [command, "recipes/lr.toml", *(["--dry-run"] if command == "run" else []),
            *(["--setup", "tiny-cpu"] if with_setup else []), *(a for s in sets for a in ("--set", s))]
    proc = run_cli(*args, cwd=study, check=True)
    prefix, text = ("# override: ", proc.stdout) if command == "validate" else ("override: ", proc.stderr)
    assert [ln[len(prefix):] for ln in text.splitlines() if ln.startswith(prefix)] == expected
    if command == "validate":
        data = json.loads(run_cli(*args, "--json", cwd=study, check=True).stdout)
        assert [[r["from"] for r in o["overrides"]] for o in data[0]["overridden"]] == [
            re.findall(r"from (\S+)", line.split(" overrides ", 1)[1]) for line in expected]


def test_a_layer_keeps_the_sources_it_was_made_with():
    origin = {"optim.lr": "recipes/lr.toml"}
    layer = Layer({"optim.lr": 0.5}, origin, "recipes/lr.toml")
    origin["optim.lr"] = "--set optim.lr"              # the loader fills its table on
    top = Layer({"optim.lr": 3e-5}, {"optim.lr": "--set optim.lr"}, "--set")
    assert layer.source("optim.lr") == "recipes/lr.toml"
    assert [str(o) for o in find_overridden([layer, top])] == [
        "optim.lr = 3e-05 from --set optim.lr overrides 0.5 from recipes/lr.toml"]


def test_a_recipe_file_variant_trains_its_own_value(study):
    spec = AblationSpec("lr", "variants", None, setup=TINY, baseline="base",
                        variants=(VariantSpec("base", recipe=presets.packaged("recipes", "scalerl")),
                                  VariantSpec("lr", recipe=study / "recipes/lr.toml")))
    p = plan(spec)
    lr = p.variant("lr")
    assert [str(c) for c in lr.changes] == ["optim.lr 0.0002 -> 0.5"]
    assert lr.recipe_hash != p.variant("base").recipe_hash


def _refusal(tmp_path, variant_text: str, ablation_set: str = "") -> str:
    (tmp_path / "v.toml").write_text('extends = "scalerl"\n' + variant_text)
    (tmp_path / "a.toml").write_text(
        f'kind = "variants"\nsetup = "{TINY}"\n{ablation_set}\n'
        f'[[variants]]\nname = "base"\nrecipe = "{presets.packaged("recipes", "scalerl")}"\n'
        '[[variants]]\nname = "v"\nrecipe = "v.toml"\nset = ["hardware.threads=1"]\n')
    with pytest.raises(UserError) as exc:
        plan(read_ablation(tmp_path / "a.toml"))
    return str(exc.value)


def test_a_variant_that_resolves_to_the_base_is_refused_naming_its_keys(tmp_path):
    why = _refusal(tmp_path, "[optim]\nlr = 0.5\n", 'set = ["optim.lr=0.001"]')
    assert why.startswith("variant v trains exactly what base trains (content hash ")
    assert f"optim.lr = 0.5 from {tmp_path / 'v.toml'} is overridden by 0.001 from --set optim.lr" in why
    why = _refusal(tmp_path, "[optim]\nlr = 2e-4\n[checkpoint]\nevery_steps = 7\n")
    assert f"optim.lr = 0.0002 from {tmp_path / 'v.toml'} is base's own value" in why
    assert f"checkpoint.every_steps (from {tmp_path / 'v.toml'}) is left out of the content hash" in why
    assert "hardware.threads (from --set hardware.threads) is left out of the content hash" in why
    assert "would reuse base's runs and report a tie" in why
