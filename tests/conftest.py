"""Shared test fixtures."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

#: The session's exit status, kept for :func:`pytest_unconfigure`.
_EXIT_STATUS = pytest.StashKey[int]()

ROOT = Path(__file__).resolve().parents[1]

# Training runs started by the tests (in this process or as `scalectl` subprocesses) use
# one torch thread each, as a recipe would with hardware.threads = 1: the suite runs on a
# busy 2-core machine where two OpenMP threads per process spin against other processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# rich reads $COLUMNS once, when scalectl's consoles are made (at import): a width the test
# process inherited (pytest-xdist's workers get one) would hold every in-process invocation
# at it, whatever width the test sets.
os.environ.pop("COLUMNS", None)
SCALECTL = str(Path(sys.executable).parent / "scalectl")


#: The test files of the two Slurm clusters: one unit of work for pytest-xdist.
SLURM_FILES = ("test_slurm.py", "test_slurm_cluster.py")


def _work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to when ``make test`` runs the suite in two processes
    (pytest-xdist): its file, so that a module's fixtures (a warm start, a training run several
    tests read) are made once, in the one process that runs the file; one unit for both Slurm
    clusters' files, whose tests share the nodes, start the clusters and cancel the jobs of
    ended sessions, so they run one after another as in a single process."""
    path = nodeid.split("::", 1)[0]
    return "slurm" if Path(path).name in SLURM_FILES else path


def pytest_collection_modifyitems(config, items):
    """Order the tests for pytest-xdist's work units (:func:`_work_unit`): the Slurm unit first
    (the longest, mostly waiting on the daemons), then the files with the most tests; within
    a file, the collected order.  Every process orders the same collection the same way."""
    if not config.pluginmanager.hasplugin("xdist") or not getattr(config.option, "numprocesses", None):
        return
    unit = {item.nodeid: _work_unit(item.nodeid) for item in items}
    sizes = Counter(unit.values())
    items.sort(key=lambda item: (unit[item.nodeid] != "slurm", -sizes[unit[item.nodeid]], unit[item.nodeid]))


@pytest.hookimpl(optionalhook=True)       # a hook of pytest-xdist: unknown where it is not installed (.venv-vllm)
def pytest_xdist_make_scheduler(config, log):
    """Hand pytest-xdist one :func:`_work_unit` at a time, in the collected order (see
    :func:`pytest_collection_modifyitems`)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnits(config, log)


@pytest.fixture
def db_path(tmp_path) -> Path:
    """A fresh SQLite store path in a temporary folder."""
    return tmp_path / "scalectl.db"


def run_cli(*args: str, db: Path | None = None, check: bool = False, cwd: Path = ROOT,
            timeout: float = 120, env: dict | None = None,
            ignore_sigint: bool = False) -> subprocess.CompletedProcess:
    """Run the real ``scalectl`` console script in a subprocess; ``ignore_sigint``: as a
    background shell starts it (`make test &`), SIGINT ignored, which its children inherit."""
    full_env = dict(os.environ, COLUMNS="200")
    if db is not None:
        full_env["SCALECTL_DB"] = str(db)
    full_env.update(env or {})
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    proc = subprocess.run([SCALECTL, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=full_env, preexec_fn=preexec)
    if check and proc.returncode != 0:
        raise AssertionError(f"scalectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module: a tiny model gains nothing from two, and on a
    busy 2-core machine OpenMP threads spin against other processes (measured: 8x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: A test session's pid, written in its temporary folder so that a later session can tell
#: the Slurm jobs an interrupted session left behind (they would hold the nodes) from those
#: of a session still running beside it.
SESSION_PID_FILE = "session.pid"


def session_root(basetemp: Path) -> tuple[Path, int]:
    """The temporary folder of the whole test session and the pid of the process that runs it:
    ``basetemp`` and this process, or, in a pytest-xdist worker (whose ``basetemp`` is
    ``pytest-<n>/popen-gw<i>``), its parent folder and the controlling pytest process."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return basetemp.parent, os.getppid()
    return basetemp, os.getpid()


def cancel_stale_test_jobs(basetemp: Path, conf: str | None = None) -> list[str]:
    """Cancel the queued or running Slurm jobs of test sessions that have ended: a job whose
    log lies under another session's temporary folder (``pytest-of-<user>/pytest-<n>``)
    whose ``session.pid`` names no live process (or that has none: an older session).
    Writes this session's pid first.  Returns the ids cancelled."""
    basetemp, pid = session_root(basetemp)
    (basetemp / SESSION_PID_FILE).write_text(str(pid))
    env = dict(os.environ, SLURM_CONF=conf) if conf else None
    out = subprocess.run(["squeue", "-h", "-t", "PENDING,RUNNING,SUSPENDED", "-O", "JobID:30,STDOUT:1000"],
                         capture_output=True, text=True, env=env)
    stale = []
    for line in out.stdout.splitlines():
        job_id, _, stdout = line.strip().partition(" ")
        parts = Path(stdout.strip()).parts
        session = next((Path(*parts[:i + 1]) for i, part in enumerate(parts)
                        if re.fullmatch(r"pytest-\d+", part) and parts[i - 1].startswith("pytest-of-")), None)
        if session is None or session == basetemp:
            continue
        pid_file = session / SESSION_PID_FILE
        pid = int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text().strip().isdigit() else None
        if pid is None or not Path(f"/proc/{pid}").exists():
            stale.append(job_id)
    if stale:
        subprocess.run(["scancel", *stale], capture_output=True, env=env)
    return stale


CLUSTER_SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
#: The namespace cluster's config: commands and submitit reach it through $SLURM_CONF.
CLUSTER_CONF = "/etc/slurm-cluster/slurm.conf"


def _cluster_up() -> bool:
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The multi-node Slurm cluster of network namespaces (scripts/slurm-cluster.sh): its
    ``slurm.conf`` path.  Used if it is up; started (and stopped afterwards) when this process
    is root; otherwise, or where network namespaces cannot be made, a skip saying why.
    Jobs that ended test sessions left queued or running are cancelled first."""
    if _cluster_up():
        cancel_stale_test_jobs(tmp_path_factory.getbasetemp(), CLUSTER_CONF)
        yield CLUSTER_CONF
        return
    if os.environ.get("SCALECTL_NO_SLURM_CLUSTER_START"):
        pytest.skip("the multi-node Slurm cluster could not be started (SCALECTL_NO_SLURM_CLUSTER_START is set "
                    "by .ci/run)")
    if os.geteuid() != 0:
        pytest.skip("no multi-node Slurm cluster is running and starting one needs root "
                    "(sudo scripts/slurm-cluster.sh start)")
    proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip())            # network namespaces cannot be made here: the reason
    if proc.returncode != 0:
        pytest.skip(f"scripts/slurm-cluster.sh start failed: {(proc.stdout + proc.stderr).strip()[-800:]}")
    cancel_stale_test_jobs(tmp_path_factory.getbasetemp(), CLUSTER_CONF)
    yield CLUSTER_CONF
    subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True, timeout=120)


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process without the interpreter's teardown when a test left gloo process groups
    with operations pending (:func:`scalectl.rl.transport.stream.keep_until_exit`: sends to peers it
    stopped or killed): destroying them would wait for ever, as it would in a job's process, which
    ends the same way (:func:`scalectl.rl.processes.supervise.child_main`)."""
    stream = sys.modules.get("scalectl.rl.transport.stream")
    if stream is not None and stream._KEPT:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash.get(_EXIT_STATUS, 0))
