"""Hostile input: every bad recipe, override, import file or store file gets a clear
error (exit 2) naming the file and the key or row, never a traceback, and leaves an
existing store byte for byte as it was.

The table runs the real CLI in this process through typer's CliRunner (fast: the
app is imported once); a few cases run the console script as a real subprocess, as
another user where the store must be unwritable (root may write any file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from typer.testing import CliRunner

from conftest import ROOT, SCALECTL
from scalectl.cli import app
from scalectl.store.importer import import_points
from scalectl.store.database import Store

GRPO = str(ROOT / "recipes" / "grpo.toml")


# --------------------------------------------------------------------------- helpers


def _digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (the store and anything beside it)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _make_store(path: Path, points: int = 3) -> Path:
    """A store holding run ``keep`` with ``points`` points, closed (no -wal left)."""
    csv = path.parent / "keep-points.csv"
    csv.write_text("compute,pass_rate\n" + "".join(f"{i * 10},{0.2 + i * 1e-5}\n" for i in range(points)))
    with Store.open(path) as store:
        import_points(store, csv, "keep")
    csv.unlink()
    return path


def _corrupt(path: Path) -> None:
    """Overwrite the root page of the ``runs`` table with garbage (the header stays valid)."""
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page)
        fh.write((b"\xde\xad\xbe\xef garbage " * page)[:page])


@dataclass
class Case:
    """One hostile input: ``build(tmp, store)`` writes what it needs and returns the CLI
    arguments; ``expect`` are substrings of the error (``{tmp}`` is the case's folder)."""

    id: str
    build: Callable[[Path, Path], list[str]]
    expect: tuple[str, ...]


def recipe(text: str | bytes, *extra: str, name: str = "r.toml") -> Callable[[Path, Path], list[str]]:
    """``validate`` of a recipe file holding ``text``."""
    def build(tmp: Path, store: Path) -> list[str]:
        f = tmp / name
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["validate", str(f), *extra]
    return build


def override(*sets: str, command: str = "validate") -> Callable[[Path, Path], list[str]]:
    """``validate`` (or ``run``) of recipes/grpo.toml with ``--set`` overrides."""
    def build(tmp: Path, store: Path) -> list[str]:
        args = [command, GRPO, *[a for s in sets for a in ("--set", s)]]
        if command == "run":
            args += ["--runs-dir", str(tmp / "runs"), "--db", str(store)]
        return args
    return build


def imported(content: str | bytes, name: str = "p.csv", run: str = "new",
             extra: tuple[str, ...] = ()) -> Callable[[Path, Path], list[str]]:
    """``import`` of a file holding ``content`` into the store (``extra``: more options)."""
    def build(tmp: Path, store: Path) -> list[str]:
        f = tmp / name
        f.write_bytes(content if isinstance(content, bytes) else content.encode())
        return ["import", str(f), "--name", run, "--db", str(store), *extra]
    return build


def with_files(fn: Callable[[Path], list[str]]) -> Callable[[Path, Path], list[str]]:
    def build(tmp: Path, store: Path) -> list[str]:
        return [a.replace("{store}", str(store)) for a in fn(tmp)]
    return build


def _extends_chain(tmp: Path) -> list[str]:
    for i in range(40):
        (tmp / f"c{i}.toml").write_text(f'extends = "c{i + 1}.toml"\n')
    (tmp / "c40.toml").write_text("")
    return ["validate", str(tmp / "c0.toml")]


def _fifo(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "pipe.toml")
    (tmp / "r.toml").write_text('extends = "pipe.toml"\n')
    return ["validate", str(tmp / "r.toml")]


def _folder_recipe(tmp: Path) -> list[str]:
    (tmp / "dir.toml").mkdir()
    return ["validate", str(tmp / "dir.toml")]


def _no_config_model(tmp: Path) -> list[str]:
    (tmp / "model").mkdir()
    return ["validate", GRPO, "--set", f"model.path={tmp / 'model'}"]


def _zero_csv(tmp: Path) -> list[str]:
    (tmp / "zero.csv").symlink_to("/dev/zero")
    return ["import", str(tmp / "zero.csv"), "--name", "new", "--db", "{store}"]


def _empty_folder(tmp: Path) -> list[str]:
    (tmp / "empty").mkdir()
    return ["import", str(tmp / "empty"), "--name", "new", "--db", "{store}"]


def _folder_csv(tmp: Path) -> list[str]:
    (tmp / "points.csv").mkdir()
    return ["import", str(tmp / "points.csv"), "--name", "new", "--db", "{store}"]


def _csv(tmp: Path) -> Path:
    (tmp / "ok.csv").write_text("compute,pass_rate\n0,0.3\n10,0.4\n")
    return tmp / "ok.csv"


def _store_file(kind: str, command: str) -> Callable[[Path, Path], list[str]]:
    """A command against a store path that is not a healthy store; the existing store
    (``store``) is not named, so it stays as it was; the bad file must stay too."""
    def build(tmp: Path, store: Path) -> list[str]:
        bad = tmp / "bad" / "s.db"
        bad.parent.mkdir()
        if kind == "damaged":
            shutil.copy(store, bad)
            _corrupt(bad)
        elif kind == "folder":
            bad.mkdir()
        elif kind == "text":
            bad.write_text("just some text, not a database\n" * 200)
        elif kind == "foreign":
            with sqlite3.connect(bad) as conn:
                conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
            conn.close()
        elif kind == "newer":
            shutil.copy(store, bad)
            with sqlite3.connect(bad) as conn:
                conn.execute("PRAGMA user_version = 99")
            conn.close()
        elif kind == "missing":
            bad = tmp / "nowhere" / "deeper" / "s.db"
            bad.parent.parent.parent.joinpath("bad").rmdir()
        elif kind == "device":
            bad = Path("/dev/null")
        args = {"runs": ["runs"], "show": ["show", "keep"], "fit": ["fit", "keep"],
                "import": ["import", str(_csv(tmp)), "--name", "new"],
                "status": ["status"]}[command]
        return [*args, "--db", str(bad)]
    return build


DEEP = "[" * 5000 + "]" * 5000
CASES = [
    # ---- recipe files: what the loader reads
    Case("extends-dev-zero", recipe('extends = "/dev/zero"\n'), ("/dev/zero: is a character device",)),
    Case("extends-fifo", with_files(_fifo), ("pipe.toml: is a FIFO",)),
    Case("recipe-is-folder", with_files(_folder_recipe), ("dir.toml: is a folder",)),
    Case("extends-empty", recipe('extends = ""\n'), (": is a folder",)),
    Case("extends-not-string", recipe("extends = 5\n"), ("r.toml: extends = 5 must be a path",)),
    Case("extends-chain-40", with_files(_extends_chain), ("c16.toml: extends chain longer than 16 files",)),
    Case("extends-self", recipe('extends = "r.toml"\n'), ("r.toml: extends cycle",)),
    Case("array-5000-deep", recipe(f"x = {DEEP}\n"), ("r.toml: nested more than 16 levels deep",)),
    Case("table-40-deep", recipe(".".join(f"k{i}" for i in range(40)) + " = 1\n"),
         ("r.toml: nested more than 16 levels deep",)),
    Case("latin-1-byte", recipe(b'# recipe\nname = "caf\xe9"\n'), ("r.toml: line 2: byte 0xe9 is not UTF-8",)),
    Case("binary-file", recipe(bytes(range(256)) * 4), ("r.toml: line 2: byte 0x80 is not UTF-8",)),
    Case("over-1-MiB", recipe("# " + "x" * (1 << 20) + "\n"), ("r.toml: larger than 1,048,576 bytes",)),
    Case("invalid-toml", recipe("[loss\n"), ("r.toml: invalid TOML",)),
    # ---- recipe values: strict, finite, bounded
    Case("lr-inf", recipe("[optim]\nlr = inf\n"), ("r.toml: optim.lr = inf: must be a finite number",)),
    Case("lr-nan", recipe("[optim]\nlr = nan\n"), ("r.toml: optim.lr = nan: must be a finite number",)),
    Case("weight-decay-inf", recipe("[optim]\nweight_decay = inf\n"), ("optim.weight_decay = inf: must be a finite",)),
    Case("gpu-hours-inf", recipe("[budget]\ngpu_hours = inf\n"), ("r.toml: budget.gpu_hours = inf: must be a finite",)),
    Case("min-compute-inf", recipe("[fit]\nmin_compute = inf\n"), ("r.toml: fit.min_compute = inf: must be a finite",)),
    Case("clip-high-inf", recipe("[loss]\nclip_high = inf\n"), ("r.toml: loss.clip_high = inf: must be a finite",)),
    Case("mem-gb-inf", recipe("[launcher.slurm]\nmem_gb = inf\n"),
         ("r.toml: launcher.slurm.mem_gb = inf: must be a finite",)),
    Case("eval-temperature-minus-inf", recipe("[eval]\ntemperature = -inf\n"), ("eval.temperature = -inf: must be a finite",)),
    Case("seed-huge", recipe("seed = 99999999999999999999999\n"),
         ("r.toml: seed = 99999999999999999999999 is out of range: must be <= 4294967295",)),
    Case("seed-negative", recipe("seed = -5\n"), ("r.toml: seed = -5 is out of range: must be >= 0",)),
    Case("data-seed-negative", recipe("[data]\nseed = -1\n"), ("r.toml: data.seed = -1 is out of range",)),
    Case("prompts-1e8-float", recipe("[batch]\nprompts_per_step = 1e8\n"),
         ("r.toml: batch.prompts_per_step = 100000000.0: must be an integer",)),
    Case("prompts-1e8-int", recipe("[batch]\nprompts_per_step = 100000000\n"),
         ("r.toml: batch.prompts_per_step = 100000000 is out of range: must be <= 65536",)),
    Case("steps-true", recipe("[budget]\nsteps = true\n"), ("r.toml: budget.steps = true: must be an integer",)),
    Case("steps-fraction", recipe("[budget]\nsteps = 1.5\n"), ("r.toml: budget.steps = 1.5: must be an integer",)),
    Case("filter-yes", recipe('[filter]\nzero_variance = "yes"\n'),
         ("r.toml: filter.zero_variance = 'yes': must be true or false",)),
    Case("k-huge", recipe("[async]\nk = 1000000000000\n"), ("r.toml: async.k = 1000000000000 is out of range",)),
    Case("tokens-huge", recipe("[length]\nmax_new_tokens = 10000000000\n"),
         ("r.toml: length.max_new_tokens = 10000000000 is out of range",)),
    Case("time-min-huge", recipe("[launcher.slurm]\ntime_min = 1000000000\n"),
         ("r.toml: launcher.slurm.time_min = 1000000000 is out of range",)),
    Case("name-newline", recipe('name = "a\\nb"\n'), ("r.toml: name: contains the control character '\\n'",)),
    Case("description-long", recipe(f'description = "{"d" * 20000}"\n'),
         ("r.toml: description = 'ddd", "longer than 10,000 characters")),
    Case("description-nul", recipe('description = "two\\nlines\\u0000"\n'),
         ("r.toml: description: contains the control character '\\x00' (U+0000) at character 10: printable text, "
          "tabs and newlines are allowed",)),
    Case("description-rtl-override", recipe('description = "see gpj.\\u202eexe.txt"\n'),
         ("r.toml: description: contains the control character '\\u202e' (U+202E RIGHT-TO-LEFT OVERRIDE) at "
          "character 9",)),
    Case("description-carriage-return", recipe('description = "a\\rb"\n'),
         ("r.toml: description: contains the control character '\\r' (U+000D) at character 2",)),
    Case("name-rtl-override", recipe('name = "run\\u202ecod"\n'),
         ("r.toml: name: contains the control character '\\u202e' (U+202E RIGHT-TO-LEFT OVERRIDE) at character 4: "
          "one line of printable text is allowed",)),
    Case("name-c1-control", recipe('name = "a\\u009bb"\n'), ("r.toml: name: contains the control character '\\x9b'",)),
    Case("version-zero-width", recipe('[reward]\nversion = "v\\u200b1"\n'),
         ("r.toml: reward.version: contains the control character '\\u200b' (U+200B ZERO WIDTH SPACE) at character 2",)),
    Case("set-interrupt-phrase-escape", override('length.interrupt_phrase="\\u001b[2J</think>"'),
         ("length.interrupt_phrase: contains the control character '\\x1b' (U+001B) at character 1",)),
    Case("setup-config-key-bidi", recipe('[model.config]\n"hidden\\u2066_size" = 64\n'),
         ("r.toml: model.config.hidden\\u2066_size.[key]: contains the control character '\\u2066' (U+2066 "
          "LEFT-TO-RIGHT ISOLATE) at character 7",)),
    Case("section-not-table", recipe("loss = 5\n"), ("r.toml: loss = 5: must be a table",)),
    # ---- what validate checks without loading
    Case("model-path-missing", recipe('[model]\npath = "/nonexistent/model"\n'),
         ("r.toml: model.path = '/nonexistent/model': no such folder",)),
    Case("model-path-no-config", with_files(_no_config_model), ("--set model.path: model.path =", "no config.json")),
    Case("model-builtin-unknown", recipe('[model]\npath = "builtin:huge"\n'),
         ("r.toml: model.path = 'builtin:huge' is not one of: builtin:tiny",)),
    Case("data-file-missing", recipe('[data]\nsource = "missing.jsonl"\n'),
         ("r.toml: data.source = 'missing.jsonl': no such file",)),
    Case("data-synthetic-unknown", recipe('[data]\nsource = "synthetic:chess"\n'),
         ("r.toml: data.source = 'synthetic:chess' is not one of",)),
    Case("data-hf-empty", recipe('[data]\nsource = "hf:"\n'), ("r.toml: data.source = 'hf:': a dataset name must follow",)),
    Case("data-csv", recipe('[data]\nsource = "prompts.csv"\n'), ("r.toml: data.source = 'prompts.csv' is not one of",)),
    # ---- --set overrides
    Case("set-lr-inf", override("optim.lr=inf"), ("--set optim.lr: optim.lr = inf: must be a finite number",)),
    Case("set-mem-1e400", override("launcher.slurm.mem_gb=1e400"), ("launcher.slurm.mem_gb = inf: must be a finite",)),
    Case("set-seed-huge", override("seed=99999999999999999999999"), ("--set seed: seed = 99999999999999999999999 is out",)),
    Case("set-steps-true", override("budget.steps=true"), ("--set budget.steps: budget.steps = true: must be an integer",)),
    Case("set-filter-yes", override("filter.retire_solved=yes"), ("filter.retire_solved = 'yes': must be true or false",)),
    Case("set-background-maybe", override("eval.background=maybe"),
         ("--set eval.background: eval.background = 'maybe' is not one of: auto, on, off",)),
    Case("set-background-on-vllm", override("eval.background=on", "hardware.rollout_engine=vllm"),
         ("eval.background = 'on' needs hardware.rollout_engine = 'cpu'", "allowed with 'vllm': auto, off")),
    Case("set-no-equals", override("optim.lr"), ("--set 'optim.lr': expected KEY=VALUE",)),
    Case("set-empty-key", override("=1"), ("--set '=1': empty key",)),
    Case("set-empty-part", override("loss..type=cispo"), ("key 'loss..type' is not a dotted key",)),
    Case("set-deep-key", override(".".join(["a"] * 20) + "=1"), ("nested more than 16 levels deep",)),
    Case("set-deep-value", override(f"loss.type={DEEP}"), ("--set loss.type: nested more than 16 levels deep",)),
    Case("set-two-values", override('seed=1\nname="x"'), ("--set seed: the value", "holds more than one value")),
    Case("set-name-newline", override("hardware.name=a\nb"), ("hardware.name: contains the control character",)),
    Case("set-unknown-key", override("loss.clipp_high=0.3"),
         ("--set loss.clipp_high: loss.clipp_high: unknown key; did you mean loss.clip_high? The keys of [loss]:\n"
          "  type         Policy loss: ", "\n  clip_high    Upper clip epsilon+ ")),
    Case("set-loss-type-list", override("loss.type=[1]"),
         ("--set loss.type: loss.type = [1] is not one of: ppo_clip, gspo, cispo",)),
    Case("explain-unknown-key", lambda tmp, store: ["validate", "--explain", "optim.betta1"],
         ("optim.betta1: unknown key; did you mean optim.beta1? The keys of [optim]:\n  lr ",)),
    Case("explain-not-a-key", lambda tmp, store: ["validate", "--explain", "loss.type\n[x]" + "y" * 5000],
         ("is not a dotted key (parts of letters, digits, _ and -, e.g. loss.clip_high)", "(5,013 chars)")),
    Case("run-unknown-key", override("async.kk=2", command="run"),
         ("--set async.kk: async.kk: unknown key; did you mean async.k? The keys of [async]:",)),
    Case("run-seed-negative", override("seed=-5", command="run"), ("--set seed: seed = -5 is out of range",)),
    Case("run-prompts-1e8", override("batch.prompts_per_step=1e8", command="run"),
         ("batch.prompts_per_step = 100000000.0: must be an integer",)),
    Case("run-dev-zero-recipe", with_files(lambda tmp: ["run", "/dev/zero", "--db", "{store}"]),
         ("/dev/zero: is a character device",)),
    # ---- import files
    Case("import-binary", imported(bytes(range(256))), ("p.csv: line 2: byte 0x80 is not UTF-8",)),
    Case("import-empty-pass-rate", imported("compute,pass_rate\n0,\n10,\n"), ("p.csv: no row has a pass rate",)),
    Case("import-short-row", imported("compute,pass_rate\n0,0.3\n10\n"),
         ("p.csv: row 2 (line 3): 1 cell(s), the header has 2",)),
    Case("import-extra-cells", imported("compute,pass_rate\n0,0.3,0.9\n"),
         ("p.csv: row 1 (line 2): 3 cell(s), the header has 2",)),
    Case("import-json-null", imported('{"step": 0, "gpu_hours": 0, "pass_rate": null}\n', "p.jsonl"),
         ("p.jsonl: no row has a pass rate (1 row(s)",)),
    Case("import-json-true", imported('{"step": 0, "gpu_hours": 0, "pass_rate": true}\n', "p.jsonl"),
         ("p.jsonl: row 1: pass_rate = true is not a number",)),
    Case("import-json-string", imported('{"step": 0, "gpu_hours": "1", "pass_rate": 0.1}\n', "p.jsonl"),
         ("p.jsonl: row 1: gpu_hours = '1' is not a number",)),
    Case("import-json-array", imported("[1, 2]\n", "p.jsonl"), ("p.jsonl: row 1: expected a JSON object, got list",)),
    Case("import-json-deep", imported(DEEP + "\n", "p.jsonl"), ("p.jsonl: row 1: nested too deeply",)),
    Case("import-step-inf", imported("step,compute,pass_rate\ninf,0,0.3\n"), ("p.csv: row 1: step = 'inf' is not a finite",)),
    Case("import-step-1e400", imported('{"step": 1e400, "pass_rate": 0.3}\n', "p.jsonl"),
         ("p.jsonl: row 1: step = inf is not a finite number",)),
    Case("import-step-fraction", imported("step,compute,pass_rate\n1.7,0,0.3\n"),
         ("p.csv: row 1: step = '1.7' must be a whole number",)),
    Case("import-compute-inf", imported("compute,pass_rate\n0,0.3\ninf,0.4\n"),
         ("p.csv: row 2: gpu_hours = 'inf' is not a finite number",)),
    # integers beyond a float (10**400) or beyond Python's own int reading (5000 digits), in each file kind
    Case("import-compute-int-beyond-float-jsonl",
         imported('{"step": 0, "gpu_hours": 1, "pass_rate": 0.3}\n{"step": 1, "gpu_hours": 1%s, "pass_rate": 0.4}\n'
                  % ("0" * 400), "p.jsonl"),
         ("p.jsonl: row 2: gpu_hours = 1.000e+400 (401 digits) is too large for a float (at most 1.8e+308)",)),
    Case("import-flops-int-beyond-float-csv", imported("step,flops,pass_rate\n0,1,0.3\n1,7%s,0.4\n" % ("0" * 400)),
         ("p.csv: row 2: flops = '7.000e+400 (401 digits)' is too large for a float (at most 1.8e+308)",)),
    Case("import-compute-column-named", imported("step,compute,pass_rate\n0,1,0.3\n1,2%s,0.4\n" % ("0" * 320)),
         ("p.csv: row 2: gpu_hours = '2.000e+320 (321 digits)' is too large for a float (at most 1.8e+308) "
          "(column 'compute')",)),
    Case("import-reward-negative-int-beyond-float", imported(
        '{"step": 0, "gpu_hours": 1, "pass_rate": 0.3, "eval/train_reward": -3%s}\n' % ("0" * 310), "p.jsonl"),
         ("p.jsonl: row 1: train_reward = -3.000e+310 (311 digits) is too large for a float (at most 1.8e+308) "
          "(column 'eval/train_reward')",)),
    Case("import-flops-5000-digits-jsonl",
         imported('{"step": 0, "flops": 9%s, "pass_rate": 0.3}\n' % ("0" * 5000), "p.jsonl"),
         ("p.jsonl: row 1: flops = 9.000e+5000 (5001 digits) is too large for a float (at most 1.8e+308)",)),
    Case("import-tokens-5000-digits-csv", imported("tokens,pass_rate\n5%s,0.3\n" % ("0" * 5000)),
         ("p.csv: row 1: tokens = '5.000e+5000 (5001 digits)' is too large (at most 9223372036854775807)",)),
    Case("import-step-5000-digits-jsonl", imported('{"step": 4%s, "pass_rate": 0.3}\n' % ("0" * 5000), "p.jsonl"),
         ("p.jsonl: row 1: step = 4.000e+5000 (5001 digits) is too large (at most 9223372036854775807)",)),
    Case("import-compute-down", imported("step,compute,pass_rate\n0,10,0.3\n1,5,0.4\n"),
         ("p.csv: row 2: gpu_hours = 5.0 at step 1 is below 10.0 at step 0 (row 1)",)),
    Case("import-compute-negative", imported("compute,pass_rate\n-1,0.3\n"), ("p.csv: row 1: gpu_hours = '-1' must be",)),
    Case("import-tokens-huge", imported("tokens,pass_rate\n1e30,0.3\n"), ("p.csv: row 1: tokens = '1e30' is too large",)),
    Case("import-pass-rate-1.5", imported("compute,pass_rate\n0,1.5\n"), ("p.csv: row 1: pass_rate = '1.5' must be in [0, 1]",)),
    Case("import-duplicate-step", imported("step,pass_rate\n3,0.1\n3,0.2\n"),
         ("p.csv: row 2: step 3 appears more than once (first in row 1)",)),
    Case("import-duplicate-column", imported("compute,pass_rate,compute\n0,0.3,0\n"),
         ("p.csv: column 'compute' appears twice",)),
    Case("import-json-duplicate-key", imported('{"step": 0, "pass_rate": 0.1, "pass_rate": 0.9}\n', "p.jsonl"),
         ("p.jsonl: row 1 (line 1): key 'pass_rate' appears twice in one object (JSON would keep the last value)",)),
    Case("import-json-duplicate-spaced-key", imported('{"step": 0, "pass_rate": 0.1}\n\n{"step": 1, " step ": 2, '
                                                      '"pass_rate": 0.2}\n', "p.jsonl"),
         ("p.jsonl: row 3 (line 3): key 'step' appears twice",)),
    Case("import-json-duplicate-nested-key", imported('{"step": 0, "pass_rate": 0.1, "x": {"a": 1, "a": 2}}\n',
                                                      "p.jsonl"), ("p.jsonl: row 1 (line 1): key 'a' appears twice",)),
    Case("import-no-pass-rate-column", imported("compute,pass_rat,colour\n0,0.3,red\n"),
         ("p.csv: no pass_rate column (columns: compute, pass_rat, colour); name it with --tag COLUMN",)),
    Case("import-map-not-a-field", imported("compute,acc\n0,0.3\n", extra=("--map", "acc=accuracy")),
         ("--map 'acc=accuracy': 'accuracy' is not a field of a point; allowed:",)),
    Case("import-map-no-equals", imported("compute,acc\n0,0.3\n", extra=("--map", "acc")),
         ("--map 'acc': expected COLUMN=FIELD",)),
    Case("import-map-missing-column", imported("compute,acc\n0,0.3\n", extra=("--map", "val/acc=pass_rate")),
         ("--map: no column 'val/acc' here; columns: compute, acc",)),
    Case("import-devices-without-runtime", imported("step,pass_rate\n0,0.3\n", extra=("--devices", "8")),
         ("p.csv: --devices needs the runtime of every point (a _runtime or wall_seconds column",)),
    Case("import-devices-sparse-runtime", imported("_step,_runtime,pass_rate\n0,10,0.3\n2,,0.4\n",
                                                   extra=("--devices", "8")), ("step 2 has none",)),
    Case("import-hours-beside-column", imported("gpu_hours,pass_rate\n0,0.3\n", extra=("--hours-per-step", "2")),
         ("p.csv: GPU-hours come from column 'gpu_hours'; --hours-per-step would replace them",)),
    Case("import-two-compute-rules", imported("_step,_runtime,pass_rate\n0,1,0.3\n",
                                              extra=("--hours-per-step", "2", "--devices", "8")),
         ("give one of --hours-per-step and --devices, not both",)),
    Case("import-hours-per-step-zero", imported("step,pass_rate\n0,0.3\n", extra=("--hours-per-step", "0")),
         ("--hours-per-step 0.0 must be a number > 0",)),
    Case("import-unknown-format", imported("x", "p.txt"), ("p.txt: unknown format '.txt'; expected a .csv or .jsonl",)),
    Case("import-empty-folder", with_files(_empty_folder), ("empty: is a folder holding neither TensorBoard event files",)),
    Case("import-mlflow-missing", with_files(lambda tmp: ["import", f"sqlite:///{tmp}/none.db", "--name", "n",
                                                          "--db", "{store}"]), ("none.db not found",)),
    Case("import-no-rows", imported("compute,pass_rate\n"), ("p.csv: no rows",)),
    Case("import-dev-zero", with_files(_zero_csv), ("zero.csv: is a character device",)),
    Case("import-folder", with_files(_folder_csv), ("points.csv: is a folder",)),
    Case("import-name-newline", imported("compute,pass_rate\n0,0.3\n", run="new\n"), ("run name 'new\\n' is not allowed",)),
    Case("import-name-exists", imported("compute,pass_rate\n0,0.3\n", run="keep"), ("a run named 'keep' exists already",)),
    # ---- store files
    Case("runs-damaged-store", _store_file("damaged", "runs"), ("bad/s.db: the store is damaged",)),
    Case("import-damaged-store", _store_file("damaged", "import"), ("bad/s.db: the store is damaged",)),
    Case("show-damaged-store", _store_file("damaged", "show"), ("bad/s.db: the store is damaged",)),
    Case("runs-store-folder", _store_file("folder", "runs"), ("bad/s.db: is a folder, not a store file",)),
    Case("import-store-folder", _store_file("folder", "import"), ("bad/s.db: is a folder, not a store file",)),
    Case("runs-text-file", _store_file("text", "runs"), ("bad/s.db: not a SQLite database",)),
    Case("import-text-file", _store_file("text", "import"), ("bad/s.db: not a SQLite database",)),
    Case("import-foreign-db", _store_file("foreign", "import"), ("bad/s.db: not a scalectl store", "customers")),
    Case("runs-newer-schema", _store_file("newer", "runs"), ("bad/s.db: store schema version 99 is newer",)),
    Case("runs-missing-folder", _store_file("missing", "runs"), ("nowhere/deeper/s.db: no store there",)),
    Case("status-missing-folder", _store_file("missing", "status"), ("nowhere/deeper/s.db: no store there",)),
    Case("fit-missing-folder", _store_file("missing", "fit"), ("nowhere/deeper/s.db: no store there",)),
    Case("runs-dev-null", _store_file("device", "runs"), ("/dev/null: not a regular file",)),
    Case("file-name-is-markup", with_files(lambda tmp: ["validate", str(tmp / "[/x].toml")]),
         ("[/x].toml: no such file",)),
    Case("value-is-markup", override("data.source=[/oops][bold].jsonl"),
         ("data.source = '[/oops][bold].jsonl': no such file",)),
    Case("report-empty-name", with_files(lambda tmp: ["report", "", "--db", "{store}"]), ("ABLATION is empty",)),
]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused_cleanly(case: Case, runner: CliRunner, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    store = _make_store(home / "scalectl.db")
    work = tmp_path / "case"
    work.mkdir()
    args = case.build(work, store)
    before = _digest(home)
    before_work = {k: v for k, v in _digest(work).items() if k.startswith("bad/")}
    result = runner.invoke(app, args, env={"SCALECTL_DB": str(store), "COLUMNS": "300"})
    stderr = result.stderr
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception    # no uncaught exception
    assert "Traceback" not in result.output
    for text in case.expect:
        assert text.replace("{tmp}", str(work)) in stderr, stderr
    assert _digest(home) == before                                       # the store is untouched
    assert {k: v for k, v in _digest(work).items() if k.startswith("bad/")} == before_work
    assert not (work / "nowhere").exists()                                # no folder or store made
    assert not (work / "runs").exists()                                   # no run folder either


def test_the_table_is_large_enough():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


# --------------------------------------------------------------------------- accepted, correctly


def test_csv_with_byte_order_mark_imports(tmp_path, runner):
    store = tmp_path / "s.db"
    f = tmp_path / "excel.csv"
    f.write_bytes("\ufeffstep,compute,pass_rate\n0,0,0.25\n1,10,0.5\n".encode())
    result = runner.invoke(app, ["import", str(f), "--name", "excel", "--db", str(store), "--json"])
    assert result.exit_code == 0, result.output
    with Store.open(store) as s:
        points = s.points(s.get_run("excel")["id"])
    assert [(p["step"], p["gpu_hours"], p["pass_rate"]) for p in points] == [(0, 0.0, 0.25), (1, 10.0, 0.5)]


def test_whole_numbers_written_as_floats_import_as_integers(tmp_path, runner):
    store = tmp_path / "s.db"
    f = tmp_path / "p.jsonl"
    f.write_text('{"step": 2.0, "tokens": 1e6, "pass_rate": 0.5, "train_reward": -0.25}\n')
    assert runner.invoke(app, ["import", str(f), "--name", "w", "--db", str(store)]).exit_code == 0
    with Store.open(store) as s:
        (p,) = s.points(s.get_run("w")["id"])
    assert (p["step"], p["tokens"], p["train_reward"]) == (2, 1_000_000, -0.25)
    assert isinstance(p["step"], int) and isinstance(p["tokens"], int)


def test_free_text_keeps_tabs_newlines_and_any_script(tmp_path, runner):
    """The control-character check of the free-text fields refuses neither the whitespace of
    several lines nor letters beyond ASCII."""
    text = "Zeile 1:\tGRPO über 日本語 données\nline 2 \u00e9\u0301 ok"
    f = tmp_path / "r.toml"
    f.write_text(f'extends = "{GRPO}"\ndescription = """{text}"""\n[length]\ninterrupt_phrase = "Stop.\\n</think>"\n')
    result = runner.invoke(app, ["validate", str(f)])
    assert result.exit_code == 0, result.output
    from scalectl.recipe.load import load

    recipe = load(f)
    assert recipe.description == text and recipe.length.interrupt_phrase == "Stop.\n</think>"


def test_a_json_lines_row_with_each_key_once_imports_as_before(tmp_path, runner):
    """Keys are matched without surrounding spaces, as before the duplicate check."""
    store = tmp_path / "s.db"
    f = tmp_path / "p.jsonl"
    f.write_text('{" step": 0, "pass_rate ": 0.25, "gpu_hours": 0}\n{"step": 1, "pass_rate": 0.5, "gpu_hours": 2}\n')
    assert runner.invoke(app, ["import", str(f), "--name", "j", "--db", str(store)]).exit_code == 0
    with Store.open(store) as s:
        points = s.points(s.get_run("j")["id"])
    assert [(p["step"], p["gpu_hours"], p["pass_rate"]) for p in points] == [(0, 0.0, 0.25), (1, 2.0, 0.5)]


def test_reading_commands_create_no_store(tmp_path, runner):
    missing = tmp_path / "none" / "s.db"
    for args in (["runs"], ["status"], ["show", "x"], ["compare", "a", "b"]):
        result = runner.invoke(app, [*args, "--db", str(missing)])
        assert result.exit_code == 2 and "no store there" in result.stderr, (args, result.output)
    assert not (tmp_path / "none").exists()


def test_validate_accepts_existing_sources(tmp_path, runner):
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    model = save_policy(build_tiny_model(num_hidden_layers=1), build_tokenizer(), tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    result = runner.invoke(app, ["validate", GRPO, "--set", f"model.path={model}", "--set", f"data.source={data}",
                                 "--set", "data.source=hf:gsm8k", "--set", f"data.source={data}"])
    assert result.exit_code == 0, result.output


def test_markdown_summary_escapes_user_text():
    from scalectl.ablation.report import md_escape

    assert md_escape("<script>alert(1)</script> [x](javascript:y) a|b *c*") == \
        "\\<script>alert(1)\\</script> \\[x\\](javascript:y) a\\|b \\*c\\*"
    assert md_escape("line\nbreak") == "line break"


# --------------------------------------------------------------------------- read-only stores, real subprocesses


@contextlib.contextmanager
def read_only(*paths: Path):
    """Make files and folders unwritable, even to root (whose file modes do not bind it):
    the immutable attribute (chattr +i) as root, the mode bits otherwise."""
    root = os.geteuid() == 0
    done = []
    try:
        for p in paths:
            if root:
                if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
                    pytest.skip("running as root where chattr +i is not available")
            else:
                p.chmod(0o555 if p.is_dir() else 0o444)
            done.append(p)
        yield
    finally:
        for p in reversed(done):
            if root:
                subprocess.run(["chattr", "-i", str(p)], check=True)
            else:
                p.chmod(0o755 if p.is_dir() else 0o644)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="300")
    env.pop("SCALECTL_DB", None)
    return subprocess.run([SCALECTL, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_read_only_store_reads_and_refuses_writes(tmp_path, what):
    """A store whose file (or folder) cannot be written: listing, showing and fitting work
    (the fit is not cached), importing is refused with exit 2, the file stays as it was."""
    folder = tmp_path / "store"
    folder.mkdir()
    curve = tmp_path / "curve.csv"          # a sigmoid: A = 0.6, B = 1.5, C_mid = 50, R0 = 0.1
    curve.write_text("compute,pass_rate\n" + "".join(f"{c},{0.1 + 0.5 / (1 + (50 / c) ** 1.5):.6f}\n"
                                                       for c in range(10, 200, 10)))
    store = folder / "s.db"
    with Store.open(store) as s:
        import_points(s, curve, "keep")
    csv = _csv(tmp_path)
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    with read_only(store if what == "file" else folder):
        listed = _cli("runs", "--json", "--db", str(store), cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert [(r["name"], r["n_points"]) for r in json.loads(listed.stdout)] == [("keep", 19)]
        shown = _cli("show", "keep", "--json", "--db", str(store), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert [p["gpu_hours"] for p in json.loads(shown.stdout)["points"]] == list(range(10, 200, 10))
        fitted = _cli("fit", "keep", "--json", "--bootstrap", "0", "--db", str(store), cwd=tmp_path)
        assert fitted.returncode == 0, fitted.stderr
        # 6-digit pass rates: the fit recovers A to well within 1e-3
        assert json.loads(fitted.stdout)["fits"][0]["fit"]["A"] == pytest.approx(0.6, abs=1e-3)
        imported_ = _cli("import", str(csv), "--name", "new", "--db", str(store), cwd=tmp_path)
        assert imported_.returncode == 2, imported_.stderr
        assert f"{store}: the store is read-only" in imported_.stderr and "Traceback" not in imported_.stderr
        assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    with Store.open(store) as s:                         # and nothing was cached in it
        assert s.db.execute("SELECT COUNT(*) FROM fits").fetchone()[0] == 0


@pytest.mark.parametrize("args, expect", [
    (["validate", "{tmp}/r.toml"], "r.toml: nested more than 16 levels deep"),
    (["run", "{tmp}/z.toml", "--setup", str(ROOT / "setups" / "tiny-cpu.toml")], "/dev/zero: is a character device"),
    (["import", "{tmp}/p.csv", "--name", "x"], "p.csv: row 1: step = 'inf' is not a finite number"),
    (["runs"], "s.db: the store is damaged"),
])
def test_console_script_refuses_cleanly(tmp_path, args, expect):
    (tmp_path / "r.toml").write_text(f"x = {DEEP}\n")
    (tmp_path / "z.toml").write_text('extends = "/dev/zero"\n')
    (tmp_path / "p.csv").write_text("step,pass_rate\ninf,0.3\n")
    store = _make_store(tmp_path / "s.db")
    if args == ["runs"]:
        _corrupt(store)
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    proc = subprocess.run([SCALECTL, *[a.replace("{tmp}", str(tmp_path)) for a in args], "--db", str(store)]
                          if args[0] != "validate" else [SCALECTL, args[0], args[1].replace("{tmp}", str(tmp_path))],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr and "Traceback" not in proc.stderr
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
