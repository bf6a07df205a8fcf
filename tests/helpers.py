"""Helpers shared by the tests (tests/ is on sys.path through pytest's pythonpath setting).

The repository root is deliberately not on sys.path: tests import the installed counterprof."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
PYTHON = sys.executable
COUNTERPROF = [PYTHON, "-m", "counterprof"]


def run_cli(*args: str, check: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`counterprof ARGS...` as a user runs it, in a fresh interpreter."""
    proc = subprocess.run([*COUNTERPROF, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"counterprof {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


def _perf_counts(event: str) -> bool:
    perf = shutil.which("perf")
    if not perf:
        return False
    out = subprocess.run([perf, "stat", "-x,", "-e", event, "true"], capture_output=True, text=True)
    line = next((ln for ln in out.stderr.splitlines() if event in ln), "")
    return out.returncode == 0 and line != "" and "<not" not in line


HAS_PERF_TOOL = shutil.which("perf") is not None and _perf_counts("task-clock")
HAS_PMU = HAS_PERF_TOOL and _perf_counts("instructions")

# CI installs perf and sets this: there, a missing perf tool fails instead of skipping.
if os.environ.get("COUNTERPROF_REQUIRE_PERF_TOOL") and not HAS_PERF_TOOL:
    raise RuntimeError("COUNTERPROF_REQUIRE_PERF_TOOL is set but `perf stat -e task-clock true` "
                       "does not work: install linux-perf")
needs_perf_tool = pytest.mark.skipif(
    not HAS_PERF_TOOL, reason="the perf tool (Debian: linux-perf) is not installed; .ci/run installs it")
_skip_without_pmu = pytest.mark.skipif(
    not HAS_PMU, reason="no hardware PMU here: `perf stat -e instructions true` says <not supported> "
                        "(usual in VMs); hardware-event tests run only where the PMU counts")


def needs_pmu(test):
    """Marks a hardware-event test (`pytest -m hardware` selects them) and skips it where no PMU counts."""
    return pytest.mark.hardware(_skip_without_pmu(test))
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (or CAP_PERFMON)")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spilled_rows(run_dir: Path) -> int:
    """Sample rows in a running (or killed) run's perf spills: from -I 100 the drain hands rows
    to the journal every 10 s, and until then they are there (collectors/perf/spill.py)."""
    import json
    from counterprof.collectors.perf import spill
    n = 0
    for folder in Path(run_dir).glob(f"_ranks/rank=*/{spill.SPILL_DIR}"):
        for labels in folder.glob("perf*.json"):
            name = labels.name[:-len(".json")]
            try:
                n += spill.spill_rows(spill.spill_records(folder, name), json.loads(labels.read_text())).num_rows
            except (OSError, ValueError):     # created, not written yet
                pass
    return n


def wait_for_samples(run_dir: Path, rows: int = 1, timeout: float = 60.0) -> int:
    """Wait until a running run holds `rows` sample rows, in its journal or its perf spill (a
    test that kills the profiler then knows there is data a recovery keeps, whatever the
    machine's speed); their number."""
    import time
    import counterprof
    deadline = time.monotonic() + timeout
    while True:
        try:
            n = counterprof.load(run_dir).samples().num_rows
        except Exception:              # not created yet, or no segment written yet
            n = 0
        n = max(n, spilled_rows(run_dir))
        if n >= rows:
            return n
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_dir}: {n} sample rows after {timeout} s, waited for {rows}")
        time.sleep(0.1)


def kill_profiler(proc: subprocess.Popen) -> list:
    """SIGKILL a `counterprof run` (no chance to finish anything); its workload goes on as an
    orphan: the processes are returned so that the test can end them (`end_processes`)."""
    import psutil
    workload = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    return workload


def end_processes(procs: list) -> None:
    import psutil
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass



def table_files(run_dir, table: str, rank: int | None = None) -> list[Path]:
    """A run's Parquet files of one table (samples, spans), every rank or one: where the run
    layout puts them (counterprof.store.rundir), so tests name no path of their own."""
    from counterprof.store import rundir
    return [f for _, f in rundir.table_files(Path(run_dir), table, rank)]


def table_dir(run_dir, table: str, rank: int = 0) -> Path:
    """The folder of a rank's Parquet files of one table, created (to put a file there)."""
    from counterprof.store import rundir
    return rundir.dataset_dir(Path(run_dir), table, rank)


def table_file(run_dir, table: str, rank: int = 0, writer: str = "a") -> Path:
    """Where a writer's Parquet file of one table goes in a rank's partition (folder created)."""
    return table_dir(run_dir, table, rank) / f"{table}-{writer}.parquet"


def rank_files(run_dir, rank: int = 0) -> Path:
    """The folder of a rank's own files (journal/, traces/, a joined rank's meta.json)."""
    from counterprof.store import rundir
    return Path(run_dir) / rundir.RANKS / rundir.rank_name(rank)


def journal_dir(run_dir, rank: int = 0) -> Path:
    from counterprof.store import rundir
    return rank_files(run_dir, rank) / rundir.JOURNAL


def traces_dir(run_dir, rank: int = 0) -> Path:
    from counterprof.store import rundir
    return rank_files(run_dir, rank) / rundir.TRACES


def to_older_layout(run_dir) -> Path:
    """Rewrite a run in the layout counterprof wrote before one dataset per table: everything
    of a rank in <run>/rank=<r>/ (Parquet files, journal/, traces/, meta.json). Such runs are
    data someone kept; counterprof still reads them."""
    from counterprof.store import rundir
    run_dir = Path(run_dir)
    for rank in rundir.ranks(run_dir):
        old = run_dir / rundir.rank_name(rank)
        own = rank_files(run_dir, rank)
        if own.is_dir():
            own.rename(old)
        old.mkdir(mode=0o700, exist_ok=True)
        for table in rundir.TABLE_NAMES:
            part = run_dir / table / rundir.rank_name(rank)
            for f in list(part.glob("*")) if part.is_dir() else []:
                f.rename(old / f.name)
    for name in (rundir.RANKS, *rundir.TABLE_NAMES):
        d = run_dir / name
        if d.is_dir():
            for sub in sorted(d.rglob("*"), reverse=True):
                sub.rmdir()
            d.rmdir()
    return run_dir


# Two ranks (RANK=0, 1: one partition each), each marking regions: samples from perf and host,
# spans from each rank's own regions journal.
TWO_RANKS = textwrap.dedent(f"""
    import os, subprocess, sys
    child = '''
    import time, counterprof
    for i in range(4):
        with counterprof.region("work"):
            sum(range(300_000))
        with counterprof.region("rest"):
            time.sleep(0.03)
    '''
    procs = [subprocess.Popen([{PYTHON!r}, "-c", child],
                              env={{**os.environ, "RANK": str(r), "WORLD_SIZE": "2"}}) for r in (0, 1)]
    sys.exit(max(p.wait() for p in procs))
""")


def two_rank_run(path) -> Path:
    """A real run of two ranks through `counterprof run --per-rank`, in path."""
    proc = run_cli("run", "-q", "--per-rank", "-o", str(path), "--", PYTHON, "-c", TWO_RANKS,
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    return path


class ClaimHeldElsewhere:
    """Another process holds a torch trace's conversion claim (as a second converter would)
    until `die()`: it then exits without marking the trace converted, like a killed one."""

    def __init__(self, trace):
        self.proc = subprocess.Popen(
            [PYTHON, "-c", "import os, sys; from pathlib import Path\n"
                           "from counterprof.collectors.torch_trace.claim import Claim\n"
                           f"c = Claim.take(Path({str(trace)!r})); print(c is not None, flush=True)\n"
                           "sys.stdin.readline(); os._exit(9)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "True", "the claim was not free"

    def die(self) -> None:
        self.proc.communicate("\n", timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def calibrated(home) -> tuple[dict, dict]:
    """(an environment whose XDG_CACHE_HOME holds this machine's ceilings, as `counterprof
    calibrate --quick` saves them; the CPU's ceilings document)."""
    import json
    env = {**os.environ, "XDG_CACHE_HOME": str(home)}
    # --force: on a shared machine others often hold the CPUs; the tests need a ceilings file
    proc = run_cli("calibrate", "--quick", "--no-collectives", "--json", "--force", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "saved" in proc.stderr and list((Path(home) / "counterprof" / "ceilings").glob("*-cpu.json"))
    return env, json.loads(proc.stdout)["cpu"]


def count_listings(monkeypatch, run: Path) -> dict[str, int]:
    """How many times each table's dataset folder (<run>/<table>) is listed from now on."""
    from counterprof.store.rundir import TABLE_NAMES
    seen = {t: 0 for t in TABLE_NAMES}
    real = os.scandir
    folders = {str(Path(run) / t): t for t in TABLE_NAMES}

    def counting(p=".", *a, **kw):
        t = folders.get(os.fspath(p))
        if t is not None:
            seen[t] += 1
        return real(p, *a, **kw)
    monkeypatch.setattr(os, "scandir", counting)
    return seen
