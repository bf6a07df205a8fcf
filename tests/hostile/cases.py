"""The hostile pass's cases: bad bytes, wrong shapes, unreadable runs, full disks, hostile traces.

Each case copies a pristine run, damages it one way, runs one counterprof command on it as a user
would (a fresh interpreter, under an address-space limit and a timeout) and checks what every
command owes its user whatever the input: no traceback, no death by signal, no runaway memory, no
hang, an exit status that means what it says (compare: 2 for a run it cannot read, never the
gate's 1), and, where the case says, a line naming what was wrong. tests/hostile/run.py runs them
all; the tests in tests/integration/test_hostile_*.py run a few of each class. Issue 30's classes
(race, secrets, output, exec, serve: hardening.py) are cases with a runner of their own (several
processes, a server, every output of a run); tests/integration/test_hardening_third_pass.py runs
the ones the issue names. Its items 3-6 (misplaced, range, memory: files_memory.py) likewise;
tests/integration/test_hardening_files_memory.py runs them on real runs.
"""
from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from helpers import COUNTERPROF, PYTHON, end_processes, kill_profiler, wait_for_samples  # noqa: E402

AS_LIMIT = 3 * 1024 ** 3          # the limit: a reader of a small run stays far below
TIMEOUT = 120
BURN = "import time; t = time.time()\nwhile time.time() - t < {s}: pass"


@dataclass
class Case:
    klass: str                         # the class: journal, parquet, span, meta, ...
    name: str
    setup: Callable[[Path], list[str]]  # damages a copy in the given dir; returns the argv
    codes: tuple[int, ...] = (0, 1)    # exit statuses that are right
    says: str = ""                     # stderr must hold this (case-insensitive), when set
    as_user: str | None = None         # run as this user (setpriv)
    env: dict = field(default_factory=dict)
    # a case that is more than one command (processes at once, a server, every output of a run):
    # runner(work, argv from setup) runs it and returns (exit status, stderr, problems); the
    # checks every case gets (no traceback, the exit status, `says`) still apply
    runner: Callable[[Path, list[str]], tuple[int, str, list[str]]] | None = None


@dataclass
class Result:
    case: Case
    rc: int
    seconds: float
    stderr: str
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run_case(case: Case, work: Path) -> Result:
    work.mkdir(parents=True, exist_ok=True)
    argv = case.setup(work)
    cmd = [*COUNTERPROF, *argv]
    if case.as_user:
        cmd = ["setpriv", f"--reuid={case.as_user}", "--regid=nogroup", "--clear-groups", *cmd]
    t0 = time.monotonic()
    problems: list[str] = []
    if case.runner is not None:
        try:
            rc, stderr, problems = case.runner(work, argv)
        except subprocess.TimeoutExpired:
            rc, stderr = -999, ""
        seconds = time.monotonic() - t0
        return _judge(case, rc, seconds, stderr, problems)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=work,
                           preexec_fn=_limits, env={**os.environ, **case.env})
        rc, stderr = p.returncode, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stderr = -999, ((exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes)
                            else (exc.stderr or ""))
    seconds = time.monotonic() - t0
    return _judge(case, rc, seconds, stderr, problems)


def _judge(case: Case, rc: int, seconds: float, stderr: str, problems: list[str]) -> Result:
    problems = list(problems)
    if rc == -999:
        problems.append(f"hung (no exit in {TIMEOUT} s)")
    elif rc < 0:
        problems.append(f"killed by signal {-rc}")
    elif rc not in case.codes:
        problems.append(f"exit {rc}, expected one of {case.codes}")
    if "Traceback" in stderr:
        problems.append("traceback: " + stderr.strip().splitlines()[-1][:200])
    if "MemoryError" in stderr or ("out of memory" in stderr and case.klass != "memory"):
        problems.append("ran out of memory")     # (the memory class runs out on purpose)
    if case.says and case.says.lower() not in stderr.lower():
        problems.append(f"stderr does not say {case.says!r}: {stderr.strip()[-300:]!r}")
    return Result(case, rc, seconds, stderr, problems)


# -- pristine runs ----------------------------------------------------------------------------

def finished_run(path: Path, seconds: float = 1.5) -> Path:
    subprocess.run([*COUNTERPROF, "run", "-o", str(path), "-I", "20", "--", PYTHON, "-c",
                    BURN.format(s=seconds)], check=True, capture_output=True, timeout=120)
    return path


def killed_run(path: Path, rows: int = 50) -> Path:
    """A run whose profiler was SIGKILLed: its samples still in journal segments."""
    p = subprocess.Popen([*COUNTERPROF, "run", "-o", str(path), "-I", "10", "--", PYTHON, "-c",
                          BURN.format(s=30)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_samples(path, rows)
        time.sleep(0.5)
    finally:
        end_processes(kill_profiler(p))
    return path


@dataclass
class Pristine:
    finished: Path
    killed: Path


def pristine(root: Path) -> Pristine:
    root.mkdir(parents=True, exist_ok=True)
    fin, kil = root / "finished", root / "killed"
    if not (fin / "meta.json").exists():
        finished_run(fin)
    if not (kil / "meta.json").exists():
        killed_run(kil)
    return Pristine(fin, kil)


def _copy(src: Path, work: Path, name: str = "run") -> Path:
    dst = work / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _files(run: Path, suffix: str) -> list[Path]:
    return sorted(p for p in run.rglob(f"*{suffix}") if p.is_file())


def flip_bytes(path: Path, rng: random.Random, n: int = 1) -> list[int]:
    data = bytearray(path.read_bytes())
    where = [rng.randrange(len(data)) for _ in range(n)]
    for pos in where:
        data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return where


# -- the classes ------------------------------------------------------------------------------

READERS = [  # (name, argv after the run): every command that reads a run
    ("report", lambda r, w: ["report", str(r)]),
    ("report-json", lambda r, w: ["report", "--json", str(r)]),
    ("export", lambda r, w: ["export", str(r), "--perfetto", str(w / "out.json")]),
    ("history", lambda r, w: ["history", "add", "--db", str(w / "h.duckdb"), str(r)]),
    ("breakdown", lambda r, w: ["breakdown", str(r)]),
    ("roofline", lambda r, w: ["roofline", str(r)]),
]


def journal_cases(p: Pristine, n: int, seed: int = 12) -> list[Case]:
    """One flipped byte in a killed run's journal segment, then recover / report."""
    out = []
    for i in range(n):
        def setup(work, i=i, verb="recover" if i % 2 == 0 else "report"):
            run = _copy(p.killed, work)
            seg = _files(run, ".arrows")[0]
            flip_bytes(seg, random.Random(seed * 1000 + i))
            return [verb, str(run)]
        out.append(Case("journal", f"flip-{i}-{'recover' if i % 2 == 0 else 'report'}", setup))
    return out


def parquet_cases(p: Pristine, n: int, seed: int = 9) -> list[Case]:
    """Random byte flips (1-8) in a finished run's Parquet file, then each reader, and compare."""
    out = []
    readers = READERS + [("compare", None)]
    for i in range(n):
        name, argv = readers[i % len(readers)]

        def setup(work, i=i, argv=argv):
            run = _copy(p.finished, work)
            f = _files(run, ".parquet")[0]
            rng = random.Random(seed * 1000 + i)
            flip_bytes(f, rng, rng.randint(1, 8))
            if argv is None:
                return ["compare", str(p.finished), str(run)]
            return argv(run, work)
        out.append(Case("parquet", f"flip-{i}-{name}", setup,
                        codes=(0, 2) if name == "compare" else (0, 1)))
    return out


def span_cases(p: Pristine) -> list[Case]:
    """A sample time of 1915 / 2200, a duration of 36 years: bounded memory, a named warning."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    out = []

    def damage(work, column, value):
        run = _copy(p.finished, work)
        f = _files(run, ".parquet")[0]
        t = pq.read_table(f)
        vals = t[column].cast(pa.int64()).to_pylist()
        vals[len(vals) // 2] = value
        i = t.schema.get_field_index(column)
        t = t.set_column(i, t.schema.field(column), pa.array(vals, pa.int64()).cast(t.schema.field(column).type))
        pq.write_table(t, f)
        return run

    for label, column, value in [("1915", "time", -1_735_000_000 * 10**9),
                                 ("2200", "time", 7_258_000_000 * 10**9),
                                 ("36y-duration", "duration_ns", 2**60)]:
        for verb in ("report", "compare", "export", "history"):
            def setup(work, column=column, value=value, verb=verb):
                run = damage(work, column, value)
                if verb == "compare":
                    return ["compare", str(p.finished), str(run)]
                return dict((n, a) for n, a in READERS)[verb](run, work)
            out.append(Case("span", f"{label}-{verb}", setup,
                            codes=(0, 2) if verb == "compare" else (0,),
                            says="outside the run's span"))
    return out


SHAPES = {"array": [], "numbers": [1, 2, 3], "string": "hello", "null": None, "number": 7,
          "status-int": {"status": 3}, "collectors-list": {"status": "complete", "collectors": [1]},
          "collector-str": {"status": "complete", "collectors": {"perf": "ok"}},
          "start-str": {"status": "complete", "start_ns": "yesterday"},
          "command-int": {"status": "complete", "command": 5},
          "workload-list": {"status": "complete", "workload": []},
          "profiler-pid-str": {"status": "running", "profiler": {"pid": "x", "host": "vm"}}}
CATALOG_SHAPES = {"object": {}, "numbers": [1, 2, 3], "string": "hello", "null": None,
                  "entry-no-name": [{"unit": "s"}], "name-int": [{"name": 4}]}
META_COMMANDS = READERS + [("recover", lambda r, w: ["recover", str(r)]),
                           ("compare", None),
                           ("merge", lambda r, w: ["merge", str(r), "-o", str(w / "merged")])]


def _json_case(p: Pristine, file: str, doc, argv) -> Callable[[Path], list[str]]:
    def setup(work):
        run = _copy(p.finished, work)
        (run / file).write_text(json.dumps(doc))
        return ["compare", str(p.finished), str(run)] if argv is None else argv(run, work)
    return setup


def meta_cases(p: Pristine) -> list[Case]:
    """meta.json of every wrong shape over every command; catalog.json likewise."""
    out = []
    for shape, doc in SHAPES.items():
        for name, argv in META_COMMANDS:
            out.append(Case("meta", f"{shape}-{name}", _json_case(p, "meta.json", doc, argv),
                            codes=(2,) if name == "compare" else (1,),
                            # breakdown reads only the spans: it stops at their absence
                            says="" if name == "breakdown" else "is not a counterprof run's metadata"))
    for shape, doc in CATALOG_SHAPES.items():
        for name, argv in META_COMMANDS:
            out.append(Case("catalog", f"{shape}-{name}", _json_case(p, "catalog.json", doc, argv),
                            codes=(0, 1, 2) if name == "compare" else (0, 1)))
    return out


def unreadable_cases(p: Pristine) -> list[Case]:
    """The run belongs to root with mode 0700 and nobody reads it; or one of its files is 000."""
    out = []
    for name, argv in META_COMMANDS:
        def setup(work, argv=argv):
            os.chmod(work, 0o777)
            run = _copy(p.finished, work)
            os.chmod(run, 0o700)
            ref = _copy(p.finished, work, "ref")
            for q in [ref, *ref.rglob("*")]:
                os.chmod(q, 0o777 if q.is_dir() else 0o666)
            return ["compare", str(ref), str(run)] if argv is None else argv(run, work)
        out.append(Case("unreadable", f"dir-{name}", setup, codes=(2,) if name == "compare" else (1,),
                        says="permission denied", as_user="nobody" if shutil.which("setpriv") else None))
    return out


def _event(name="aten::mm", ts=1000, dur=5) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


TRACES = {   # name: (the trace document, what stderr must say)
    "base-1e40": ({"baseTimeNanoseconds": 1e40, "traceEvents": [_event()]}, "is not a time"),
    "rank-1e30": ({"distributedInfo": {"rank": 10**30}, "traceEvents": [_event()]}, "is not a rank"),
    "ts-not-numbers": ({"traceEvents": [_event(ts="abc"), _event(ts=float("nan")), _event(ts=1e300),
                                        _event(dur="x"), _event(ts=3000)]}, "4 complete event(s)"),
    "name-50MB": ({"traceEvents": [_event("n" * 50_000_000), _event(ts=2000)]}, "1 event(s) left out"),
    "deviceProperties-25MB": ({"deviceProperties": [{"name": "x" * 25_000_000}],
                               "traceEvents": [_event()]}, "'deviceProperties' is"),
    # issue 30 item 6: a negative duration is named and left out, as NaN is
    "negative-dur": ({"traceEvents": [_event(), _event(ts=2000, dur=-50), _event(ts=3000, dur=-1e9),
                                      _event(ts=4000)]}, "2 complete event(s) (ph X) left out: their dur is negative"),
}


def import_cases() -> list[Case]:
    out = []
    for name, (doc, says) in TRACES.items():
        def setup(work, doc=doc):
            (work / "t.json").write_text(json.dumps(doc, allow_nan=True))
            return ["import", str(work / "t.json"), "-o", str(work / "imported")]
        out.append(Case("import", name, setup, codes=(0,), says=says))
    return out


def fill_disk(disk: Path) -> None:
    """Write disk/filler until the file system says it is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def disk_full_cases(p: Pristine) -> list[Case]:
    """A 2 MB tmpfs filled up before the command (mounted in setup; needs root): one line that
    says so, no traceback. Left out where mounting is not allowed."""
    if os.geteuid() != 0:
        return []
    out = []
    for name, argv in [("report-html", lambda d: ["report", str(d / "ok"), "--html", str(d / "x.html")]),
                       ("export", lambda d: ["export", str(d / "ok"), "--perfetto", str(d / "x.json")]),
                       ("history", lambda d: ["history", "add", "--db", str(d / "h.duckdb"), str(d / "ok")]),
                       ("recover", lambda d: ["recover", str(d / "ok")])]:
        def setup(work, argv=argv, name=name):
            disk = work / "disk"
            disk.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True,
                           capture_output=True)
            shutil.copytree(p.killed if name == "recover" else p.finished, disk / "ok")
            fill_disk(disk)
            return argv(disk)
        out.append(Case("disk-full", name, setup))
    return out


def all_cases(p: Pristine, quick: bool = False) -> list[Case]:
    n = 6 if quick else 40
    return (journal_cases(p, n) + parquet_cases(p, n) + span_cases(p) + meta_cases(p)
            + unreadable_cases(p) + import_cases() + disk_full_cases(p) + hardening_cases(p, quick)
            + files_memory_cases(p, quick))


def hardening_cases(p: Pristine, quick: bool = False) -> list[Case]:
    """Issue 30's classes (tests/hostile/hardening.py): race, secrets, output, exec, serve."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import hardening
    return hardening.hardening_cases(p, quick, Case)


def files_memory_cases(p: Pristine, quick: bool = False) -> list[Case]:
    """Issue 30's items 3-6 (tests/hostile/files_memory.py): misplaced, range, memory."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import files_memory
    return files_memory.files_memory_cases(p, quick, Case)
