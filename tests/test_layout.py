"""The dry run's layout checks (pure functions) and what `scalectl run --dry-run` does with them."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_cli
from scalectl.job.layout import check_layout, parameter_count, role_map, role_map_lines, trainer_memory
from scalectl.recipe.load import load
from scalectl.rl.transport.weight_sync import bucket_ranges, weight_sync_plan

PAPER = (ROOT / "recipes/scalerl.toml", ROOT / "setups/paper-8b.toml")


def test_trainer_memory_matches_the_zero_paper_figure():
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6, 1.9 GB.
    # By hand: 16 x 7.5 = 120; 4 x 7.5 + 12 x 7.5 / 64 = 31.40625; 2 x 7.5 + 14 x 7.5 / 64 = 16.640625;
    # 16 x 7.5 / 64 = 1.875 (GB of 1e9 bytes; exact in binary floating point up to 1 ulp).
    got = [trainer_memory(7_500_000_000, stage, 64, "bf16").total / 1e9 for stage in range(4)]
    assert got == pytest.approx([120.0, 31.40625, 16.640625, 1.875], rel=1e-12)
    fp32 = trainer_memory(1000, 2, 4, "fp32")     # fp32 weights 4 B, gradients 4/4 B, moments 8/4 B
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4000, 1000, 2000)
    with pytest.raises(ValueError, match="zero_stage must be 0-3"):
        trainer_memory(1, 4, 1)


def test_role_map_of_the_paper_setup():
    slots = role_map(64, 16, 8)
    assert len(slots) == 80
    assert [(s.node, s.local_rank, s.role, s.role_rank) for s in (slots[0], slots[63], slots[64], slots[79])] == [
        (0, 0, "generator", 0), (7, 7, "generator", 63), (8, 0, "trainer", 0), (9, 7, "trainer", 15)]
    lines = role_map_lines(slots)
    assert lines[0] == "node 0: ranks 0-7 -> generators 0-7"
    assert lines[-1] == "node 9: ranks 72-79 -> trainers 8-15"
    assert role_map_lines(role_map(3, 2, 4))[0] == "node 0: ranks 0-3 -> generators 0-2, trainers 0"


def test_buckets_cover_every_parameter_in_order():
    assert bucket_ranges([100, 100, 300, 50, 50], 200) == [(0, 2), (2, 3), (3, 5)]
    assert bucket_ranges([], 200) == []
    assert bucket_ranges([1, 1, 1], 1) == [(0, 1), (1, 2), (2, 3)]
    plan = weight_sync_plan(8_000_000_000, "bf16", 64)
    # 16e9 bytes / 256 MiB = 59.6 -> 60 buckets
    assert (plan.bytes_per_update, plan.buckets, plan.exact) == (16_000_000_000, 60, False)
    exact = weight_sync_plan(0, "fp32", 2, bucket_bytes=200, sizes=[100, 100, 300])
    assert (exact.bytes_per_update, exact.buckets, exact.exact) == (500, 2, True)


def test_parameter_count_of_the_tiny_model_without_weights():
    # 4 layers x (4 x 128^2 attention + 3 x 128 q/k/v biases + 3 x 128 x 512 MLP + 2 x 128 norms)
    # + 2 x 261 x 128 (embedding, untied head) + 128 (final norm) = 1,118,080
    recipe = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml", [])
    assert parameter_count(recipe.model) == 1_118_080
    paper = load(*PAPER, [])
    assert parameter_count(paper.model) == 8_000_000_000       # model.params: no checkpoint folder here


def test_layout_problems_name_the_keys():
    tiny = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml", [])
    assert check_layout(tiny, 1_118_080).problems == []
    assert check_layout(tiny, 1_118_080, "slurm").problems == []
    odd = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
               ["async.mode=sync", "hardware.generators=3", "batch.prompts_per_step=16"])
    problems = check_layout(odd, None).problems
    assert any("hardware.generators = 3" in p for p in problems)
    assert any("prompts_per_step = 16 does not split into whole groups across hardware.generators = 3" in p
               for p in problems)
    gpus = load(*PAPER, ["launcher.slurm.gpus_per_node=4"])
    assert any("gpus_per_node = 4 < 8 process(es) per node" in p for p in check_layout(gpus, 8_000_000_000).problems)
    eight_b = load(*PAPER, ["hardware.trainers=1", "hardware.generators=79", "hardware.zero_stage=0"])
    report = check_layout(eight_b, 8_000_000_000)
    assert report.memory.total == 128e9
    assert any("needs 128.0 GB" in p and "memory_gb = 80" in p for p in report.problems)


def test_dry_run_accepts_the_paper_setup(tmp_path):
    """The job runs 64 generators and 16 data-parallel trainers as 80 tasks: the dry run exits 0
    with the role map, the ZeRO-3 memory estimate and the weight-sync plan."""
    proc = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", db=tmp_path / "s.db")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "node 0: ranks 0-7 -> generators 0-7" in out and "node 9: ranks 72-79 -> trainers 8-15" in out
    # bf16 with AdamW: 2 + 2 + 12 bytes per parameter, all three partitioned over 16 trainers at ZeRO-3
    assert "trainer memory (ZeRO-3, 16 trainer(s), 8 B parameters): 8.0 GB per trainer" in out
    assert "16.0 GB per update from trainer 0 to 64 generator(s)" in out
    assert not (tmp_path / "s.db").exists()


def test_dry_run_refuses_what_the_job_would_refuse(tmp_path):
    proc = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", "--set", "hardware.trainers=15", db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert "10 x 8 = 80 tasks, but hardware.generators + trainers = 64 + 15 = 79" in proc.stderr
    assert "does not split into whole groups across hardware.trainers = 15" in proc.stderr
    proc = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", "--set", "hardware.trainers=1", "--set",
                   "hardware.generators=79", "--set", "hardware.zero_stage=0", db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert "trainer memory (ZeRO-0, 1 trainer(s), 8 B parameters): 128.0 GB per trainer" in proc.stderr
    assert "needs 128.0 GB for parameters, gradients and optimiser states" in proc.stderr
    assert "node 9: ranks 72-79 -> generators 72-78, trainers 0" in proc.stderr
    assert not (tmp_path / "s.db").exists()


def test_dry_run_json_carries_the_layout(tmp_path):
    proc = run_cli("run", "recipes/scalerl.toml", "--dry-run", "--json", db=tmp_path / "s.db")
    assert proc.returncode == 0, proc.stderr
    layout = json.loads(proc.stdout)["layout"]
    assert layout["memory"]["params"] == 1_118_080
    # fp32 tiny model: 16 bytes per parameter on the one trainer
    assert layout["memory"]["total"] == 16 * 1_118_080
    assert layout["weight_sync"]["bytes_per_update"] == 4 * 1_118_080


def test_sync_and_ppo_off_policy_use_n_trainers_and_m_generators(tmp_path):
    """sync and ppo_off_policy run as generator and trainer processes beyond 1 + 1: the dry run
    accepts every layout whose rounds split into whole groups (a sync round is one step's P
    prompts, a ppo_off_policy-k round k P) and prints the role map at paper scale; it refuses,
    naming the keys, a layout where generators would wait."""
    tiny = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                ["async.mode=sync", "hardware.generators=2", "hardware.trainers=2"])
    report = check_layout(tiny, 1_118_080)
    assert report.problems == []
    assert report.lines[0] == "role map (processes on this machine): ranks 0-1 generator(s), ranks 2-3 trainer(s)"
    # paper scale, ppo_off_policy-8: a round of 8 x 48 = 384 prompts, 6 for each of 64 generators
    ppo = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", "--set", "async.mode=ppo_off_policy",
                  db=tmp_path / "s.db")
    assert ppo.returncode == 0, ppo.stderr
    assert "node 0: ranks 0-7 -> generators 0-7" in ppo.stderr and "node 9: ranks 72-79 -> trainers 8-15" in ppo.stderr
    # paper scale, sync: a round is one step's 48 prompts, which 64 generators cannot share
    sync = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", "--set", "async.mode=sync",
                   db=tmp_path / "s.db")
    assert sync.returncode == 2
    assert "node 9: ranks 72-79 -> trainers 8-15" in sync.stderr          # the role map is printed too
    assert ("batch.prompts_per_step = 48 does not split into whole groups across hardware.generators = 64 in "
            "async.mode = sync: 16 generator(s) would wait") in sync.stderr
    odd = load(*PAPER, ["async.mode=ppo_off_policy", "async.k=3", "hardware.generators=40",
                        "launcher.slurm.nodes=7"])
    # 3 x 48 = 144 prompts over 40 generators: 144 = 3 x 40 + 24, so 16 generators get one prompt less
    assert [p for p in check_layout(odd, None).problems if "generators = 40" in p] == [
        "a round of async.k x batch.prompts_per_step = 3 x 48 = 144 prompts does not split into whole groups "
        "across hardware.generators = 40 in async.mode = ppo_off_policy: 16 generator(s) would wait while the "
        "others sample the last prompts of each round (use a number of generators that divides 144)"]
    assert not (tmp_path / "s.db").exists()


def test_pipeline_refuses_generators_its_request_window_cannot_feed():
    # pipeline-1 keeps (1 + 1) x 8 = 16 prompts requested: 20 generators leave 4 without work; 16 do not
    many = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                ["async.k=1", "batch.prompts_per_step=8", "hardware.generators=20"])
    assert check_layout(many, None).problems == [
        "async.mode = pipeline keeps (async.k + 1) x batch.prompts_per_step = (1 + 1) x 8 = 16 prompts requested "
        "at once: hardware.generators = 20 would leave 4 generator(s) without work (use at most 16)"]
    fed = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
               ["async.k=1", "batch.prompts_per_step=8", "hardware.generators=16"])
    assert check_layout(fed, None).problems == []


@pytest.mark.parametrize("overrides, tied", [({}, False), ({"num_key_value_heads": 2, "head_dim": 16}, False),
                                             ({"num_hidden_layers": 2, "intermediate_size": 96}, True)])
def test_the_qwen2_count_from_a_config_equals_the_built_models(overrides, tied):
    """The dry run counts the built-in model from its config, without torch: the count equals
    the parameters of the model transformers builds from the same config (on the meta device)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from scalectl.rl.policy.model import build_tokenizer
    from scalectl.rl.policy.tiny_config import TINY_CONFIG, TINY_VOCAB_SIZE, qwen2_parameter_count

    assert TINY_VOCAB_SIZE == len(build_tokenizer())
    config = {**TINY_CONFIG, "vocab_size": TINY_VOCAB_SIZE, **overrides}
    with torch.device("meta"):
        net = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=tied, **config))
    assert qwen2_parameter_count(config, tie_word_embeddings=tied) == sum(p.numel() for p in net.parameters())
