"""Wasted work: the effect, alone, of each cut: completions whose advantage is 0 and all-padding
columns skipped by the training pass, the padding inside the remaining rows skipped by packing,
and finished rows leaving the decoding batch.

The benchmark recipe of ``bench_trl.py`` (tiny warm-started model, 16 prompts x 8
generations, CISPO, token-level aggregation, no zero-variance filter, as TRL
trains) generates ``--batches`` real batches with the CPU rollout engine.  For
each batch it counts the completions and token cells (rows x columns) the
forward/backward pass computes with and without the cut
(:func:`scalectl.rl.train.trainer.gradient_rows`) and, of the rows kept, the cells a packed
pass computes (:func:`scalectl.rl.train.packing.token_cells`, micro-batch by micro-batch), then
times ``train_step`` three ways, alternating, ``--repeats`` times per batch, at
``--threads`` torch threads: "padded" (``gradient_rows`` replaced by the identity, as
before the cut, and no packing), "cut" (the cut, ``pack`` off) and "packed" (the cut,
``pack`` on); the packing case is "cut" against "packed", run one after the other on
the same batch.  Figures: the share of rows and cells kept (counting, independent of
load) and the time ratios cut / padded and packed / cut (wall-clock and CPU time),
judged only while the 1-minute load average stays under ``--max-load``.  Decoding is counted, not
timed (the engine no longer has the old path): a completion of L tokens is fed
to L - 1 decoding steps, where a whole-batch decoder feeds every row of the
batch to every step until the longest completion ends.

    python benchmarks/bench_waste.py [--batches 6] [--repeats 3] [--threads 1] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import time

from common import Figure, Load, default_max_load, machine_line, median, print_table, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the setup's model, warm-started)")
    ap.add_argument("--max-load", type=float, default=default_max_load(),
                    help="1-minute load average above which no verdict is given (default nproc + 0.5)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    import scalectl.rl.train.trainer as trainer_mod
    from bench_trl import load_recipe
    from scalectl.rl.train.batch import build_train_batch
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.batches.collect import generate_batch
    from scalectl.rl.loop import Reporter, build_policy, new_state
    from scalectl.rl.train.losses import aggregation_weights
    from scalectl.rl.policy.model import pad_token_id
    from scalectl.rl.train.packing import token_cells
    from scalectl.rl.train.warmstart import ensure_warm_start

    print(machine_line())
    torch.set_num_threads(args.threads)
    recipe = load_recipe("cispo", "sync", 1, args.batches, model=args.model, threads=args.threads)
    ensure_warm_start(recipe)
    train, _ = load_prompt_sets(recipe)
    policy = build_policy(recipe, Reporter())
    state = new_state(recipe, policy.n_params, len(train))
    pad = pad_token_id(policy.tokenizer)
    batches = []
    for b in range(args.batches):
        groups, _ = generate_batch(recipe, policy.engine, train, state, seed=1000 + b)
        batches.append(build_train_batch(groups, recipe.advantage.normalization, pad))
    trainer = policy.trainer
    rows = cells = rows_cut = cells_cut = cells_packed = fed_live = fed_all = 0
    for batch in batches:
        lengths = batch.attention_mask[:, batch.start + 1:].sum(dim=1)
        fed_live += int((lengths - 1).clamp(min=0).sum())
        fed_all += int(lengths.numel() * (int(lengths.max()) - 1))
        w = aggregation_weights(batch.loss_mask, batch.group_ids, recipe.loss.aggregation)
        cut, _ = trainer_mod.gradient_rows(batch, w)
        rows += batch.input_ids.shape[0]
        cells += batch.input_ids.numel()
        rows_cut += cut.input_ids.shape[0]
        cells_cut += cut.input_ids.numel()
        cells_packed += token_cells(cut.attention_mask, trainer.micro_batch_size)[1]

    real = trainer_mod.gradient_rows
    cases = ("padded", "cut", "packed")
    times = {case: [] for case in cases}
    cpu = {case: [] for case in cases}
    computed = {case: 0 for case in cases}      # the token cells train_step reports, first repeat
    with Load() as load:
        for r in range(args.repeats):
            for batch in batches:
                for case in cases:   # alternating, so drift in the load hits every case
                    trainer_mod.gradient_rows = (lambda b, w: (b, w)) if case == "padded" else real
                    trainer.pack = case == "packed"
                    t, c = time.perf_counter(), time.process_time()
                    metrics = trainer.train_step(batch)
                    times[case].append(time.perf_counter() - t)
                    cpu[case].append(time.process_time() - c)
                    computed[case] += metrics["token_cells"] if r == 0 else 0
    trainer_mod.gradient_rows = real
    trainer.pack = True
    if (computed["cut"], computed["packed"]) != (cells_cut, cells_packed):
        raise SystemExit(f"train_step computed {computed} token cells, counted {cells_cut} cut / {cells_packed} packed")
    print_table(f"training step, {args.batches} batches x {args.repeats} repeats, {args.threads} thread(s) ({load})",
                ["case", "rows", "token cells", "wall median (s)", "CPU median (s)"],
                [["padded, every completion", str(rows), str(cells), median(times["padded"]), median(cpu["padded"])],
                 ["zero-advantage rows and padding cut", str(rows_cut), str(cells_cut), median(times["cut"]),
                  median(cpu["cut"])],
                 ["cut, then packed", str(rows_cut), str(cells_packed), median(times["packed"]),
                  median(cpu["packed"])]])
    lo = (load.before, load.after)
    report(Figure("bench_waste", "rows through the training pass, cut / padded", rows_cut / rows, "x"))
    report(Figure("bench_waste", "token cells through the training pass, cut / padded", cells_cut / cells, "x"))
    report(Figure("bench_waste", "decoding rows fed, live rows only / whole batch", fed_live / fed_all, "x"))
    report(Figure("bench_waste", "training step time, cut / padded (wall, median)",
                  median(times["cut"]) / median(times["padded"]), "x", "<", 1.0, load=lo, max_load=args.max_load))
    report(Figure("bench_waste", "training step time, cut / padded (CPU, median)",
                  median(cpu["cut"]) / median(cpu["padded"]), "x", load=lo))
    report(Figure("bench_waste", "token cells through the training pass, packed / cut", cells_packed / cells_cut, "x"))
    # the time target is judged only where packing computes fewer cells: with as many cells, the
    # two passes are the same work and their ratio is noise around 1
    packs = cells_packed < cells_cut
    if not packs:
        print("packing: no two kept sequences fit one row of these batches (as many cells): the time "
              "ratio below is the same work twice, no verdict")
    report(Figure("bench_waste", "training step time, packed / cut (wall, median)",
                  median(times["packed"]) / median(times["cut"]), "x", *(("<", 1.0) if packs else (None, None)),
                  load=lo, max_load=args.max_load))
    report(Figure("bench_waste", "training step time, packed / cut (CPU, median)",
                  median(cpu["packed"]) / median(cpu["cut"]), "x", load=lo))


if __name__ == "__main__":
    main()
