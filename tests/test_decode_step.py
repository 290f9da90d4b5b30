"""The decoding step over a static KV cache (scalectl.rl.policy.decode): the same log-probs as
the DynamicCache step, compiled or eager, and the eager fallback where inductor cannot compile.

Tolerances: every comparison is of float32 log-softmax values of magnitude <= log V = 5.6
(V = 261), computed by the same operations in a different summation order (the static
cache sums attention over masked columns that weigh exactly 0, inductor fuses and
reorders reductions); float32 rounding of such sums over H = 64..128 terms is a few
ulps of 5.6 (~5e-7 each), so 1e-5 bounds them with room and is the bound the engine's
teacher-forced tests use (tests/test_rollout_cpu.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from scalectl.rl.policy.decode import CompiledStep, StaticKV, compiler_missing, decode_step
from scalectl.rl.policy.logprobs import next_token_logprobs, position_ids_from_mask
from scalectl.rl.policy.model import build_tokenizer, encode_prompt
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams

PROMPTS = ["1+1=", "12+30=", "7*8= so"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    from test_rollout_cpu import _small

    return _small(eos_bias=3.0)     # rows of different lengths


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _batch(tok):
    ids = [encode_prompt(tok, p) for p in PROMPTS]
    P = max(map(len, ids))
    input_ids = torch.full((len(ids), P), tok.pad_token_id)
    mask = torch.zeros_like(input_ids)
    for r, x in enumerate(ids):
        input_ids[r, P - len(x):], mask[r, P - len(x):] = torch.tensor(x), 1
    return input_ids, mask


@torch.inference_mode()
def test_static_step_equals_dynamic_cache_step(model, tok):
    """Eight steps of fixed tokens, one row leaving the batch after step 3: the static step's
    log-probs equal the DynamicCache step's (transformers' own mask and concatenation)."""
    from transformers import DynamicCache

    input_ids, mask = _batch(tok)
    B = input_ids.shape[0]
    pos = position_ids_from_mask(mask)
    dyn = DynamicCache(config=model.config)
    first = next_token_logprobs(model, input_ids, mask, pos, dyn)
    kv = StaticKV.from_prefill(dyn, mask, 8)
    dyn2 = DynamicCache(config=model.config)
    assert torch.equal(next_token_logprobs(model, input_ids, mask, pos, dyn2), first)
    next_pos, dmask = mask.sum(-1, keepdim=True), mask.clone()
    rows = torch.arange(B)
    worst = 0.0
    for t in range(8):
        if t == 3:        # the middle row finishes
            rows = torch.tensor([0, 2])
            kv.select_rows(rows)
            dyn2.batch_select_indices(rows)
            next_pos, dmask = next_pos[rows], dmask[rows]
        step_ids = torch.full((len(rows), 1), 10 + t)
        dmask = torch.cat([dmask, torch.ones((len(rows), 1), dtype=dmask.dtype)], dim=-1)
        ref = next_token_logprobs(model, step_ids, dmask, next_pos, dyn2)
        kv.open_column()
        got = decode_step(model, step_ids, next_pos, kv.keys, kv.values, kv.mask, kv.column, True, 1.0)
        kv.advance()
        next_pos = next_pos + 1
        assert got.shape == ref.shape == (len(rows), model.config.vocab_size)
        worst = max(worst, float((got - ref).abs().max()))
    assert worst <= ATOL
    assert kv.free_columns == 0


def test_fallback_to_eager_without_a_compiler(model, tok):
    """No C++ compiler among inductor's candidates: one RuntimeWarning, the eager step runs,
    and the engine gives exactly the eager engine's completions (same code path)."""
    from torch._inductor import config

    with config.patch({"cpp.cxx": ("/nonexistent/c++",)}):
        assert compiler_missing() is not None
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*run eagerly"):
            engine = CPURolloutEngine(model, tok, compile_step=True)
    assert engine._step.compiled is False
    params = SamplingParams(max_new_tokens=10)
    got = engine.generate(PROMPTS, 3, params, seed=4)
    ref = CPURolloutEngine(model, tok).generate(PROMPTS, 3, params, seed=4)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in ref]
    assert [[c.logprobs for c in g] for g in got] == [[c.logprobs for c in g] for g in ref]


@pytest.mark.slow
def test_fallback_in_a_process_whose_cxx_is_missing(tmp_path):
    """A fresh process with ``CXX`` naming no program (inductor's compiler search then finds
    none): the engine warns, decodes eagerly, and its log-probs are the teacher-forced ones."""
    script = textwrap.dedent("""
        import warnings, torch
        from scalectl.rl.policy.model import build_tiny_model, build_tokenizer
        from scalectl.rl.policy.logprobs import token_logprobs
        from scalectl.rl.rollout.cpu import CPURolloutEngine
        from scalectl.rl.rollout.sampling import SamplingParams
        m, tok = build_tiny_model(0, num_hidden_layers=1), build_tokenizer()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            e = CPURolloutEngine(m, tok, compile_step=True)
        c = e.generate(["1+1="], 1, SamplingParams(max_new_tokens=6), seed=0)[0][0]
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            ref = token_logprobs(m, ids, torch.ones_like(ids), start=len(c.prompt_ids) - 1)[0][0]
        err = float((torch.tensor(c.logprobs) - ref).abs().max())
        print("WARN", [str(x.message) for x in w if x.category is RuntimeWarning])
        print("COMPILED", e._step.compiled, "ERR", err)
    """)
    env = dict(os.environ, CXX=str(tmp_path / "no-such-c++"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    warn_line = next(line for line in out.stdout.splitlines() if line.startswith("WARN"))
    assert "no C++ compiler" in warn_line and "run eagerly" in warn_line
    compiled_line = next(line for line in out.stdout.splitlines() if line.startswith("COMPILED"))
    assert compiled_line.split()[1] == "False" and float(compiled_line.split()[3]) <= ATOL


@pytest.mark.slow
@pytest.mark.skipif(compiler_missing() is not None, reason="no C++ compiler for inductor")
def test_compiled_engine_equals_eager_and_teacher_forced(model, tok):
    """The compiled step (inductor, C++) gives the eager step's log-probs to float rounding and,
    sampling from the same stream, the same tokens; its log-probs equal a teacher-forced pass."""
    from test_rollout_cpu import _flat, _teacher_forced

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # no fallback here
        compiled = CPURolloutEngine(model, tok, compile_step=True)
        params = SamplingParams(max_new_tokens=12, temperature=0.7)
        got = _flat(compiled.generate(PROMPTS, 4, params, seed=2))
    assert compiled._step.compiled is True
    ref = _flat(CPURolloutEngine(model, tok).generate(PROMPTS, 4, params, seed=2))
    assert len({len(c.token_ids) for c in got}) > 1          # rows left the batch at different steps
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    worst = max(max(abs(a - b) for a, b in zip(c.logprobs, r.logprobs)) for c, r in zip(got, ref))
    assert worst <= ATOL
    for c, forced in zip(got, _teacher_forced(model, got, tok.pad_token_id, temperature=0.7)):
        assert torch.allclose(torch.tensor(c.logprobs), forced, atol=ATOL)


@pytest.mark.slow
@pytest.mark.skipif(compiler_missing() is not None, reason="no C++ compiler for inductor")
def test_failed_compilation_falls_back_at_the_first_step(model, tok, tmp_path, monkeypatch):
    """The compiler disappears after the step was set up (an empty inductor cache, so the
    first call must build C++): that call warns, the batch completes eagerly, and the
    completions are the eager engine's."""
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    engine = CPURolloutEngine(model, tok, compile_step=True)
    assert engine._step.compiled is True
    torch._dynamo.reset()
    params = SamplingParams(max_new_tokens=8)
    with config.patch({"cpp.cxx": ("/nonexistent/c++",)}), \
            pytest.warns(RuntimeWarning, match="compiling the decoding step failed"):
        got = engine.generate(PROMPTS, 2, params, seed=3)
    assert engine._step.compiled is False
    ref = CPURolloutEngine(model, tok).generate(PROMPTS, 2, params, seed=3)
    assert [[c.logprobs for c in g] for g in got] == [[c.logprobs for c in g] for g in ref]


def test_hardware_compile_reaches_the_engine_and_leaves_the_hash_alone(model, tok):
    """``hardware.compile = true`` gives :func:`make_engine` a compiling engine (here without a
    compiler, so its eager fallback), off by default; the content hash ignores the key."""
    from torch._inductor import config

    from conftest import ROOT
    from scalectl.recipe.load import load
    from scalectl.rl.rollout import make_engine

    base = load(ROOT / "recipes" / "minimax.toml", ROOT / "setups" / "tiny-cpu.toml")
    on = load(ROOT / "recipes" / "minimax.toml", ROOT / "setups" / "tiny-cpu.toml", ["hardware.compile=true"])
    assert base.hardware.compile is False and on.hardware.compile is True
    assert on.content_hash == base.content_hash
    assert make_engine(base, model, tok)._step is decode_step
    with config.patch({"cpp.cxx": ("/nonexistent/c++",)}), pytest.warns(RuntimeWarning, match="run eagerly"):
        engine = make_engine(on, model, tok)
    assert isinstance(engine._step, CompiledStep) and not engine._step.compiled


@pytest.mark.slow
@pytest.mark.skipif(compiler_missing() is not None, reason="no C++ compiler for inductor")
def test_compiled_step_compiles_one_graph_down_to_the_last_live_row(model, tok):
    """Rows leave the decoding batch as they finish, down to a single live row: the compiled
    step keeps one graph for every batch size (a batch of one row runs eagerly, since dynamic
    shapes specialise a size of 1 and would compile a second graph), and the completions are
    the eager engine's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    params = SamplingParams(max_new_tokens=40)
    compiled = CPURolloutEngine(model, tok, compile_step=True)
    got = compiled.generate(PROMPTS, 3, params, seed=1)    # lengths 2 .. 25 on this model
    lengths = sorted(len(c.token_ids) for g in got for c in g)
    assert lengths[-1] > lengths[-2]       # the longest row decoded alone for its last steps
    assert counters["stats"]["unique_graphs"] == 1
    ref = CPURolloutEngine(model, tok).generate(PROMPTS, 3, params, seed=1)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in ref]


def test_the_kv_cache_goes_under_the_name_the_installed_transformers_takes():
    """Before transformers 5.24 a model's forward takes its KV cache as ``past_key_values`` and
    ignores an unknown ``cache=`` (the cache is then never filled): the name is read from the
    signature, and the prefill fills the cache of every layer with one column per prompt token."""
    from transformers import DynamicCache

    from scalectl.rl.policy.decode import CACHE_ARG
    from scalectl.rl.policy.logprobs import cache_arg_of, next_token_logprobs
    from scalectl.rl.policy.model import build_tiny_model

    class Old:
        def forward(self, hidden, attention_mask=None, past_key_values=None, use_cache=False):
            return hidden

    class New:
        def forward(self, hidden, attention_mask=None, cache=None, use_cache=False):
            return hidden

    assert cache_arg_of(Old) == "past_key_values" and cache_arg_of(New) == "cache"
    model = build_tiny_model(seed=0)
    assert CACHE_ARG == cache_arg_of(type(model.model.layers[0])) == cache_arg_of(type(model.model))
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        next_token_logprobs(model, ids, torch.ones_like(ids), torch.arange(5).unsqueeze(0), cache)
    assert len(cache.layers) == model.config.num_hidden_layers
    assert all(layer.keys is not None and layer.keys.shape[-2] == 5 for layer in cache.layers)
