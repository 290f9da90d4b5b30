"""The built-in tiny policy (``model.path = "builtin:tiny"``), and loading and saving checkpoints.

* :func:`build_tokenizer`: a character-level tokenizer (one token per byte, plus one
  multi-character token ``\\boxed{``), a transformers ``PreTrainedTokenizerFast``.
* :func:`build_tiny_model`: a Qwen2-architecture causal LM of ~1.1 M parameters
  (4 layers, hidden 128, untied LM head, eager attention), built from a config
  (no download).  Saved with ``save_pretrained`` it loads as any checkpoint
  (transformers ``AutoModelForCausalLM``, vLLM).
* :func:`load_policy` / :func:`save_policy`: checkpoint folders in the ``save_pretrained`` layout.
* :func:`stop_token_ids`: the ids that end a completion in both rollout engines (the
  tokenizer's EOS and the EOS ids of the model's generation config, :func:`generation_config_of`).
* :func:`n_params`: the N of the FLOPs accounting (2N per generated token,
  6N per trained token; Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1).

The log-probs of a policy are computed in one place, :mod:`scalectl.rl.policy.logprobs`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from scalectl.rl.policy.tiny_config import (BOS, BOXED, EOS, PAD, SPECIAL_TOKENS, TINY_CONFIG,  # noqa: F401
                                            TINY_MOE_CONFIG, UNK)

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


def generation_config_of(source):
    """The generation config of a model, or of a checkpoint folder.

    Args:
        source: a transformers model (its ``generation_config``: what ``from_pretrained``
            read from ``generation_config.json``, else what it derived from the model's
            config), or a folder in the ``save_pretrained`` layout (its
            ``generation_config.json``, else the config derived from its ``config.json``).

    Returns:
        A transformers ``GenerationConfig``, or None (a folder with neither file, an object
        without one).
    """
    if not isinstance(source, (str, Path)):
        return getattr(source, "generation_config", None)
    from transformers import AutoConfig, GenerationConfig

    path = Path(source)
    if (path / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(path)
    if (path / "config.json").is_file():
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    return None


def stop_token_ids(tokenizer, generation_config=None) -> list[int]:
    """THE ids that end a completion (``finish_reason = "stop"``), in both rollout engines:
    the tokenizer's EOS and every EOS id of the model's generation config.

    Chat models often list several there (an end-of-turn token beside the EOS, e.g.
    ``[151645, 151643]``); ``model.generate`` and vLLM stop on each of them, and so must the
    engines, or a completion runs past its own end of turn to the length limit.  The CPU
    engine stops on them (:class:`scalectl.rl.rollout.cpu.CPURolloutEngine`), the vLLM engine
    passes them as ``SamplingParams.stop_token_ids`` (:mod:`scalectl.rl.rollout.vllm`).

    Args:
        tokenizer: a transformers tokenizer.
        generation_config: the model's (:func:`generation_config_of`), or None.

    Returns:
        The ids, ascending, without repeats.

    Raises:
        ValueError: neither the tokenizer nor the generation config names an EOS.
    """
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update(int(t) for t in ([eos] if isinstance(eos, int) else eos))
    if not ids:
        raise ValueError("the tokenizer needs an eos token (it ends completions)")
    return sorted(ids)


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


def build_tiny_moe(seed: int = 0, **overrides):
    """A freshly initialised tiny mixture-of-experts causal LM (``Qwen2MoeForCausalLM``,
    :data:`TINY_MOE_CONFIG` with ``overrides``), for :func:`build_tokenizer`'s vocabulary.
    Saved with :func:`save_policy` it is a checkpoint folder like any other (``model.path``).

    Returns:
        The model in float32, eval mode, untied LM head, eager attention.
    """
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    tok = build_tokenizer()
    config = Qwen2MoeConfig(vocab_size=len(tok), tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                            attn_implementation="eager", **{**TINY_MOE_CONFIG, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2MoeForCausalLM(config)
    return model.eval()


def checkpoint_state(model, state: dict) -> dict:
    """``state`` (some of ``model.state_dict()``'s (name, tensor) pairs) in the checkpoint's
    names and layout, as ``save_pretrained`` writes them and other loaders (vLLM's
    ``load_weights``) read them.

    transformers 5 holds the experts of a mixture-of-experts layer fused (``mlp.experts.gate_up_proj``
    of shape (E, 2 I, H)) where checkpoints keep one tensor per expert and projection
    (``mlp.experts.3.gate_proj.weight``); transformers' own reverse conversion
    (``core_model_loading.revert_weight_conversion``) maps one to the other, tensor by tensor.
    Dense models, and versions without the conversion, come back as they are.

    Args:
        model: the transformers model (or one built like it on the meta device).
    """
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return dict(state)
    return dict(revert_weight_conversion(model, dict(state)))


def meta_model(config):
    """A transformers causal LM of ``config`` on the meta device (no memory), e.g. for
    :func:`checkpoint_state` where only the architecture is known."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


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
