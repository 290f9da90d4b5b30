"""Packing (several sequences per row of the training pass): placement, the index, the mask
transformers derives from the positions, and log-probs, entropies and a training step equal
to those of the padded rows."""

from __future__ import annotations

import pytest
import torch

from scalectl.recipe.schema import Loss, Optim
from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.policy.logprobs import packed_token_logprobs, position_ids_from_mask, token_logprobs
from scalectl.rl.train.packing import pack, place, sequence_spans, token_cells
from scalectl.rl.train.trainer import PolicyTrainer, TrainBatch

EPS = 2.0**-23
#: Packed and padded passes do the same float32 arithmetic except for the order of some sums:
#: the matmuls run on (R * C) rather than (n * L) rows (another blocking), and attention sums
#: over the keys of one sequence rather than over a padded row whose extra keys have weight
#: exactly 0.  Such rounding is relative, so log pi(y) = z_y - logsumexp(z) moves by a few
#: float32 epsilons of the largest |logit| z at the position, or of |log pi| itself when larger
#: (the argument of tests/test_vllm_pipeline.py); the entropy -sum pi log pi likewise, on the
#: scale of its |log pi|.  Bound: ULPS epsilons of max(max |z|, |log pi|, 1).  Measured here:
#: identical bits (0 epsilons) on one CPU thread.
ULPS = 16


def _example():
    """4 sequences in 6 columns, start = 2 (prompt columns 0-2, completion columns 3-5); 0 is padding."""
    ids = torch.tensor([[0, 11, 12, 13, 14, 0],      # prompt 2, completion 2: length 4
                        [21, 22, 23, 24, 25, 26],    # prompt 3, completion 3: length 6
                        [0, 0, 31, 32, 0, 0],        # prompt 1, completion 1: length 2
                        [0, 0, 41, 0, 0, 0]])        # prompt 1, no completion: length 1
    return ids, (ids != 0).long()


def test_pack_places_every_token_once_and_indexes_the_predicting_position():
    ids, att = _example()
    packed = pack(ids, att, start=2, T=3, pad_id=0)
    # first-fit decreasing: 6 -> row 0; 4 -> row 1; 2 -> row 1 after it; 1 -> a new row 2
    assert torch.equal(packed.input_ids, torch.tensor([[21, 22, 23, 24, 25, 26],
                                                       [11, 12, 13, 14, 31, 32],
                                                       [41, 0, 0, 0, 0, 0]]))
    # positions restart for each sequence, and for the tail of row 2 (its own sequence of pads)
    assert torch.equal(packed.position_ids, torch.tensor([[0, 1, 2, 3, 4, 5],
                                                          [0, 1, 2, 3, 0, 1],
                                                          [0, 0, 1, 2, 3, 4]]))
    # index[i, t]: the flat position of the token before completion token t (row * 6 + column);
    # past the completion, the sequence's last token
    assert torch.equal(packed.index, torch.tensor([[7, 8, 9],         # 12 -> 13, 13 -> 14, then 14
                                                   [2, 3, 4],         # 23 -> 24, 24 -> 25, 25 -> 26
                                                   [10, 11, 11],      # 31 -> 32, then 32
                                                   [12, 12, 12]]))    # 41 (no completion)
    flat = packed.input_ids.flatten()
    real = packed.input_ids != 0
    assert sorted(flat[real.flatten()].tolist()) == sorted(ids[att.bool()].tolist())   # each token once
    targets = ids[:, 3:]
    hit = (targets != 0)
    assert torch.equal(flat[packed.index + 1][hit], targets[hit])   # the next packed token is the target


def test_placement_token_cells_and_the_errors():
    assert place([4, 6, 2, 1], 6) == [(1, 0), (0, 0), (1, 4), (2, 0)]
    assert place([3, 3, 3], 6) == [(0, 0), (0, 3), (1, 0)]
    _, att = _example()
    assert token_cells(att) == (24, 18)
    assert token_cells(att, micro_batch_size=2) == (24, 12 + 6)     # [4, 6]: 2 rows; [2, 1]: 1 row
    assert token_cells(att, micro_batch_size=1) == (24, 24)
    first, length = sequence_spans(att, 2)
    assert first.tolist() == [1, 0, 2, 2] and length.tolist() == [4, 6, 2, 1]
    with pytest.raises(ValueError, match="one run"):
        sequence_spans(torch.tensor([[1, 0, 1, 1]]), 2)
    with pytest.raises(ValueError, match="padding in some row"):
        sequence_spans(torch.tensor([[0, 0, 0, 1]]), 2)
    with pytest.raises(ValueError, match=r"lie in \[1, 6\]"):
        place([7], 6)
    with pytest.raises(ValueError, match="> L"):
        pack(*_example(), start=2, T=4)


def test_the_backbone_builds_a_block_diagonal_causal_mask_from_the_positions():
    """transformers 5.x derives the mask from position_ids when attention_mask is None (no cache):
    checked for the tiny Qwen2 model with eager attention."""
    from transformers.masking_utils import create_causal_mask

    model = build_tiny_model(num_hidden_layers=1)
    assert model.config._attn_implementation == "eager"
    packed = pack(*_example(), start=2, T=3)
    embeds = model.model.embed_tokens(packed.input_ids)
    mask = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None, cache=None,
                              position_ids=packed.position_ids)
    allowed = mask[:, 0] == 0 if mask.dtype != torch.bool else mask[:, 0]     # additive float mask: 0 = attend
    seq = torch.tensor([[0] * 6, [0] * 4 + [1] * 2, [0] + [1] * 5])           # sequence of each cell, per row
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(allowed, (seq[:, :, None] == seq[:, None, :]) & causal)


def _random_batch(seed: int, n: int = 8, P: int = 7, T: int = 11):
    """n sequences: prompts of 1..P tokens (left padded), completions of 0..T (right padded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 260, (n, P + T), generator=g)
    att = torch.zeros(n, P + T, dtype=torch.long)
    comp = torch.randint(0, T + 1, (n,), generator=g)
    for i, p in enumerate(torch.randint(1, P + 1, (n,), generator=g).tolist()):
        att[i, P - p:P + int(comp[i])] = 1
    ids[att == 0] = 0
    valid = torch.arange(T)[None, :] < comp[:, None]
    return ids, att, P - 1, valid


def test_packed_logprobs_and_entropies_equal_the_padded_ones(one_torch_thread):
    model = build_tiny_model(seed=1, num_hidden_layers=2)
    worst = 0.0
    for seed in range(4):
        ids, att, start, valid = _random_batch(seed)
        T = ids.shape[1] - 1 - start
        packed = pack(ids, att, start, T)
        assert packed.rows < ids.shape[0]
        with torch.no_grad():
            logp, ent = token_logprobs(model, ids, att, start=start)
            p_logp, p_ent = packed_token_logprobs(model, packed.input_ids, packed.position_ids, packed.index,
                                                  ids[:, start + 1:])
            hidden = model.model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att),
                                 use_cache=False).last_hidden_state[:, start:-1]
            zmax = model.lm_head(hidden).abs().amax(-1)
        assert p_logp.shape == logp.shape == (ids.shape[0], T) and p_ent.shape == ent.shape
        scale = torch.maximum(torch.maximum(zmax, logp.abs()), torch.ones_like(zmax))
        tol = ULPS * EPS * scale
        assert bool(((p_logp - logp).abs() <= tol)[valid].all())
        assert bool(((p_ent - ent).abs() <= tol)[valid].all())
        worst = max(worst, float(((p_logp - logp).abs() / (EPS * scale))[valid].max()))
    print(f"\nworst packed vs padded log-prob: {worst:.1f} float32 epsilons of the scale")


def test_gradients_flow_through_the_gather(one_torch_thread):
    """The gradient of sum(log pi) over the completion tokens is the padded path's (plain autograd)."""
    ids, att, start, valid = _random_batch(5)
    grads = []
    for packed_path in (False, True):
        model = build_tiny_model(seed=1, num_hidden_layers=2).train()
        if packed_path:
            p = pack(ids, att, start, ids.shape[1] - 1 - start)
            logp, _ = packed_token_logprobs(model, p.input_ids, p.position_ids, p.index, ids[:, start + 1:],
                                            with_entropy=False)
        else:
            logp, _ = token_logprobs(model, ids, att, start=start, with_entropy=False)
        (logp * valid).sum().backward()
        grads.append({k: q.grad for k, q in model.named_parameters() if q.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    n, L = ids.shape
    for name, g in grads[0].items():
        # each entry: a float32 sum over at most n * L positions, reordered by packing (the bound
        # of test_a_packed_step_gives_the_padded_step)
        tol = n * L * 2**-24 * 8 * max(g.abs().max().item(), 1e-3)
        torch.testing.assert_close(grads[1][name], g, rtol=0, atol=tol)


def _train_batch():
    ids, att, start, valid = _random_batch(7, n=8)
    n, T = valid.shape
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():      # on-policy: the generator's log-probs are the policy's own (ratio 1)
        gen_logp, _ = token_logprobs(build_tiny_model(seed=0, num_hidden_layers=2), ids, att, start=start)
    return TrainBatch(ids, att, start, valid.float(), gen_logp * valid, torch.randn(n, generator=g),
                      torch.arange(n) // 2)


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_a_packed_step_gives_the_padded_step(zero_stage, one_torch_thread):
    from scalectl.rl.train.losses import aggregation_weights
    from scalectl.rl.train.trainer import gradient_rows

    batch = _train_batch()
    n, L = batch.input_ids.shape
    T = batch.loss_mask.shape[1]
    loss = Loss(type="cispo", aggregation="token")
    runs = {}
    for pack_on in (False, True):
        # lr 1, Adam eps 1, no clipping: the first update is u = g / (|g| + 1), so the gradient shows
        trainer = PolicyTrainer(build_tiny_model(seed=0, num_hidden_layers=2), loss=loss,
                                optim=Optim(lr=1.0, warmup_steps=0, eps=1.0, weight_decay=0.0, grad_clip=None),
                                head_fp32=True, temperature=1.0, micro_batch_size=4, zero_stage=zero_stage,
                                pack=pack_on)
        metrics = trainer.train_step(batch)
        runs[pack_on] = metrics, trainer.gathered(
            lambda m: {k: p.detach().clone() for k, p in m.named_parameters()})
    (m_pad, p_pad), (m_pack, p_pack) = runs[False], runs[True]
    w = aggregation_weights(batch.loss_mask, batch.group_ids, loss.aggregation)
    cut, _ = gradient_rows(batch, w)        # the rows and columns the passes get
    assert (m_pack["rows"], m_pack["columns"]) == (m_pad["rows"], m_pad["columns"]) == tuple(cut.input_ids.shape)
    padded, packed = token_cells(cut.attention_mask, micro_batch_size=4)
    assert m_pad["token_cells"] == padded == cut.input_ids.numel()
    assert m_pack["token_cells"] == packed < padded
    # Loss: -sum w A sg(rho) log pi over n x T tokens, rho = 1 (on-policy).  A log-prob off by
    # delta (ULPS epsilons of a scale below 8: |log pi| < 8 for this vocabulary) moves a term by
    # at most |w A| rho |1 + log pi| delta < 8 |w A| delta, and reordering the float32 sums of
    # terms |w A log pi| < 8 |w A| adds at most n T 2^-24 times their sum.
    wa = float((w * batch.advantages[:, None].abs()).sum())
    assert abs(m_pack["loss"] - m_pad["loss"]) <= 8 * wa * (ULPS * EPS * 8 + n * T * 2**-24)
    start = dict(build_tiny_model(seed=0, num_hidden_layers=2).named_parameters())
    for name, p in p_pad.items():
        u = start[name].detach() - p
        g = u / (1 - u.abs())
        # The gradients: each entry a float32 sum over at most n * L positions, which packing
        # reorders (as gradient_rows' cut does, tests/test_trainer.py): off by at most
        # n L 2^-24 sum|terms|, sum|terms| <= 8 max|g|; |du/dg| <= 1, so the updates differ by no
        # more; then each run rounds p0 - u to float32, one ulp of |p| together (rtol 2^-23).
        tol = n * L * 2**-24 * 8 * max(g.abs().max().item(), 1e-3)
        torch.testing.assert_close(p_pack[name], p, rtol=2.0**-23, atol=tol)
    assert max((p_pad[k] - start[k].detach()).abs().max().item() for k in p_pad) > 1e-4   # the step moved


# --------------------------------------------------------------------------- which models pack

#: Tiny models built from their configs (no download), 2 layers of width 32, weights drawn with
#: std 0.2 so that what a layer carries along a row shows in the log-probs.  The hybrids: a
#: gated-delta-rule linear-attention layer (Qwen3.5), a short-convolution layer (LFM2), a Mamba2
#: state-space mixer beside attention (Falcon-H1); each also has one softmax-attention layer.
_SMALL = dict(vocab_size=261, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
              num_hidden_layers=2, initializer_range=0.2)
HYBRIDS = {
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
                         linear_num_key_heads=1, linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16),
    "lfm2": dict(layer_types=["conv", "full_attention"]),
    "falcon_h1": dict(mamba_n_heads=2, mamba_d_head=16, mamba_n_groups=1, mamba_d_ssm=32, mamba_d_state=8,
                      mamba_chunk_size=4, head_dim=16),
}
#: The architectures packing.ISOLATING_MODEL_TYPES allows, with a sliding window where they have one.
ATTENTION_ONLY = {
    "llama": {}, "mistral": dict(sliding_window=3), "qwen2": dict(use_sliding_window=True, sliding_window=3,
                                                                 max_window_layers=1),
    "qwen3": dict(head_dim=16),
}


def _tiny(model_type: str, attn: str = "eager", **extra):
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **_SMALL, **{**HYBRIDS.get(model_type, {}),
                                                         **ATTENTION_ONLY.get(model_type, {}), **extra})
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "falling back to the reference PyTorch implementation"
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def _alone_logprobs(model, ids, att, start):
    """Each sequence's log-probs computed on its own (no padding, no other sequence), padded to
    (n, T) with 0, and the largest |logit| at each of its positions (the rounding scale)."""
    n, T = ids.shape[0], ids.shape[1] - 1 - start
    logp, zmax = torch.zeros(n, T), torch.zeros(n, T)
    with torch.no_grad():
        for i in range(n):
            row = ids[i][att[i].bool()][None]
            s = start - int(att[i].long().argmax())
            lp, _ = token_logprobs(model, row, torch.ones_like(row), start=s)
            z = model(input_ids=row).logits[0, s:-1].abs().amax(-1)
            logp[i, :lp.shape[1]], zmax[i, :lp.shape[1]] = lp[0], z
    return logp, zmax


@pytest.mark.parametrize("model_type", sorted(ATTENTION_ONLY))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_every_allowed_architecture_isolates_packed_sequences(model_type, attn, one_torch_thread):
    """The allowlist is what this checks: packed log-probs of each allowed architecture (and
    attention implementation) equal each sequence's log-probs alone, to rounding."""
    from scalectl.rl.train.packing import packing_support

    model = _tiny(model_type, attn)
    assert packing_support(model.config).packs
    ids, att, start, valid = _random_batch(3)
    packed = pack(ids, att, start, ids.shape[1] - 1 - start)
    assert packed.rows < ids.shape[0]
    with torch.no_grad():
        p_logp, _ = packed_token_logprobs(model, packed.input_ids, packed.position_ids, packed.index,
                                          ids[:, start + 1:])
    alone, zmax = _alone_logprobs(model, ids, att, start)
    scale = torch.maximum(torch.maximum(zmax, alone.abs()), torch.ones_like(zmax))
    assert bool(((p_logp - alone).abs() <= ULPS * EPS * scale)[valid].all())


def test_packing_is_allowed_only_where_every_layer_isolates_sequences():
    from scalectl.rl.train.packing import packing_support

    for model_type in HYBRIDS:
        support = packing_support(_tiny(model_type).config)
        assert not support.packs and support.reason.startswith("padded rows") and model_type in support.reason
    assert "linear_attention" in packing_support(_tiny("qwen3_5_text").config).reason
    assert "conv" in packing_support(_tiny("lfm2").config).reason
    # an allowed architecture with a layer type outside the allowlist, an unchecked attention
    qwen2 = build_tiny_model(num_hidden_layers=2)
    assert packing_support(qwen2.config).packs
    qwen2.config.layer_types = ["full_attention", "linear_attention"]
    assert not packing_support(qwen2.config).packs
    other = build_tiny_model(num_hidden_layers=1)
    other.config._attn_implementation = "flex_attention"
    assert "flex_attention" in packing_support(other.config).reason


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_a_hybrid_models_training_pass_gives_each_sequence_its_own_logprobs(model_type, one_torch_thread):
    """On a hybrid model the trainer's log-probs (``logprob_mismatch`` against each sequence's
    log-probs alone, the generator's view) are those of each sequence alone, whatever the
    other sequences of the batch: the trainer takes the padded pass and says so."""
    from scalectl.rl.train.losses import aggregation_weights
    from scalectl.rl.train.trainer import gradient_rows

    ids, att, start, valid = _random_batch(2)
    n, T = valid.shape
    alone, zmax = _alone_logprobs(_tiny(model_type), ids, att, start)
    packed = pack(ids, att, start, T)
    assert packed.rows < n                                  # packing would put several in one row
    # the sequence placed after another one in its packed row (not at its start)
    row_start = (packed.index[:, 0] // ids.shape[1]) * ids.shape[1]
    first, _ = sequence_spans(att, start)
    at = packed.index[:, 0] - (start - first) - row_start   # each sequence's offset in its row
    target = int(torch.nonzero((at > 0) & valid.any(1)).flatten()[0])
    bound = float((ULPS * EPS * torch.maximum(torch.maximum(zmax, alone.abs()), torch.ones_like(zmax)))[valid].max())
    measured, trainers = {}, []
    for other in (False, True):
        batch_ids = ids.clone()
        mask = valid.float()
        if other:   # every other sequence's tokens change, and only the target counts in the metric
            others = att.bool() & (torch.arange(n) != target)[:, None]
            batch_ids = torch.where(others, (ids * 7 + 3) % 256 + 4, ids)
            mask[torch.arange(n) != target] = 0
        batch = TrainBatch(batch_ids, att, start, mask, alone * mask, torch.linspace(-1, 1, n),
                           torch.arange(n) // 2)
        trainer = PolicyTrainer(_tiny(model_type), loss=Loss(type="cispo", aggregation="token"),
                                optim=Optim(lr=1e-3, warmup_steps=0, grad_clip=None), head_fp32=True,
                                temperature=1.0, micro_batch_size=n)
        metrics = trainer.train_step(batch)
        measured[other] = metrics["logprob_mismatch"]
        cut, _ = gradient_rows(batch, aggregation_weights(batch.loss_mask, batch.group_ids, "token"))
        trainers.append((trainer, metrics["token_cells"], cut.input_ids.numel()))
    print(f"\n{model_type}: mean |log pi_train - log pi_alone| {measured[False]:.2e} (every sequence), "
          f"{measured[True]:.2e} (sequence {target}, the others' tokens changed); bound {bound:.2e}")
    assert measured[False] <= bound and measured[True] <= bound
    for trainer, cells, padded in trainers:
        assert cells == padded                                   # the padded rows' cells
        assert not trainer.packing.packs and trainer.packing.reason.startswith("padded rows")


def test_the_run_log_says_which_pass_trains(tmp_path, one_torch_thread):
    """A run's policy (loop.build_policy, from a checkpoint folder) logs the trainer's choice."""
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.loop import Reporter, build_policy
    from scalectl.rl.policy.model import build_tokenizer, save_policy

    class Lines(Reporter):
        def __init__(self):
            self.lines = []

        def log(self, message):
            self.lines.append(message)

    said = {}
    for name, model in (("qwen2", build_tiny_model(num_hidden_layers=1)), ("lfm2", _tiny("lfm2"))):
        path = save_policy(model, build_tokenizer(), tmp_path / name)
        reporter = Lines()
        build_policy(Recipe.model_validate({"model": {"path": str(path)}}), reporter)
        said[name] = [line for line in reporter.lines if line.startswith("training pass: ")]
    assert said["qwen2"] == ["training pass: packed rows where they take fewer rows: every layer of model type "
                             "'qwen2' is attention (eager) that isolates sequences by their positions"]
    assert said["lfm2"] == ["training pass: padded rows: model type 'lfm2' (its layers include conv) is not among "
                            "those whose every layer is checked to isolate packed sequences (llama, mistral, "
                            "qwen2, qwen3)"]
