"""The CPU rollout engine against a teacher-forced pass of the same weights, on an untrained tiny model."""

import threading

import pytest
import torch

from scalectl.rl.policy.model import BOXED, build_tiny_model, build_tokenizer, encode_prompt
from scalectl.rl.policy.logprobs import token_logprobs
from scalectl.rl.rollout import make_engine
from scalectl.rl.rollout.base import Completion
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams

PROMPTS = ["1+2=", "123+45-6=", "7-70+700="]



pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _small(seed=0, eos_bias=None):
    """Smaller than the default tiny model (engine tests need speed, not capacity).  With
    ``eos_bias`` the LM head gets a bias on EOS: +3 makes a random model stop after ~20
    tokens on average (rows of different lengths); -1e4 never, +1e4 at once."""
    m = build_tiny_model(seed=seed, num_hidden_layers=2, hidden_size=64, intermediate_size=128)
    if eos_bias is not None:
        bias = torch.zeros(m.config.vocab_size)
        bias[m.config.eos_token_id] = eos_bias
        m.lm_head.bias = torch.nn.Parameter(bias)
    return m


@pytest.fixture(scope="module")
def model():
    return _small(eos_bias=3.0)


def _teacher_forced(model, comps, pad, **kw):
    """Log-probs of each completion's tokens from one full forward pass (left padded together)."""
    seqs = [c.prompt_ids + c.token_ids for c in comps]
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, L - len(s):], mask[r, L - len(s):] = torch.tensor(s), 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, mask, **kw)
    return [logp[r, L - 1 - len(c.token_ids):] for r, c in enumerate(comps)]


def _flat(groups):
    return [c for g in groups for c in g]


def test_shapes_and_fields(model, tok):
    groups = CPURolloutEngine(model, tok).generate(PROMPTS, 3, SamplingParams(max_new_tokens=10), seed=0)
    assert [len(g) for g in groups] == [3, 3, 3]
    for i, g in enumerate(groups):
        for c in g:
            assert c.prompt_index == i and c.prompt_ids == encode_prompt(tok, PROMPTS[i])
            assert 1 <= len(c.token_ids) <= 10
            assert len(c.logprobs) == len(c.versions) == len(c.loss_mask) == len(c.token_ids)
            assert c.finish_reason == ("stop" if c.token_ids[-1] == tok.eos_token_id else "length")
            assert tok.eos_token_id not in c.token_ids[:-1]
            assert c.finish_reason == "stop" or len(c.token_ids) == 10
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert c.loss_mask == [1] * len(c.token_ids) and not c.interrupted
            assert all(lp <= 0 for lp in c.logprobs)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampler_logprobs_equal_teacher_forced(model, tok, temperature):
    """Prompts of different lengths (left padding) and rows that stop early (PAD, mask 0)."""
    engine = CPURolloutEngine(model, tok, head_fp32=True)
    comps = _flat(engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=16, temperature=temperature), seed=1))
    assert len({len(c.token_ids) for c in comps}) > 1  # rows finished at different steps
    forced = _teacher_forced(model, comps, tok.pad_token_id, temperature=temperature)
    for c, ref in zip(comps, forced):
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-5)
    # one completion alone (no padding at all) agrees too
    alone = _teacher_forced(model, comps[:1], tok.pad_token_id, temperature=temperature)[0]
    assert torch.allclose(torch.tensor(comps[0].logprobs), alone, atol=1e-5)


def test_sampling_is_without_dropout_when_the_trainer_left_the_model_in_training_mode(tok):
    """A model with attention dropout 0.5, shared with a trainer that left it in training mode
    (as every training step does): the engine samples in eval mode (log-probs equal a
    teacher-forced eval-mode pass, 1e-5 as above) and hands the model back in training mode."""
    m = build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128, attention_dropout=0.5)
    engine = CPURolloutEngine(m, tok)
    m.train()      # a training step after the engine was built
    comps = _flat(engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8), seed=4))
    assert m.training
    m.eval()
    for c, ref in zip(comps, _teacher_forced(m, comps, tok.pad_token_id, temperature=1.0)):
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-5)


def test_finished_rows_leave_the_decoding_batch(model, tok):
    """After the prefill, each decoding step feeds only the rows still running: a completion
    of L tokens is fed to L - 1 steps (its last token is never fed back)."""
    sizes = []   # the embedding sees every forward pass's input ids: the prefill's, then each step's
    hook = model.model.embed_tokens.register_forward_pre_hook(lambda mod, args: sizes.append(args[0].shape))
    try:
        comps = _flat(CPURolloutEngine(model, tok).generate(PROMPTS, 4, SamplingParams(max_new_tokens=16), seed=1))
    finally:
        hook.remove()
    prefill, steps = sizes[0], [s[0] for s in sizes[1:]]
    assert prefill[0] == len(comps) and all(s[1] == 1 for s in sizes[1:])
    assert steps == sorted(steps, reverse=True) and steps[-1] < len(comps)
    assert sum(steps) == sum(len(c.token_ids) - 1 for c in comps)


def test_fp32_head_used_when_asked(model, tok):
    bf16 = _small().to(torch.bfloat16)
    for head_fp32 in (True, False):
        comps = _flat(CPURolloutEngine(bf16, tok, head_fp32=head_fp32).generate(PROMPTS, 2, SamplingParams(max_new_tokens=6), seed=2))
        same = _teacher_forced(bf16, comps, tok.pad_token_id, head_fp32=head_fp32)
        other = _teacher_forced(bf16, comps, tok.pad_token_id, head_fp32=not head_fp32)
        err_same = max(float((torch.tensor(c.logprobs) - r.float()).abs().max()) for c, r in zip(comps, same))
        err_other = max(float((torch.tensor(c.logprobs) - r.float()).abs().max()) for c, r in zip(comps, other))
        # the engine matches the trainer's computation at the same precision far better than at the other
        assert err_same < err_other / 5, (head_fp32, err_same, err_other)


def test_deterministic_given_seed(model, tok):
    engine = CPURolloutEngine(model, tok)
    a = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8), seed=5)
    b = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8), seed=5)
    c = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8), seed=6)
    assert [x.token_ids for x in _flat(a)] == [x.token_ids for x in _flat(b)]
    assert [x.token_ids for x in _flat(a)] != [x.token_ids for x in _flat(c)]


def test_batch_split_gives_same_completions_when_each_batch_is_one_prompt(model, tok):
    """max_batch only changes how rows are grouped; with one row per batch vs all rows the
    samples differ (one generator stream), but the log-probs of each stay exact."""
    engine = CPURolloutEngine(model, tok, max_batch=1)
    comps = _flat(engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8), seed=0))
    for c, ref in zip(comps, _teacher_forced(model, comps, tok.pad_token_id)):
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-5)


def test_kv_bytes_per_row_and_rows_for_memory_by_hand():
    """2 x layers x kv heads x head dim x tokens x bytes: the default tiny model (4 layers, 4 heads
    of 32) at 32 + 20 tokens in float32 holds 2*4*4*32*52*4 = 212,992 bytes a row; 1 GiB holds
    floor(2^30 / 212,992) = 5,041 rows (5,041 x 212,992 = 1,073,692,672 <= 2^30 < 5,042 x 212,992).
    Grouped key/value heads and an explicit head_dim count as they are."""
    from types import SimpleNamespace

    from scalectl.rl.rollout.cpu import kv_bytes_per_row, rows_for_memory

    cfg = build_tiny_model(seed=0).config
    assert kv_bytes_per_row(cfg, 52, 4) == 212_992
    assert rows_for_memory(1024, 212_992) == 5_041
    gqa = SimpleNamespace(num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, hidden_size=3584)
    assert kv_bytes_per_row(gqa, 1000, 2) == 2 * 28 * 4 * 128 * 1000 * 2          # Qwen2.5-7B's shape, bf16
    explicit = SimpleNamespace(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=None,
                               hidden_size=512, head_dim=128)
    assert kv_bytes_per_row(explicit, 10, 4) == 2 * 2 * 8 * 128 * 10 * 4
    assert rows_for_memory(1e-9, 212_992) == 1                                     # never fewer than one row
    with pytest.raises(ValueError, match="memory_mib > 0"):
        rows_for_memory(0, 100)


def test_rows_per_batch_follow_the_memory_and_the_split_keeps_every_completion_exact(model, tok):
    """Without ``max_batch`` a call decodes as many rows together as ``kv_memory_mib`` holds for
    its longest prompt plus max_new_tokens; 3 rows' worth of memory splits 3 prompts x 3 = 9 rows
    into batches of 3, and every completion, in its group and order, keeps exact log-probs."""
    from scalectl.rl.rollout.cpu import kv_bytes_per_row

    longest = max(len(encode_prompt(tok, p)) for p in PROMPTS)
    per_row = kv_bytes_per_row(model.config, longest + 8, 4)
    engine = CPURolloutEngine(model, tok, kv_memory_mib=3.5 * per_row / 2**20)
    assert engine.rows_per_batch(longest, 8) == 3
    assert CPURolloutEngine(model, tok).rows_per_batch(longest, 8) == int(192 * 2**20 // per_row)
    assert CPURolloutEngine(model, tok, max_batch=7).rows_per_batch(longest, 8) == 7
    groups = engine.generate(PROMPTS, 3, SamplingParams(max_new_tokens=8), seed=0)
    assert [len(g) for g in groups] == [3, 3, 3]
    assert all(c.prompt_index == i for i, g in enumerate(groups) for c in g)
    comps = _flat(groups)
    for c, ref in zip(comps, _teacher_forced(model, comps, tok.pad_token_id)):
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-5)
    with pytest.raises(ValueError, match="kv_memory_mib must be > 0"):
        CPURolloutEngine(model, tok, kv_memory_mib=0)


def test_seed_blocks():
    from scalectl.rl.rollout.base import SeedBlock, seed_blocks

    assert seed_blocks(5, 2, 100, 2) == [SeedBlock(0, 4, 100), SeedBlock(4, 8, 102), SeedBlock(8, 10, 104)]
    assert seed_blocks(5, 2, 100) == seed_blocks(5, 2, 100, 5) == [SeedBlock(0, 10, 100)]
    with pytest.raises(ValueError, match="seed_block must be >= 1"):
        seed_blocks(5, 2, 100, 0)


SIX = ["1+2=", "123+45-6=", "7-70+700=", "9*9=", "40+2=", "3-1="]


@pytest.mark.parametrize("interrupt", [None, (3, 5, " so " + BOXED)])
def test_seed_blocks_sample_what_calls_of_each_block_alone_sample(model, tok, interrupt):
    """Prompts [lo, lo + 2) of a call with seed_block=2 get the tokens a call of those two prompts
    alone with seed + lo gets (interruption lengths included), in one batch or in batches of whole
    blocks, and their log-probs to float rounding (the batch's shape changes the sums' blocking:
    a few float32 epsilons of log-probs of at most ~log V = 5.6 here, far below 1e-5)."""
    params = SamplingParams(max_new_tokens=14, interrupt=interrupt)
    apart = [c for lo in (0, 2, 4) for g in CPURolloutEngine(model, tok).generate(SIX[lo:lo + 2], 3, params,
                                                                                  seed=40 + lo) for c in g]
    from scalectl.rl.rollout.cpu import kv_bytes_per_row

    longest = max(len(encode_prompt(tok, p)) for p in SIX)
    two_blocks = 12.5 * kv_bytes_per_row(model.config, longest + 14, 4) / 2**20      # 12 rows: 2 blocks of 6
    for engine in (CPURolloutEngine(model, tok), CPURolloutEngine(model, tok, kv_memory_mib=two_blocks)):
        together = _flat(engine.generate(SIX, 3, params, seed=40, seed_block=2))
        assert [c.token_ids for c in together] == [c.token_ids for c in apart]
        assert [c.loss_mask for c in together] == [c.loss_mask for c in apart]
        for a, b in zip(together, apart):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    one_stream = _flat(CPURolloutEngine(model, tok).generate(SIX, 3, params, seed=40))
    assert [c.token_ids for c in one_stream] != [c.token_ids for c in apart]     # one stream draws otherwise


def test_interruption_inserts_the_phrase(model, tok):
    """A random model rarely stops: with a range [3, 5] each completion gets the phrase right
    at its drawn length, marked as forced (loss_mask 0), then continues."""
    phrase = " so " + BOXED
    k = len(tok.encode(phrase, add_special_tokens=False))
    engine = CPURolloutEngine(model, tok)
    comps = _flat(engine.generate(PROMPTS, 6, SamplingParams(max_new_tokens=14, interrupt=(3, 5, phrase)), seed=3))
    phrase_ids = tok.encode(phrase, add_special_tokens=False)
    positions = set()
    for c in comps:
        if not c.interrupted:   # stopped (EOS) before its drawn length, or wrote the phrase itself
            assert c.finish_reason == "stop" and len(c.token_ids) <= 6 or phrase in c.text
            continue
        at = c.loss_mask.index(0)
        positions.add(at)
        assert 3 <= at <= 5
        assert c.loss_mask[at:at + k] == [0] * k and sum(c.loss_mask) == len(c.token_ids) - k
        assert c.token_ids[at:at + k] == phrase_ids and phrase in c.text
        assert len(c.token_ids) > at + k or c.finish_reason == "length"
    assert positions == {3, 4, 5}
    # forced tokens carry the model's log-prob of the forced token
    for c, ref in zip(comps, _teacher_forced(model, comps, tok.pad_token_id)):
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-5)


def test_interrupt_range_must_leave_room(model, tok):
    engine = CPURolloutEngine(model, tok)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=5, interrupt=(3, 5, BOXED)))
    with pytest.raises(ValueError, match="empty"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=9, interrupt=(3, 5, "")))


def test_truncation_and_stop(model, tok):
    """EOS forced by making its logit huge: every completion stops at once; with EOS
    impossible, every completion runs to max_new_tokens."""
    m = _small(eos_bias=1e4)
    engine = CPURolloutEngine(m, tok)
    comps = _flat(engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=7), seed=0))
    assert all(c.finish_reason == "stop" and c.token_ids == [tok.eos_token_id] and c.text == "" for c in comps)
    with torch.no_grad():
        m.lm_head.bias[tok.eos_token_id] = -1e4
    comps = _flat(engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=7), seed=0))
    assert all(c.finish_reason == "length" and c.truncated and len(c.token_ids) == 7 for c in comps)


def test_versions_and_weight_updates(model, tok):
    m = _small()
    engine = CPURolloutEngine(m, tok, version=3)
    assert {v for c in _flat(engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=4))) for v in c.versions} == {3}
    new = _small(seed=9).state_dict()
    engine.update_weights(new, 4)
    assert engine.version == 4 and torch.equal(m.lm_head.weight, new["lm_head.weight"])
    engine.update_weights(None, 5)   # shared model: version only
    assert engine.version == 5


def test_in_flight_update_tags_later_tokens(tok, monkeypatch):
    """A weight update from another thread between decoding steps: later tokens carry the new version."""
    import scalectl.rl.rollout.cpu as cpu

    m = _small(eos_bias=-1e4)   # never stops: every row runs all steps
    engine = CPURolloutEngine(m, tok, version=0)
    calls = {"n": 0}
    sample = cpu._sample

    def sample_then_update(*args):
        calls["n"] += 1
        if calls["n"] == 10:   # between two decoding steps, outside the engine's lock
            t = threading.Thread(target=engine.update_weights, args=(None, 1))
            t.start()
            t.join()
        return sample(*args)

    monkeypatch.setattr(cpu, "_sample", sample_then_update)
    comps = _flat(engine.generate(PROMPTS[:1], 2, SamplingParams(max_new_tokens=20), seed=0))
    for c in comps:
        # token 10 was sampled from the step-9 forward pass (version 0); tokens after it from version 1
        assert c.versions == [0] * 10 + [1] * 10


def test_make_engine_from_recipe(model, tok):
    from scalectl.recipe.schema import Recipe

    engine = make_engine(Recipe(), model, tok)
    assert isinstance(engine, CPURolloutEngine) and engine.head_fp32
    bf = Recipe.model_validate({"precision": {"lm_head": "bf16"}})
    assert make_engine(bf, model, tok).head_fp32 is False


def test_completion_checks_lengths():
    with pytest.raises(ValueError, match="one entry per token"):
        Completion(0, [2], [5, 6], [-1.0], [0, 0], "length", "ab")


#: A second end id, as chat models list an end-of-turn token beside the EOS in their
#: ``generation_config.json``: here the byte symbol 100 of the tiny vocabulary.
END_OF_TURN = 100


def _checkpoint_with_two_eos(tmp_path, tok, end_bias: float):
    """A tiny model saved with ``save_pretrained`` whose ``generation_config.json`` names EOS
    ids [3, 100], loaded back as any checkpoint.  Its LM head (a bias added after loading: the
    Qwen2 head has none to save) never picks the tokenizer's EOS and picks 100 with bias
    ``end_bias``."""
    from scalectl.rl.policy.model import load_policy, save_policy

    m = _small()
    m.generation_config.eos_token_id = [tok.eos_token_id, END_OF_TURN]
    path = tmp_path / f"two-eos-{end_bias:g}"
    if not path.exists():
        save_policy(m, tok, path)
    assert '"eos_token_id": [\n    3,\n    100\n  ]' in (path / "generation_config.json").read_text()
    model, loaded_tok = load_policy(path)
    bias = torch.zeros(model.config.vocab_size)
    bias[tok.eos_token_id], bias[END_OF_TURN] = -1e4, end_bias
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model, loaded_tok


def test_a_second_eos_of_the_generation_config_stops_completions(tmp_path, tok):
    """As ``model.generate`` (and vLLM): a completion ends at the first id of the model's stop set."""
    model, loaded_tok = _checkpoint_with_two_eos(tmp_path, tok, end_bias=1e4)
    forced = _flat(CPURolloutEngine(model, loaded_tok).generate(PROMPTS, 2, SamplingParams(max_new_tokens=16), seed=0))
    ids = torch.tensor([encode_prompt(loaded_tok, PROMPTS[0])])
    with torch.no_grad():
        reference = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
    reference = reference[0, ids.shape[1]:].tolist()
    # sampled completions of varied lengths (100 has probability ~0.03 a token)
    model, loaded_tok = _checkpoint_with_two_eos(tmp_path, tok, end_bias=2.0)
    comps = _flat(CPURolloutEngine(model, loaded_tok).generate(PROMPTS, 4, SamplingParams(max_new_tokens=48), seed=1))
    past = sum(END_OF_TURN in c.token_ids[:-1] for c in comps)
    print(f"\nmodel.generate: {reference}; engine: {sorted({(len(c.token_ids), c.finish_reason) for c in forced})}; "
          f"sampled: {past} of {len(comps)} run past a stop id, {sum(c.finish_reason == 'stop' for c in comps)} stop")
    assert reference == [END_OF_TURN]                      # transformers stops at the second id
    assert all(c.token_ids == [END_OF_TURN] and c.finish_reason == "stop" for c in forced)
    assert past == 0
    assert any(c.finish_reason == "stop" and len(c.token_ids) > 1 for c in comps)
    for c in comps:       # each ends at its first stop id, or at the length limit
        assert c.finish_reason == ("stop" if c.token_ids[-1] == END_OF_TURN else "length")
        assert c.finish_reason == "stop" or len(c.token_ids) == 48


def test_a_prompt_at_the_limit_gets_the_whole_budget_and_one_over_it_is_refused(tok):
    """length.max_prompt_tokens = 5: "1+2=" is 5 tokens with BOS (one per character), "12+2=" 6.
    The engine from the recipe (as the vLLM engine, tests/test_vllm.py) gives the first all
    max_new_tokens and refuses the second; the prompt sets drop such prompts beforehand."""
    from scalectl.recipe.schema import Recipe

    recipe = Recipe.model_validate({"length": {"max_prompt_tokens": 5, "max_new_tokens": 12, "control": "none"}})
    engine = make_engine(recipe, _small(eos_bias=-1e4), tok)      # never stops by itself
    params = SamplingParams.for_training(recipe)
    assert len(encode_prompt(tok, "1+2=")) == 5 and len(encode_prompt(tok, "12+2=")) == 6
    comps = _flat(engine.generate(["1+2="], 2, params, seed=0))
    assert [(len(c.token_ids), c.finish_reason) for c in comps] == [(12, "length")] * 2
    try:
        over = [len(c.token_ids) for c in _flat(engine.generate(["1+2=", "12+2="], 1, params, seed=0))]
    except ValueError as exc:
        over = str(exc)
    print(f"\na prompt one token over the limit: {over}")
    assert over == "prompt 1 has 6 tokens, more than length.max_prompt_tokens = 5 (the prompt sets drop such prompts)"
