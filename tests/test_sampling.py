"""One sampling-parameters object from the recipe to every engine call: each field changes what
is sampled, and the loop's training and evaluation calls carry the recipe's settings."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import ROOT
from scalectl.recipe.load import load
from scalectl.rl.policy.model import BOXED, build_tiny_model, build_tokenizer
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["1+2=", "123+45-6=", "7-70+700="]
BASE = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1.0, interrupt=None)
#: one changed value per field; the test below fails when a field is added without one
VARIANTS = {"max_new_tokens": 5, "temperature": 0.3, "top_p": 0.3, "interrupt": (3, 4, " so " + BOXED)}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def engine(tok):
    """A random small model with an EOS bias (+3: completions of varied length, ~20 tokens)."""
    m = build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128)
    bias = torch.zeros(m.config.vocab_size)
    bias[m.config.eos_token_id] = 3.0
    m.lm_head.bias = torch.nn.Parameter(bias)
    return CPURolloutEngine(m, tok)


def _sample(engine, params, seed=11):
    return [(c.token_ids, c.loss_mask) for g in engine.generate(PROMPTS, 4, params, seed=seed) for c in g]


def _recipe(*sets: str, name: str = "grpo"):
    return load(ROOT / "recipes" / f"{name}.toml", ROOT / "setups" / "tiny-cpu.toml", list(sets))


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(SamplingParams)])
def test_every_field_changes_what_is_sampled(engine, field):
    assert set(VARIANTS) == {f.name for f in dataclasses.fields(SamplingParams)}
    base = _sample(engine, BASE)
    assert base == _sample(engine, BASE)                       # same seed, same completions
    changed = _sample(engine, dataclasses.replace(BASE, **{field: VARIANTS[field]}))
    assert changed != base


def test_top_p_samples_inside_the_nucleus_and_records_full_softmax_logprobs(engine):
    """top_p = 0.3 on a random model: every sampled token is among the top tokens that reach 0.3
    cumulative probability; its recorded log-prob is of the full softmax (not renormalised)."""
    from scalectl.rl.policy.logprobs import token_logprobs

    comps = [c for g in engine.generate(PROMPTS[:1], 3, SamplingParams(max_new_tokens=6, top_p=0.3), seed=2)
             for c in g]
    for c in comps:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            out = engine.model(input_ids=ids)
        logp_all = torch.log_softmax(out.logits[0, len(c.prompt_ids) - 1:-1].float(), -1)
        for t, tok_id in enumerate(c.token_ids):
            p_sorted, order = logp_all[t].exp().sort(descending=True)
            nucleus = order[: int(((p_sorted.cumsum(0) - p_sorted) < 0.3).sum())].tolist()
            assert tok_id in nucleus
            # log-softmax of the same logits, one row at a time vs the batched decode: float32 rounding
            assert abs(c.logprobs[t] - float(logp_all[t, tok_id])) < 1e-4
        with torch.no_grad():
            ref, _ = token_logprobs(engine.model, ids, torch.ones_like(ids), head_fp32=True, with_entropy=False)
        assert torch.allclose(torch.tensor(c.logprobs), ref[0, len(c.prompt_ids) - 1:], atol=1e-4)


def test_params_from_the_recipe():
    r = _recipe("sampling.top_p=0.3", "sampling.temperature=0.9", "eval.temperature=0.6",
                "length.control=interrupt", name="scalerl")
    train, evaluation = SamplingParams.for_training(r), SamplingParams.for_evaluation(r)
    assert train == SamplingParams(max_new_tokens=20, temperature=0.9, top_p=0.3, interrupt=(12, 14, "\\boxed{"))
    # evaluation: the policy itself at eval.temperature (the same protocol whatever the recipe's top-p)
    assert evaluation == SamplingParams(max_new_tokens=20, temperature=0.6, top_p=1.0, interrupt=(12, 14, "\\boxed{"))
    assert SamplingParams.for_training(_recipe("length.control=none")).interrupt is None


@pytest.mark.parametrize("bad, match", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=0.0), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(interrupt=(3, 5, BOXED), max_new_tokens=5), "max_new_tokens"),
    (dict(interrupt=(0, 2, BOXED)), "1 <= min"), (dict(interrupt=(3, 4, "")), "empty"),
])
def test_bad_params_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{"max_new_tokens": 10, **bad})


@pytest.mark.parametrize("mode", ["sync", "ppo_off_policy"])
def test_training_rollouts_of_every_in_process_mode_follow_the_recipe(engine, tok, mode):
    """The loop's training batch with top_p 1.0 vs 0.3 (in-process modes): different completions,
    and each equals the engine's own output for ``SamplingParams.for_training`` of its recipe."""
    from scalectl.rl.batches.collect import generate_batch
    from scalectl.rl.loop import new_state
    from scalectl.rl.data.arithmetic import train_problems

    problems = train_problems(8, seed=0, difficulty=2)
    seen = []
    for top_p in (1.0, 0.3):
        recipe = _recipe(f"async.mode={mode}", f"sampling.top_p={top_p}", "batch.prompts_per_step=2",
                         "batch.generations_per_prompt=3", "filter.zero_variance=false")
        state = new_state(recipe, 0, len(problems))
        groups, _ = generate_batch(recipe, engine, problems, state, seed=5)
        got = [c.token_ids for g in groups for c in g.completions]
        ids = new_state(recipe, 0, len(problems)).sampler.next(2)
        direct = engine.generate([problems[i].prompt for i in ids], 3, SamplingParams.for_training(recipe),
                                 seed=5 * 1009)
        assert got == [c.token_ids for g in direct for c in g]
        seen.append(got)
    assert seen[0] != seen[1]


def test_evaluation_follows_the_recipe(engine, tok):
    """A held-out point at eval.temperature 0.3 differs from one at 1.0 (same seed and weights)."""
    from scalectl.rl.evaluation.during_training import Evaluations
    from scalectl.rl.loop import new_state, point_fields
    from scalectl.rl.data.arithmetic import eval_problems

    held = eval_problems(4, seed=0, difficulty=2)
    lengths = []
    for temperature in (1.0, 0.3):
        recipe = _recipe(f"eval.temperature={temperature}", "eval.samples_per_prompt=3")
        [(point, _)] = Evaluations(recipe, engine, held).start(point_fields(new_state(recipe, 0, 4)))
        lengths.append(point.mean_length)
    assert lengths[0] != lengths[1]
