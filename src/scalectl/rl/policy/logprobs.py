"""Log-probabilities of a causal LM: THE one computation, used by the trainer and the rollout engines.

So that ``precision.lm_head`` (ScaleRL, arXiv 2510.13786, Sec. 3.2: FP32 LM head)
applies on both sides, every log-prob of scalectl comes from here:

* :func:`token_logprobs`: teacher-forced log-probs (and entropies) of given tokens,
  a block of positions at a time (:func:`head_token_logprobs`), never over the whole
  (N, T, V) logits.
* :func:`packed_token_logprobs`: the same, for sequences packed several to a row
  (:mod:`scalectl.rl.train.packing`), so that the trainer computes no padding.
* :func:`next_token_logprobs`: one decoding step with a KV cache (the samplers).
* :func:`head_logits` / :func:`head_log_softmax`: the LM head, in float32 or the model dtype.
"""

from __future__ import annotations

import functools
import inspect
import types

import torch
import torch.nn.functional as F


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
    """:func:`token_logprobs` of sequences packed several to a row (:mod:`scalectl.rl.train.packing`).

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
                      use_cache=True, **cache_kwargs(model.model, cache))
    return head_log_softmax(model, out.last_hidden_state[:, -1], head_fp32=head_fp32, temperature=temperature)


@functools.cache
def cache_arg_of(cls: type) -> str:
    """The name under which ``cls.forward`` (a transformers model or decoder layer) takes its KV
    cache: ``cache`` from transformers 5.24 on, ``past_key_values`` before (the vLLM CPU build,
    for one, needs transformers < 5.20).  Passed under the other name, a cache is silently not
    filled."""
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module, cache) -> dict:
    """``{name: cache}`` for ``module.forward`` (:func:`cache_arg_of`)."""
    return {cache_arg_of(type(module)): cache}
