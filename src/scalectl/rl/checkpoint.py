"""Checkpoints of a run's state in its run folder, written atomically.

``RUN_DIR/checkpoints/step-000040/`` holds the DeepSpeed engine (weights,
optimiser, scheduler) and ``state.pt``: the step, the compute meter, the
prompt sampler (data order), the prompt history (retired prompts), the
batches already generated but not yet trained on (PPO-off-policy-k) and the
evaluation steps done.

A checkpoint is written to a temporary folder and renamed into place, then
``checkpoints/latest`` is replaced.  Saving a step that is already there (the
final checkpoint of a run whose last step was saved, a resumed run saving the
step it resumed from) first moves the old folder aside (``.old-step-...``) and
deletes it only once the new one is in place and named by ``latest``; folders
beyond ``keep`` are renamed out of the ``step-*`` names before they are deleted.
A crash at any moment thus leaves at least one complete checkpoint (an
``engine`` folder and ``state.pt``), and :func:`latest_checkpoint` finds it:
the folder ``latest`` names when it is complete, else the newest complete one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

#: A checkpoint folder's name: ``step-000040``, or ``.old-step-000040-PID`` (moved aside by a re-save).
_NAME = re.compile(r"^(?:\.old-)?step-(\d+)(?:-\d+)?$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a whole checkpoint: the engine folder and ``state.pt``."""
    return (Path(path) / "state.pt").is_file() and (Path(path) / "engine").is_dir()


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoint folders of a run, oldest step first; of two folders of one
    step, ``step-N`` after ``.old-step-N-PID`` (the newer write)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_dir() and is_complete(path):
            found.append((int(match.group(1)), not path.name.startswith("."), path))
    return [path for _, _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a run resumes from: the folder named by ``checkpoints/latest`` when it
    is complete, else the newest complete checkpoint folder (a save interrupted between its
    renames), else None."""
    pointer = checkpoint_dir(run_dir) / "latest"
    if pointer.is_file():
        named = pointer.read_text().strip()
        path = checkpoint_dir(run_dir) / named
        if named and _NAME.match(named) and is_complete(path):
            return path
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, trainer, state: dict, keep: int = 2) -> Path:
    """Write a checkpoint for ``step`` and point ``latest`` at it; keep the last ``keep``.

    The previous checkpoint of ``step``, if any, stays complete until the new one is in place
    and named by ``latest`` (module docstring).

    Args:
        run_dir: the run folder.
        step: the optimiser steps taken.
        trainer: has ``save(folder)`` (the engine's weights, optimiser and scheduler).
        state: the loop state (``torch.save``-able).
        keep: checkpoint folders kept (>= 1).

    Returns:
        The new checkpoint's folder.
    """
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainer.save(str(tmp / "engine"))
    torch.save(state, tmp / "state.pt")
    aside = root / f".old-{name}-{os.getpid()}"
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    pointer_tmp = root / f".latest-{os.getpid()}"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / "latest")
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    """Delete the ``step-*`` folders before the last ``keep`` and what earlier saves left
    (folders moved aside, temporary folders and pointers): one trainer writes a run folder at
    a time (:mod:`scalectl.job.lock`), and ``latest`` names a complete checkpoint now.  Each
    is renamed out of the checkpoint names first, so a crash mid-delete leaves no partial
    folder that looks like a checkpoint."""
    steps = [p for _, p in sorted((int(_NAME.match(p.name).group(1)), p) for p in root.glob("step-*")
                                  if p.is_dir() and _NAME.match(p.name))]
    leftovers = [p for p in root.iterdir() if p.name.startswith((".old-", ".tmp-", ".trash-", ".latest-"))]
    for p in steps[:-keep] + leftovers:
        doomed = p if p.name.startswith(".trash-") else root / f".trash-{p.name.lstrip('.')}"
        try:
            if doomed != p:
                os.replace(p, doomed)
        except OSError:
            continue
        if doomed.is_dir():
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            doomed.unlink(missing_ok=True)


def load_checkpoint(path: Path, trainer) -> dict:
    """Restore the engine from ``path`` and return the saved state dict."""
    trainer.load(str(Path(path) / "engine"))
    return torch.load(Path(path) / "state.pt", weights_only=False)
