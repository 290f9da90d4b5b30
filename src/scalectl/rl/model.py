"""The built-in tiny policy (``model.path = "builtin:tiny"``) and the one log-prob function.

* :func:`build_tokenizer`: a character-level tokenizer (one token per byte, plus one
  multi-character token ``\\boxed{``), a transformers ``PreTrainedTokenizerFast``.
* :func:`build_tiny_model`: a Qwen2-architecture causal LM of ~1.1 M parameters
  (4 layers, hidden 128, untied LM head, eager attention), built from a config
  (no download).  Saved with ``save_pretrained`` it loads as any checkpoint
  (transformers ``AutoModelForCausalLM``, vLLM).
* :func:`token_logprobs` / :func:`next_token_logprobs`: THE log-prob computation,
  used by both the trainer and the rollout engine, so that ``precision.lm_head``
  (ScaleRL, arXiv 2510.13786, Sec. 3.2: FP32 LM head) applies on both sides.
  Teacher-forced log-probs and entropies are computed a block of positions at a
  time (:func:`head_token_logprobs`), never over the whole (N, T, V) logits.
  :func:`packed_token_logprobs`: the same, for sequences packed several to a row
  (:mod:`scalectl.rl.packing`), so that the trainer computes no padding.
* :func:`n_params`: the N of the FLOPs accounting (2N per generated token,
  6N per trained token; Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1).
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path

import torch
import torch.nn.functional as F

#: The one multi-character token: the answer marker of the synthetic tasks.
BOXED = "\\boxed{"
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)

#: The default tiny architecture (Qwen2).  Parameters: 4 x (4 x 128 x 128 attention
#: + 3 x 128 x 512 MLP + biases/norms) + 2 x 261 x 128 (embedding, untied head) = 1.12 M.
TINY_CONFIG = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_tokenizer():
    """The character-level tokenizer of the tiny model.

    One token per byte (so per character for ASCII), plus ``\\boxed{`` as one token.
    Vocabulary: ``<pad>`` (0), ``<unk>`` (1), ``<s>`` (2, BOS), ``</s>`` (3, EOS), the
    256 byte symbols of the GPT-2 byte-level alphabet (4-259), ``\\boxed{`` (260): 261.
    Every string encodes (``<unk>`` is declared but never produced: all bytes are in
    the vocabulary).

    Why byte-level BPE without merges rather than a WordLevel model: transformers 5.x
    ``AutoTokenizer`` loads the tokenizer of any ``model_type = "qwen2"`` checkpoint as
    ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the saved vocabulary and
    merges and ignores the saved pipeline; a WordLevel tokenizer does not survive that
    round trip (spaces are lost).  This tokenizer *is* a ``Qwen2Tokenizer`` (a
    ``PreTrainedTokenizerFast``), so the saved folder loads identically through
    ``AutoTokenizer`` (and vLLM).  ``\\boxed{`` is an added token, matched before the
    Qwen2 pre-tokenizer regex.

    The tokenizer adds no BOS itself: prompts are encoded by :func:`encode_prompt`.

    Returns:
        ``Qwen2Tokenizer`` with pad/unk/bos/eos set and left padding.
    """
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in bytes_to_unicode().values():
        vocab[symbol] = len(vocab)
    vocab[BOXED] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=UNK, bos_token=BOS, eos_token=EOS,
                         pad_token=PAD, padding_side="left")
    tok.add_tokens([AddedToken(BOXED, special=False, normalized=False)])
    return tok


def encode_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of prompts: the text's tokens, after the tokenizer's BOS when it has one.

    THE prompt encoding: the CPU and vLLM rollout engines, the warm start and the
    prompt-length filter of real prompt sets all use it, so no special token is
    assumed anywhere else.  The text is encoded without the tokenizer's own special
    tokens (``add_special_tokens=False``: some tokenizers would append EOS); BOS is
    then prepended once when ``tokenizer.bos_token_id`` is set and the text does not
    already begin with it (a chat template that writes the BOS string itself).  A
    tokenizer without BOS (``bos_token = None``, as many current chat models ship)
    gets the text's tokens alone.

    Args:
        tokenizer: a transformers tokenizer.
        texts: prompt texts (already rendered through a chat template where the recipe asks).

    Returns:
        One list of token ids per text.

    Raises:
        ValueError: a text that encodes to no token (empty, with a tokenizer without BOS).
    """
    bos = tokenizer.bos_token_id
    out = []
    for text, ids in zip(texts, tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
        ids = list(ids)
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        if not ids:
            raise ValueError(f"the prompt {text!r} encodes to no token")
        out.append(ids)
    return out


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of one prompt: :func:`encode_prompts` of ``[text]``.

    Raises:
        ValueError: a text that encodes to no token.
    """
    return encode_prompts(tokenizer, [text])[0]


def pad_token_id(tokenizer) -> int:
    """The id that fills padding slots: the tokenizer's pad token, else its EOS (many
    tokenizers have no pad token; padding slots are masked out, so any id serves).

    Raises:
        ValueError: the tokenizer has neither a pad nor an EOS token.
    """
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("the tokenizer has neither a pad token nor an eos token")


def eos_token_id(tokenizer) -> int:
    """The id that ends a completion (``finish_reason = "stop"``); it may equal the pad id.

    Raises:
        ValueError: the tokenizer has no EOS token.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer needs an eos token (it ends completions)")
    return int(tokenizer.eos_token_id)


def build_tiny_model(seed: int = 0, vocab_size: int | None = None, **overrides):
    """A freshly initialised Qwen2-architecture causal LM (``Qwen2ForCausalLM``).

    Args:
        seed: torch seed for the initialisation (same seed, same weights).
        vocab_size: defaults to the size of :func:`build_tokenizer`'s vocabulary.
        **overrides: any ``Qwen2Config`` field, over :data:`TINY_CONFIG`
            (e.g. ``num_hidden_layers=2``).

    Returns:
        The model in float32, eval mode, with ``tie_word_embeddings=False`` and
        ``attn_implementation="eager"`` (10-15 % faster than sdpa at this size on CPU).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer()
    cfg = dict(TINY_CONFIG)
    cfg.update(overrides)
    config = Qwen2Config(
        vocab_size=vocab_size or len(tok),
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        attn_implementation="eager",
        **cfg,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()


@contextlib.contextmanager
def _quiet_transformers():
    """No transformers progress bars ("Loading weights", "Writing model shards") on stderr."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def save_policy(model, tokenizer, path: str | Path) -> Path:
    """Write model and tokenizer with ``save_pretrained`` (safetensors): the folder
    loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``."""
    path = Path(path)
    with _quiet_transformers():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def load_policy(path: str | Path, dtype: str = "fp32"):
    """Load a checkpoint folder (``save_pretrained`` layout) as (model, tokenizer).

    Args:
        path: the folder.
        dtype: ``"fp32"`` or ``"bf16"`` (recipe ``model.dtype``).

    Returns:
        (model in eval mode with eager attention, tokenizer with left padding).

    Raises:
        ValueError: unknown dtype.  FileNotFoundError: no folder at ``path``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype = {dtype!r} is not one of: {', '.join(DTYPES)}")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {path}")
    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation="eager")
        tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: (attention_mask.cumsum(-1) - 1).clamp(min=0), shape of the mask."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _head_forward(head, hidden: torch.Tensor, head_fp32: bool = False, temperature: float = 1.0) -> torch.Tensor:
    weight, bias = head.weight, head.bias
    if head_fp32:
        hidden, weight = hidden.float(), weight.float()
        bias = bias.float() if bias is not None else None
    logits = F.linear(hidden, weight, bias)
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def route_head_through_module(model) -> None:
    """Make :func:`head_logits` call the LM head as a module (``model.lm_head(h, head_fp32=...)``)
    rather than read its weight: DeepSpeed ZeRO-3 partitions parameters and gathers them only
    in the hooks of a module call (outside one, ``lm_head.weight`` is an empty partition), and
    reduces their gradients through those hooks.  Plain calls ``lm_head(h)`` are unchanged."""
    head = model.lm_head
    head.forward = types.MethodType(_head_forward, head)
    head.routed_through_module = True


def head_logits(model, hidden: torch.Tensor, *, head_fp32: bool, temperature: float = 1.0) -> torch.Tensor:
    """LM head: logits W h / temperature, shape (..., V).

    With ``head_fp32`` the projection runs in float32 (hidden states and weight are
    upcast; ScaleRL, arXiv 2510.13786, Sec. 3.2); otherwise in the model dtype.  Through
    the module call when :func:`route_head_through_module` was applied (the trainer).

    Args:
        hidden: (..., H) final hidden states (after the last norm).
    """
    head = model.lm_head
    if getattr(head, "routed_through_module", False):
        return head(hidden, head_fp32=head_fp32, temperature=temperature)
    return _head_forward(head, hidden, head_fp32, temperature)


def head_log_softmax(model, hidden: torch.Tensor, *, head_fp32: bool, temperature: float = 1.0) -> torch.Tensor:
    """LM head and log-softmax: log pi(. | h) = log_softmax(W h / temperature), over the
    whole vocabulary (the sampler's per-step form; teacher-forced passes use
    :func:`head_token_logprobs`, which never holds this for all positions).

    Args:
        hidden: (..., H) final hidden states (after the last norm).
    Returns:
        (..., V) log-probabilities, float32 when ``head_fp32``, else the model dtype.
    """
    return torch.log_softmax(head_logits(model, hidden, head_fp32=head_fp32, temperature=temperature), dim=-1)


#: Largest (rows x columns x vocabulary) block of logits one chunk of
#: :func:`head_token_logprobs` materialises: 2**26 elements, 256 MiB in float32.
HEAD_CHUNK_ELEMENTS = 2**26


def _chunk_logprobs(model, hidden, targets, head_fp32, temperature, with_entropy):
    """log pi(target) and the entropy -sum_v pi(v) log pi(v) (no gradient) for one block of
    positions, (N, c) each, from the same log-softmax as the sampler's :func:`head_log_softmax`."""
    logp_all = head_log_softmax(model, hidden, head_fp32=head_fp32, temperature=temperature)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        z = logp_all.detach()
        entropy = -(z.exp() * z).sum(-1)
    return logp, entropy


def head_token_logprobs(
    model,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    head_fp32: bool = True,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int = HEAD_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the target tokens, and the entropy, from final hidden states, in blocks
    of positions: the (N, T, V) logits are never held at once.

    logp[i, t] = log_softmax(z[i, t])[y] with z = W h / temperature (:func:`head_logits`),
    y = targets[i, t] (the sampler's :func:`head_log_softmax`, so trainer and CPU
    engine agree to the last bit of the same arithmetic); entropy[i, t] =
    -sum_v pi(v) log pi(v).  Positions are taken
    ``c = max(1, chunk_elements // (N * V))`` at a time.  With gradients enabled and
    more than one block, each block is recomputed in the backward pass
    (``torch.utils.checkpoint``): the graph keeps only the (N, c, H) hidden block, so
    forward and backward peak at a few (N, c, V) blocks instead of several (N, T, V)
    tensors (measured: 0.26 against 5.0 times one (N, T, V) float32 tensor, 16
    blocks, ``tests/test_logprob_memory.py``); the head's matmul then runs three
    times instead of two.  The entropy is a
    logged value: it carries no gradient.

    Args:
        model: a causal LM with ``.lm_head``.
        hidden: (N, T, H) final hidden states.
        targets: (N, T) long, the token whose log-prob each position gives.
        head_fp32: LM head and log-softmax in float32.
        temperature: the temperature the log-probs refer to (> 0).
        with_entropy: also return the entropy per position.
        chunk_elements: most logits one block materialises.

    Returns:
        (logp (N, T), entropy (N, T) or None); float32 when ``head_fp32``.
    """
    N, T = targets.shape
    V = model.lm_head.out_features          # the weight may be a ZeRO-3 partition
    step = max(1, chunk_elements // max(1, N * V))
    # one block (at most chunk_elements logits): autograd may keep it, no recomputation
    grad = T > step and torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in model.lm_head.parameters()))
    logps, entropies = [], []
    for lo in range(0, T, step):
        h, y = hidden[:, lo:lo + step], targets[:, lo:lo + step]
        if grad:
            from torch.utils.checkpoint import checkpoint

            lp, ent = checkpoint(_chunk_logprobs, model, h, y, head_fp32, temperature, with_entropy,
                                 use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(model, h, y, head_fp32, temperature, with_entropy)
        logps.append(lp)
        if ent is not None:
            entropies.append(ent)
    logp = torch.cat(logps, dim=1) if logps else hidden.new_zeros((N, 0))
    entropy = (torch.cat(entropies, dim=1) if entropies else logp.detach().clone()) if with_entropy else None
    return logp, entropy


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    head_fp32: bool = True,
    temperature: float = 1.0,
    position_ids: torch.Tensor | None = None,
    start: int = 0,
    with_entropy: bool = True,
    chunk_elements: int = HEAD_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs of the realised next tokens, and the policy's entropy.

    logp[i, t] = log pi(input_ids[i, start + t + 1] | input_ids[i, :start + t + 1]), with
    pi = softmax(logits / temperature), computed in blocks of positions by
    :func:`head_token_logprobs` (the same head as :func:`head_log_softmax`).

    Args:
        model: a causal LM with ``.model`` (backbone) and ``.lm_head`` (Qwen2/Llama layout).
        input_ids: (N, L) long, prompt and completion, left padded.
        attention_mask: (N, L), 1 on real tokens, 0 on padding.
        head_fp32: LM head and log-softmax in float32 (``precision.lm_head = "fp32"``).
        temperature: sampling temperature the log-probs refer to (> 0).
        position_ids: (N, L); default :func:`position_ids_from_mask` (needed for left padding).
        start: skip the head for the first ``start`` target positions (e.g. the prompt
            columns, when all completions start at one column): outputs have L - 1 - start columns.
        with_entropy: also return the entropy -sum_v pi(v) log pi(v) per position (no gradient).
        chunk_elements: most logits held at once (see :func:`head_token_logprobs`).

    Returns:
        (logp (N, L-1-start), entropy (N, L-1-start) or None); float32 when ``head_fp32``.
        Values at padded targets are meaningless: mask them.
    """
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=False).last_hidden_state
    return head_token_logprobs(model, hidden[:, start:-1], input_ids[:, start + 1:], head_fp32=head_fp32,
                               temperature=temperature, with_entropy=with_entropy, chunk_elements=chunk_elements)


def packed_token_logprobs(
    model,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    index: torch.Tensor,
    targets: torch.Tensor,
    *,
    head_fp32: bool = True,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int = HEAD_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs` of sequences packed several to a row (:mod:`scalectl.rl.packing`).

    The backbone runs on the packed rows with ``attention_mask=None`` and the packed
    ``position_ids``, from which transformers builds the block-diagonal causal mask (each
    token sees the earlier tokens of its own sequence only); the hidden states the
    completion tokens need are gathered through ``index`` (gradients flow back through
    the gather), and the head is :func:`head_token_logprobs`, as on the padded path.

    Args:
        model: a causal LM with ``.model`` (backbone) and ``.lm_head``.
        input_ids: (R, C) long, the packed rows.
        position_ids: (R, C) long, restarting at 0 for each sequence.
        index: (n, T) long into the flattened R * C positions: the position whose hidden
            state predicts ``targets[i, t]``.
        targets: (n, T) long, the completion tokens (the padded batch's
            ``input_ids[:, start + 1:]``).
        head_fp32, temperature, with_entropy, chunk_elements: as :func:`token_logprobs`.

    Returns:
        (logp (n, T), entropy (n, T) or None), as :func:`token_logprobs` of the padded batch.

    Raises:
        ValueError: ``index`` and ``targets`` of different shapes, or ``position_ids`` not
            the shape of ``input_ids``.
    """
    if index.shape != targets.shape or position_ids.shape != input_ids.shape:
        raise ValueError(f"index {tuple(index.shape)} / targets {tuple(targets.shape)}, position_ids "
                         f"{tuple(position_ids.shape)} / input_ids {tuple(input_ids.shape)}: shapes must agree")
    hidden = model.model(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                         use_cache=False).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])[index]            # (n, T, H)
    return head_token_logprobs(model, hidden, targets, head_fp32=head_fp32, temperature=temperature,
                               with_entropy=with_entropy, chunk_elements=chunk_elements)


def next_token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache,
    *,
    head_fp32: bool = True,
    temperature: float = 1.0,
) -> torch.Tensor:
    """One decoding step: log pi(. | prefix) for the last position of ``input_ids``.

    The per-step variant of :func:`token_logprobs` (same head, same precision) for
    samplers with a KV cache.

    Args:
        input_ids: (N, S) new tokens (S = prompt length at prefill, 1 while decoding).
        attention_mask: (N, past + S), the mask of everything seen so far.
        position_ids: (N, S).
        cache: a transformers ``DynamicCache``, updated in place.

    Returns:
        (N, V) log-probabilities of the next token.
    """
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      cache=cache, use_cache=True)
    return head_log_softmax(model, out.last_hidden_state[:, -1], head_fp32=head_fp32, temperature=temperature)


def n_params(model, *, embeddings: bool = False) -> int:
    """Parameter count N for FLOPs accounting: 2N FLOPs per generated token, 6N per
    trained token (Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1).

    By default the input embedding table is excluded (a lookup, no multiply-adds), and
    the LM head is included (it is a matmul).  ``embeddings=True`` counts every parameter.
    """
    total = sum(p.numel() for p in model.parameters())
    if embeddings:
        return total
    return total - model.get_input_embeddings().weight.numel()
