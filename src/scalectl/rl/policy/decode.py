"""One decoding step over a static KV cache, eager or compiled (``torch.compile``, inductor).

The sampler's per-step forward pass, with a fixed number of kernels per step:

* :class:`StaticKV`: the keys and values of every layer, preallocated for the whole
  decode, (B, kv_heads, L_max, head_dim) per layer; a step writes one column in place
  (``index_copy_``), nothing is concatenated.  Its attention mask is preallocated too
  (:meth:`StaticKV.open_column`), additive (0 on seen tokens, the dtype's minimum elsewhere,
  as transformers' eager attention), so columns not yet written weigh exactly 0.
* :func:`decode_step`: embedding, the model's own decoder layers (their attention writes
  through :class:`StaticKV`'s ``update``), the final norm and the LM head with log-softmax
  (:func:`~scalectl.rl.policy.logprobs.head_log_softmax`, the trainer's head): the same
  arithmetic as :func:`~scalectl.rl.policy.logprobs.next_token_logprobs` over a
  ``DynamicCache``, up to the order of float summation over the masked columns.
* :func:`step_function`: :func:`decode_step` compiled by inductor (C++ for the CPU), with
  dynamic shapes (batch and cache length vary without recompiling), or eager with a
  warning where no C++ compiler is found or compilation fails (:class:`CompiledStep`).
  Compiled code is cached on disk (:func:`inductor_cache_dir`), so a new process pays
  the trace but not the C++ build.

The layers are called as modules of a Qwen2/Llama-layout model (``model.model.layers``,
``embed_tokens``, ``rotary_emb``, ``norm``; attention calling ``cache.update(k, v, layer_idx)``).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from scalectl.rl.policy.logprobs import cache_arg_of, head_log_softmax


def _release_cache_arg() -> str:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    return cache_arg_of(Qwen2DecoderLayer)


#: The KV-cache argument of a decoder layer's ``forward`` in the installed transformers (one name
#: for every architecture of a release), fixed at import so that the compiled step sees a constant.
CACHE_ARG = _release_cache_arg()


class StaticKV:
    """Preallocated keys, values and attention mask of one decoding batch.

    Args:
        keys, values: per layer, (B, kv_heads, L_max, head_dim) tensors.
        mask: (B, 1, 1, L_max) additive attention mask (0: attend; dtype minimum: not).
        column: (1,) long tensor, the cache column the next step writes.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor,
                 column: torch.Tensor):
        self.keys, self.values, self.mask, self.column = keys, values, mask, column

    @classmethod
    def from_prefill(cls, cache, attention_mask: torch.Tensor, new_tokens: int) -> "StaticKV":
        """The static cache holding a prefilled ``DynamicCache`` (its P columns first), room for
        ``new_tokens`` more, and the prefill's (B, P) 0/1 ``attention_mask``.

        Raises:
            ValueError: the cache holds no layer, or its length is not the mask's.
        """
        layers = getattr(cache, "layers", None)
        if not layers:
            raise ValueError("the prefilled cache holds no layer")
        B, P = attention_mask.shape
        keys, values = [], []
        for layer in layers:
            k, v = layer.keys, layer.values
            if k.shape[-2] != P:
                raise ValueError(f"prefilled cache of {k.shape[-2]} columns, mask of {P}")
            L = P + new_tokens
            kk = k.new_zeros((*k.shape[:2], L, k.shape[-1]))
            vv = v.new_zeros((*v.shape[:2], L, v.shape[-1]))
            kk[:, :, :P], vv[:, :, :P] = k, v
            keys.append(kk)
            values.append(vv)
        dtype = keys[0].dtype
        mask = torch.full((B, 1, 1, P + new_tokens), torch.finfo(dtype).min, dtype=dtype, device=keys[0].device)
        mask[:, 0, 0, :P].masked_fill_(attention_mask.to(mask.device).bool(), 0.0)
        column = torch.tensor([P], dtype=torch.long, device=keys[0].device)
        return cls(keys, values, mask, column)

    def open_column(self) -> None:
        """Let every row attend to the column the next step writes (its own token)."""
        self.mask[:, 0, 0, int(self.column)] = 0.0

    def advance(self) -> None:
        """Move to the next column, after a step."""
        self.column += 1

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (1-D long indices) of the batch (finished rows leave it)."""
        rows = rows.to(self.mask.device)
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask = self.mask.index_select(0, rows)

    @property
    def free_columns(self) -> int:
        """Columns not yet written."""
        return self.mask.shape[-1] - int(self.column)


class _LayerWriter:
    """The cache interface the model's attention calls: ``update(k, v, layer_idx)`` writes the
    step's (B, kv_heads, 1, head_dim) keys and values at ``column`` and returns the whole cache."""

    def __init__(self, keys, values, column):
        self.keys, self.values, self.column = keys, values, column

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.column, key_states)
        v.index_copy_(2, self.column, value_states)
        return k, v


def decode_step(model, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
                values: list[torch.Tensor], mask: torch.Tensor, column: torch.Tensor, head_fp32: bool,
                temperature: float) -> torch.Tensor:
    """One decoding step: log pi(. | prefix) of the next token, writing this step's keys and
    values into the static cache.

    Args:
        model: a Qwen2/Llama-layout causal LM (``.model`` with ``embed_tokens``, ``rotary_emb``,
            ``layers``, ``norm``; ``.lm_head``).
        input_ids: (B, 1) long, the tokens sampled last step.
        position_ids: (B, 1) long, their positions (left padding skipped).
        keys, values: per layer (B, kv_heads, L_max, head_dim), written in place at ``column``.
        mask: (B, 1, 1, L_max) additive mask, 0 on every column written so far and on ``column``.
        column: (1,) long, the column this step writes.
        head_fp32, temperature: as :func:`~scalectl.rl.policy.logprobs.head_log_softmax`.

    Returns:
        (B, V) log-probabilities (float32 when ``head_fp32``).
    """
    backbone = model.model
    hidden = backbone.embed_tokens(input_ids)
    position_embeddings = backbone.rotary_emb(hidden, position_ids)
    cache = _LayerWriter(keys, values, column)
    for layer in backbone.layers:
        hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=True,
                       position_embeddings=position_embeddings, **{CACHE_ARG: cache})
    hidden = backbone.norm(hidden)
    return head_log_softmax(model, hidden[:, -1], head_fp32=head_fp32, temperature=temperature)


def inductor_cache_dir() -> Path:
    """Where compiled steps are cached: ``$TORCHINDUCTOR_CACHE_DIR`` when set to a folder of
    one's own, else ``~/.cache/scalectl/inductor`` (set for this process; torch writes its own
    default, a folder in /tmp, into the variable when it first reads it, so that value
    counts as unset)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not path or os.path.abspath(path) == os.path.abspath(default_cache_dir()):
        path = str(Path.home() / ".cache" / "scalectl" / "inductor")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return Path(path)


def compiler_missing() -> str | None:
    """Why inductor cannot build C++ here (no compiler among ``torch._inductor.config.cpp.cxx``,
    i.e. ``$CXX`` or ``g++``), or None when it can."""
    try:
        from torch._inductor import config
        from torch._inductor.cpp_builder import cpp_compiler_search

        search = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
        getattr(cpp_compiler_search, "cache_clear", lambda: None)()   # it caches its last answer
        cpp_compiler_search(tuple(search))
        return None
    except Exception as exc:  # InvalidCxxCompiler, or inductor not importable
        return f"no C++ compiler for torch.compile ({type(exc).__name__}: {exc})".strip()


class CompiledStep:
    """:func:`decode_step` compiled by inductor, falling back to eager for good (one
    ``RuntimeWarning``) where no C++ compiler is found or the first compiled call fails.

    Call it as :func:`decode_step`.  :attr:`compiled` says which path runs now.
    """

    def __init__(self):
        inductor_cache_dir()   # before anything of inductor's reads its cache directory
        reason = compiler_missing()
        self._fn = None
        if reason is None:
            try:
                self._fn = torch.compile(decode_step, backend="inductor", dynamic=True)
            except Exception as exc:
                reason = f"torch.compile unavailable ({type(exc).__name__}: {exc})"
        if reason is not None:
            self._fall_back(reason)

    @property
    def compiled(self) -> bool:
        return self._fn is not None

    def _fall_back(self, reason: str) -> None:
        warnings.warn(f"{reason}: decoding steps run eagerly (same results, slower)", RuntimeWarning,
                      stacklevel=3)
        self._fn = None

    def __call__(self, model, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        # a batch of one row runs eagerly: inductor's dynamic shapes specialise a size of 1,
        # so the last live row of a batch would otherwise compile a second graph (seconds to
        # minutes on a CPU) for a step that costs milliseconds
        args = (model, input_ids, *args)
        if self._fn is not None and input_ids.shape[0] > 1:
            try:
                return self._fn(*args, **kwargs)
            except Exception as exc:
                # a rerun writes the same keys and values at the same column: harmless
                self._fall_back(f"compiling the decoding step failed ({type(exc).__name__}: {exc})")
        return decode_step(*args, **kwargs)


def step_function(compile_step: bool):
    """The decoding step to call: a :class:`CompiledStep` when ``compile_step``, else :func:`decode_step`."""
    return CompiledStep() if compile_step else decode_step
