"""Recipes: presets, inheritance, overrides, hashing and the errors bad files get."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from scalectl.errors import UserError
from scalectl.recipe.load import load

PRESETS = ["grpo", "dapo", "magistral", "minimax", "scalerl"]
BAD = ROOT / "tests" / "data" / "bad"


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("setup", ["tiny-cpu", "paper-8b"])
def test_presets_validate(name, setup):
    recipe = load(ROOT / "recipes" / f"{name}.toml", ROOT / "setups" / f"{setup}.toml")
    assert recipe.name == name
    assert len(recipe.content_hash) == 12


def test_presets_match_the_published_table():
    """docs/recipe-axes.md, 'Named recipes': loss, clip, aggregation, advantage, async, filters, head."""
    expect = {
        "grpo": ("ppo_clip", 0.2, 0.2, "sample", "prompt", "ppo_off_policy", 8, False, False, "bf16"),
        "dapo": ("ppo_clip", 0.2, 0.26, "prompt", "prompt", "ppo_off_policy", 8, True, False, "bf16"),
        "magistral": ("ppo_clip", 0.2, 0.26, "prompt", "prompt", "pipeline", 8, True, False, "bf16"),
        "minimax": ("cispo", None, 5.0, "prompt", "prompt", "ppo_off_policy", 8, False, False, "fp32"),
        "scalerl": ("cispo", None, 5.0, "prompt", "batch", "pipeline", 8, True, True, "fp32"),
    }
    for name, (lt, lo, hi, agg, adv, mode, k, zv, retire, head) in expect.items():
        r = load(ROOT / "recipes" / f"{name}.toml")
        got = (r.loss.type, r.loss.clip_low if lo is not None else None, r.loss.clip_high,
               r.loss.aggregation, r.advantage.normalization, r.async_.mode, r.async_.k,
               r.filter.zero_variance, r.filter.retire_solved, r.precision.lm_head)
        assert got == (lt, lo, hi, agg, adv, mode, k, zv, retire, head), name
    assert load(ROOT / "recipes" / "dapo.toml").filter.dynamic_sampling is True
    scalerl = load(ROOT / "recipes" / "scalerl.toml")
    assert scalerl.filter.retire_threshold == 0.9 and scalerl.length.control == "interrupt"


def test_paper_setup_numbers():
    r = load(ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "paper-8b.toml")
    assert (r.batch.prompts_per_step, r.batch.generations_per_prompt) == (48, 16)
    assert (r.length.max_new_tokens, r.length.interrupt_min, r.length.interrupt_max) == (14336, 10000, 12000)
    assert (r.optim.lr, r.optim.warmup_steps, r.optim.eps, r.optim.weight_decay) == (5e-7, 100, 1e-15, 0.01)
    assert (r.eval.every_steps, r.eval.prompts, r.eval.samples_per_prompt) == (100, 1000, 16)
    assert (r.hardware.generators, r.hardware.trainers, r.launcher.type) == (64, 16, "slurm")
    # the recipe's choices survive the setup
    assert (r.loss.type, r.async_.mode, r.precision.lm_head) == ("cispo", "pipeline", "fp32")


def test_hash_ignores_key_order_file_name_and_seed(tmp_path):
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text('[loss]\ntype = "ppo_clip"\nclip_high = 0.28\n[advantage]\nnormalization = "none"\n')
    b.write_text('seed = 7\n[advantage]\nnormalization = "none"\n[loss]\nclip_high = 0.28\ntype = "ppo_clip"\n')
    assert load(a).content_hash == load(b).content_hash
    c = tmp_path / "c.toml"
    c.write_text('[loss]\ntype = "ppo_clip"\nclip_high = 0.27\n[advantage]\nnormalization = "none"\n')
    assert load(c).content_hash != load(a).content_hash


def test_extends_and_overrides(tmp_path):
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{ROOT / "recipes" / "scalerl.toml"}"\n[precision]\nlm_head = "bf16"\n')
    r = load(child, None, ["loss.type=ppo_clip", "async.k=4", "filter.retire_solved=false"])
    assert r.precision.lm_head == "bf16"                      # from the child
    assert r.advantage.normalization == "batch"               # inherited
    # the new loss type takes its own companions (clip 0.2/0.28), not CISPO's eps_max 5.0
    assert (r.loss.type, r.loss.clip_low, r.loss.clip_high) == ("ppo_clip", 0.2, 0.28)
    assert r.async_.k == 4 and r.filter.retire_solved is False


def test_override_is_validated_like_the_file():
    with pytest.raises(UserError) as exc:
        load(ROOT / "recipes" / "scalerl.toml", None, ["loss.type=cisp"])
    assert str(exc.value) == "--set loss.type: loss.type = 'cisp' is not one of: ppo_clip, gspo, cispo"


EXPECTED_ERRORS = {
    "bad-loss-type.toml": "bad-loss-type.toml: loss.type = 'cisp' is not one of: ppo_clip, gspo, cispo",
    "clip-low-range.toml": "clip-low-range.toml: loss.clip_low = 1.5 is out of range: must be < 1",
    "unknown-section.toml": "unknown-section.toml: lossy: unknown key; did you mean loss? The keys of a recipe (line 1):\n"
                            "  name         Name of the recipe",
    "unknown-key.toml": "unknown-key.toml: loss.tipe: unknown key; did you mean loss.type? The keys of [loss] (line 2):\n"
                        "  type         Policy loss: ",
    "wrong-type.toml": "wrong-type.toml: batch.prompts_per_step = 'many': must be an integer",
    "retire-threshold.toml": "retire-threshold.toml: filter.retire_threshold = 1.5 is out of range: must be <= 1",
    "async-k.toml": "async-k.toml: async.k = 0 is out of range: must be >= 1",
    "batch-zero.toml": "batch-zero.toml: batch.prompts_per_step = 0 is out of range: must be >= 1",
    "extends-missing.toml": "extends-missing.toml: extends = 'missing.toml': no such file",
    "cycle-a.toml": "cycle-a.toml: extends cycle:",
    "invalid-toml.toml": "invalid-toml.toml: invalid TOML: Invalid value (at line 3, column 13)",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ERRORS))
def test_bad_recipes_give_a_clear_error(name):
    with pytest.raises(UserError) as exc:
        load(BAD / name)
    assert EXPECTED_ERRORS[name] in str(exc.value)


def test_validate_cli_exit_codes(tmp_path):
    bad = run_cli("validate", str(BAD / "bad-loss-type.toml"))
    assert bad.returncode == 2
    assert "loss.type = 'cisp' is not one of: ppo_clip, gspo, cispo" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml", "--json", check=True)
    data = json.loads(good.stdout)
    assert data[0]["recipe"]["loss"]["type"] == "cispo"
    assert data[0]["hash"] == load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml").content_hash


def test_hash_ignores_where_it_runs_but_not_what_it_measures():
    base = load(ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "tiny-cpu.toml")
    moved = load(ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "tiny-cpu.toml",
                 ["launcher.type=slurm", "launcher.slurm.time_min=5", "checkpoint.every_steps=7"])
    assert moved.content_hash == base.content_hash
    other_eval = load(ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "tiny-cpu.toml", ["eval.prompts=100"])
    assert other_eval.content_hash != base.content_hash


def test_a_key_added_later_keeps_stored_hashes_at_its_neutral_value():
    """scalerl on tiny-cpu has the hash c33f6230083a (the setup since 2026-12-07, with its fit window and R0
    rule and its budget of 1,000 steps) with ``model.think_tags`` and ``fit.r0`` unset (runs in users' stores carry it); a key at its neutral
    value leaves it, any other value changes it."""
    from scalectl.recipe.load import load

    assert load("scalerl", setup="tiny-cpu").content_hash == "c33f6230083a"
    thinking = load("scalerl", setup="tiny-cpu", overrides=["model.think_tags=true"])
    assert thinking.content_hash != "c33f6230083a"
    assert load("scalerl", setup="tiny-cpu", overrides=["model.think_tags=false"]).content_hash == "c33f6230083a"


def test_a_bad_value_names_its_file_key_and_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ndescription = "ok\\u0000no"\n\n[loss]\n# a comment\nclip_low = "a"\n'
                   '\n[length]\nmax_new_tokens = -3\n')
    proc = run_cli("validate", str(bad))
    assert proc.returncode == 2
    lines = [line.removeprefix("error: ") for line in proc.stderr.strip().splitlines()]
    described = {line.split(": ", 2)[1].split(" ")[0].rstrip(":"): line for line in lines if "bad.toml" in line}
    assert described["description"].endswith("(line 2)") and "U+0000" in described["description"]
    assert described["loss.clip_low"].endswith("(line 6)")
    assert described["length.max_new_tokens"].endswith("(line 9)")


#: A run placed by role on a cluster: a generator node and a trainer node.
PLACED = ["launcher.type=slurm", "async.mode=pipeline", "launcher.slurm.nodes=2", "launcher.slurm.generator_nodes=1",
          "launcher.slurm.generator_nodelist=inf1", "launcher.slurm.trainer_nodelist=trn1"]


def test_resume_may_move_a_run_with_its_placement_keys_and_keeps_its_hash():
    """Each placement key changes on resume (the value lands where the launcher reads it) and leaves
    the content hash as it was; a key that changes the job's shape or what it trains is refused."""
    from scalectl.recipe.load import PLACEMENT_KEYS, resumed_recipe

    stored = load("scalerl", setup="tiny-cpu", overrides=PLACED)
    moves = {"launcher.slurm.generator_nodelist": "inf2", "launcher.slurm.trainer_nodelist": "trn[2-3]",
             "launcher.slurm.partition": "spare", "launcher.slurm.additional_parameters.nodelist": "inf2,trn2",
             "launcher.slurm.additional_parameters.exclude": "trn1"}
    assert sorted(moves) == sorted(PLACEMENT_KEYS)
    for key, value in moves.items():
        moved = resumed_recipe(stored, [f"{key}={value}"])
        slurm = moved.launcher.slurm
        where = (slurm.additional_parameters.get(key.rsplit(".", 1)[1]) if ".additional_parameters." in key
                 else getattr(slurm, key.rsplit(".", 1)[1]))
        assert where == value, key
        assert moved.content_hash == stored.content_hash, key
        assert moved.to_dict() != stored.to_dict(), key
    both = resumed_recipe(stored, ["launcher.slurm.trainer_nodelist=trn2", "budget.steps=900"])
    assert (both.launcher.slurm.trainer_nodelist, both.budget.steps) == ("trn2", 900)
    for key in ("launcher.slurm.nodes=3", "launcher.slurm.account=other", "launcher.slurm.time_min=5",
                "launcher.slurm.additional_parameters.constraint=h100", "hardware.trainers=2", "loss.type=gspo"):
        with pytest.raises(UserError, match=rf"--set {key.split('=')[0]}: a resumed run keeps its recipe; only "
                                            r"budget\.steps, .* \(to extend the run\) and launcher\.slurm\."
                                            r"generator_nodelist, .* \(to run its job elsewhere\) may change"):
            resumed_recipe(stored, [key])


def test_decode_memory_is_speed_only_and_must_be_positive():
    """``hardware.decode_memory_mib`` sets how many rows the CPU engine decodes together, not what
    is trained: the content hash stays; zero or a word is refused naming the key."""
    base = load("scalerl", setup="tiny-cpu")
    assert base.hardware.decode_memory_mib == 192.0
    small = load("scalerl", setup="tiny-cpu", overrides=["hardware.decode_memory_mib=64"])
    assert small.hardware.decode_memory_mib == 64.0 and small.content_hash == base.content_hash == "c33f6230083a"
    for bad in ("0", "lots"):
        with pytest.raises(UserError, match=r"hardware\.decode_memory_mib"):
            load("scalerl", setup="tiny-cpu", overrides=[f"hardware.decode_memory_mib={bad}"])
