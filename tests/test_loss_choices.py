"""One table of loss choices, read alike by the validator, the loader, the ablation planner
and the loss registry; a change of loss.type means the same in every command."""

import json
import typing

import pytest

from conftest import run_cli
from scalectl.errors import UserError
from scalectl.ablation import with_companions
from scalectl.recipe.loss_choices import COMPANIONS, DEFAULT_LOSS, LOSS_CHOICES, LOSS_NAMES, companion_defaults
from scalectl.recipe.schema import Loss
from scalectl.recipe.load import load


def test_every_loss_of_the_table_is_implemented_and_validated_alike():
    """``loss.type`` accepts the table's names (its Literal is built from them); the loss
    registry implements each by the function of that name; the validator, the loader and the
    planner fill the companions with the row's defaults."""
    from scalectl.rl.train.losses import POLICY_LOSSES

    assert typing.get_args(Loss.model_fields["type"].annotation) == LOSS_NAMES
    assert Loss.model_fields["type"].default == DEFAULT_LOSS == Loss().type
    assert {name: fn.__name__ for name, fn in POLICY_LOSSES.items()} == {name: name for name in LOSS_NAMES}
    for name, choice in LOSS_CHOICES.items():
        filled = Loss(type=name)
        assert (filled.clip_low, filled.clip_high) == (choice.clip_low, choice.clip_high)
        assert filled.ratio_level == choice.ratio_level
        planned = dict(o.split("=", 1) for o in with_companions((f"loss.type={name}",)))
        assert {k: float(planned[f"loss.{k}"]) for k in COMPANIONS} == choice.companions
        loaded = load("recipes/grpo.toml", None, [f"loss.type={name}"])
        expect = (0.2, 0.2) if name == "ppo_clip" else (choice.clip_low, choice.clip_high)  # grpo's own
        assert (loaded.loss.clip_low, loaded.loss.clip_high) == expect
    assert (LOSS_CHOICES["ppo_clip"].clip_low, LOSS_CHOICES["ppo_clip"].clip_high) == (0.2, 0.28)
    assert LOSS_CHOICES["cispo"].clip_high == 5.0


def test_companion_defaults():
    # a layer over a [loss] table: a change of type resets the companions the layer leaves unset
    assert companion_defaults({"type": "ppo_clip"}, {"type": "cispo", "clip_high": 5.0}) == \
        {"clip_low": 0.2, "clip_high": 0.28}
    assert companion_defaults({"type": "ppo_clip", "clip_high": 0.3}, {"type": "cispo", "clip_high": 5.0}) == \
        {"clip_low": 0.2}
    assert companion_defaults({"type": "cispo"}, {"type": "cispo"}) == {}
    assert companion_defaults({"type": "cispo"}, {"clip_high": 4.0}) == {}      # the default loss before
    assert companion_defaults({"aggregation": "token"}, {"type": "cispo"}) == {}
    assert companion_defaults({"type": "nope"}, {}) == {}
    assert companion_defaults({"type": ["ppo_clip"]}, {}) == {}                 # not a name: the validator says so
    # a layer alone (the validator's table, an ablation variant): its type always counts as new
    assert companion_defaults({"type": "cispo"}) == {"clip_low": 0.2, "clip_high": 5.0}
    assert companion_defaults({"type": "gspo", "clip_low": None, "clip_high": 0.01}) == {"clip_low": 3e-3}


def test_a_loss_type_that_is_not_a_name_is_an_error_not_a_crash():
    """A list given as loss.type reached the companion rule before the validator (TypeError:
    unhashable type, a traceback); now the validator names the allowed values."""
    for overrides in (["loss.type=[1]"], ["loss.type=[1]", "loss.clip_high=0.3"]):
        with pytest.raises(UserError) as exc:
            load("recipes/scalerl.toml", None, overrides)
        assert str(exc.value) == "--set loss.type: loss.type = [1] is not one of: ppo_clip, gspo, cispo"
    assert with_companions(("loss.type=[1]",)) == ("loss.type=[1]",)


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
