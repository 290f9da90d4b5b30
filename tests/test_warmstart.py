"""SFT warm start: stop at the first check on target, cache hits, atomic writes.

A very small model (1 layer, hidden 64) on difficulty 1 (one-digit sums) with a
low target keeps these tests to a few seconds.
"""

import json
import re
from types import SimpleNamespace as NS

import pytest
import torch

import scalectl.rl.train.warmstart as ws
from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, load_policy
from scalectl.rl.data.arithmetic import eval_problems, sft_target, train_problems

SMALL = dict(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
             num_key_value_heads=2)
SFT = ws.SFTConfig(lr=5e-3, warmup_steps=5, batch_size=32, check_every=5, check_prompts=24, check_samples=2,
                   max_steps=400)
TARGET = 0.1



pytestmark = pytest.mark.usefixtures("one_torch_thread")

def _cfgs(target=TARGET, path="builtin:tiny", source="synthetic:arithmetic", train_size=60):
    return dict(model_cfg=NS(path=path, warm_start_target=target),
                data_cfg=NS(source=source, difficulty=1, seed=0, train_size=train_size), max_new_tokens=12)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One warm start, shared by the tests that only read it."""
    cache = tmp_path_factory.mktemp("cache")
    logs = []
    path = ws.ensure_warm_start(**_cfgs(), cache_dir=cache, sft=SFT, model_overrides=SMALL, log=logs.append)
    return path, cache, logs


def test_sft_batch_masks_exactly_the_completion():
    tok = build_tokenizer()
    problems = [NS(prompt="3+4=", answer="7"), NS(prompt="12-5+6=", answer="13")]
    ids, mask, target = ws.sft_batch(problems, tok)
    for r, p in enumerate(problems):
        completion = tok.encode(sft_target(p.prompt), add_special_tokens=False) + [tok.eos_token_id]
        predicted = ids[r, 1:][target[r].bool()].tolist()
        assert predicted == completion
        assert int(mask[r].sum()) == 1 + len(p.prompt) + len(completion)   # BOS + one token per character


def test_stops_at_first_check_on_target(built):
    path, _, logs = built
    meta = json.loads((path / "warmstart.json").read_text())
    rates = [h[2] for h in meta["history"]]
    assert rates[-1] >= TARGET and all(r < TARGET for r in rates[:-1])
    assert meta["pass_rate"] == rates[-1] and meta["steps"] == meta["history"][-1][0]
    assert meta["steps"] % SFT.check_every == 0 and 0 < meta["steps"] <= SFT.max_steps
    assert any("pass rate" in m for m in logs)
    # a line every LOG_EVERY_CHECKS-th check, from the one before training
    logged = [int(m.group(1)) for m in (re.search(r"warm start\[/\] step +(\d+)", x) for x in logs) if m]
    every = ws.LOG_EVERY_CHECKS * SFT.check_every
    assert logged == [h[0] for h in meta["history"] if h[0] % every == 0] and logged[0] == 0


def test_checkpoint_reaches_its_pass_rate_on_held_out_prompts(built):
    """Independent re-evaluation on the held-out prompts: the saved model is the trained one."""
    from scalectl.rl.evaluation.pass_rate import evaluate
    from scalectl.rl.reward.scoring import Scorer
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.sampling import SamplingParams

    path, _, _ = built
    model, tok = load_policy(path)
    fresh = build_tiny_model(seed=SFT.seed, **SMALL)
    held = eval_problems(SFT.check_prompts, seed=0, difficulty=1)
    kw = dict(samples_per_prompt=4, seed=123, score=Scorer())
    params = SamplingParams(max_new_tokens=12)
    trained = evaluate(CPURolloutEngine(model, tok), held, params, **kw)["pass_rate"]
    untrained = evaluate(CPURolloutEngine(fresh, tok), held, params, **kw)["pass_rate"]
    assert untrained == 0.0 and trained >= 0.05


def test_cache_hit_costs_nothing(built, monkeypatch):
    path, cache, _ = built

    def no_training(*a, **k):
        raise AssertionError("a cache hit must not train")

    monkeypatch.setattr(ws, "train_sft", no_training)
    assert ws.ensure_warm_start(**_cfgs(), cache_dir=cache, sft=SFT, model_overrides=SMALL) == path
    assert path.parent == cache and not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_key_depends_on_what_determines_the_weights():
    base = ws.cache_key(SMALL, 1, 0, 60, 0.3, 12, SFT)
    assert base == ws.cache_key(dict(SMALL), 1, 0, 60, 0.3, 12, SFT)
    others = [ws.cache_key(SMALL, 2, 0, 60, 0.3, 12, SFT), ws.cache_key(SMALL, 1, 1, 60, 0.3, 12, SFT),
              ws.cache_key(SMALL, 1, 0, 61, 0.3, 12, SFT), ws.cache_key(SMALL, 1, 0, 60, 0.25, 12, SFT),
              ws.cache_key(SMALL, 1, 0, 60, 0.3, 13, SFT), ws.cache_key({}, 1, 0, 60, 0.3, 12, SFT),
              ws.cache_key(SMALL, 1, 0, 60, 0.3, 12, ws.SFTConfig(lr=1e-3))]
    assert len({base, *others}) == 1 + len(others)


def test_a_larger_pool_shares_the_warm_start(built, monkeypatch):
    """The SFT set is the first SFT_PROBLEMS problems of the training split: a pool larger than
    that finds the same cache entry (nothing trained, nothing logged); a smaller one trains on
    its own pool, so its key differs."""
    path, cache, _ = built
    monkeypatch.setattr(ws, "SFT_PROBLEMS", 60)
    logs = []
    larger = ws.ensure_warm_start(**_cfgs(train_size=75), cache_dir=cache, sft=SFT, model_overrides=SMALL,
                                  log=logs.append)
    assert larger == path and logs == []
    assert train_problems(75, seed=0, difficulty=1)[:60] == train_problems(60, seed=0, difficulty=1)
    smaller = ws.cache_key(SMALL, 1, 0, 40, TARGET, 12, SFT)
    assert smaller != path.name == ws.cache_key(SMALL, 1, 0, 60, TARGET, 12, SFT)


def test_warm_start_problems_sets_the_sft_set(built):
    """model.warm_start_problems overrides min(data.train_size, SFT_PROBLEMS): a pool of 75
    with an SFT set of 60 finds the warm start trained on 60 (the same key); an SFT set of 40
    from a pool of 75 is another one; a pool smaller than the set does not cut the set."""
    path, cache, _ = built
    model = NS(path="builtin:tiny", warm_start_target=TARGET, warm_start_problems=60)
    pool = NS(source="synthetic:arithmetic", difficulty=1, seed=0, train_size=75)
    assert ws.sft_set_size(model, pool) == 60
    assert ws.sft_set_size(NS(warm_start_problems=None), pool) == min(75, ws.SFT_PROBLEMS)
    assert ws.sft_set_size(model, NS(train_size=30)) == 60
    logs = []
    found = ws.ensure_warm_start(model_cfg=model, data_cfg=pool, max_new_tokens=12, cache_dir=cache, sft=SFT,
                                 model_overrides=SMALL, log=logs.append)
    assert found == path and logs == []
    other = NS(path="builtin:tiny", warm_start_target=TARGET, warm_start_problems=40)
    assert ws.cache_key(SMALL, 1, 0, ws.sft_set_size(other, pool), TARGET, 12, SFT) != path.name


def test_crash_leaves_no_cache_entry(tmp_path, monkeypatch):
    """A crash while writing: nothing under the final name; the next call trains and succeeds."""
    def crash(model, tok, path):
        path.mkdir(parents=True)
        (path / "config.json").write_text("{")   # half written
        raise OSError("disk full")

    monkeypatch.setattr(ws, "save_policy", crash)
    with pytest.raises(OSError, match="disk full"):
        ws.ensure_warm_start(**_cfgs(target=0.02), cache_dir=tmp_path, sft=SFT, model_overrides=SMALL, log=print)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []
    monkeypatch.undo()
    path = ws.ensure_warm_start(**_cfgs(target=0.02), cache_dir=tmp_path, sft=SFT, model_overrides=SMALL, log=print)
    assert (path / "warmstart.json").is_file() and (path / "model.safetensors").is_file()
    load_policy(path)


def test_deterministic(built, tmp_path):
    path, _, _ = built
    again = ws.ensure_warm_start(**_cfgs(), cache_dir=tmp_path, sft=SFT, model_overrides=SMALL, log=print)
    a, _ = load_policy(path)
    b, _ = load_policy(again)
    assert again.name == path.name
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_not_reaching_the_target_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="warm_start_target"):
        ws.ensure_warm_start(**_cfgs(target=0.9), cache_dir=tmp_path, model_overrides=SMALL, log=print,
                             sft=ws.SFTConfig(max_steps=5, check_every=5, check_prompts=8, check_samples=1))


def test_other_paths_and_sources(tmp_path):
    assert ws.ensure_warm_start(**_cfgs(path=str(tmp_path))) == tmp_path
    with pytest.raises(FileNotFoundError, match="model.path"):
        ws.ensure_warm_start(**_cfgs(path=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="synthetic:arithmetic"):
        ws.ensure_warm_start(**_cfgs(source="data.jsonl"), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="needs a recipe"):
        ws.ensure_warm_start(model_cfg=NS(path="builtin:tiny", warm_start_target=0.3))


def test_takes_a_recipe(tmp_path, monkeypatch):
    """``ensure_warm_start(recipe)`` keys on the recipe's model, data and length.max_new_tokens."""
    from scalectl.recipe.schema import Recipe

    seen = {}
    monkeypatch.setattr(ws, "cache_key", lambda *a: seen.update(key_args=a) or "k")
    monkeypatch.setattr(ws, "train_sft", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop here")))
    recipe = Recipe.model_validate({"model": {"warm_start_target": 0.25}, "data": {"difficulty": 4},
                                    "length": {"max_new_tokens": 30, "interrupt_min": 20, "interrupt_max": 25}})
    with pytest.raises(RuntimeError, match="stop here"):
        ws.ensure_warm_start(recipe, cache_dir=tmp_path, log=lambda m: None)
    _, difficulty, _, _, target, max_new_tokens, _, mix = seen["key_args"]
    assert (difficulty, target, max_new_tokens, mix) == (4, 0.25, 30, {})


def test_sft_loss_with_label_smoothing_against_its_formula():
    """(1 - eps) (-log p(token)) + eps mean_v (-log p(v)) over the completion tokens, computed here
    from the model's own logits; eps = 0 is the plain cross-entropy of the RL's log-prob function."""
    tok = build_tokenizer()
    model = build_tiny_model(seed=3, **SMALL)
    ids, mask, tmask = ws.sft_batch([NS(prompt="3+4=", answer="7"), NS(prompt="12-5+6=", answer="13")], tok)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, :-1].double()
        logp = torch.log_softmax(logits, dim=-1)
        nll = -logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        uniform = -logp.mean(-1)
        for eps in (0.0, 0.05, 0.2):
            expected = (((1 - eps) * nll + eps * uniform) * tmask).sum() / tmask.sum()
            got = ws.sft_loss(model, ids, mask, tmask, eps)
            # float32 logits of a few hundred tokens: a few float32 epsilons of a loss near log V
            assert abs(float(got) - float(expected)) < 1e-5, (eps, float(got), float(expected))


def test_label_smoothing_is_a_setting_of_the_key_only_when_set():
    plain = ws.SFTConfig()
    assert ws.cache_key({}, 2, 0, 4000, 0.45, 20, plain) == "59c7f4608cc12e3c"     # the key it always had
    smooth = ws.SFTConfig(label_smoothing=0.05)
    assert ws.settings_key({}, 2, 0, 4000, 0.45, 20, smooth) != ws.settings_key({}, 2, 0, 4000, 0.45, 20, plain)


def test_a_greedy_target_then_a_flattened_head():
    """With a greedy target the SFT stops at the first greedy check on it, then the LM head is
    scaled down until the sampled check is at most the target: the most likely token of every
    step is unchanged (a scaled head keeps the argmax), the sampled pass rate falls."""
    sft = ws.SFTConfig(lr=5e-3, warmup_steps=5, batch_size=32, check_every=5, check_prompts=24, check_samples=2,
                       max_steps=400, greedy_target=0.3)
    model, tok, meta = ws.train_warm_start(SMALL, 1, 0, 60, 0.1, 12, sft, log=lambda m: None)
    greedy_checks = [h[2] for h in meta["history"]]
    assert greedy_checks[-1] >= 0.3 and all(r < 0.3 for r in greedy_checks[:-1])
    assert meta["greedy_pass_rate"] == greedy_checks[-1] and 0 < meta["head_scale"] < 1
    assert meta["pass_rate"] <= 0.1
    check = eval_problems(24, seed=0, difficulty=1)
    engine = ws.CPURolloutEngine(model, tok, head_fp32=True)
    # the flattened policy's greedy pass rate is the one the SFT stopped at (same argmax, same seed)
    assert ws.check_pass_rate(engine, check, sft, 12, seed=sft.seed + meta["steps"], greedy=True) == \
        meta["greedy_pass_rate"]
    assert ws.check_pass_rate(engine, check, sft, 12, seed=sft.seed) == meta["pass_rate"]
