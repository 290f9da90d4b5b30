"""Checkpoints survive a crash at any moment of a save: a re-save of the step ``latest`` names
keeps the old folder until the new one is in place, and lookup falls back to the newest
complete checkpoint.  The crash is a failing rename (the moment a crash would hit); the
trainer, its DeepSpeed engine and the files are real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from scalectl.recipe.schema import Loss, Optim
from scalectl.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.train.trainer import PolicyTrainer


def _trainer(seed: int = 0) -> PolicyTrainer:
    return PolicyTrainer(build_tiny_model(seed=seed, num_hidden_layers=1, hidden_size=32, intermediate_size=64),
                         loss=Loss(type="cispo"), optim=Optim(lr=1e-3, warmup_steps=0), head_fp32=True,
                         temperature=1.0, micro_batch_size=4)


def _weights(trainer) -> dict:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def _shift(trainer, by: float) -> None:
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(by)


class Crash(OSError):
    """What the failing rename raises."""


def _crash_on(monkeypatch, target: str, source_prefix: str = "") -> list:
    """Make ``os.replace`` fail (as a crash at that moment would stop the save) when it moves a
    file or folder whose name starts with ``source_prefix`` onto one named ``target``."""
    real, calls = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == target and Path(src).name.startswith(source_prefix):
            calls.append((Path(src).name, Path(dst).name))
            raise Crash(f"crash while moving {src} to {dst}")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_an_interrupted_resave_of_the_latest_step_leaves_that_checkpoint(tmp_path, monkeypatch, one_torch_thread):
    trainer = _trainer()
    save_checkpoint(tmp_path, 2, trainer, {"step": 2, "saved": "first"})
    _shift(trainer, 0.5)
    save_checkpoint(tmp_path, 4, trainer, {"step": 4, "saved": "first"})
    saved = _weights(trainer)
    _shift(trainer, 0.25)                                  # the weights the re-save would write
    calls = _crash_on(monkeypatch, "step-000004", ".tmp-")
    with pytest.raises(Crash):
        save_checkpoint(tmp_path, 4, trainer, {"step": 4, "saved": "second"})
    monkeypatch.undo()
    assert calls == [(f".tmp-step-000004-{os.getpid()}", "step-000004")]
    found = latest_checkpoint(tmp_path)
    print(f"\nafter the failed rename: latest_checkpoint -> {found}")
    assert found is not None                             # the run resumes, not from step 0
    restored = _trainer(seed=1)                            # other weights until the load
    state = load_checkpoint(found, restored)
    assert state == {"step": 4, "saved": "first"}
    for name, value in _weights(restored).items():
        assert torch.equal(value, saved[name]), name       # the first save's weights, bit for bit

    # the next save (a resumed run taking step 4 again) completes and clears what the crash left
    again = save_checkpoint(tmp_path, 4, restored, {"step": 4, "saved": "third"})
    assert latest_checkpoint(tmp_path) == again
    assert sorted(p.name for p in again.parent.iterdir()) == ["latest", "step-000002", "step-000004"]
    assert torch.load(again / "state.pt")["saved"] == "third"


def test_a_pointer_that_names_nothing_complete_falls_back_to_the_newest_complete_checkpoint(tmp_path, monkeypatch,
                                                                                            one_torch_thread):
    trainer = _trainer()
    save_checkpoint(tmp_path, 2, trainer, {"step": 2})
    # a crash before ``latest`` is replaced: it still names step 2, step 4 is complete beside it
    _crash_on(monkeypatch, "latest", ".latest-")
    with pytest.raises(Crash):
        save_checkpoint(tmp_path, 4, trainer, {"step": 4})
    monkeypatch.undo()
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text() == "step-000002"
    assert latest_checkpoint(tmp_path) == root / "step-000002"       # the named one, complete
    # the named folder gone (deleted by hand), and a newer folder without state.pt (never complete)
    os.replace(root / "step-000002", tmp_path / "elsewhere")
    (root / "step-000006" / "engine").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == root / "step-000004"
    assert load_checkpoint(latest_checkpoint(tmp_path), trainer) == {"step": 4}
    # no pointer at all (a crash before the first one was written)
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == root / "step-000004"
    assert latest_checkpoint(tmp_path / "no-such-run") is None


def test_old_checkpoints_beyond_keep_are_deleted(tmp_path, one_torch_thread):
    trainer = _trainer()
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, trainer, {"step": step}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-000006", "step-000008"]
    assert latest_checkpoint(tmp_path).name == "step-000008"
