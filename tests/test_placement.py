"""Placement by role: generators and trainers on node sets of their own
(``launcher.slurm.generator_nodes``, ``generator_nodelist``, ``trainer_nodelist``): the host
list grammar (checked against Slurm's own ``scontrol show hostnames``), the host of every task,
the dry run's role map and the batch script that places the tasks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from scalectl.errors import UserError
from scalectl.job.layout import check_layout, role_map, spread
from scalectl.launch.placement import PlacementError, task_hosts
from scalectl.launch.slurm import check_hostlist, job_tasks, sbatch_script, submitit_parameters
from scalectl.names import expand_hostlist
from scalectl.recipe.load import load

PAPER = (ROOT / "recipes/scalerl.toml", ROOT / "setups/paper-8b.toml")
#: The paper's 10 nodes x 8 GPUs as 8 inference nodes (64 generators) and 2 training nodes (16 trainers).
BY_ROLE = ["launcher.slurm.generator_nodes=8"]
LISTS = ["hardware.generators=6", "hardware.trainers=2", "launcher.slurm.nodes=4", "launcher.slurm.tasks_per_node=2",
         "launcher.slurm.generator_nodes=3", "launcher.slurm.generator_nodelist=inf[01-03]",
         "launcher.slurm.trainer_nodelist=trn7"]

HOSTLISTS = ["c1", "c[1-3]", "gpu[08-10],big1", "rack[1-2]-n[1-2]", "inf[01-03,7]", "a.b-c_d"]


@pytest.mark.parametrize("text", HOSTLISTS)
def test_host_lists_expand_as_slurm_expands_them(text):
    want = {"c1": ["c1"], "c[1-3]": ["c1", "c2", "c3"], "gpu[08-10],big1": ["gpu08", "gpu09", "gpu10", "big1"],
            "rack[1-2]-n[1-2]": ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
            "inf[01-03,7]": ["inf01", "inf02", "inf03", "inf7"], "a.b-c_d": ["a.b-c_d"]}[text]
    assert expand_hostlist(text) == want
    if shutil.which("scontrol"):             # Slurm's own expansion agrees (it needs no controller)
        out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True)
        assert out.returncode != 0 or out.stdout.split() == want


@pytest.mark.parametrize("text", ["", "c[1-", "c]1", "c[3-1]", "c[a-b]", "c1,,c2", "c1;rm -rf /", "c$(id)"])
def test_malformed_host_lists_are_refused_naming_the_key(text):
    with pytest.raises(UserError, match="launcher.slurm.trainer_nodelist = .* is not a Slurm host list"):
        check_hostlist(text, "launcher.slurm.trainer_nodelist")


def test_each_role_is_spread_over_its_own_nodes():
    assert spread(5, 3) == [2, 2, 1] and spread(16, 2) == [8, 8] and spread(2, 3) == [1, 1, 0]
    slots = role_map(5, 3, 2, generator_nodes=3, trainer_nodes=2)
    assert [(s.node, s.rank, s.role, s.role_rank) for s in slots] == [
        (0, 0, "generator", 0), (0, 1, "generator", 1), (1, 2, "generator", 2), (1, 3, "generator", 3),
        (2, 4, "generator", 4), (3, 5, "trainer", 0), (3, 6, "trainer", 1), (4, 7, "trainer", 2)]
    assert all(len({s.role for s in slots if s.node == n}) == 1 for n in range(5))     # a node holds one role
    with pytest.raises(ValueError, match="placement by role"):
        role_map(2, 1, 1, generator_nodes=1, trainer_nodes=2)


def test_task_hosts_follow_the_node_lists_of_each_role():
    job = ["inf01", "inf02", "inf03", "trn7"]
    assert task_hosts(job, 6, 2, 3) == ["inf01", "inf01", "inf02", "inf02", "inf03", "inf03", "trn7", "trn7"]
    # Slurm sorts a job's nodes: the trainers' named host comes first in SLURM_JOB_NODELIST
    sorted_job = ["a1", "b1", "b2"]
    assert task_hosts(sorted_job, 2, 1, 2, trainer_hosts=["a1"]) == ["b1", "b2", "a1"]
    assert task_hosts(sorted_job, 1, 2, 1, generator_hosts=["b2"]) == ["b2", "a1", "b1"]
    with pytest.raises(PlacementError, match="generator_nodelist names x9, not among the job's nodes"):
        task_hosts(sorted_job, 2, 1, 2, generator_hosts=["x9", "b1"])


def test_the_placement_module_writes_the_host_file_from_the_job_nodelist():
    env = dict(os.environ, SLURM_JOB_NODELIST="trn7,inf[01-03]", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-m", "scalectl.launch.placement", "--generators", "6", "--trainers", "2",
                           "--generator-nodes", "3", "--trainer-nodelist", "trn7"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["inf01", "inf01", "inf02", "inf02", "inf03", "inf03", "trn7", "trn7"]
    assert "generators on inf01, inf02, inf03, trainers on trn7" in proc.stderr
    env["SLURM_JOB_NODELIST"] = "inf[01-03]"        # the trainers' host is not in the job
    proc = subprocess.run([sys.executable, "-m", "scalectl.launch.placement", "--generators", "6", "--trainers", "2",
                           "--generator-nodes", "3", "--trainer-nodelist", "trn7"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "trainer_nodelist names trn7, not among the job's nodes" in proc.stderr


def test_the_layout_check_shows_and_refuses_placement_by_role():
    report = check_layout(load(*PAPER, BY_ROLE), 8_000_000_000)
    assert report.problems == []
    text = "\n".join(report.lines)
    assert "generators and trainers on separate nodes, launcher.slurm.generator_nodes = 8" in text
    assert "node 7: ranks 56-63 -> generators 56-63" in text and "node 8: ranks 64-71 -> trainers 0-7" in text
    assert "node 9: ranks 72-79 -> trainers 8-15" in text
    lists = load(*PAPER, LISTS + ["hardware.device=cpu"])
    assert check_layout(lists, None).problems == []
    assert "generator nodes: inf01, inf02, inf03; trainer nodes: trn7" in "\n".join(check_layout(lists, None).lines)
    bad = {"launcher.slurm.generator_nodes=10": "leaves 0 node(s) for hardware.trainers = 16",
           "launcher.slurm.tasks_per_node=4": "launcher.slurm.tasks_per_node = 4, but with generator_nodes = 8",
           "launcher.slurm.trainer_nodelist=trn[1-3]": "names 3 host(s), but the role has 2 node(s)",
           "launcher.slurm.generator_nodelist=n[1-8],n9[": "launcher.slurm.generator_nodelist = 'n[1-8],n9['"}
    for key, message in bad.items():
        problems = check_layout(load(*PAPER, BY_ROLE + [key]), 8_000_000_000).problems
        assert any(message in p for p in problems), (key, problems)
    shared = check_layout(load(*PAPER, ["launcher.slurm.trainer_nodelist=trn[1-2]"]), 8_000_000_000).problems
    assert any("set launcher.slurm.generator_nodes too" in p for p in shared)


def test_the_batch_script_places_each_task_by_a_host_file(tmp_path):
    recipe = load(*PAPER, LISTS)
    folder = tmp_path / "runs" / "x" / "slurm" / "00"
    params = submitit_parameters(recipe, "x", folder)
    assert (params["nodes"], params["ntasks_per_node"], job_tasks(params)) == (4, 2, 8)
    assert params["additional_parameters"]["nodelist"] == "inf[01-03],trn7"
    script = sbatch_script(recipe, "x", folder)
    assert "#SBATCH --nodelist='inf[01-03],trn7'" in script        # quoted by submitit; sbatch reads it
    assert f'export SLURM_HOSTFILE="{folder}/hosts-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"' in script
    assert ("-m scalectl.launch.placement --generators 6 --trainers 2 --generator-nodes 3 --generator-nodelist "
            "'inf[01-03]' --trainer-nodelist trn7 > \"$SLURM_HOSTFILE\" || exit 1") in script
    assert 'export SCALECTL_MASTER_ADDR="$(head -n 1 "$SLURM_HOSTFILE")"' in script
    srun = next(line for line in script.splitlines() if line.startswith("srun"))
    assert "--ntasks=8" in srun and "--distribution=arbitrary" in srun
    assert script.index("scalectl.launch.placement") < script.index("\nsrun")


def test_the_dry_run_prints_the_role_map_by_role(tmp_path):
    proc = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run",
                   *[a for s in BY_ROLE for a in ("--set", s)], db=tmp_path / "s.db")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "node 8: ranks 64-71 -> trainers 0-7" in out and "--distribution=arbitrary" in out
    assert not (tmp_path / "s.db").exists()


def test_tasks_of_a_job_placed_by_role_meet_on_task_0s_host():
    """The batch script exports task 0's host: the tasks meet there, not on the job's first node."""
    from scalectl.rl.transport.roles import MASTER_ADDR_ENV, detect

    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_JOB_ID": "7"}
    assert detect(2, 1, env).master_addr == "c1"
    task = detect(2, 1, dict(env, **{MASTER_ADDR_ENV: "c2"}))
    assert (task.master_addr, task.role, task.role_rank) == ("c2", "trainer", 0)
