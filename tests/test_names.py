"""User strings that end up in paths, job names and sbatch scripts are refused or quoted."""

from __future__ import annotations

import shlex

import pytest

from conftest import ROOT, run_cli
from scalectl.errors import UserError
from scalectl.names import check_name
from scalectl.recipe.load import load

HOSTILE = ["x; rm -rf ~", "../../etc", "..", "a/b", "a b", "$(id)", "`id`", "a\nb", "", ".hidden",
           "-rf", "x" * 101, "name'quote", 'name"dq', "a|b", "a&b", "a>b", "~root"]


@pytest.mark.parametrize("name", ["grpo-s0", "scalerl-s12", "a.b_c+d=e", "X", "x" * 100])
def test_safe_names_pass(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_refused(name):
    with pytest.raises(UserError, match="is not allowed: use 1-100 letters, digits"):
        check_name(name)


@pytest.mark.parametrize("name", ["x; rm -rf ~", "../../etc"])
def test_run_refuses_hostile_name_and_creates_nothing(tmp_path, name):
    runs = tmp_path / "runs"
    proc = run_cli("run", "recipes/grpo.toml", "--name", name, "--runs-dir", str(runs),
                   "--set", "budget.steps=1", db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert f"run name {name!r} is not allowed" in proc.stderr
    assert not runs.exists()                      # no folder made, inside or outside the runs folder
    assert not (tmp_path / "etc").exists() and not (ROOT.parent / "etc").exists()
    listed = run_cli("runs", "--json", db=tmp_path / "s.db", check=True)
    assert listed.stdout.strip() == "[]"          # and no run in the store


def test_run_refuses_hostile_recipe_name(tmp_path):
    """The default run name comes from the recipe's name: it is checked too."""
    proc = run_cli("run", "recipes/grpo.toml", "--set", "name=x; rm -rf ~", "--runs-dir", str(tmp_path / "runs"),
                   "--dry-run", db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert "'x; rm -rf ~-s0' is not allowed" in proc.stderr


def test_slurm_dry_run_refuses_hostile_partition(tmp_path):
    proc = run_cli("run", "recipes/grpo.toml", "--launcher", "slurm", "--dry-run",
                   "--set", "launcher.slurm.partition=debug;rm -rf ~", db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert "launcher.slurm.partition = 'debug;rm -rf ~' is not allowed" in proc.stderr


def test_slurm_dry_run_refuses_runs_dir_with_spaces(tmp_path):
    proc = run_cli("run", "recipes/grpo.toml", "--launcher", "slurm", "--dry-run",
                   "--runs-dir", str(tmp_path / "my runs"), db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert "is not allowed in an sbatch script" in proc.stderr


def _recipe(**slurm):
    overrides = [f"launcher.slurm.{k}={v}" for k, v in slurm.items()]
    return load(ROOT / "recipes/grpo.toml", ROOT / "setups/tiny-cpu.toml", overrides)


def _commands(script: str) -> list[str]:
    """The lines bash would execute: neither blank nor comments."""
    return [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_additional_parameters_cannot_inject_lines():
    from scalectl.launch.slurm import sbatch_script, submitit_parameters

    recipe = load(ROOT / "recipes/grpo.toml", ROOT / "setups/tiny-cpu.toml", [])
    recipe = recipe.model_copy(update={"launcher": recipe.launcher.model_copy(update={
        "slurm": recipe.launcher.slurm.model_copy(update={"additional_parameters": {"comment": "x; rm -rf ~"}})})})
    script = sbatch_script(recipe, "grpo-s0", "/tmp/runs/grpo-s0/slurm/00")
    # the value is one quoted word on its #SBATCH line, and the script runs only submitit
    assert f"#SBATCH --comment={shlex.quote('x; rm -rf ~')}" in script.splitlines()
    assert _commands(script) == [
        "export SUBMITIT_EXECUTOR=slurm",
        "srun --unbuffered --output /tmp/runs/grpo-s0/slurm/00/%j_%t_log.out "
        + shlex.quote(__import__("sys").executable) + " -u -m submitit.core._submit /tmp/runs/grpo-s0/slurm/00",
    ]
    for bad in ({"comment": "ok\nrm -rf ~"}, {"x\nrm -rf ~": "1"}, {"--output": "/etc/passwd"}):
        hostile = recipe.model_copy(update={"launcher": recipe.launcher.model_copy(update={
            "slurm": recipe.launcher.slurm.model_copy(update={"additional_parameters": bad})})})
        with pytest.raises(UserError, match="additional_parameters"):
            submitit_parameters(hostile, "grpo-s0")


@pytest.mark.parametrize("path", ["/tmp/a b/run", "/tmp/x;rm -rf ~", "/tmp/a\nb", "/tmp/$(id)", "/tmp/'q'"])
def test_unsafe_slurm_folders_refused(path):
    from scalectl.launch.slurm import check_slurm_path

    with pytest.raises(UserError, match="not allowed in an sbatch script"):
        check_slurm_path(path)


def test_job_name_is_checked():
    from scalectl.launch.slurm import submitit_parameters

    with pytest.raises(UserError, match="Slurm job name 'x; rm -rf ~' is not allowed"):
        submitit_parameters(_recipe(), "x; rm -rf ~")


@pytest.mark.parametrize("text, name", [
    ("lmhead", "lmhead"), ("lm head/v2", "lm-head-v2"), ("x; rm -rf ~", "x-rm--rf-"), ("../../etc", "etc"),
    ("a..b", "a.b"), ("-rf", "rf"), ("$(id)", "id-"), ("", "scalectl"), ("~/", "scalectl"), ("x" * 120, "x" * 100)])
def test_job_name_makes_any_text_a_safe_sbatch_job_name(text, name):
    from scalectl.names import job_name

    assert job_name(text) == name
    assert check_name(name, "Slurm job name") == name
    for hostile in HOSTILE:                     # whatever comes in, what goes out is accepted
        check_name(job_name(hostile), "Slurm job name")
