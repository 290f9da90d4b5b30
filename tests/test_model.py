"""The tiny policy: tokenizer round trips, save/load, token log-probs against a plain forward pass."""

import json

import pytest
import torch

from scalectl.rl.policy.model import BOXED, build_tiny_model, build_tokenizer, encode_prompt, load_policy, n_params, save_policy
from scalectl.rl.policy.logprobs import head_log_softmax, position_ids_from_mask, token_logprobs



pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


def _left_pad(seqs, pad):
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, L - len(s):], mask[r, L - len(s):] = torch.tensor(s), 1
    return ids, mask


def test_tokenizer_is_character_level_with_one_boxed_token(tok):
    text = "47+8-63=55;-8;" + BOXED + "-8}"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) - len(BOXED) + 1
    assert tok.convert_ids_to_tokens(ids).count(BOXED) == 1
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + 256 + 1


def test_any_text_round_trips_and_bos_comes_from_encode_prompt(tok):
    text = "Okay, time is up. </think>\n\tÉté 数 " + BOXED
    ids = encode_prompt(tok, text)
    assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_tiny_model_shape_and_parameter_count(model, tok):
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("qwen2", 4, 128)
    assert cfg.tie_word_embeddings is False and cfg._attn_implementation == "eager"
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    # per layer: q,k,v (128x128 + bias 128) + o (128x128) + MLP 3 x 128x512 + 2 norms of 128
    layer = 3 * (128 * 128 + 128) + 128 * 128 + 3 * 128 * 512 + 2 * 128
    V = len(tok)
    assert n_params(model) == 4 * layer + 128 + V * 128          # final norm + LM head, no embedding
    assert n_params(model, embeddings=True) == n_params(model) + V * 128


def test_same_seed_same_weights(model):
    again = build_tiny_model(seed=0)
    other = build_tiny_model(seed=1)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_save_load_through_auto_classes(tmp_path, model, tok):
    save_policy(model, tok, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    loaded, tok2 = load_policy(tmp_path, "fp32")
    text = "12+345=357;" + BOXED + "357} a b"
    assert tok2.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert tok2.decode(tok2.encode(text, add_special_tokens=False)) == text
    assert tok2.padding_side == "left"
    ids, mask = _left_pad([encode_prompt(tok, "1+2=3")], tok.pad_token_id)
    a, _ = token_logprobs(model, ids, mask)
    b, _ = token_logprobs(loaded, ids, mask)
    assert torch.equal(a, b)
    bf16, _ = load_policy(tmp_path, "bf16")
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="model.dtype"):
        load_policy(tmp_path, "fp16")


def test_token_logprobs_equal_full_forward_log_softmax(model, tok):
    seqs = [encode_prompt(tok, "12+34=46;" + BOXED + "46}"), encode_prompt(tok, "7-9=")]
    ids, mask = _left_pad(seqs, tok.pad_token_id)
    with torch.no_grad():
        logp, ent = token_logprobs(model, ids, mask, head_fp32=True, temperature=0.7)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    ref_all = torch.log_softmax(logits[:, :-1].float() / 0.7, -1)
    ref = ref_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = mask[:, 1:].bool()
    assert torch.allclose(logp[real], ref[real], atol=1e-5)
    ref_ent = -(ref_all.exp() * ref_all).sum(-1)
    assert torch.allclose(ent[real], ref_ent[real], atol=1e-5)
    assert logp.shape == (2, ids.shape[1] - 1)


def test_left_padding_does_not_change_logprobs(model, tok):
    seq = encode_prompt(tok, "123+456=579;" + BOXED + "579}")
    alone_ids, alone_mask = _left_pad([seq], tok.pad_token_id)
    ids, mask = _left_pad([seq, seq + seq], tok.pad_token_id)
    with torch.no_grad():
        alone, _ = token_logprobs(model, alone_ids, alone_mask)
        padded, _ = token_logprobs(model, ids, mask)
    assert torch.allclose(padded[0, -(len(seq) - 1):], alone[0], atol=1e-5)


def test_start_skips_leading_targets(model, tok):
    ids, mask = _left_pad([encode_prompt(tok, "1+2=3;4")], tok.pad_token_id)
    with torch.no_grad():
        full, _ = token_logprobs(model, ids, mask)
        tail, ent = token_logprobs(model, ids, mask, start=3, with_entropy=False)
    assert ent is None and torch.allclose(tail, full[:, 3:], atol=1e-6)


def test_head_precision(model):
    bf = build_tiny_model(seed=0).to(torch.bfloat16)
    hidden = torch.randn(3, 128, dtype=torch.bfloat16)
    assert head_log_softmax(bf, hidden, head_fp32=True).dtype == torch.float32
    assert head_log_softmax(bf, hidden, head_fp32=False).dtype == torch.bfloat16
    ref = torch.log_softmax(hidden.float() @ bf.lm_head.weight.float().T, -1)
    assert torch.allclose(head_log_softmax(bf, hidden, head_fp32=True), ref, atol=1e-5)
