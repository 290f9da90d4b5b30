"""The wheel: built with `python -m build`, installed in a fresh virtual environment, it runs
the presets by name from an empty folder (no checkout in sight).

The fresh environment is offline: it sees this environment's packages (torch pinned by
constraints.txt, deepspeed, transformers, ...) through a .pth line and installs scalectl
from the wheel alone (--no-index), so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """(wheel, venv, an empty folder) with scalectl installed from the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # sdist first, then the wheel built from the sdist (what `python -m build` does): both must carry the presets
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT], cwd=tmp)
    (wheel,) = dist.glob("scalectl-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])    # pip and setuptools: this environment's
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "outer-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = dict(os.environ, PIP_CONSTRAINT=str(ROOT / "constraints.txt"))
    env.pop("PYTHONPATH", None)
    _run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--force-reinstall", wheel], env=env)
    _run([py, "-m", "pip", "check"], env=env)            # every dependency is satisfied, offline
    empty = tmp / "empty"
    empty.mkdir()
    return {"wheel": wheel, "venv": venv, "py": py, "scalectl": venv / "bin" / "scalectl", "empty": empty,
            "env": env}


def test_the_wheel_carries_the_presets(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for kind in ("recipes", "setups", "ablations"):
        files = sorted((ROOT / kind).glob("*.toml"))
        assert len(files) >= 2
        for path in files:                          # every preset of the checkout is in the wheel
            assert f"scalectl/presets/{kind}/{path.name}" in names
    assert "scalectl/presets/datasette.json" in names


def test_the_installed_package_is_the_wheel_and_lists_its_presets(installed):
    where = _run([installed["py"], "-c", "import scalectl.presets as p; print(p.root())"],
                 cwd=installed["empty"]).stdout.strip()
    assert Path(where).is_relative_to(installed["venv"]) and not Path(where).is_relative_to(ROOT)
    listed = json.loads(_run([installed["scalectl"], "recipes", "--json"], cwd=installed["empty"],
                             env=installed["env"]).stdout)
    assert {r["name"] for r in listed if r["kind"] == "recipe"} == {"dapo", "grpo", "magistral", "minimax", "scalerl"}
    from scalectl.recipe.load import load

    scalerl = next(r for r in listed if r["name"] == "scalerl")
    assert scalerl["hash"] == load(ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "tiny-cpu.toml").content_hash
    plan = json.loads(_run([installed["scalectl"], "ablate", "--leave-one-out", "--dry-run", "--json"],
                           cwd=installed["empty"], env=installed["env"]).stdout)
    assert len(plan["plan"]["variants"]) == 8
    assert sorted(os.listdir(installed["empty"])) == []          # a dry run leaves the folder empty


def _stored(folder: Path) -> tuple[tuple, Path, list[int]]:
    con = sqlite3.connect(folder / "scalectl.db")
    (name, status, run_dir), = con.execute("SELECT name, status, run_dir FROM runs").fetchall()
    steps = [s for (s,) in con.execute("SELECT step FROM eval_points ORDER BY step")]
    con.close()
    return (name, status), Path(run_dir), steps


@pytest.mark.slow   # 10-25 s: make test-slow (the default suite keeps under 10 minutes)
def test_the_wheel_trains_scalerl_by_name_from_an_empty_folder(installed, tmp_path):
    """The preset and the default setup come from the installed package; the pipeline's
    processes run the installed code.  A freshly initialised policy stands in for the warm
    start (the slow test below builds that), so this takes a minute, not ten."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    policy = save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path / "policy")
    folder = tmp_path / "work"
    folder.mkdir()
    _run([installed["scalectl"], "run", "scalerl", "--set", "budget.steps=4", "--set", "eval.every_steps=2",
          "--set", "eval.prompts=16", "--set", "eval.samples_per_prompt=2", "--set", f"model.path={policy}",
          "--set", "batch.prompts_per_step=4", "--set", "batch.generations_per_prompt=4", "--set", "async.k=1"],
         cwd=folder, env=installed["env"], timeout=900)
    run, run_dir, steps = _stored(folder)
    assert run == ("scalerl-s0", "completed") and run_dir == folder / "runs" / "scalerl-s0"
    assert steps == [0, 2, 4]
    assert (run_dir / "pipeline").is_dir()                     # ScaleRL's PipelineRL: generator + trainer processes


@pytest.mark.slow
def test_the_wheel_runs_scalerl_by_name_from_an_empty_folder(installed, tmp_path):
    """`scalectl run scalerl --set budget.steps=20` (the tiny CPU setup, found in the package)."""
    folder = tmp_path / "work"
    folder.mkdir()
    _run([installed["scalectl"], "run", "scalerl", "--set", "budget.steps=20", "--set", "eval.prompts=100",
          "--json"], cwd=folder, env=installed["env"], timeout=1800)
    run, run_dir, steps = _stored(folder)
    assert run == ("scalerl-s0", "completed") and run_dir == folder / "runs" / "scalerl-s0"
    assert steps == [0, 20]
