"""The warm start shipped in the package: found by its settings, checked by its checksums,
refused when damaged, and recorded by every run in the store."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace as NS

import pytest
import torch

import scalectl.rl.train.warmstart as ws
from scalectl.errors import UserError
from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, load_policy

SMALL = dict(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
             num_key_value_heads=2)
SFT = ws.SFTConfig(lr=5e-3, warmup_steps=5, batch_size=32, check_every=5, check_prompts=24, check_samples=2,
                   max_steps=400)
SETTINGS = (SMALL, 1, 0, 60, 0.1, 12, SFT)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A small warm start trained here and written as a shipped one (in a folder of the test's)."""
    root = tmp_path_factory.mktemp("warmstarts")
    model, tok, meta = ws.train_warm_start(*SETTINGS, log=lambda m: None)
    key = ws.settings_key(*SETTINGS)
    folder = ws.save_shipped(root / "small", model, tok, meta, key, {"command": "test", "commit": None})
    return root, folder, key, meta, model


def test_a_shipped_folder_holds_what_a_run_loads_and_its_checksums(shipped):
    root, folder, key, meta, model = shipped
    described = json.loads((folder / "warmstart.json").read_text())
    assert sorted(p.name for p in folder.iterdir()) == sorted([*ws.CHECKED_FILES, "warmstart.json"])
    assert described["settings_key"] == key and described["steps"] == meta["steps"]
    assert described["pass_rate"] == meta["pass_rate"] >= 0.1 and "history" not in described
    for name in ws.CHECKED_FILES:     # an independent hash of the bytes on disk
        import hashlib
        assert described["files"][name] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
    loaded, _ = load_policy(folder)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_found_by_its_settings_key_and_not_by_another(shipped):
    root, folder, key, *_ = shipped
    assert ws.shipped_warm_start(key, root) == folder
    other = ws.settings_key(SMALL, 1, 0, 60, 0.2, 12, SFT)          # another target
    assert other != key and ws.shipped_warm_start(other, root) is None
    # the torch release is part of the cache key of a trained one, not of the settings key
    assert ws.cache_key(*SETTINGS) != key


def test_ensure_warm_start_takes_the_shipped_one_without_training(shipped, monkeypatch):
    root, folder, *_ = shipped
    monkeypatch.setattr(ws, "shipped_root", lambda: root)
    monkeypatch.setattr(ws, "train_sft", lambda *a, **k: pytest.fail("trained although one is shipped"))
    logs = []
    path = ws.ensure_warm_start(model_cfg=NS(path="builtin:tiny", warm_start_target=0.1),
                                data_cfg=NS(source="synthetic:arithmetic", difficulty=1, seed=0, train_size=60),
                                max_new_tokens=12, sft=SFT, model_overrides=SMALL, log=logs.append)
    assert path == folder and logs == []
    record = ws.warm_start_record(path)
    assert record["source"] == "shipped" and record["name"] == "small"
    assert record["sha256"] == json.loads((folder / "warmstart.json").read_text())["files"]["model.safetensors"]


@pytest.mark.parametrize("damage", ["flip a byte", "missing file"])
def test_a_damaged_shipped_warm_start_is_refused_naming_the_file(shipped, tmp_path, damage):
    root, folder, key, *_ = shipped
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    weights = copy / folder.name / "model.safetensors"
    if damage == "flip a byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x01
        weights.write_bytes(bytes(data))
    else:
        weights.unlink()
    with pytest.raises(UserError, match=r"model\.safetensors") as err:
        ws.shipped_warm_start(key, copy)
    assert "make warm-start" in str(err.value)


def test_the_default_setup_starts_from_the_shipped_warm_start():
    """The package ships the default setup's warm start; its files match their checksums and the
    default setup's warm-start settings select it (no SFT on any machine)."""
    from scalectl.recipe.load import load

    recipe = load("scalerl", "tiny-cpu")
    path = ws.ensure_warm_start(recipe, log=lambda m: pytest.fail(f"trained: {m}"))
    assert path.parent == ws.shipped_root()
    described = json.loads((path / "warmstart.json").read_text())
    assert {name: ws.file_sha256(path / name) for name in ws.CHECKED_FILES} == described["files"]
    assert described["target"] == recipe.model.warm_start_target
    assert described["difficulty"] == recipe.data.difficulty
    assert described["max_new_tokens"] == recipe.length.max_new_tokens
    assert described["provenance"]["command"].startswith("python scripts/build_warm_start.py")


def test_a_store_keeps_the_warm_start_of_a_run(tmp_path):
    """Schema 6: runs.warm_start round-trips as JSON, directly and through a run's journal, and an
    older store gains the column empty."""
    from scalectl.job.journal import journal_for
    from scalectl.store.database import Store
    from scalectl.store.journal import ingest

    record = {"source": "shipped", "name": "tiny-cpu", "sha256": "ab" * 32, "steps": 860, "pass_rate": 0.45}
    with Store.open(tmp_path / "s.db") as store:
        a = store.create_run("a")
        b = store.create_run("b", run_dir=str(tmp_path / "b"))
        assert store.get_run(a)["warm_start"] is None
        store.update_run(a, warm_start=json.dumps(record))
        assert store.get_run(a)["warm_start"] == record
        journal_for(tmp_path / "b", b).append("run", fields={"warm_start": json.dumps(record)})
        ingest(store)
        assert store.get_run(b)["warm_start"] == record
