"""Every recipe key is documented where it is declared; `validate --explain` prints that
documentation, and an unknown key is answered with the keys of its section."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from pydantic import BaseModel

from conftest import ROOT, run_cli
from scalectl.recipe.explain import key_doc, summary, toml_text
from scalectl.recipe.load import load
from scalectl.recipe.loss_choices import LOSS_CHOICES
from scalectl.recipe.schema import Length, Loss, Recipe

BAD = ROOT / "tests" / "data" / "bad"


def value_keys(doc=None):
    """Every value key of the schema, as key docs (sections walked)."""
    doc = doc or key_doc("")
    for k in doc.keys:
        yield from (value_keys(k) if k.kind == "section" else (k,))


def schema_keys(model=Recipe, prefix=""):
    """Every value key of the schema by its TOML name, walked from pydantic's fields."""
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from schema_keys(info.annotation, key + ".")
        else:
            yield key


def test_every_field_has_a_description_that_leaves_the_default_to_its_declaration():
    keys = list(value_keys())
    assert [k.key for k in keys] == list(schema_keys())
    assert {"async.k", "launcher.slurm.time_min", "logging.rollouts"} <= {k.key for k in keys}
    for k in keys:
        assert k.description, f"{k.key} has no description"
        assert k.description.endswith("."), k.key
        assert 10 < len(k.summary) <= 110, (k.key, k.summary)
        if k.default not in ("unset", "[]", "{}", '""'):
            said = re.escape(k.default.strip('"'))
            assert not re.search(rf"\bdefault(s| is| to|:)?\s+{said}\b", k.description), (k.key, k.description)
    sections = [k for k in key_doc("").keys if k.kind == "section"]
    assert len(sections) == 19 and all(s.description for s in sections)


def test_the_docs_a_description_cites_exist():
    """A description citing docs/X.md, "Heading" or docs/method.md, section N names a page and
    a heading that are there."""
    cited = 0
    for k in [*value_keys(), *key_doc("").keys]:
        for page, heading in re.findall(r'docs/([\w-]+\.md)(?:, \\?"([^"\\]+)\\?")?', k.description):
            text = (ROOT / "docs" / page).read_text()
            assert not heading or re.search(rf"^#+ .*{re.escape(heading)}", text, re.M), (k.key, page, heading)
            cited += 1
        for number in re.findall(r"docs/method\.md, section (\d+)", k.description):
            assert re.search(rf"^## {number}\. ", (ROOT / "docs" / "method.md").read_text(), re.M), k.key
    assert cited > 30


def test_summary_is_the_first_sentence_without_its_citation():
    assert summary("Most tokens of one completion. Longer ones are cut.") == "Most tokens of one completion."
    assert summary("A rate (e.g. 0.5) of groups. More.") == "A rate (e.g. 0.5) of groups."
    assert summary("What is divided (ScaleRL, arXiv 2510.13786, Sec. 3.2). Then.") == "What is divided."
    assert summary("Nodes per job (sbatch --nodes).") == "Nodes per job (sbatch --nodes)."


def test_key_docs_read_the_declaration():
    clip = key_doc("loss.clip_high")
    assert clip.description == Loss.model_fields["clip_high"].description
    assert (clip.kind, clip.bounds, clip.default) == ("number", ("> 0", "<= 100"), "unset")
    assert clip.default_note == "taken from loss.type: ppo_clip 0.28, gspo 0.005, cispo 5.0"
    loss_type = key_doc("loss.type")
    assert [v for v, _ in loss_type.allowed] == list(LOSS_CHOICES) and loss_type.default == '"cispo"'
    assert dict(loss_type.allowed)["gspo"].startswith("clip_low 0.003, clip_high 0.005, sequence-level ratio: ")
    assert dict(key_doc("launcher.type").allowed)["slurm"].startswith("a Slurm job submitted through submitit")
    assert key_doc("seed").bounds == (">= 0", "<= 4,294,967,295")
    assert (key_doc("optim.eps").default, key_doc("optim.eps").bounds) == ("1e-15", ("> 0", "<= 1"))
    assert key_doc("length.interrupt_phrase").default == json.dumps(Length().interrupt_phrase)
    assert key_doc("budget.steps").default_note == "100 when the recipe has no [budget] table"
    backends = key_doc("logging.backends")
    assert (backends.kind, backends.bounds, backends.default) == (
        "list, each one of: tensorboard, wandb, mlflow, jsonl", ("at most 4 entries",), "[]")
    assert key_doc("data.subset").bounds == ("at most 4,096 characters", "one line")
    assert key_doc("name").bounds == ("at most 100 characters", "one line")          # the tighter length
    assert key_doc("logging.project").type_text == "string; at least 1 character, at most 4,096 characters, one line"
    assert key_doc("optim.grad_clip").type_text == "number > 0, <= 1e6, or unset"
    assert key_doc("async").key == "async" and [k.name for k in key_doc("async").keys] == ["mode", "k", "schedule"]
    assert [k.name for k in key_doc("launcher.slurm").keys][:3] == ["partition", "account", "qos"]
    assert toml_text(5.0) == "5.0" and toml_text(5e-7) == "5e-07" and toml_text(None) == "unset"


def test_explain_a_key_with_its_value_in_the_merged_recipe():
    done = run_cli("validate", "--explain", "loss.clip_high", "recipes/scalerl.toml", "recipes/grpo.toml",
                   "--set", "loss.type=gspo", check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "loss.clip_high"
    assert lines[1] == "  " + Loss.model_fields["clip_high"].description
    assert "  type: number, or unset" in lines and "  bounds: > 0, <= 100" in lines
    assert "  default: unset (taken from loss.type: ppo_clip 0.28, gspo 0.005, cispo 5.0)" in lines
    # the merged value (gspo's default, not CISPO's 5.0 nor grpo's 0.2) and where it came from
    assert load("recipes/scalerl.toml", None, ["loss.type=gspo"]).loss.clip_high == 0.005
    assert lines[-2] == ("  in recipes/scalerl.toml: 0.005 (default of loss.type = 'gspo' (set in --set "
                         "loss.type; was 5.0 from recipes/scalerl.toml))")
    assert lines[-1].startswith("  in recipes/grpo.toml: 0.005 (default of loss.type = 'gspo'")


def test_explain_a_section_lists_every_key_once():
    done = run_cli("validate", "--explain", "loss", "recipes/grpo.toml", "--setup", "setups/tiny-cpu.toml",
                   "--json", check=True)
    data = json.loads(done.stdout)
    assert [k["key"] for k in data["keys"]] == [f"loss.{n}" for n in Loss.model_fields]
    recipe = load(ROOT / "recipes/grpo.toml", ROOT / "setups/tiny-cpu.toml")
    assert {v["key"]: v["value"] for v in data["values"]} == {f"loss.{k}": v for k, v in recipe.to_dict()["loss"].items()}
    assert {v["key"]: v["from"] for v in data["values"]}["loss.aggregation"] == "set in recipes/grpo.toml"
    text = run_cli("validate", "--explain", "length", check=True).stdout.splitlines()
    rows = [line for line in text if line.startswith("  ") and not line.startswith("   ")][1:]
    assert len(rows) == len(Length.model_fields)
    for row, (name, info) in zip(rows, Length.model_fields.items()):
        assert row.split()[0] == name and row.endswith(summary(info.description))
    assert text[3].startswith("  max_new_tokens     integer >= 1, <= 1,048,576            default 14336   ")
    assert text[8].startswith('  interrupt_phrase   string; at most 4,096 characters      default "Okay, time is up. L..."  Text')


@pytest.mark.parametrize("key, expect", [
    ("loss.clipp_high", "error: loss.clipp_high: unknown key; did you mean loss.clip_high? The keys of [loss]:"),
    ("lossy", "error: lossy: unknown key; did you mean loss? The keys of a recipe:"),
    ("launcher.slurm.zzz", "error: launcher.slurm.zzz: unknown key. The keys of [launcher.slurm]:"),
    ("loss.type.x", ("error: loss.type.x: unknown key: loss.type is a value (one of: ppo_clip, gspo, cispo), "
                     "not a section")),
])
def test_explain_an_unknown_key(key, expect):
    done = run_cli("validate", "--explain", key)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == expect


def test_unknown_key_error_lists_the_section_and_suggests_the_closest(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text('[loss]\nclipp_high = 0.3\n')
    done = run_cli("validate", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"error: {bad}: loss.clipp_high: unknown key; did you mean loss.clip_high? The keys of [loss] (line 2):"
    assert [line.split()[0] for line in lines[1:]] == list(Loss.model_fields)
    for line, info in zip(lines[1:], Loss.model_fields.values()):
        assert line.endswith(summary(info.description))
    over = run_cli("validate", "recipes/grpo.toml", "--set", "launcher.slurm.nods=2", "--set", "optim.zzz=1")
    lines = over.stderr.splitlines()
    assert over.returncode == 2
    assert lines[0] == "error: --set optim.zzz: optim.zzz: unknown key. The keys of [optim]:"   # nothing close
    assert ("--set launcher.slurm.nods: launcher.slurm.nods: unknown key; did you mean launcher.slurm.nodes? "
            "The keys of [launcher.slurm]:") in lines
    assert sum(line.startswith("  lr ") for line in lines) == 1


def test_validate_needs_files_or_explain():
    done = run_cli("validate")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: validate: give the recipe files to check, or --explain KEY"


def test_explain_imports_neither_torch_nor_a_launcher():
    code = ("import sys; from scalectl.cli import main\n"
            "sys.argv = ['scalectl', 'validate', '--explain', 'launcher', 'recipes/scalerl.toml']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('torch', 'numpy', 'submitit', 'scalectl.launch', 'scalectl.rl') "
            "if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "[launcher]" in done.stdout and "  type = \"local\"" in done.stdout
    assert done.stdout.splitlines()[-1] == "HEAVY []"
    assert Recipe().launcher.type == "local"
