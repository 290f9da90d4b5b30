"""The dry run's memory plans, against hand computations: the generators' KV cache at
``gpu_memory_utilization``, the trainers' activations with and without gradient checkpointing,
and the role map of tensor-parallel and dedicated evaluation generators."""

from __future__ import annotations

import pytest

from conftest import ROOT, run_cli
from scalectl.job.layout import check_layout, model_geometry, role_map, role_map_lines
from scalectl.job.memory import (Geometry, activation_bytes, completions_in_flight, generator_memory_plan,
                                 head_bytes, kv_bytes_per_token, step_share)
from scalectl.errors import UserError
from scalectl.recipe.load import load

PAPER = (ROOT / "recipes/scalerl.toml", ROOT / "setups/paper-8b.toml")
#: The paper setup's model.config: a Llama-3-style 8B.
EIGHT_B = Geometry(layers=32, kv_heads=8, head_dim=128, hidden=4096, vocab=128256)


def test_kv_bytes_per_token_by_hand():
    # 2 (K and V) x 32 layers x 8 KV heads x 128 x 2 bytes (bf16)
    assert kv_bytes_per_token(32, 8, 128, 2) == 2 * 32 * 8 * 128 * 2 == 131_072
    # tensor parallelism over 4 GPUs splits the 8 KV heads, 2 each
    assert kv_bytes_per_token(32, 8, 128, 2, tensor_parallel=4) == 32_768
    # 2 KV heads over 4 GPUs: one head per GPU, replicated
    assert kv_bytes_per_token(48, 2, 128, 2, tensor_parallel=4) == 2 * 48 * 1 * 128 * 2
    with pytest.raises(ValueError):
        kv_bytes_per_token(0, 8, 128, 2)


def test_completions_in_flight_by_hand():
    # pipeline-8, 48 x 16 over 64 generators: (8 + 1) x 48 = 432 prompts requested, 6.75 -> 7 each
    assert completions_in_flight("pipeline", 8, 48, 16, 64) == 7 * 16 == 112
    # one generator: at most P prompts per call
    assert completions_in_flight("pipeline", 8, 48, 16, 1) == 48 * 16
    assert completions_in_flight("sync", 8, 48, 16, 64) == 16              # ceil(48 / 64) = 1 prompt
    assert completions_in_flight("ppo_off_policy", 8, 48, 16, 64) == 6 * 16  # 384 / 64
    assert step_share(48, 16, 64) == 16 and step_share(48, 16, 16) == 48
    with pytest.raises(ValueError, match="unknown async mode"):
        completions_in_flight("async", 1, 1, 1, 1)


def test_the_paper_generator_plan_by_hand():
    """0.9 x 80 GB = 72 GB; the bf16 weights of 8e9 parameters take 16 GB; 56e9 / 131,072 =
    427,246.09 tokens; a completion of 2,048 + 14,336 = 16,384 tokens: 26 at once; a step's share
    is ceil(48 / 64) x 16 = 16: it fits."""
    plan = generator_memory_plan(params=8_000_000_000, geometry=EIGHT_B, dtype="bf16", memory_gb=80,
                                 utilization=0.9, tensor_parallel=1, longest=16_384, in_flight=112, step_share=16,
                                 max_num_seqs=256)
    assert plan.weights == 16e9 and plan.kv_budget == pytest.approx(56e9, rel=1e-12)
    assert (plan.tokens, plan.concurrent, plan.step_share, plan.in_flight) == (427_246, 26, 16, 112)
    assert plan.fits_step
    short = generator_memory_plan(params=8_000_000_000, geometry=EIGHT_B, dtype="bf16", memory_gb=80,
                                  utilization=0.1, tensor_parallel=1, longest=16_384, in_flight=112, step_share=16,
                                  max_num_seqs=64)
    assert short.kv_budget == pytest.approx(-8e9) and short.tokens == 0 and not short.fits_step
    assert short.in_flight == 64                                              # max_num_seqs caps it
    # four GPUs: a quarter of the weights and of the KV heads on each
    tp = generator_memory_plan(params=8_000_000_000, geometry=EIGHT_B, dtype="bf16", memory_gb=80,
                               utilization=0.9, tensor_parallel=4, longest=16_384, in_flight=112, step_share=16,
                               max_num_seqs=256)
    assert tp.weights == 4e9 and tp.kv_per_token == 32_768 and tp.tokens == int(68e9 // 32_768)


def test_activation_estimate_by_hand():
    """Korthikanti et al. 2022, Eq. 1 without the attention scores: 34 s b h bytes per layer in
    bf16; with checkpointing 2 s b h per layer plus one layer's 34 s b h.  The paper setup: s =
    16,384, b = 4, h = 4,096, 32 layers: s b h = 268,435,456."""
    sbh = 16_384 * 4 * 4096
    kw = dict(micro_batch=4, seq_len=16_384, hidden=4096, layers=32)
    assert activation_bytes(checkpointing=False, **kw) == 32 * 34 * sbh == pytest.approx(292.06e9, rel=1e-4)
    assert activation_bytes(checkpointing=True, **kw) == (32 * 2 + 34) * sbh == pytest.approx(26.31e9, rel=1e-3)
    assert activation_bytes(checkpointing=False, dtype_bytes=4, **kw) == 2 * 32 * 34 * sbh   # fp32 activations
    # the LM head: 4.2 blocks of 2**26 float32 logits at its peak; a small batch holds its own logits
    assert head_bytes(4, 16_384, 128_256) == pytest.approx(4.2 * 2**26 * 4)
    assert head_bytes(2, 10, 261) == pytest.approx(4.2 * 2 * 10 * 261 * 4)


def test_the_head_block_is_the_trainers():
    from scalectl.job import memory
    from scalectl.rl.policy.logprobs import HEAD_CHUNK_ELEMENTS

    assert memory.HEAD_CHUNK_ELEMENTS == HEAD_CHUNK_ELEMENTS


def test_geometry_from_configs():
    paper = load(*PAPER, [])
    assert model_geometry(paper.model) == EIGHT_B                  # model.config: no checkpoint here
    tiny = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml", [])
    assert model_geometry(tiny.model) == Geometry(4, 4, 32, 128, 261)
    # a multimodal MoE checkpoint's text_config (Llama 4 Scout's geometry)
    scout = {"text_config": {"num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
                             "head_dim": 128, "hidden_size": 5120, "vocab_size": 202048}}
    assert Geometry.from_config(scout) == Geometry(48, 8, 128, 5120, 202048)
    assert Geometry.from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}).head_dim == 16


def test_dry_run_prints_the_generator_memory_plan(tmp_path):
    proc = run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", db=tmp_path / "s.db")
    assert proc.returncode == 0, proc.stderr
    out = proc.stderr
    assert ("generator memory (per GPU, 1 GPU(s) per generator): 0.9 x 80.0 GB = 72.0 GB - weights 16.0 GB = "
            "KV cache 56.0 GB at 131,072 bytes per token = 427,246 tokens = 26 completion(s) of 16,384 tokens; "
            "a step's share is 16, 112 decode at once (vLLM preempts beyond 26)") in out
    assert ("trainer activations (micro-batch of 65,536 tokens, gradient checkpointing on): 26.3 GB + LM head "
            "1.1 GB (off: 292.1 GB + 1.1 GB); with the ZeRO states 35.4 GB per trainer") in out
    assert "evaluation: 1000 held-out prompt(s) x 16 on the 64 generator(s), each a share" in out
    assert not (tmp_path / "s.db").exists()


def test_dry_run_refuses_generators_that_cannot_hold_a_step(tmp_path):
    low = run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", "--set", "hardware.gpu_memory_utilization=0.1",
                  db=tmp_path / "s.db")
    assert low.returncode == 2
    assert ("a generator GPU holds 16.0 GB of weights, more than hardware.gpu_memory_utilization x memory_gb = "
            "0.1 x 80 = 8.0 GB") in low.stderr
    # 0.4: 32 - 16 = 16 GB of KV cache, 122,070 tokens, 7 completions of 16,384 < a step's 16
    mid = run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", "--set", "hardware.gpu_memory_utilization=0.4",
                  db=tmp_path / "s.db")
    assert mid.returncode == 2
    assert ("a generator's KV cache holds 122,070 tokens (16.0 GB at hardware.gpu_memory_utilization = 0.4), "
            "7 completion(s) of 16,384 tokens, but one step's share is 16 (34.4 GB)") in mid.stderr
    # four GPUs per generator (16 of them): weights 4 GB a GPU, and the step's share grows to 48
    tp = run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", "--set", "hardware.gpus_per_generator=4",
                 "--set", "hardware.generators=16", db=tmp_path / "s.db")
    assert tp.returncode == 0, tp.stderr
    assert "node 0: ranks 0-7 -> generators 0-1 (4 GPUs each)" in tp.stderr
    assert "generator memory (per GPU, 4 GPU(s) per generator): 0.9 x 80.0 GB = 72.0 GB - weights 4.0 GB" in tp.stderr
    assert "a step's share is 48" in tp.stderr
    assert not (tmp_path / "s.db").exists()


def test_dry_run_refuses_trainer_activations_that_do_not_fit(tmp_path):
    proc = run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", "--set",
                   "hardware.gradient_checkpointing=false", db=tmp_path / "s.db")
    assert proc.returncode == 2
    assert ("a trainer needs 301.2 GB: 8.0 GB of ZeRO states and 293.2 GB of activations for batch.micro_batch_size "
            "= 4 sequences of up to 16,384 tokens, more than hardware.memory_gb = 80 (set "
            "hardware.gradient_checkpointing = true or lower batch.micro_batch_size)") in proc.stderr


def test_role_map_counts_gpus():
    # 16 generators of 4 GPUs + 16 trainers = 80 GPUs, one task each, 8 per node
    slots = role_map(16, 16, 8, gpus_per_generator=4)
    assert len(slots) == 80
    assert [(s.rank, s.role, s.role_rank) for s in slots[:5]] == [
        (0, "generator", 0), (1, "generator", 0), (2, "generator", 0), (3, "generator", 0), (4, "generator", 1)]
    lines = role_map_lines(slots, 4)
    assert lines[0] == "node 0: ranks 0-7 -> generators 0-1 (4 GPUs each)"
    assert lines[7] == "node 7: ranks 56-63 -> generators 14-15 (4 GPUs each)"
    assert lines[9] == "node 9: ranks 72-79 -> trainers 8-15"
    dedicated = role_map_lines(role_map(64, 16, 8, evaluator=True))
    assert dedicated[7] == "node 7: ranks 56-63 -> generators 56-62, evaluation generator 63"


def test_layout_problems_of_tensor_parallel_and_dedicated_generators():
    # a generator's 4 GPUs would straddle two nodes of 6 tasks
    straddle = load(*PAPER, ["hardware.gpus_per_generator=4", "hardware.generators=16",
                             "launcher.slurm.tasks_per_node=6", "launcher.slurm.nodes=14"])
    problems = check_layout(straddle, None).problems
    assert any("tasks_per_node = 6 is not a multiple of hardware.gpus_per_generator = 4" in p for p in problems)
    assert any("14 x 6 = 84 tasks, but hardware.generators x gpus_per_generator + trainers = 16 x 4 + 16 = 80 "
               "(one task per GPU)" in p for p in problems)
    one = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml", ["hardware.evaluation=dedicated"])
    assert check_layout(one, None).problems == [
        "hardware.evaluation = dedicated keeps the last generator for evaluation: it needs a run in processes with "
        "hardware.generators >= 2 (have 1 generator(s), async.mode = pipeline)"]
    with pytest.raises(UserError, match="hardware.gpus_per_generator: .* gpus_per_generator = 2 needs rollout_engine = 'vllm'"):
        load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml", ["hardware.gpus_per_generator=2"])


def test_gradient_checkpointing_recomputes_and_gives_the_same_step(tmp_path, one_torch_thread):
    """hardware.gradient_checkpointing: the trainer's step enters each layer's MLP twice (forward,
    and again when the backward pass recomputes the layer) instead of once, and moves the weights
    exactly as without (a pre-hook counts entries: the recomputation stops once the tensors the
    backward needs are rebuilt, before the MLP returns)."""
    import sys

    import torch

    from scalectl.rl.loop import Reporter, build_policy
    from scalectl.rl.policy.model import save_policy, build_tokenizer, build_tiny_model
    from scalectl.rl.train.batch import build_train_batch

    sys.path.insert(0, str(ROOT / "tests"))
    from dp_worker import make_groups

    path = save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path / "tiny")
    after, calls = {}, {}
    for ckpt in (False, True):
        recipe = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                      [f"model.path={path}", f"hardware.gradient_checkpointing={str(ckpt).lower()}",
                       "optim.warmup_steps=0"])
        policy = build_policy(recipe, Reporter(), engine=False)
        layer = policy.model.model.layers[0].mlp
        calls[ckpt] = 0
        handle = layer.register_forward_pre_hook(lambda *a, c=ckpt: calls.__setitem__(c, calls[c] + 1))
        policy.trainer.train_step(build_train_batch(make_groups(seed=0), "batch", 0))
        handle.remove()
        after[ckpt] = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    assert (calls[False], calls[True]) == (1, 2)
    for name, t in after[False].items():
        assert torch.equal(after[True][name], t), name
