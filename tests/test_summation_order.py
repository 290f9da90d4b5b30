"""The reordered copies the vLLM pipeline check measures rounding with (tests/summation_order.py):
the same function in exact arithmetic, other roundings in float32."""

from __future__ import annotations

import math

import pytest
import torch

from summation_order import reordered_copy, rounding_spread


def _model(**overrides):
    from scalectl.rl.policy.model import build_tiny_model

    model = build_tiny_model(seed=3, **overrides)
    with torch.no_grad():            # weights of a trained model's size, not the initialiser's 0.02
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    return model


def _float64_throughout(monkeypatch):
    """Qwen2's RMSNorm and eager attention softmax compute in float32 whatever the model's dtype:
    in float64 throughout for the test (a float32 step would round each order differently)."""
    from transformers.models.qwen2 import modeling_qwen2

    softmax = torch.nn.functional.softmax

    def softmax64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=x.dtype if x.dtype == torch.float64 else dtype)

    def norm64(self, hidden):
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", norm64)


def test_a_reordered_copy_is_the_same_function_in_float64_and_rounds_otherwise_in_float32(one_torch_thread,
                                                                                           monkeypatch):
    model = _model()
    ids = torch.randint(4, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    copies = [reordered_copy(model, torch.Generator().manual_seed(s)) for s in range(3)]
    assert all(any(not torch.equal(a, b) for a, b in zip(model.parameters(), c.parameters())) for c in copies)
    with torch.no_grad():
        ref32 = model(input_ids=ids).logits
        diffs = [(c(input_ids=ids).logits - ref32).abs().max().item() for c in copies]
        _float64_throughout(monkeypatch)
        ref64 = model.double()(input_ids=ids).logits
        for c in copies:
            got = c.double()(input_ids=ids).logits
            # float64 rounding (2^-53) of sums of a few hundred terms, through 4 layers: far below 1e-9
            assert (got - ref64).abs().max().item() <= 1e-9 * max(1.0, ref64.abs().max().item())
    scale = ref64.abs().max().item()
    assert all(d > 0 for d in diffs), diffs               # float32 rounds each order differently ...
    assert all(d <= 1e-3 * scale for d in diffs), diffs  # ... by rounding, not by another function


def test_grouped_key_value_heads_are_refused():
    with pytest.raises(ValueError, match="4 query heads share 2 key/value heads"):
        reordered_copy(_model(num_key_value_heads=2), torch.Generator())


def test_rounding_spread_is_the_rms_around_the_reference():
    assert rounding_spread([1.0, 3.0, -1.0], 1.0) == pytest.approx(math.sqrt((0 + 4 + 4) / 3), rel=1e-15)
