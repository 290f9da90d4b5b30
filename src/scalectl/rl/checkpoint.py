"""Checkpoints of a run's state in its run folder, written atomically.

``RUN_DIR/checkpoints/step-000040/`` holds the DeepSpeed engine (weights,
optimiser, scheduler) and ``state.pt``: the step, the compute meter, the
prompt sampler (data order), the prompt history (retired prompts), the
batches already generated but not yet trained on (PPO-off-policy-k) and the
evaluation steps done.  A checkpoint is written to a temporary folder and
renamed into place, then ``checkpoints/latest`` is replaced: a crash at any
moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder named by ``checkpoints/latest``, or None."""
    pointer = checkpoint_dir(run_dir) / "latest"
    if not pointer.exists():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text().strip()
    return path if (path / "state.pt").exists() else None


def save_checkpoint(run_dir: Path, step: int, trainer, state: dict, keep: int = 2) -> Path:
    """Write a checkpoint for ``step`` and point ``latest`` at it; keep the last ``keep``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainer.save(str(tmp / "engine"))
    torch.save(state, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = root / f".latest-{os.getpid()}"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / "latest")
    old = sorted(p for p in root.glob("step-*") if p.is_dir())
    for p in old[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def load_checkpoint(path: Path, trainer) -> dict:
    """Restore the engine from ``path`` and return the saved state dict."""
    trainer.load(str(Path(path) / "engine"))
    return torch.load(Path(path) / "state.pt", weights_only=False)
