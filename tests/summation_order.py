"""How far float32 rounding alone can move a log-prob: the same model with its sums in other orders.

A Qwen2 causal LM computes the same function, in exact arithmetic, after its residual-stream
channels, its MLP channels and its attention heads are permuted (every weight that reads or
writes a channel permuted alike; RMSNorm's mean of squares and every dot product only add
the same terms in another order).  In float32 each permutation rounds differently, so the
spread of a log-prob over a few such copies measures the rounding error of that token for
*this* model at *this* context: usually a few 1e-8, but 1e-4 to 1e-3 at the rare ill-conditioned
token (measured on the shipped warm start: a token whose spread over 8 copies was 6.2e-4
rms, against 9e-8 for the median token).  A second float32 implementation (vLLM's CPU kernels:
other blockings, fused operators) is one more such order, and can differ from the trainer's
pass by that much without any error in the weights it holds.

This is Monte Carlo arithmetic in spirit (Parker, Stott and Pierce, "Monte Carlo Arithmetic:
a framework for the statistical analysis of roundoff error", 2000): the rounding error is
estimated from the spread of equally valid evaluations rather than bounded a priori; a
worst-case first-order bound of the same tokens (every Linear's gamma_n |W||x| times the
log-prob's gradient) was 10^3 times the measured difference, too loose to tell weight
versions apart.
"""

from __future__ import annotations

import copy
import math

import torch


def reordered_copy(model, generator: torch.Generator):
    """A deep copy of a Qwen2 causal LM (``Qwen2ForCausalLM``) with permuted channels: the
    same function in exact arithmetic, float32 sums in another order.

    Permuted: the hidden size H (columns of the embedding, of q/k/v projections, of the MLP's
    gate and up projections and of the LM head; rows of the output and down projections;
    every RMSNorm weight), the attention heads (blocks of head_dim rows of q/k/v and their
    biases, columns of the output projection: rotary embedding acts within a head, so heads
    move whole) and the MLP's intermediate size I.

    Args:
        model: a ``Qwen2ForCausalLM`` with as many key/value heads as query heads.
        generator: the permutations' random source.

    Raises:
        ValueError: grouped key/value heads (their grouping would have to move with the queries).
    """
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads != kv_heads:
        raise ValueError(f"{heads} query heads share {kv_heads} key/value heads: not supported")
    out = copy.deepcopy(model)
    hidden, head_dim = cfg.hidden_size, cfg.hidden_size // heads
    p = torch.randperm(hidden, generator=generator)
    with torch.no_grad():
        out.model.embed_tokens.weight.copy_(out.model.embed_tokens.weight[:, p])
        out.lm_head.weight.copy_(out.lm_head.weight[:, p])
        out.model.norm.weight.copy_(out.model.norm.weight[p])
        for layer in out.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layer.input_layernorm.weight.copy_(layer.input_layernorm.weight[p])
            layer.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight[p])
            order = torch.randperm(heads, generator=generator)
            rows = (order[:, None] * head_dim + torch.arange(head_dim)).reshape(-1)
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj):
                lin.weight.copy_(lin.weight[rows][:, p])
                if lin.bias is not None:
                    lin.bias.copy_(lin.bias[rows])
            attn.o_proj.weight.copy_(attn.o_proj.weight[p][:, rows])
            q = torch.randperm(mlp.gate_proj.out_features, generator=generator)
            mlp.gate_proj.weight.copy_(mlp.gate_proj.weight[q][:, p])
            mlp.up_proj.weight.copy_(mlp.up_proj.weight[q][:, p])
            mlp.down_proj.weight.copy_(mlp.down_proj.weight[p][:, q])
    return out


def rounding_spread(values: list[float], reference: float) -> float:
    """Root mean square of ``values - reference``: the rounding spread of one log-prob (nats)
    over reordered copies (``values``) around the unpermuted pass (``reference``)."""
    return math.sqrt(sum((v - reference) ** 2 for v in values) / len(values))
