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
from scalectl.rl.rollout.base import Completion, RolloutEngine, SamplingParams, check_prompt_lengths


class CPURolloutEngine(RolloutEngine):
    """Sampling engine over a transformers model held in this process.

    Args:
        model: a causal LM with ``.model`` and ``.lm_head`` (e.g. ``Qwen2ForCausalLM``).
        tokenizer: its tokenizer (padding uses :func:`~scalectl.rl.policy.model.pad_token_id`,
            which may equal the EOS).  A completion stops at any of
            :func:`~scalectl.rl.policy.model.stop_token_ids` (the tokenizer's EOS and the EOS
            ids of the model's generation config), as in the vLLM engine.
        head_fp32: LM head and log-softmax in float32 (``precision.lm_head = "fp32"``).
        max_batch: most rows (completions) decoded together; larger batches are split.
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

    def __init__(self, model, tokenizer, *, head_fp32: bool = True, max_batch: int = 512, version: int = 0,
                 poll_weights=None, max_prompt_tokens: int | None = None, compile_step: bool = False):
        self.pad_id = pad_token_id(tokenizer)
        self.stop_ids = stop_token_ids(tokenizer, generation_config_of(model))
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.head_fp32 = head_fp32
        self.max_batch = max_batch
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

    def generate(self, prompts: list[str], n: int, params: SamplingParams, *, seed: int = 0) -> list[list[Completion]]:
        """See :meth:`RolloutEngine.generate`.  ``params.top_p`` < 1 samples from the
        nucleus but still records the full-softmax log-probs.

        Raises:
            ValueError: n < 1, a prompt or an interruption phrase that encodes to no token, a
                prompt longer than ``max_prompt_tokens``.
        """
        phrase_ids = self.check_request(n, params)
        encoded = encode_prompts(self.tokenizer, prompts)
        check_prompt_lengths(encoded, self.max_prompt_tokens)
        rows = [(i, ids) for i, ids in enumerate(encoded) for _ in range(n)]
        gen = torch.Generator().manual_seed(int(seed))
        out: list[list[Completion]] = [[] for _ in prompts]
        # sampling is inference: no dropout, whatever mode the trainer sharing the model left it
        # in (its step sets training mode; a compiled step would also recompile on the flag)
        training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(rows), self.max_batch):
                chunk = rows[start:start + self.max_batch]
                for c in self._decode(chunk, params, phrase_ids, gen):
                    out[c.prompt_index].append(c)
        finally:
            self.model.train(training)
        return out

    # ------------------------------------------------------------------ one batch

    @torch.inference_mode()
    def _decode(self, rows, params: SamplingParams, phrase_ids, gen) -> list[Completion]:
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
        at = (interrupt_lengths(B, interrupt[0], interrupt[1], gen) if interrupt is not None
              else torch.full((B,), -1, dtype=torch.long))
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
            sampled[live] = _sample(step_logp, top_p, gen)
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


def _sample(logp: torch.Tensor, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """One token per row from exp(logp) (N, V), restricted to the top-p nucleus when top_p < 1."""
    probs = logp.float().exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # keeps at least the top token
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)
