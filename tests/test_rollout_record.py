"""``logging.rollouts``: every trained completion in ``RUN_DIR/rollouts.jsonl`` with its
per-token versions, the generator's log-probs and the trainer's recomputation."""

from __future__ import annotations

import json

from conftest import run_cli

P, G, STEPS = 2, 2, 2


def test_a_sync_run_records_its_rollouts(tmp_path):
    """sync in one process (the CPU engine shares the trainer's model): each step trains P x G
    completions, all sampled by the trainer's own version, and the generator's log-probs
    (KV-cached decoding) equal the trainer's teacher-forced recomputation in float32 (the same
    sums in another order over a near-uniform softmax of 261 tokens, log-probs ~ -5.6 whose
    float32 ulp is 4.8e-7: a few ulps, < 1e-5)."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    policy = save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path / "policy")
    sets = ["async.mode=sync", f"batch.prompts_per_step={P}", f"batch.generations_per_prompt={G}",
            "eval.every_steps=100", "eval.prompts=2", "eval.samples_per_prompt=1", f"budget.steps={STEPS}",
            "length.max_new_tokens=8", "length.control=none", "filter.zero_variance=false",
            "data.train_size=20", f"model.path={policy}", "logging.rollouts=true"]
    run_cli("run", "recipes/grpo.toml", "--runs-dir", str(tmp_path / "runs"), "--name", "rec",
            *[a for s in sets for a in ("--set", s)], db=tmp_path / "s.db", check=True, timeout=300)
    lines = [json.loads(x) for x in (tmp_path / "runs" / "rec" / "rollouts.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [s for s in range(STEPS) for _ in range(P * G)]
    diffs = []
    for x in lines:
        n = len(x["token_ids"])
        assert 1 <= n <= 8 and x["versions"] == [x["step"]] * n and x["loss_mask"] == [1] * n
        assert len(x["gen_logprobs"]) == len(x["train_logprobs"]) == n and x["reward"] in (-1.0, 1.0)
        diffs += [abs(a - b) for a, b in zip(x["gen_logprobs"], x["train_logprobs"])]
        assert all(-9 < lp < -2 for lp in x["train_logprobs"])      # near uniform over 261 tokens: ~ -5.6
    assert max(diffs) < 1e-5
    steps = [json.loads(x) for x in (tmp_path / "runs" / "rec" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
