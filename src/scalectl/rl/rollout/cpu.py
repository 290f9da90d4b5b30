"""The CPU rollout engine: batched sampling with a KV cache over a transformers causal LM.

The model may sit on a GPU: its inputs are moved to the model's device and
each step's log-probs back to the CPU, where sampling and bookkeeping stay
(one random stream whatever the device).

Each batch of prompts is left padded; positions skip the padding
(``position_ids = cumsum(mask) - 1``).  The prompt is prefilled through a ``DynamicCache``
(:func:`scalectl.rl.policy.logprobs.next_token_logprobs`); its keys and values then move
into a static cache preallocated for the whole decode
(:class:`scalectl.rl.policy.decode.StaticKV`), which each decoding step
(:func:`scalectl.rl.policy.decode.decode_step`) writes one column of, in place; with
``compile_step`` that step is compiled by inductor (eager, with a warning, where it cannot
be).  A finished row leaves the decoding batch and its rows of the cache, so later steps
compute only live rows.  Both passes end in the trainer's head
(:func:`~scalectl.rl.policy.logprobs.head_log_softmax`, same precision), so the recorded
generator log-probs equal a teacher-forced pass of the same weights up to float rounding.

A call decodes its rows in batches of as many rows as :data:`DEFAULT_KV_MEMORY_MIB` (or the
engine's ``kv_memory_mib``, recipe ``hardware.decode_memory_mib``) holds in that static cache
(:func:`rows_for_memory`): larger batches amortise the fixed cost of each decoding step's
operator calls over more rows (benchmarks/bench_decode_rows.py).

Weights may be replaced from another thread while a batch decodes
(:meth:`CPURolloutEngine.update_weights`, PipelineRL in-flight updates): each
decoding step runs under a lock and tags its tokens with the version current at
that step; the KV cache of earlier tokens is kept (computed by the older weights),
as in PipelineRL.  A generator process that receives weights over the network
sets :attr:`CPURolloutEngine.poll_weights`: the engine calls it before every
forward pass (prefill and each decoding step), and it loads whatever weights
have arrived (through :meth:`~CPURolloutEngine.update_weights`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from scalectl.rl.rollout.length import interrupt_lengths
from scalectl.rl.policy.model import encode_prompts, generation_config_of, load_policy, pad_token_id, stop_token_ids
from scalectl.rl.policy.decode import StaticKV, step_function
from scalectl.rl.policy.logprobs import next_token_logprobs, position_ids_from_mask
from scalectl.rl.rollout.base import Completion, RolloutEngine, SamplingParams, check_prompt_lengths, seed_blocks


#: Memory for the keys and values of one decoding batch (MiB), by default: 192 MiB hold about 1,100
#: rows of the tiny setup's model at 25 + 20 tokens, where its decoding rate peaked on a quiet
#: 2-core machine (1,024 rows: 1.10x the rate of 512, 4,000 rows 0.80x; benchmarks/README.md);
#: ``hardware.decode_memory_mib``.
DEFAULT_KV_MEMORY_MIB = 192.0


def kv_bytes_per_row(config, tokens: int, bytes_per_value: int) -> int:
    """Bytes of the keys and values one row holds over ``tokens`` positions:
    2 x layers x key/value heads x head dim x tokens x ``bytes_per_value``.

    Args:
        config: a transformers model config (``num_hidden_layers``, ``num_attention_heads``,
            ``num_key_value_heads`` (default: the attention heads), ``hidden_size``, ``head_dim``
            (default: hidden_size / heads)).
        tokens: positions per row (the longest prompt plus ``max_new_tokens``).
        bytes_per_value: 4 for float32, 2 for bfloat16.
    """
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * tokens * bytes_per_value


def rows_for_memory(memory_mib: float, bytes_per_row: int) -> int:
    """Rows of ``bytes_per_row`` (:func:`kv_bytes_per_row`) that ``memory_mib`` MiB hold, at least 1.

    Raises:
        ValueError: ``memory_mib`` or ``bytes_per_row`` not > 0.
    """
    if not (memory_mib > 0 and bytes_per_row > 0):
        raise ValueError(f"need memory_mib > 0 and bytes_per_row > 0 (given {memory_mib}, {bytes_per_row})")
    return max(1, int(memory_mib * 2**20 // bytes_per_row))


class CPURolloutEngine(RolloutEngine):
    """Sampling engine over a transformers model held in this process.

    Args:
        model: a causal LM with ``.model`` and ``.lm_head`` (e.g. ``Qwen2ForCausalLM``).
        tokenizer: its tokenizer (padding uses :func:`~scalectl.rl.policy.model.pad_token_id`,
            which may equal the EOS).  A completion stops at any of
            :func:`~scalectl.rl.policy.model.stop_token_ids` (the tokenizer's EOS and the EOS
            ids of the model's generation config), as in the vLLM engine.
        head_fp32: LM head and log-softmax in float32 (``precision.lm_head = "fp32"``).
        max_batch: most rows (completions) decoded together; larger calls are split.  None (the
            default): as many as ``kv_memory_mib`` holds (:func:`rows_for_memory` of the call's
            longest prompt plus ``max_new_tokens``).  Batches hold whole seed blocks where one
            fits (:meth:`generate`), so the split changes no sample; a block cut across batches
            draws from its stream in turn, and another cut samples other tokens (from the same
            distribution).
        kv_memory_mib: memory for one decoding batch's keys and values (MiB; the prompt's
            prefill cache holds as much again while it moves into the static cache).
        version: policy version of the initial weights.
        poll_weights: called with no argument before every forward pass, outside the
            engine's lock; it may call :meth:`update_weights` (in-flight weight updates:
            tokens sampled after it carry the new version).
        max_prompt_tokens: longest prompt accepted (``length.max_prompt_tokens``; None: any),
            as in the vLLM engine (:func:`~scalectl.rl.rollout.base.check_prompt_lengths`).
        compile_step: compile the decoding step (``torch.compile``, inductor: C++ for the CPU;
            :class:`~scalectl.rl.policy.decode.CompiledStep`).  The first batch then pays the
            trace and, without a cached build (``~/.cache/scalectl/inductor``), the C++ build;
            where no C++ compiler is found or compilation fails, steps run eagerly and a
            ``RuntimeWarning`` says so.  Same log-probs either way, up to float rounding.
    """

    def __init__(self, model, tokenizer, *, head_fp32: bool = True, max_batch: int | None = None,
                 kv_memory_mib: float = DEFAULT_KV_MEMORY_MIB, version: int = 0, poll_weights=None,
                 max_prompt_tokens: int | None = None, compile_step: bool = False):
        self.pad_id = pad_token_id(tokenizer)
        self.stop_ids = stop_token_ids(tokenizer, generation_config_of(model))
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not kv_memory_mib > 0:
            raise ValueError(f"kv_memory_mib must be > 0, got {kv_memory_mib}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.head_fp32 = head_fp32
        self.max_batch = max_batch
        self.kv_memory_mib = kv_memory_mib
        self._version = version
        self._lock = threading.Lock()
        self.poll_weights = poll_weights
        self.max_prompt_tokens = max_prompt_tokens
        self._step = step_function(compile_step)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "fp32", **kwargs) -> "CPURolloutEngine":
        """An engine over the checkpoint folder ``path`` (see :func:`scalectl.rl.policy.model.load_policy`)."""
        model, tokenizer = load_policy(path, dtype)
        return cls(model, tokenizer, **kwargs)

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, state_dict: dict | None, version: int) -> None:
        """Copy ``state_dict`` into the model (strict) and tag later tokens with ``version``.

        ``state_dict=None``: the engine shares its model object with the trainer (one
        process), so the weights are already current and only the version changes.
        """
        with self._lock, torch.no_grad():
            if state_dict is not None:
                self.model.load_state_dict(state_dict, strict=True)
            self._version = int(version)

    def generate(self, prompts: list[str], n: int, params: SamplingParams, *, seed: int = 0,
                 seed_block: int | None = None) -> list[list[Completion]]:
        """See :meth:`RolloutEngine.generate`.  ``params.top_p`` < 1 samples from the
        nucleus but still records the full-softmax log-probs.

        Rows are decoded in batches of :meth:`rows_per_batch`, each of whole seed blocks
        (:func:`~scalectl.rl.rollout.base.seed_blocks`) where one fits: a block's draws then do
        not depend on what else its batch holds, only on its own rows (their logits move with
        the batch's shape by float rounding at most).  A block larger than a batch is decoded in
        several, its stream continuing from one to the next.

        Raises:
            ValueError: n < 1, a prompt or an interruption phrase that encodes to no token, a
                prompt longer than ``max_prompt_tokens``, ``seed_block`` < 1.
        """
        phrase_ids = self.check_request(n, params)
        encoded = encode_prompts(self.tokenizer, prompts)
        check_prompt_lengths(encoded, self.max_prompt_tokens)
        blocks = seed_blocks(len(encoded), n, int(seed), seed_block)
        streams = [torch.Generator().manual_seed(b.seed) for b in blocks]
        rows = [(i, ids) for i, ids in enumerate(encoded) for _ in range(n)]
        per_batch = self.rows_per_batch(max((len(ids) for ids in encoded), default=1), params.max_new_tokens)
        out: list[list[Completion]] = [[] for _ in prompts]
        # sampling is inference: no dropout, whatever mode the trainer sharing the model left it
        # in (its step sets training mode; a compiled step would also recompile on the flag)
        training = self.model.training
        self.model.eval()
        try:
            for batch in _batches(blocks, per_batch):
                first = batch[0][1]
                chunk = rows[first:batch[-1][2]]
                segments = [(streams[b], lo - first, hi - first) for b, lo, hi in batch]
                for c in self._decode(chunk, params, phrase_ids, segments):
                    out[c.prompt_index].append(c)
        finally:
            self.model.train(training)
        return out

    def rows_per_batch(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Rows decoded together for prompts of at most ``prompt_tokens``: ``max_batch`` when
        set, else what ``kv_memory_mib`` holds (:func:`rows_for_memory`) at the model's dtype."""
        if self.max_batch is not None:
            return self.max_batch
        size = next(self.model.parameters()).element_size()
        return rows_for_memory(self.kv_memory_mib, kv_bytes_per_row(self.model.config, prompt_tokens + max_new_tokens,
                                                                    size))

    # ------------------------------------------------------------------ one batch

    @torch.inference_mode()
    def _decode(self, rows, params: SamplingParams, phrase_ids, segments) -> list[Completion]:
        """Decode one batch; ``segments``: (random stream, first row, stop row) covering ``rows``
        in order, each segment's draws (interruption lengths, then each step's tokens of its live
        rows) from its own stream."""
        from transformers import DynamicCache

        max_new_tokens, temperature, top_p, interrupt = (params.max_new_tokens, params.temperature, params.top_p,
                                                         params.interrupt)
        pad, stops = self.pad_id, torch.tensor(self.stop_ids, dtype=torch.long)
        B, P = len(rows), max(len(ids) for _, ids in rows)
        input_ids = torch.full((B, P), pad, dtype=torch.long)
        mask = torch.zeros((B, P), dtype=torch.long)
        for r, (_, ids) in enumerate(rows):
            input_ids[r, P - len(ids):] = torch.tensor(ids)
            mask[r, P - len(ids):] = 1
        positions = position_ids_from_mask(mask)
        next_pos = mask.sum(-1, keepdim=True)  # (B, 1): position of the next token

        tokens = torch.full((B, max_new_tokens), pad, dtype=torch.long)
        logps = torch.zeros((B, max_new_tokens), dtype=torch.float32)
        versions = torch.zeros((B, max_new_tokens), dtype=torch.long)
        forced = torch.zeros((B, max_new_tokens), dtype=torch.bool)
        length = torch.zeros(B, dtype=torch.long)  # tokens generated so far
        done = torch.zeros(B, dtype=torch.bool)
        stopped = torch.zeros(B, dtype=torch.bool)

        k = len(phrase_ids)
        phrase = torch.tensor(phrase_ids, dtype=torch.long)
        at = (torch.cat([interrupt_lengths(hi - lo, interrupt[0], interrupt[1], gen) for gen, lo, hi in segments])
              if interrupt is not None else torch.full((B,), -1, dtype=torch.long))
        force_pos = torch.full((B,), -1, dtype=torch.long)  # index into the phrase while forcing, else -1
        interrupted = torch.zeros(B, dtype=torch.bool)
        seen_phrase = torch.zeros(B, dtype=torch.bool)

        cache = DynamicCache(config=self.model.config)
        dev = self.model.device      # the model's inputs go there; the bookkeeping stays on the CPU
        if self.poll_weights is not None:
            self.poll_weights()
        with self._lock:
            step_logp = next_token_logprobs(self.model, input_ids.to(dev), mask.to(dev), positions.to(dev), cache,
                                            head_fp32=self.head_fp32, temperature=temperature).cpu()
            version = self._version
        kv = None
        live = torch.arange(B)   # rows still decoding: finished rows leave the batch (and the KV cache)
        for t in range(max_new_tokens):
            active = ~done
            sampled = torch.full((B,), pad, dtype=torch.long)
            for gen, lo, hi in segments:
                mine = torch.nonzero((live >= lo) & (live < hi)).flatten()
                if mine.numel():
                    sampled[live[mine]] = _sample(step_logp[mine], top_p, gen)
            if k:
                start = active & ~interrupted & ~seen_phrase & (length == at)
                force_pos[start] = 0
                interrupted |= start
            forcing = force_pos >= 0
            tok = torch.where(forcing, phrase[force_pos.clamp(min=0, max=max(k - 1, 0))] if k else sampled, sampled)
            tok = torch.where(active, tok, torch.full_like(tok, pad))
            tokens[:, t] = tok
            logps[live, t] = step_logp.float().gather(-1, tok[live].unsqueeze(-1)).squeeze(-1)
            versions[:, t] = version
            forced[:, t] = forcing & active
            if k:
                force_pos = torch.where(forcing, force_pos + 1, force_pos)
                force_pos[force_pos >= k] = -1
                if t + 1 >= k:
                    seen_phrase |= (tokens[:, t + 1 - k:t + 1] == phrase).all(-1)
            length += active.long()
            newly_stopped = active & torch.isin(tok, stops) & ~forcing
            stopped |= newly_stopped
            done |= newly_stopped
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            if kv is None:      # the prompt's keys and values move into the static cache
                kv = StaticKV.from_prefill(cache, mask, max_new_tokens - 1)
                del cache
            still = torch.nonzero(~done[live]).flatten()
            if still.numel() < live.numel():
                kv.select_rows(still)
                next_pos, live = next_pos[still], live[still]
            kv.open_column()
            step_ids = tok[live].unsqueeze(-1)
            if self.poll_weights is not None:
                self.poll_weights()
            with self._lock:
                step_logp = self._step(self.model, step_ids.to(dev), next_pos.to(dev), kv.keys, kv.values, kv.mask,
                                       kv.column, self.head_fp32, temperature).cpu()
                version = self._version
            kv.advance()
            next_pos = next_pos + 1

        out = []
        for r, (prompt_index, ids) in enumerate(rows):
            L = int(length[r])
            tok_r = tokens[r, :L].tolist()
            out.append(Completion(
                prompt_index=prompt_index,
                prompt_ids=list(ids),
                token_ids=tok_r,
                logprobs=logps[r, :L].tolist(),
                versions=versions[r, :L].tolist(),
                finish_reason="stop" if bool(stopped[r]) else "length",
                text=self.tokenizer.decode(tok_r, skip_special_tokens=True),
                interrupted=bool(interrupted[r]),
                loss_mask=(~forced[r, :L]).long().tolist(),
            ))
        return out


def _batches(blocks: list, per_batch: int) -> list[list[tuple[int, int, int]]]:
    """Decoding batches of at most ``per_batch`` rows, as (block index, first row, stop row)
    pieces of consecutive :class:`~scalectl.rl.rollout.base.SeedBlock` s: whole blocks packed in
    order while they fit; a block larger than ``per_batch`` alone, cut into batches of it."""
    out, current, size = [], [], 0
    for b, block in enumerate(blocks):
        rows = block.stop - block.first
        if rows == 0:
            continue
        if rows > per_batch:
            if current:
                out.append(current)
                current, size = [], 0
            out += [[(b, lo, min(lo + per_batch, block.stop))] for lo in range(block.first, block.stop, per_batch)]
            continue
        if size + rows > per_batch:
            out.append(current)
            current, size = [], 0
        current.append((b, block.first, block.stop))
        size += rows
    if current:
        out.append(current)
    return out


def _sample(logp: torch.Tensor, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """One token per row from exp(logp) (N, V), restricted to the top-p nucleus when top_p < 1."""
    probs = logp.float().exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # keeps at least the top token
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)
