"""One table of loss choices, read alike by the validator, the loader, the ablation planner
and the loss registry; a change of loss.type means the same in every command."""

import json
import typing

import pytest

from conftest import run_cli
from scalectl.ablation import with_companions
from scalectl.recipe.loss_choices import COMPANIONS, LOSS_CHOICES, LOSS_NAMES, stale_companions
from scalectl.recipe.schema import Loss
from scalectl.recipe.load import load


def test_validator_planner_and_registry_agree_with_the_table():
    from scalectl.rl.train.losses import POLICY_LOSSES

    type_field = Loss.model_fields["type"].annotation
    assert typing.get_args(type_field) == LOSS_NAMES
    assert tuple(POLICY_LOSSES) == LOSS_NAMES
    for name, choice in LOSS_CHOICES.items():
        filled = Loss(type=name)
        assert (filled.clip_low, filled.clip_high) == (choice.clip_low, choice.clip_high)
        assert filled.ratio_level == choice.ratio_level
        planned = dict(o.split("=", 1) for o in with_companions((f"loss.type={name}",)))
        assert {k: float(planned[f"loss.{k}"]) for k in COMPANIONS} == choice.companions
    assert (LOSS_CHOICES["ppo_clip"].clip_low, LOSS_CHOICES["ppo_clip"].clip_high) == (0.2, 0.28)
    assert LOSS_CHOICES["cispo"].clip_high == 5.0


def test_stale_companions():
    assert stale_companions({"type": "cispo", "clip_high": 5.0}, {"type": "ppo_clip"}) == \
        {"clip_low": 0.2, "clip_high": 0.28}
    assert stale_companions({"type": "cispo", "clip_high": 5.0},
                            {"type": "ppo_clip", "clip_high": 0.3}) == {"clip_low": 0.2}
    assert stale_companions({"type": "cispo"}, {"type": "cispo"}) == {}
    assert stale_companions({"type": "cispo"}, {"aggregation": "token"}) == {}
    assert stale_companions({}, {"type": "nope"}) == {}


def test_set_loss_type_resets_companions_not_set_explicitly():
    notes: list[str] = []
    r = load("recipes/scalerl.toml", "setups/tiny-cpu.toml", ["loss.type=ppo_clip"], notes=notes)
    assert (r.loss.type, r.loss.clip_low, r.loss.clip_high) == ("ppo_clip", 0.2, 0.28)
    assert notes == ["loss.clip_high = 0.28: default of loss.type = 'ppo_clip' (set in --set "
                     "loss.type; was 5.0 from recipes/scalerl.toml)"]
    kept = load("recipes/scalerl.toml", None, ["loss.type=ppo_clip", "loss.clip_high=0.3"])
    assert (kept.loss.clip_low, kept.loss.clip_high) == (0.2, 0.3)
    same = load("recipes/grpo.toml", None, ["loss.type=ppo_clip"])      # no change of type
    assert (same.loss.clip_low, same.loss.clip_high) == (0.2, 0.2)


def test_a_file_that_extends_and_changes_the_loss_takes_its_defaults(tmp_path):
    (tmp_path / "variant.toml").write_text('extends = "scalerl.toml"\n[loss]\ntype = "gspo"\n')
    (tmp_path / "scalerl.toml").write_text('[loss]\ntype = "cispo"\nclip_high = 5.0\n')
    r = load(tmp_path / "variant.toml")
    assert (r.loss.type, r.loss.clip_low, r.loss.clip_high) == ("gspo", 3e-3, 5e-3)


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo"])
def test_run_validate_and_ablate_give_one_hash(loss):
    run = json.loads(run_cli("run", "recipes/scalerl.toml", "--set", f"loss.type={loss}", "--dry-run",
                             "--json", check=True).stdout)
    val = json.loads(run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml",
                             "--set", f"loss.type={loss}", "--json", check=True).stdout)
    plan = json.loads(run_cli("ablate", "--forward", f"loss.type={loss}", "--dry-run", "--json",
                              check=True).stdout)["plan"]
    variant = next(v for v in plan["variants"] if v["name"] == loss)
    assert run["hash"] == val[0]["hash"] == variant["recipe_hash"]
    assert val[0]["taken"] and "clip_high" in val[0]["taken"][0]
