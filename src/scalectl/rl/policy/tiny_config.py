"""The built-in tiny policy's architecture and vocabulary, without torch or transformers:
what the dry run needs to count its parameters and plan its memory in a fraction of a second.

:mod:`scalectl.rl.policy.model` builds the model and tokenizer from these.
"""

from __future__ import annotations

#: The one multi-character token: the answer marker of the synthetic tasks.
BOXED = "\\boxed{"
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
#: The tokenizer's vocabulary: the 4 special tokens, the 256 byte symbols, ``\\boxed{``.
TINY_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256 + 1

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


#: A tiny mixture-of-experts architecture (Qwen2-MoE): 2 layers of hidden 128, 4 attention heads of
#: 32 (the CPU build of vLLM has kernels for head sizes of 32 and up) sharing 2 KV heads, and in
#: every layer 4 routed experts (2 per token) of intermediate size 64 beside a shared expert of 128.
#: Positions, rotary base, norm epsilon and initialisation as :data:`TINY_CONFIG`.
TINY_MOE_CONFIG = dict(
    TINY_CONFIG,
    intermediate_size=256,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=128,
    num_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_key_value_heads=2,
)


def qwen2_parameter_count(config: dict, tie_word_embeddings: bool = False) -> int:
    """Parameters of a dense Qwen2 causal LM (transformers' ``Qwen2ForCausalLM``) from its config.

    Per layer: q, k, v projections with biases (H x n_heads d + n_heads d, and the same with the
    key/value heads for k and v), the output projection without bias (n_heads d x H), the gated
    MLP (3 x H x I) and two RMSNorm weights (2 H); then the embedding (V x H), the final norm
    (H) and the LM head (H x V, none when tied).  ``d`` is ``head_dim``, else H / n_heads.

    Args:
        config: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
            ``num_attention_heads``, ``vocab_size``; optional ``num_key_value_heads`` (default:
            the attention heads) and ``head_dim``.

    Raises:
        KeyError: a required key is missing.
    """
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, vocab = config["num_attention_heads"], config["vocab_size"]
    kv = config.get("num_key_value_heads") or heads
    d = config.get("head_dim") or h // heads
    attention = (h * heads * d + heads * d) + 2 * (h * kv * d + kv * d) + heads * d * h
    layer = attention + 3 * h * inter + 2 * h
    return vocab * h + layers * layer + h + (0 if tie_word_embeddings else h * vocab)
