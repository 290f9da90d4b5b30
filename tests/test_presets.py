"""Presets shipped in the package: names that work from any folder, `scalectl recipes`, `scalectl init`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from scalectl import presets
from scalectl.errors import UserError
from scalectl.recipe.load import load

RECIPES = ["dapo", "grpo", "magistral", "minimax", "scalerl"]


def test_the_repository_folders_are_the_packaged_presets():
    """recipes/, setups/, ablations/ at the top of a checkout are the package's files, not copies."""
    for kind in presets.KINDS:
        assert (ROOT / kind).resolve() == (presets.root() / kind).resolve()
    assert presets.names("recipes") == RECIPES
    assert presets.names("setups") == ["paper-8b", "simulated", "tiny-cpu"]
    assert presets.names("ablations") == ["async-forward", "loss-forward", "recipes", "scalerl-loo"]


def test_recipes_lists_descriptions_and_the_hashes_validate_gives(tmp_path):
    listed = json.loads(run_cli("recipes", "--json", cwd=tmp_path, check=True).stdout)
    recipes = {r["name"]: r for r in listed if r["kind"] == "recipe"}
    assert sorted(recipes) == RECIPES
    for name, row in recipes.items():
        path = ROOT / "recipes" / f"{name}.toml"
        checked = json.loads(run_cli("validate", str(path), "--setup", str(ROOT / "setups" / "tiny-cpu.toml"),
                                     "--json", check=True).stdout)
        assert row["hash"] == checked[0]["hash"]
        assert row["description"] == checked[0]["recipe"]["description"] != ""
    setups = {r["name"]: r["description"] for r in listed if r["kind"] == "setup"}
    assert setups["tiny-cpu"].startswith("tiny CPU setup")
    assert {r["name"] for r in listed if r["kind"] == "ablation"} == set(presets.names("ablations"))


def test_names_work_from_an_empty_folder_and_give_the_files_hash(tmp_path):
    by_name = json.loads(run_cli("validate", "scalerl", "--setup", "tiny-cpu", "--json", cwd=tmp_path,
                                 check=True).stdout)
    by_path = json.loads(run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml",
                                 "--json", check=True).stdout)
    assert by_name[0]["hash"] == by_path[0]["hash"]
    tiny = tomllib.loads((ROOT / "setups" / "tiny-cpu.toml").read_text())
    assert by_name[0]["recipe"]["batch"]["prompts_per_step"] == tiny["batch"]["prompts_per_step"]  # merged
    # `run` finds the default setup in the package when the folder has none
    proc = run_cli("run", "grpo", "--dry-run", "--json", cwd=tmp_path, check=True)
    plan = json.loads(proc.stdout)
    assert plan["hash"] == load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "tiny-cpu.toml").content_hash
    assert not (tmp_path / "scalectl.db").exists()


def test_the_leave_one_out_ablation_plans_from_an_empty_folder(tmp_path):
    proc = run_cli("ablate", "--leave-one-out", "--dry-run", "--json", cwd=tmp_path, check=True)
    plan = json.loads(proc.stdout)["plan"]
    assert [v["name"] for v in plan["variants"]][:2] == ["base", "loo-plan"]
    assert len(plan["variants"]) == 8
    proc = run_cli("ablate", "scalerl-loo", "--dry-run", "--json", cwd=tmp_path, check=True)
    assert sum(len(v["runs"]) for v in json.loads(proc.stdout)["plan"]["variants"]) == 8


def test_a_file_path_wins_over_a_preset_name(tmp_path):
    (tmp_path / "scalerl").write_text('[loss]\ntype = "gspo"\n')       # a file called like the preset
    got = json.loads(run_cli("validate", "scalerl", "--json", cwd=tmp_path, check=True).stdout)
    assert got[0]["recipe"]["loss"]["type"] == "gspo"
    (tmp_path / "scalerl").unlink()
    got = json.loads(run_cli("validate", "scalerl", "--json", cwd=tmp_path, check=True).stdout)
    assert got[0]["recipe"]["loss"]["type"] == "cispo"


def test_an_unknown_name_lists_the_presets(tmp_path):
    proc = run_cli("run", "scalerll", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2
    assert "scalerll: no such file, and not the name of a recipe preset" in proc.stderr
    assert "dapo, grpo, magistral, minimax, scalerl" in proc.stderr
    proc = run_cli("validate", "scalerl", "--setup", "tiny", cwd=tmp_path)
    assert proc.returncode == 2 and "setups: paper-8b, simulated, tiny-cpu" in proc.stderr


def test_extends_a_preset_by_name_outside_the_presets_folders(tmp_path):
    (tmp_path / "mine.toml").write_text('extends = "scalerl"\n[precision]\nlm_head = "bf16"\n')
    got = json.loads(run_cli("validate", "mine.toml", "--json", cwd=tmp_path, check=True).stdout)[0]["recipe"]
    assert (got["name"], got["precision"]["lm_head"], got["loss"]["type"]) == ("mine", "bf16", "cispo")
    assert got["async"]["mode"] == "pipeline"            # inherited from the packaged scalerl.toml


@pytest.mark.slow
def test_init_copies_the_presets_and_an_edited_copy_is_what_a_name_means_there(tmp_path):
    proc = run_cli("init", "work", "--json", cwd=tmp_path, check=True)
    written = [Path(p) for p in json.loads(proc.stdout)]
    assert len(written) == sum(len(presets.names(k)) for k in presets.KINDS) + len(presets.EXTRA_FILES)
    for kind in presets.KINDS:
        for name in presets.names(kind):
            copy = tmp_path / "work" / kind / f"{name}.toml"
            assert copy.read_bytes() == (presets.root() / kind / f"{name}.toml").read_bytes()
    work = tmp_path / "work"
    # a second init refuses to overwrite, and leaves the edited file alone
    edited = work / "recipes" / "scalerl.toml"
    edited.write_text(edited.read_text().replace("retire_threshold = 0.9", "retire_threshold = 0.8"))
    proc = run_cli("init", "work", cwd=tmp_path)
    assert proc.returncode == 2 and "would overwrite" in proc.stderr and "--force" in proc.stderr
    assert "retire_threshold = 0.8" in edited.read_text()
    # in that folder the name means the edited copy; elsewhere the packaged preset
    here = json.loads(run_cli("validate", "scalerl", "--json", cwd=work, check=True).stdout)[0]
    elsewhere = json.loads(run_cli("validate", "scalerl", "--json", cwd=tmp_path, check=True).stdout)[0]
    assert (here["recipe"]["filter"]["retire_threshold"], elsewhere["recipe"]["filter"]["retire_threshold"]) == (0.8, 0.9)
    # and `scalectl recipes` there lists the copy, with the hash a run of it gets
    listed = {r["name"]: r for r in json.loads(run_cli("recipes", "--json", cwd=work, check=True).stdout)
              if r["kind"] == "recipe"}
    run_hash = json.loads(run_cli("run", "scalerl", "--dry-run", "--json", cwd=work, check=True).stdout)["hash"]
    assert listed["scalerl"]["where"] == "here" and listed["scalerl"]["hash"] == run_hash
    packaged = next(r for r in json.loads(run_cli("recipes", "--json", cwd=tmp_path, check=True).stdout)
                    if r["kind"] == "recipe" and r["name"] == "scalerl")
    assert packaged["where"] == "packaged" and packaged["hash"] != listed["scalerl"]["hash"]
    # the copied ablation's relative paths point at the copies
    plan = json.loads(run_cli("ablate", "scalerl-loo", "--dry-run", "--json", cwd=work, check=True).stdout)["plan"]
    assert (work / plan["base"]).resolve() == edited.resolve()
    assert (work / plan["setup"]).resolve() == (work / "setups" / "tiny-cpu.toml").resolve()
    run_cli("init", "work", "--force", cwd=tmp_path, check=True)
    assert "retire_threshold = 0.9" in edited.read_text()


def test_validate_alone_names_the_hash_and_values_a_run_has(tmp_path):
    """Checked without a setup, a recipe shows its own values and the hash `recipes` lists for a run of it."""
    listed = {r["name"]: r["hash"] for r in json.loads(run_cli("recipes", "--json", cwd=tmp_path,
                                                                check=True).stdout) if r["kind"] == "recipe"}
    got = json.loads(run_cli("validate", "scalerl", "--json", cwd=tmp_path, check=True).stdout)[0]
    assert got["hash"] != got["run_hash"] == listed["scalerl"]
    recipe = load(ROOT / "recipes" / "scalerl.toml").to_dict()          # the recipe alone, defaults filled
    tiny = tomllib.loads((ROOT / "setups" / "tiny-cpu.toml").read_text())
    changes = {k: (was, now) for k, was, now in got["run_changes"]}
    assert changes["length.max_new_tokens"] == (recipe["length"]["max_new_tokens"], tiny["length"]["max_new_tokens"])
    assert changes["batch.prompts_per_step"] == (recipe["batch"]["prompts_per_step"], tiny["batch"]["prompts_per_step"])
    assert "loss.type" not in changes                                   # the setup leaves the loss alone
    proc = run_cli("validate", "scalerl", cwd=tmp_path, check=True)
    assert f"hash {listed['scalerl']} on the default setup" in proc.stdout
    assert "length.max_new_tokens 14336 -> 20" in proc.stdout
    with_setup = json.loads(run_cli("validate", "scalerl", "--setup", "tiny-cpu", "--json", cwd=tmp_path,
                                    check=True).stdout)[0]
    assert with_setup["hash"] == listed["scalerl"] and "run_hash" not in with_setup


def test_an_ablation_file_in_a_subfolder_names_presets_bare(tmp_path, monkeypatch):
    """`base = "scalerl"` (and `setup`, a variant's `recipe`) in data/abl.toml means the preset,
    as from the current folder; a file of that name beside the ablation file still wins."""
    from scalectl.ablation.planner import plan, read_ablation

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    text = ('name = "sub"\nkind = "variants"\nbase = "scalerl"\nsetup = "tiny-cpu"\n'
            '[[variants]]\nname = "base"\n[[variants]]\nname = "magistral"\nrecipe = "magistral"\n')
    (tmp_path / "data" / "abl.toml").write_text(text)
    spec = read_ablation("data/abl.toml")
    assert spec.base == presets.root() / "recipes" / "scalerl.toml"
    assert spec.setup == presets.root() / "setups" / "tiny-cpu.toml"
    assert spec.variants[1].recipe == presets.root() / "recipes" / "magistral.toml"
    variants = plan(spec).variants
    tiny = ROOT / "setups" / "tiny-cpu.toml"
    assert [v.recipe.content_hash for v in variants] == [
        load(ROOT / "recipes" / "scalerl.toml", tiny).content_hash,
        load(ROOT / "recipes" / "magistral.toml", tiny, ["name='magistral'"]).content_hash]
    # the same file one folder up gives the same plan
    (tmp_path / "abl.toml").write_text(text)
    assert [v.recipe.content_hash for v in plan(read_ablation("abl.toml")).variants] == [
        v.recipe.content_hash for v in variants]
    # a file beside the ablation file wins over the preset of its name
    packaged = presets.root() / "recipes" / "scalerl.toml"
    (tmp_path / "data" / "scalerl").write_text(f'extends = "{packaged}"\n[precision]\nlm_head = "bf16"\n')
    spec = read_ablation("data/abl.toml")
    assert spec.base == Path("data/scalerl")
    assert plan(spec).variants[0].recipe.precision.lm_head == "bf16"
    (tmp_path / "data" / "abl.toml").write_text(text.replace('base = "scalerl"', 'base = "scalerll"'))
    with pytest.raises(UserError, match=r"data/abl\.toml: base = 'scalerll': no such file beside the ablation "
                                        r"file \(data/scalerll\), and not the name of a recipe preset \(recipes: "
                                        r"dapo, grpo, magistral, minimax, scalerl\)"):
        read_ablation("data/abl.toml")
