"""Teacher-forced log-probs and entropy in blocks of positions: the same values and gradients as
the full-vocabulary computation, and a peak memory far below one (N, T, V) float32 tensor.

Peak memory is measured by torch's own allocation accounting (the profiler's memory events,
``Total Allocated`` of the CPU allocator after every allocation and free): a count of bytes,
the same on every run and machine load, not a timing."""

from __future__ import annotations

import json

import pytest
import torch

from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.policy.logprobs import head_token_logprobs, token_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, L, V = 2, 257, 8192          # T = L - 1 = 256 target positions


def peak_bytes(fn, tmp_path) -> int:
    """Peak of CPU bytes allocated while ``fn()`` runs, above what was allocated before it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e["args"] for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    before = events[0]["Total Allocated"] - events[0]["Bytes"]
    return max(e["Total Allocated"] for e in events) - before


def _model(dtype=torch.float32):
    # a large vocabulary against a small backbone, so the head dominates, as at scale
    return build_tiny_model(seed=0, vocab_size=V, num_hidden_layers=1, hidden_size=32,
                            intermediate_size=64).to(dtype).train()


def _ids():
    g = torch.Generator().manual_seed(0)
    return torch.randint(4, V, (N, L), generator=g)


def _reference(model, ids, head_fp32=True):
    """The full-vocabulary computation: log_softmax over (N, T, V), entropy in the graph."""
    hidden = model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[:, :-1]
    w = model.lm_head.weight
    logits = torch.nn.functional.linear(hidden.float(), w.float()) if head_fp32 else model.lm_head(hidden)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunk", [N * V * 1, N * V * 7, 10**9])
def test_blocks_give_the_full_values_and_gradients(chunk):
    """1 position per block, 7 (the last block short), one block: log-probs, entropy and the
    gradient of a loss on the log-probs match the full computation (float32: the same sums
    in another order, ~1e-6 relative)."""
    ids = _ids()
    ref_model, model = _model(), _model()
    ref_logp, ref_ent = _reference(ref_model, ids)
    (ref_logp * torch.linspace(-1, 1, L - 1)).sum().backward()
    logp, ent = token_logprobs(model, ids, torch.ones_like(ids), chunk_elements=chunk)
    assert not ent.requires_grad
    (logp * torch.linspace(-1, 1, L - 1)).sum().backward()
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        # sums over N x T positions in another order: float32 rounding relative to the largest entry
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()), msg=name)


def test_temperature_and_bf16_head():
    ids = _ids()
    model = _model(torch.bfloat16)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[:, :-1]
        for head_fp32, temperature in ((True, 0.7), (False, 1.0)):
            logp, ent = head_token_logprobs(model, hidden, ids[:, 1:], head_fp32=head_fp32, temperature=temperature,
                                            chunk_elements=N * V * 5)
            w = model.lm_head.weight
            z = (torch.nn.functional.linear(hidden.float(), w.float()) if head_fp32 else model.lm_head(hidden))
            ref = torch.log_softmax(z / temperature, -1)
            assert logp.dtype == (torch.float32 if head_fp32 else torch.bfloat16)
            # bf16 results near -log(V) = -9 (8 bits of mantissa: one ulp is 2^-4 in [8, 16)): two ulps
            tol = 1e-5 if head_fp32 else 0.125
            torch.testing.assert_close(logp.float(), ref.gather(-1, ids[:, 1:, None])[..., 0].float(), rtol=0, atol=tol)
            torch.testing.assert_close(ent.float(), -(ref.exp() * ref).sum(-1).float(), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_backward_peak_below_one_logits_tensor(tmp_path, dtype):
    """From final hidden states (the head, where the memory goes at a large vocabulary) through
    the fp32 head, forward and backward.  One (N, T, V) float32 tensor is 16 MiB here.  The full
    computation peaks at several of them (logits, log-softmax, its exp and product for the
    entropy, their gradients); in blocks of 16 positions the peak is a fraction of one: a few
    blocks of N x 16 x V x 4 bytes = 1 MiB, the head's weight gradient (V x 32 x 4 = 1 MiB) and
    the hidden states' gradient."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(N, L - 1, 32, generator=g).to(dtype).requires_grad_()
    targets = _ids()[:, 1:]
    one = N * (L - 1) * V * 4
    a, b = _model(dtype), _model(dtype)

    def ours():
        logp, ent = head_token_logprobs(a, hidden, targets, head_fp32=True, chunk_elements=N * V * 16)
        logp.sum().backward()

    def full():
        logp_all = torch.log_softmax(torch.nn.functional.linear(hidden.float(), b.lm_head.weight.float()), -1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        (logp.sum() + 0 * ent.sum()).backward()

    ours_peak, full_peak = peak_bytes(ours, tmp_path), peak_bytes(full, tmp_path)
    print(f"\npeak ({dtype}): blocks {ours_peak / one:.2f}, full {full_peak / one:.2f} "
          f"x one (N, T, V) float32 tensor of {one} bytes")
    assert full_peak > 3 * one
    assert ours_peak < 0.5 * one
