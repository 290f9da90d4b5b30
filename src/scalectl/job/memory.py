"""Memory plans of the dry run: the generators' KV cache and the trainers' activations.

Pure functions on plain numbers (no torch), each naming its formula:

* a generator (a vLLM engine on ``gpus_per_generator`` = T GPUs) keeps its weights and a
  KV cache in ``gpu_memory_utilization`` x the GPU's memory: KV bytes per token =
  2 (keys and values) x layers x KV heads x head dim x dtype bytes (:func:`kv_bytes_per_token`),
  split over the T GPUs by heads; the completions it decodes at once follow from the async
  mode, the batch and k (:func:`completions_in_flight`), each up to the longest sequence
  (prompt + completion tokens).  A layout whose generators cannot hold one step's share of
  completions at full length is refused (:func:`generator_memory_plan`);
* a trainer holds, besides ZeRO's weights, gradients and optimiser states
  (:func:`scalectl.job.layout.trainer_memory`), the activations of one micro-batch
  (:func:`activation_bytes`, Korthikanti et al. 2022), with or without gradient checkpointing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalectl.display import bytes_text

#: Bytes per element of each model dtype.
DTYPE_BYTES = {"fp32": 4, "bf16": 2}

#: The largest block of logits the trainer's LM head materialises, in elements: 2**26 (the
#: value of :data:`scalectl.rl.policy.logprobs.HEAD_CHUNK_ELEMENTS`, repeated here without torch).
HEAD_CHUNK_ELEMENTS = 2**26
#: Blocks of float32 logits the head holds at its peak (forward and backward): measured
#: 0.26 x one (N, T, V) tensor over 16 blocks, i.e. 4.2 blocks (``tests/test_logprob_memory.py``).
HEAD_PEAK_BLOCKS = 4.2


@dataclass(frozen=True)
class Geometry:
    """What the memory plans need of an architecture (a transformers ``config.json``).

    Attributes:
        layers: transformer layers L; kv_heads: key/value heads per layer; head_dim: per head;
        hidden: hidden size h; vocab: vocabulary size V.
    """

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> "Geometry":
        """From a ``config.json`` dict (its ``text_config`` when it has one, as multimodal MoE
        checkpoints do): ``num_hidden_layers``, ``num_key_value_heads`` (default: the attention
        heads), ``head_dim`` (default: hidden_size / num_attention_heads), ``hidden_size``,
        ``vocab_size``.

        Raises:
            KeyError: a key without which the geometry is unknown (layers, hidden size, heads).
        """
        c = config.get("text_config") or config
        heads = c.get("num_attention_heads")
        kv = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads else None)
        if kv is None or head_dim is None:
            raise KeyError("num_attention_heads")
        return cls(int(c["num_hidden_layers"]), int(kv), int(head_dim), int(c["hidden_size"]),
                   int(c.get("vocab_size", 0)))


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, tensor_parallel: int = 1) -> int:
    """KV-cache bytes one token takes on one GPU of a generator:
    2 x layers x ceil(kv_heads / T) x head_dim x dtype bytes.

    2: a key and a value vector per KV head per layer (Pope et al. 2022, "Efficiently Scaling
    Transformer Inference", arXiv 2211.05102, Sec. 3.1; grouped-query attention shares them
    across query heads).  Tensor parallelism over T GPUs splits the KV heads (vLLM replicates a
    head on several GPUs when there are fewer heads than GPUs, hence the ceiling).  E.g. an 8B
    Llama-3 geometry (32 layers, 8 KV heads of 128, bf16): 2 x 32 x 8 x 128 x 2 = 131,072 bytes.

    Raises:
        ValueError: a count below 1.
    """
    if min(layers, kv_heads, head_dim, dtype_bytes, tensor_parallel) < 1:
        raise ValueError("layers, kv_heads, head_dim, dtype_bytes and tensor_parallel must be >= 1")
    return 2 * layers * math.ceil(kv_heads / tensor_parallel) * head_dim * dtype_bytes


def completions_in_flight(mode: str, k: int, prompts: int, group: int, generators: int) -> int:
    """Completions one generator decodes at once, before vLLM's ``max_num_seqs`` cap.

    A generator samples the prompts requested of it, at most ``prompts`` (P) in one call
    (:func:`scalectl.rl.processes.bodies.run_generator`), G completions each:

    * ``pipeline`` (PipelineRL-k): (k + 1) P prompts are kept requested across the M
      generators, so min(P, ceil((k + 1) P / M)) x G;
    * ``sync``: a round is P prompts, ceil(P / M) x G;
    * ``ppo_off_policy`` (k): a round is k P prompts, min(P, ceil(k P / M)) x G.

    Raises:
        ValueError: an unknown mode or a count below 1.
    """
    if min(k, prompts, group, generators) < 1:
        raise ValueError("k, prompts, group and generators must be >= 1")
    requested = {"pipeline": (k + 1) * prompts, "sync": prompts, "ppo_off_policy": k * prompts}
    if mode not in requested:
        raise ValueError(f"unknown async mode {mode!r}")
    return min(prompts, math.ceil(requested[mode] / generators)) * group


def step_share(prompts: int, group: int, generators: int) -> int:
    """Completions of one step that one generator samples: ceil(P / M) x G."""
    return math.ceil(prompts / generators) * group


@dataclass(frozen=True)
class GeneratorMemoryPlan:
    """One generator's memory (per GPU of it) against what it must hold.

    Attributes:
        gpu_bytes: memory of one GPU (``hardware.memory_gb``); utilization: vLLM's share of it.
        tensor_parallel: GPUs per generator T.
        weights: bytes of the weights on one GPU (params x dtype bytes / T).
        kv_per_token: KV bytes per token on one GPU (:func:`kv_bytes_per_token`).
        longest: the longest sequence, prompt + completion tokens.
        in_flight: completions decoded at once (:func:`completions_in_flight`, capped by max_num_seqs).
        step_share: one step's completions for this generator (:func:`step_share`).
    """

    gpu_bytes: float
    utilization: float
    tensor_parallel: int
    weights: float
    kv_per_token: int
    longest: int
    in_flight: int
    step_share: int

    @property
    def kv_budget(self) -> float:
        """Bytes left for the KV cache on one GPU: utilization x GPU memory - weights (may be < 0)."""
        return self.utilization * self.gpu_bytes - self.weights

    @property
    def tokens(self) -> int:
        """Tokens the KV cache holds: floor(kv_budget / kv_per_token) (0 when nothing is left)."""
        return max(0, int(self.kv_budget // self.kv_per_token))

    @property
    def concurrent(self) -> int:
        """Completions held at once at full length: floor(tokens / longest)."""
        return self.tokens // self.longest

    @property
    def fits_step(self) -> bool:
        """Whether one step's share of completions fits at full length."""
        return self.concurrent >= self.step_share

    def line(self) -> str:
        """The dry run's line."""
        held = min(self.in_flight, self.concurrent)
        return (f"generator memory (per GPU, {self.tensor_parallel} GPU(s) per generator): "
                f"{self.utilization:g} x {bytes_text(self.gpu_bytes)} = {bytes_text(self.utilization * self.gpu_bytes)}"
                f" - weights {bytes_text(self.weights)} = KV cache {bytes_text(max(self.kv_budget, 0))} at "
                f"{self.kv_per_token:,} bytes per token = {self.tokens:,} tokens = {self.concurrent} "
                f"completion(s) of {self.longest:,} tokens; a step's share is {self.step_share}, "
                f"{self.in_flight} decode at once" + ("" if held >= self.in_flight else
                                                      f" (vLLM preempts beyond {held})"))


def generator_memory_plan(*, params: int, geometry: Geometry, dtype: str, memory_gb: float, utilization: float,
                          tensor_parallel: int, longest: int, in_flight: int, step_share: int,
                          max_num_seqs: int) -> GeneratorMemoryPlan:
    """The memory plan of one generator (see :class:`GeneratorMemoryPlan`).

    weights per GPU = params x dtype bytes / T; KV budget = utilization x memory - weights;
    tokens = KV budget / (2 x L x ceil(kv_heads / T) x head_dim x dtype bytes).
    vLLM's own activation and CUDA-graph reserve is not counted (a few per cent at this scale).

    Raises:
        ValueError: an unknown dtype.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    b = DTYPE_BYTES[dtype]
    return GeneratorMemoryPlan(
        gpu_bytes=memory_gb * 1e9, utilization=utilization, tensor_parallel=tensor_parallel,
        weights=params * b / tensor_parallel,
        kv_per_token=kv_bytes_per_token(geometry.layers, geometry.kv_heads, geometry.head_dim, b, tensor_parallel),
        longest=longest, in_flight=min(in_flight, max_num_seqs), step_share=step_share)


def activation_bytes(*, micro_batch: int, seq_len: int, hidden: int, layers: int, checkpointing: bool,
                     dtype_bytes: int = 2) -> float:
    """Activation bytes one trainer keeps for the backward pass of one micro-batch of
    ``micro_batch`` sequences of ``seq_len`` tokens (the transformer layers; the LM head's
    blocks are :func:`head_bytes`).

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    arXiv 2205.05198, Sec. 4.1, Eq. 1): a layer keeps s b h (34 + 5 a s / h) bytes of 16-bit
    activations; the 5 a s / h term is the attention-score matrix, which FlashAttention and
    PyTorch's SDPA never store, leaving 34 s b h.  With full activation checkpointing (Sec. 4.2)
    a layer keeps only its input, 2 s b h, and one layer's 34 s b h is rebuilt at a time:

    - off: L x 34 s b h
    - on:  L x 2 s b h + 34 s b h

    scaled by dtype_bytes / 2 for float32 activations.

    Raises:
        ValueError: a count below 1.
    """
    if min(micro_batch, seq_len, hidden, layers, dtype_bytes) < 1:
        raise ValueError("micro_batch, seq_len, hidden, layers and dtype_bytes must be >= 1")
    sbh = seq_len * micro_batch * hidden * dtype_bytes / 2
    return (layers * 2 * sbh + 34 * sbh) if checkpointing else layers * 34 * sbh


def head_bytes(micro_batch: int, seq_len: int, vocab: int) -> float:
    """Bytes of the trainer's float32 LM-head logits at their peak: the head computes them in
    blocks of at most :data:`HEAD_CHUNK_ELEMENTS` (:func:`scalectl.rl.policy.logprobs.head_token_logprobs`),
    about :data:`HEAD_PEAK_BLOCKS` of which are alive at once; a micro-batch smaller than one
    block holds its b x s x V logits that many times."""
    block = min(HEAD_CHUNK_ELEMENTS, micro_batch * seq_len * vocab)
    return HEAD_PEAK_BLOCKS * block * 4
