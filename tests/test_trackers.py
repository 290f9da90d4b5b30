"""[logging] backends: a real short run sends its metrics to TensorBoard, W&B (offline),
MLflow (local SQLite store) and JSON lines, and each reads back what the store and
steps.jsonl hold."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run_cli
from scalectl.job.trackers import BACKENDS, missing

INSTALLED = [b for b in BACKENDS if not missing([b])]
STEPS, EVERY = 6, 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A very small model warm-started on one-digit sums to a pass rate of 0.3 (seconds), so
    that the pass rates compared below are not all zero."""
    from types import SimpleNamespace as NS

    import scalectl.rl.train.warmstart as ws

    small = dict(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=2)
    sft = ws.SFTConfig(lr=5e-3, warmup_steps=5, batch_size=32, check_every=5, check_prompts=24, check_samples=2,
                       max_steps=400)
    path = ws.ensure_warm_start(model_cfg=NS(path="builtin:tiny", warm_start_target=0.3),
                                data_cfg=NS(source="synthetic:arithmetic", difficulty=1, seed=0, train_size=60),
                                max_new_tokens=12, cache_dir=tmp_path_factory.mktemp("cache"), sft=sft,
                                model_overrides=small)
    return str(path)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, policy) -> dict:
    """One short run with every installed backend at once."""
    tmp = tmp_path_factory.mktemp("tracked")
    db = tmp / "s.db"
    sets = ["async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=4",
            f"eval.every_steps={EVERY}", "eval.prompts=16", "eval.samples_per_prompt=2", f"model.path={policy}",
            f"budget.steps={STEPS}", "length.max_new_tokens=12", "data.difficulty=1", "data.train_size=48", f"logging.backends={json.dumps(INSTALLED)}",
            "logging.project=scalectl-test", "logging.wandb_mode=offline",
            f"logging.mlflow_tracking_uri='sqlite:///{tmp}/mlflow.db'"]
    proc = run_cli("run", "grpo", "--name", "tracked", "--runs-dir", str(tmp / "runs"),     # MLflow's artifacts go
            *[a for s in sets for a in ("--set", s)], db=db, check=True, timeout=600,  # to ./mlruns: cwd is tmp
            env={"WANDB_SILENT": "true", "SCALECTL_PROGRESS_INTERVAL": "0"}, cwd=tmp)
    show = json.loads(run_cli("show", "tracked", "--json", db=db, check=True).stdout)
    run_dir = tmp / "runs" / "tracked"
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return {"tmp": tmp, "run_dir": run_dir, "points": show["points"], "run": show, "steps": steps,
            "stderr": proc.stderr}


def _hash(tracked) -> str:
    return tracked["run"].get("recipe_hash") or tracked["run"]["run"]["recipe_hash"]


def test_the_run_evaluated_where_expected(tracked):
    assert [p["step"] for p in tracked["points"]] == list(range(0, STEPS + 1, EVERY))
    assert all(p["pass_rate"] > 0 for p in tracked["points"])        # the comparisons below are not of zeros
    assert [s["step"] for s in tracked["steps"]] == list(range(1, STEPS + 1))


def test_progress_off_a_terminal_is_one_plain_line_per_step(tracked):
    """stderr is a pipe here: no progress bar, a line per step (SCALECTL_PROGRESS_INTERVAL=0)."""
    lines = [line for line in tracked["stderr"].splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == [f"{k}/{STEPS}" for k in range(1, STEPS + 1)]
    assert "━" not in tracked["stderr"]


def test_tensorboard_event_files_hold_the_store_values(tracked):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked["run_dir"] / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    # TensorBoard stores scalars as float32: each value must be the float32 rounding of the stored one, exactly
    for key in ("pass_rate", "truncation_rate", "mean_length", "flops"):
        events = acc.Scalars(f"eval/{key}")
        assert [e.step for e in events] == [p["step"] for p in tracked["points"]]
        assert [e.value for e in events] == [float(np.float32(p[key])) for p in tracked["points"]], key
    for key in ("loss", "clip_fraction", "reward", "entropy"):
        events = acc.Scalars(f"train/{key}")
        assert [e.step for e in events] == [s["step"] for s in tracked["steps"]]
        assert [e.value for e in events] == [float(np.float32(s[key])) for s in tracked["steps"]], key
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert _hash(tracked) in config and '"loss"' in config


def test_jsonl_holds_the_config_and_every_point(tracked):
    records = [json.loads(line) for line in (tracked["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    start, end = records[0], records[-1]
    assert (start["event"], start["run"], start["recipe_hash"]) == ("start", "tracked", _hash(tracked))
    assert start["recipe"]["loss"]["type"] == "ppo_clip"
    assert end == {"event": "end", "status": "completed"}
    evals = [r for r in records if "eval/pass_rate" in r]
    assert [(r["step"], r["eval/pass_rate"]) for r in evals] == [(p["step"], p["pass_rate"]) for p in tracked["points"]]
    losses = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    assert losses == [(s["step"], s["loss"]) for s in tracked["steps"]]


def test_mlflow_run_holds_the_store_values(tracked):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tracked['tmp']}/mlflow.db")
    exp = client.get_experiment_by_name("scalectl-test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.tags["scalectl.recipe_hash"] == _hash(tracked)
    assert run.data.params["loss.type"] == "ppo_clip" and run.data.params["budget.steps"] == str(STEPS)
    history = sorted(client.get_metric_history(run.info.run_id, "eval/pass_rate"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(p["step"], p["pass_rate"]) for p in tracked["points"]]
    losses = sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in losses] == [(s["step"], s["loss"]) for s in tracked["steps"]]


def _wandb_records(path: str) -> list:
    """The protobuf records of an offline W&B run file: a 7-byte header, then records in the
    LevelDB log format (32 KiB blocks; each fragment a 7-byte header of CRC32C, length and
    type, FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4), as W&B's datastore writes them."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, out, buf = Path(path).read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):      # block padding
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def test_wandb_offline_run_holds_the_store_values(tracked):
    pytest.importorskip("wandb")
    (path,) = glob.glob(str(tracked["run_dir"] / "wandb" / "offline-run-*" / "*.wandb"))
    records = _wandb_records(path)
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    evals = [(h["step"], h["eval/pass_rate"]) for h in history if "eval/pass_rate" in h]
    assert evals == [(p["step"], p["pass_rate"]) for p in tracked["points"]]
    losses = [(h["step"], h["train/loss"]) for h in history if "train/loss" in h]
    assert losses == [(s["step"], s["loss"]) for s in tracked["steps"]]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "tracked"
    config = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in run.config.update}
    assert config["recipe_hash"] == _hash(tracked) and config["recipe"]["loss"]["type"] == "ppo_clip"
    (end,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 0


def test_a_missing_backend_names_its_extra(tmp_path):
    """With the library's import blocked (sys.modules[name] = None), the run stops before it starts."""
    code = ("import sys; sys.modules['wandb'] = None; sys.argv[0] = 'scalectl'; "
            "from scalectl.cli import app; app()")
    proc = subprocess.run([sys.executable, "-c", code, "run", "grpo", "--set", 'logging.backends=["wandb"]',
                           "--db", str(tmp_path / "s.db")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "logging.backends = ['wandb']: wandb is not installed" in proc.stderr
    assert "pip install 'scalectl[wandb]'" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_bad_logging_keys_are_named(tmp_path):
    proc = run_cli("validate", "grpo", "--set", 'logging.backends=["tensorbord"]', cwd=tmp_path)
    assert proc.returncode == 2
    assert "logging.backends.0 = 'tensorbord' is not one of: tensorboard, wandb, mlflow, jsonl" in proc.stderr


def test_the_logging_section_leaves_the_recipe_hash_alone(tmp_path):
    plain = json.loads(run_cli("validate", "grpo", "--json", cwd=tmp_path, check=True).stdout)[0]["hash"]
    logged = json.loads(run_cli("validate", "grpo", "--set", 'logging.backends=["jsonl"]', "--json",
                                cwd=tmp_path, check=True).stdout)[0]["hash"]
    assert plain == logged


def test_a_resumed_tensorboard_log_replaces_the_steps_after_the_checkpoint(tmp_path):
    """purge_step: steps logged after the checkpoint a run resumes from are logged again, once."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scalectl.job.trackers import RunInfo, TensorBoardTracker

    info = RunInfo("r", tmp_path, {"loss": {"type": "cispo"}}, "0123456789ab", "r-1")
    first = TensorBoardTracker()
    first.open(info, 0, resumed=False)
    for step in range(1, 7):                       # the crash came after step 6; the checkpoint is step 4
        first.log(step, {"train/loss": float(step)})
    first.close("failed")
    again = TensorBoardTracker()
    again.open(info, 4, resumed=True)
    for step in range(5, 9):
        again.log(step, {"train/loss": 10.0 * step})
    again.close("completed")
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert got == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0), (7, 70.0), (8, 80.0)]
