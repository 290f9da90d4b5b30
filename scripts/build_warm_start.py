"""Build the warm start shipped in the package for a setup (default: the default setup).

    make warm-start                                  # = python scripts/build_warm_start.py
    python scripts/build_warm_start.py --setup tiny-cpu --name tiny-cpu

Trains the tiny model by the SFT stage of ``scalectl.rl.train.warmstart`` (the settings of
the setup's ``model``, ``data`` and ``length.max_new_tokens``), then writes it to
``src/scalectl/presets/warmstarts/NAME/`` with ``warmstart.json``: the settings key that
selects it, the SHA-256 of every file, the SFT steps and check pass rate, and how it was made
(this command, the commit, the CPU kind, the load average, the thread count, torch and
transformers). Commit the folder: every machine then starts the setup's runs from these bits.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_kind() -> str:
    """The CPU's model name (``AMD EPYC``, ``Intel Xeon ...``): ``benchmarks/common.py``'s."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import cpu_model

    return cpu_model()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", default="tiny-cpu", help="setup preset or file (default tiny-cpu)")
    parser.add_argument("--name", default=None, help="folder name under presets/warmstarts (default: the setup's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the SFT (default 1)")
    args = parser.parse_args()

    import torch
    import transformers

    from scalectl.recipe.load import load
    from scalectl.rl.train.warmstart import (save_shipped, settings_key, sft_set_size, sft_settings, shipped_root,
                                             train_warm_start)

    torch.set_num_threads(args.threads)
    recipe = load("scalerl", args.setup)
    sft = sft_settings(recipe.model)
    train_size = sft_set_size(recipe.model, recipe.data)
    settings = ({}, recipe.data.difficulty, recipe.data.seed, train_size, recipe.model.warm_start_target,
                recipe.length.max_new_tokens, sft, dict(recipe.data.mix))
    key = settings_key(*settings)
    name = args.name or Path(str(args.setup)).stem
    load_before = os.getloadavg()
    model, tokenizer, meta = train_warm_start(*settings, log=lambda m: print(m, flush=True))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or None
    provenance = {
        "command": "python scripts/build_warm_start.py " + " ".join(sys.argv[1:]),
        "commit": commit, "cpu": cpu_kind(), "threads": args.threads,
        "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    folder = save_shipped(shipped_root() / name, model, tokenizer, meta, key, provenance)
    print(f"{folder}: settings key {key}, {meta['steps']} SFT steps, check pass rate {meta['pass_rate']:.3f}, "
          f"{meta['seconds']:.0f} s on {provenance['cpu']}")


if __name__ == "__main__":
    main()
