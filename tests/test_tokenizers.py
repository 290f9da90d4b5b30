"""No special token is assumed: tokenizers without BOS, with EOS equal to the pad token or no pad
token, and with chat templates go through the one prompt encoding, the CPU engine, a training
batch and the prompt-length filter."""

from __future__ import annotations

import json

import pytest
import torch

from scalectl.rl.data.files import load_problems, render_prompt
from scalectl.rl.policy.model import (
    BOXED, build_tiny_model, build_tokenizer, encode_prompt, encode_prompts, eos_token_id, pad_token_id,
)
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tok(kind: str):
    """The tiny tokenizer, reconfigured: ``bos`` (as built: BOS <s>=2, pad 0, EOS 3), ``no-bos``
    (bos_token None), ``pad-is-eos`` (no BOS, pad = EOS = 3), ``no-pad`` (no BOS, no pad token),
    ``chat-bos`` (a template that writes the BOS string), ``chat-no-bos`` (ChatML, no BOS)."""
    tok = build_tokenizer()
    if kind in ("no-bos", "pad-is-eos", "no-pad", "chat-no-bos"):
        tok.bos_token = None
    if kind == "pad-is-eos":
        tok.pad_token = tok.eos_token
    if kind == "no-pad":
        tok.pad_token = None
    if kind == "chat-bos":
        tok.chat_template = "{{ bos_token }}" + CHATML
    if kind == "chat-no-bos":
        tok.chat_template = CHATML
    return tok


KINDS = ["bos", "no-bos", "pad-is-eos", "no-pad", "chat-bos", "chat-no-bos"]


def test_special_ids_of_each_tokenizer():
    assert [(_tok(k).bos_token_id, pad_token_id(_tok(k)), eos_token_id(_tok(k))) for k in KINDS] == [
        (2, 0, 3), (None, 0, 3), (None, 3, 3), (None, 3, 3), (2, 0, 3), (None, 0, 3)]
    tok = _tok("no-pad")
    tok.eos_token = None
    with pytest.raises(ValueError, match="neither a pad token nor an eos token"):
        pad_token_id(tok)
    with pytest.raises(ValueError, match="eos token"):
        eos_token_id(tok)


@pytest.mark.parametrize("kind", KINDS)
def test_encoding_adds_bos_only_when_the_tokenizer_has_one(kind):
    tok = _tok(kind)
    text = "12+3="
    body = tok.encode(text, add_special_tokens=False)
    assert len(body) == len(text)                                    # one token per character
    ids = encode_prompt(tok, text)
    assert None not in ids
    assert ids == ([2] + body if tok.bos_token_id is not None else body)
    assert encode_prompts(tok, [text, "7="]) == [ids, encode_prompt(tok, "7=")]


@pytest.mark.parametrize("kind", ["chat-bos", "chat-no-bos"])
def test_chat_template_prompts_get_bos_exactly_as_the_tokenizer_has_it(kind):
    tok = _tok(kind)
    messages = ({"role": "user", "content": "1+2=?"},)
    text = render_prompt(messages, tokenizer=tok, chat_template=True)
    ids = encode_prompt(tok, text)
    assert ids.count(2) == (1 if kind == "chat-bos" else 0)
    assert (ids[0] == 2) == (kind == "chat-bos")
    # the template's own BOS string, left in the text, is not doubled either
    if kind == "chat-bos":
        assert encode_prompt(tok, tok.bos_token + text) == ids


def test_empty_prompt_without_bos_is_refused():
    assert encode_prompt(_tok("bos"), "") == [2]
    with pytest.raises(ValueError, match="encodes to no token"):
        encode_prompt(_tok("no-bos"), "")


@pytest.fixture(scope="module")
def model():
    m = build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128)
    bias = torch.zeros(m.config.vocab_size)
    bias[3] = 3.0        # EOS: completions of varied length (~20 tokens)
    m.lm_head.bias = torch.nn.Parameter(bias)
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_rollouts_and_a_training_batch_with_each_tokenizer(model, kind):
    """Generation, stop on EOS (even when EOS is the pad id), and teacher-forced log-probs of the
    padded training batch equal to the engine's (padding masked whatever its id)."""
    from scalectl.rl.train.batch import build_train_batch
    from scalectl.rl.rollout.groups import Group
    from scalectl.rl.policy.logprobs import token_logprobs

    tok = _tok(kind)
    prompts = ["1+2=", "123+45-6=", "7-70+700="]
    if kind.startswith("chat"):
        prompts = [render_prompt(({"role": "user", "content": p},), tokenizer=tok, chat_template=True)
                   for p in prompts]
    groups = CPURolloutEngine(model, tok).generate(prompts, 3, SamplingParams(max_new_tokens=24), seed=4)
    comps = [c for g in groups for c in g]
    assert {c.finish_reason for c in comps} == {"stop", "length"}       # both kinds occur with this bias
    for i, g in enumerate(groups):
        for c in g:
            assert c.prompt_ids == encode_prompt(tok, prompts[i])
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == 3)
            assert 3 not in c.token_ids[:-1]
    scored = [Group(i, g, [j == 0 for j in range(3)], torch.tensor([1.0, -1.0, -1.0])) for i, g in enumerate(groups)]
    batch = build_train_batch(scored, "prompt", pad_token_id(tok))
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, start=batch.start,
                                 with_entropy=False)
    # the same float32 computation, batched differently (row-by-row KV-cache decode vs one pass)
    assert torch.allclose(logp * batch.loss_mask, batch.gen_logp * batch.loss_mask, atol=1e-4)


@pytest.mark.parametrize("kind, bos", [("bos", 1), ("no-bos", 0)])
def test_prompt_length_filter_counts_what_the_engines_encode(tmp_path, kind, bos):
    """Prompts of 8..15 characters (one token each) with max_prompt_tokens 12: kept exactly when
    their encoding (plus BOS only if the tokenizer has one) has at most 12 tokens."""
    rows = [{"prompt": "x" * (n - 2) + "?", "answer": str(n)} for n in range(9, 17)]
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = _tok(kind)
    instr = len(tok.encode(render_prompt(({"role": "user", "content": "x?"},)), add_special_tokens=False)) - 2
    limit = 12 + instr
    train, held, info = load_problems(str(src), held_out=1, tokenizer=tok, max_prompt_tokens=limit)
    kept = sorted(int(p.answer.answers[0]) for p in train + held)
    assert kept == [n for n in range(9, 17) if (n - 1) + bos <= 12]
    assert info["too_long"] == 8 - len(kept)
    assert all(len(encode_prompt(tok, p.prompt)) <= limit for p in train + held)


def test_interrupt_phrase_needs_no_special_token(model):
    tok = _tok("pad-is-eos")
    comps = [c for g in CPURolloutEngine(model, tok).generate(
        ["1+2="], 4, SamplingParams(max_new_tokens=12, interrupt=(2, 3, " so " + BOXED)), seed=1) for c in g]
    assert any(c.interrupted for c in comps)
