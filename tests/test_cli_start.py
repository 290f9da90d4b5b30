"""The CLI starts without the training stack: no torch, deepspeed, vLLM (nor numpy) at import."""

import json
import subprocess
import sys


def test_cli_imports_no_heavy_module():
    code = ("import sys, scalectl.cli; "
            "print(','.join(m for m in ('torch', 'deepspeed', 'vllm', 'numpy', 'scipy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_reading_commands_do_not_import_sqlite_utils(tmp_path):
    """`runs` and `show` read through the standard library's sqlite3; sqlite-utils
    (0.16-0.8 s to import, pandas included when installed) is for writes only."""
    from scalectl.store.database import Store

    db = tmp_path / "s.db"
    with Store.open(db) as store:
        run = store.create_run("r1")
        store.add_point(run, {"step": 3, "pass_rate": 0.25})
    code = ("import sys; from scalectl.cli import app\n"
            f"for args in (['runs', '--json'], ['show', 'r1', '--json']):\n"
            f"    app(args + ['--db', {str(db)!r}], standalone_mode=False)\n"
            "print('sqlite_utils' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert '"name": "r1"' in out and '"step": 3' in out and '"pass_rate": 0.25' in out
    assert out.strip().splitlines()[-1] == "False False"


def test_help_names_values_as_click_does():
    """`--help` of the console script's command names option values TEXT, INTEGER, FLOAT, PATH
    and KEY=VALUE, and flags not at all (typer alone prints Python types: <list[str]>, <bool>)."""
    import re

    code = ("import sys; from scalectl.cli import main\n"
            "for args in (['--help'], ['run', '--help'], ['compare', '--help'], ['ablate', '--help']):\n"
            "    sys.argv = ['scalectl', *args]\n"
            "    try:\n        main()\n    except SystemExit:\n        pass\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "COLUMNS": "100"}).stdout
    assert re.findall(r"<[a-z\[\]]+>", out) == []
    rows = {line.split()[1]: line.split()[2] for line in out.splitlines()
            if line.startswith("│ --") and len(line.split()) > 2}
    assert rows["--set"] == "KEY=VALUE" and rows["--setup"] == "PATH" and rows["--seed"] == "INTEGER"
    assert rows["--margin"] == "auto|NUMBER" and rows["--name"] == "TEXT"   # compare, ablate: or measured
    assert rows["--help"] == "Show" and rows["--json"] == "Print"      # flags: the help text follows at once


def test_command_table_matches_what_the_modules_register():
    """`scalectl.cli.COMMANDS` (which the console script reads to import one module) names
    every command each module registers, in the order `--help` lists them."""
    import typer.main

    from scalectl import cli

    seen = {}
    for module in cli.COMMAND_MODULES:
        group = typer.main.get_command(cli.build_app((module,)))
        seen.update({name: module for name in group.commands})
    assert seen == cli.COMMANDS
    assert list(typer.main.get_command(cli.app).commands) == list(cli.COMMANDS)


def test_console_script_imports_only_the_module_of_its_command(tmp_path):
    """`scalectl runs` imports scalectl.commands.runs and no other command module; a
    misspelt command builds them all so that click can suggest the right one."""
    from scalectl.store.database import Store

    db = tmp_path / "s.db"
    Store.open(db).close()
    code = ("import sys; from scalectl.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "import json; print('MODULES', json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('scalectl.commands.'))))\n")
    def modules(*args):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES"))
        return done, json.loads(line.removeprefix("MODULES "))
    done, loaded = modules("runs", "--db", str(db), "--json")
    assert done.returncode == 0 and "[]" in done.stdout
    assert set(loaded) - {"common", "bounds"} == {"runs"}          # what every command shares
    done, loaded = modules("rnus")
    assert "Did you mean 'runs'?" in done.stderr
    assert {"runs", "run", "fit", "serve"} <= set(loaded)


def test_a_dry_run_of_the_built_in_model_imports_neither_torch_nor_transformers(tmp_path):
    """`run --dry-run` checks the layout and memory of the built-in tiny model from its config."""
    code = ("import sys; from scalectl.cli import main; sys.argv = ['scalectl', 'run', 'scalerl', '--dry-run', "
            "'--json']\ntry:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('imported:' + ','.join(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules), "
            "file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert proc.stderr.strip().splitlines()[-1] == "imported:"
    assert '"params": 1118080' in proc.stdout
