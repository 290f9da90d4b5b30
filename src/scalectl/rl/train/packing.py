"""Packing: several sequences per row of the training pass, so that no compute goes to padding.

A trainer micro-batch is a rectangle of n rows and L columns: each row one sequence, its
prompt left padded and its completion right padded, so that every completion starts at
column ``start + 1`` (:class:`scalectl.rl.train.trainer.TrainBatch`).  The padding inside the rows
(short prompts, short completions) is computed by the padded pass and then masked.
Packing drops it: each sequence's real tokens (prompt + completion, one run of columns) are
placed one after another into rows of capacity C = L, first-fit decreasing by length, with
positions restarting at 0 for each sequence; the part of a row that no sequence fills is
one more sequence of pad tokens (positions 0, 1, ...), whose outputs nothing reads.  A
token then attends only to the earlier tokens of its own sequence: a block-diagonal causal
mask.  This is the padding-free / sequence-packing layout of RL and SFT trainers
(OpenRLHF ``--packing_samples``, TRL ``padding_free``, transformers
``DataCollatorWithFlattening``).

The mask is not built here.  transformers (5.x, ``masking_utils.create_causal_mask``)
derives it from ``position_ids`` when the backbone is called with ``attention_mask=None``
and no cache: ``find_packed_sequence_indices`` starts a new sequence wherever the position
does not grow by 1 from the previous column, and ``packed_sequence_mask_function`` keeps
only the (query, key) pairs of one sequence, causal in their positions.  Checked for the
tiny Qwen2 model with eager attention (``tests/test_packing.py``: the mask is block
diagonal, and packed log-probs equal the padded ones).

The mask isolates sequences only in the layers that read it.  Linear-attention (Qwen3.5,
Qwen3-Next gated delta rule), short-convolution (LFM2) and state-space (Mamba) layers
read neither the mask nor the positions: their state runs along the whole row, from one
sequence into the next (measured on tiny hybrid models, ``tests/test_packing.py``: the
mean log-prob of a sequence packed after others moved by 0.08-1.5 nats when their tokens
changed).  Packing is therefore used only where every
layer is known to isolate sequences (:func:`packing_support`, an allowlist of
architectures and layer types, each checked in ``tests/test_packing.py``); any other model
trains on the padded rows.

* :func:`packing_support`: whether a model's every layer isolates packed sequences, and why.
* :func:`sequence_spans`: each row's run of real columns.
* :func:`place`: first-fit decreasing placement of lengths into rows.
* :func:`pack`: a micro-batch's packed rows, positions and the index that gathers, for each
  completion token, the packed position whose hidden state predicts it.
* :func:`token_cells`: the cells a padded and a packed pass compute (benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


#: Architectures (``config.model_type``) whose every token-mixing layer is softmax attention
#: with the mask transformers derives from ``position_ids``: packed log-probs equal those of
#: each sequence alone (``tests/test_packing.py`` checks each one, tiny, built from its config).
ISOLATING_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: Entries of ``config.layer_types`` that isolate packed sequences (the mask reaches them).
ISOLATING_LAYER_TYPES = ("full_attention", "sliding_attention")
#: Attention implementations checked to build the block-diagonal mask from the positions.
ISOLATING_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class PackingSupport:
    """Whether a model's training pass may pack sequences several to a row.

    Attributes:
        packs: every layer isolates packed sequences (:func:`packing_support`).
        reason: one line saying why, for the run log.
    """

    packs: bool
    reason: str


def packing_support(config) -> PackingSupport:
    """Whether every layer of a model with this (transformers) config isolates the sequences
    packed in one row: an allowlist, not a denylist.

    Packs only when ``config.model_type`` is one of :data:`ISOLATING_MODEL_TYPES`, every
    entry of ``config.layer_types`` (where the config has them) is one of
    :data:`ISOLATING_LAYER_TYPES`, and the attention implementation is one of
    :data:`ISOLATING_ATTENTION`.  Anything else (a hybrid model with linear-attention,
    convolution or state-space layers, an architecture not checked here) trains on the
    padded rows, whose results do not depend on the other sequences of the batch.

    Args:
        config: a transformers ``PretrainedConfig`` (``model.config``).

    Returns:
        A :class:`PackingSupport`.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in ISOLATING_MODEL_TYPES:
        kinds = sorted(set(getattr(config, "layer_types", None) or ()) - set(ISOLATING_LAYER_TYPES))
        layers = f" (its layers include {', '.join(kinds)})" if kinds else ""
        return PackingSupport(False, f"padded rows: model type {model_type!r}{layers} is not among those whose every "
                                     f"layer is checked to isolate packed sequences ({', '.join(ISOLATING_MODEL_TYPES)})")
    kinds = sorted(set(getattr(config, "layer_types", None) or ()) - set(ISOLATING_LAYER_TYPES))
    if kinds:
        return PackingSupport(False, f"padded rows: model type {model_type!r} has {', '.join(kinds)} layers, "
                                     "which carry state from one packed sequence to the next")
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ISOLATING_ATTENTION:
        return PackingSupport(False, f"padded rows: attention implementation {impl!r} is not among those checked "
                                     f"to isolate packed sequences ({', '.join(ISOLATING_ATTENTION)})")
    return PackingSupport(True, f"packed rows where they take fewer rows: every layer of model type {model_type!r} "
                                f"is attention ({impl}) that isolates sequences by their positions")


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch packed into R <= n rows of C columns.

    Attributes:
        input_ids: (R, C) long, the sequences' real tokens, then pad tokens.
        position_ids: (R, C) long, 0, 1, ... within each sequence (and the row's tail).
        index: (n, T) long into the flattened (R * C) positions: the hidden state at
            ``index[i, t]`` predicts completion token t of sequence i (it is the position of
            the token before it).  Past a sequence's last token it points at that last
            token (a valid position whose output the loss mask drops).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    index: torch.Tensor

    @property
    def rows(self) -> int:
        """R, the packed rows."""
        return int(self.input_ids.shape[0])


def sequence_spans(attention_mask: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's real tokens as one run of columns: (first column, length).

    Args:
        attention_mask: (n, L), 1 on real tokens, 0 on padding.
        start: the last prompt column, real in every row (its output predicts completion
            token 0).

    Returns:
        (first (n,) long, length (n,) long).

    Raises:
        ValueError: a row whose real tokens are not one run of columns, or whose run does
            not contain column ``start`` (an empty prompt).
    """
    real = attention_mask.bool()
    n, L = real.shape
    if not 0 <= start < L:
        raise ValueError(f"start = {start} is not a column of a (.., {L}) batch")
    length = real.sum(dim=1)
    first = torch.where(real.any(dim=1), real.long().argmax(dim=1), torch.zeros_like(length))
    cols = torch.arange(L, device=real.device)
    run = (cols >= first[:, None]) & (cols < (first + length)[:, None])
    if not torch.equal(run, real):
        raise ValueError("the real tokens of a row are not one run of columns (left-padded prompt, "
                         "right-padded completion)")
    if not bool(real[:, start].all()):
        raise ValueError(f"column start = {start} (the last prompt token) is padding in some row")
    return first, length


def place(lengths: list[int], capacity: int) -> list[tuple[int, int]]:
    """First-fit decreasing: put sequences of these lengths into rows of ``capacity`` cells.

    Sequences are taken longest first (ties in their order) and each goes into the first
    row with room for it, else a new row.  At most 11/9 OPT + 6/9 rows (Dosa 2007).

    Args:
        lengths: tokens of each sequence.
        capacity: cells per row.

    Returns:
        (row, offset) of each sequence, in the order of ``lengths``; rows are numbered from 0.

    Raises:
        ValueError: a length below 1 or above ``capacity``.
    """
    if any(not 1 <= x <= capacity for x in lengths):
        raise ValueError(f"sequence lengths must lie in [1, {capacity}]: {lengths}")
    used: list[int] = []
    out: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, u in enumerate(used) if u + lengths[i] <= capacity), len(used))
        if row == len(used):
            used.append(0)
        out[i] = (row, used[row])
        used[row] += lengths[i]
    return out


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int, T: int,
         pad_id: int = 0) -> PackedBatch:
    """Pack a micro-batch's sequences into rows of capacity C = L (:func:`place`).

    Args:
        input_ids: (n, L) long, left-padded prompts and right-padded completions.
        attention_mask: (n, L), 1 on real tokens.
        start: the last prompt column; completion token t sits at column start + 1 + t.
        T: completion columns (start + T <= L - 1; T = L - 1 - start for a whole batch).
        pad_id: the token in the cells no sequence fills (any id: nothing reads them).

    Returns:
        A :class:`PackedBatch` of R rows (R <= n), on the device of ``input_ids``.

    Raises:
        ValueError: as :func:`sequence_spans`; ``start + 1 + T > L``.
    """
    n, C = input_ids.shape
    if start + 1 + T > C:
        raise ValueError(f"start + 1 + T = {start + 1 + T} > L = {C}")
    first, length = sequence_spans(attention_mask, start)
    spots = place(length.tolist(), C)
    rows = 1 + max((r for r, _ in spots), default=-1)
    dev = input_ids.device
    row = torch.tensor([r for r, _ in spots], dtype=torch.long, device=dev)
    base = row * C + torch.tensor([o for _, o in spots], dtype=torch.long, device=dev)   # (n,) flat start
    used = torch.zeros(rows, dtype=torch.long, device=dev).index_add_(0, row, length)
    cols = torch.arange(C, device=dev)
    # every cell first as the row's tail (positions 0, 1, ... after the last sequence), then the sequences
    ids = torch.full((rows * C,), pad_id, dtype=input_ids.dtype, device=dev)
    pos = (cols[None, :] - used[:, None]).flatten()
    rel = cols[None, :] - first[:, None]                    # (n, L): a real column's position
    real = attention_mask.bool()
    dest = (base[:, None] + rel)[real]
    ids[dest] = input_ids[real]
    pos[dest] = rel[real]
    # the output at column start + t predicts token t; past the last real token, point at it
    t = torch.arange(T, device=dev)
    index = base[:, None] + torch.minimum(start - first[:, None] + t[None, :], length[:, None] - 1)
    return PackedBatch(ids.view(rows, C), pos.view(rows, C), index)


def token_cells(attention_mask: torch.Tensor, micro_batch_size: int | None = None) -> tuple[int, int]:
    """Cells (rows x columns) the training pass computes padded and packed, micro-batch by
    micro-batch as :meth:`scalectl.rl.train.trainer.PolicyTrainer.train_step` runs it: a micro-batch
    is packed only when that takes fewer rows.

    Args:
        attention_mask: (n, L) of the rows that go through the pass (after
            :func:`scalectl.rl.train.trainer.gradient_rows`), each one run of real columns.
        micro_batch_size: rows per micro-batch (None: all in one).

    Returns:
        (padded cells, packed cells).

    Raises:
        ValueError: a row with no real token.
    """
    n, L = attention_mask.shape
    lengths = attention_mask.bool().sum(dim=1).tolist()
    step = micro_batch_size or max(n, 1)
    packed = 0
    for lo in range(0, n, step):
        chunk = lengths[lo:lo + step]
        rows = 1 + max(r for r, _ in place(chunk, L))
        packed += min(rows, len(chunk)) * L
    return n * L, packed
