"""Issue 30's items 3-6 (the third hardening pass), in the hostile pass's Case form.

- misplaced: a samples Parquet file copied into spans/rank=0/, a spans file into samples/rank=0/:
             every reader names the file ("is not a spans file") and leaves it out: `export`
             writes the run's own spans only, `merge` does not copy it, `history add` and
             `report` exit 0;
- range:     meta.json numbers no run can hold (start_ns 10**400, end_ns 1e400 read as inf, a
             rank of 10**30, a config value of 10**400, a duration of -10**30): one line naming
             the field, for every command (`compare`: 2); `merge` makes no output;
- import:    a trace with negative durations: they are named and left out like NaN (cases.py's
             TRACES holds that case);
- memory:    `report`, `export`, `history add`, `merge` under `ulimit -v` of 1 and 2 GB work;
             under 200 MB they stop at once with one line that names the limit and what to do;
             where memory runs out anyway (the refusal lowered for the test), one line, exit 1;
             `run` under 60 MB: one line, no traceback.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from helpers import COUNTERPROF, PYTHON  # noqa: E402

CMD_TIMEOUT = 120
REGIONS = ("import time, counterprof\nfor i in range(20):\n    with counterprof.region('work'):\n"
           "        t = time.time()\n        while time.time() - t < 0.03: pass\n")
SPANS_IN_RUN = 20


def regions_run(path: Path) -> Path:
    """A finished run with samples and 20 region spans (made once; copied by every case)."""
    if not (path / "meta.json").exists():
        subprocess.run([*COUNTERPROF, "run", "-q", "-o", str(path), "-I", "20", "--", PYTHON, "-c",
                        REGIONS], check=True, capture_output=True, timeout=CMD_TIMEOUT)
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _one(run: Path, table: str) -> Path:
    return sorted((run / table / "rank=0").glob(f"{table}-*.parquet"))[0]


def plant(run: Path, what: str) -> Path:
    """Copy one table's file into the other table's folder; return the planted path."""
    src, dst_table = (_one(run, "samples"), "spans") if what == "samples-in-spans" else \
        (_one(run, "spans"), "samples")
    target = run / dst_table / "rank=0" / f"{dst_table}-planted.parquet"
    shutil.copyfile(src, target)
    return target


def export_spans(path: Path) -> int:
    """The complete events ("X") of an exported Perfetto JSON."""
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return sum(1 for e in events if e.get("ph") == "X")


def _cli(args: list[str], cwd: Path, env: dict | None = None,
         limit_kb: int | None = None) -> subprocess.CompletedProcess:
    cmd = [*COUNTERPROF, *args]
    if limit_kb is not None:           # a real shell limit, as a batch job's script sets it
        cmd = ["bash", "-c", f"ulimit -v {limit_kb}; exec {shlex.join(cmd)}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT, cwd=cwd,
                          env={**os.environ, **(env or {})})


# -- misplaced ----------------------------------------------------------------------------------

COMMANDS = {
    "report": lambda r, w: ["report", str(r)],
    "report-json": lambda r, w: ["report", "--json", str(r)],
    "export": lambda r, w: ["export", str(r), "--perfetto", str(w / "out.json")],
    "history": lambda r, w: ["history", "add", "--db", str(w / "h.duckdb"), str(r)],
    "merge": lambda r, w: ["merge", str(r), "-o", str(w / "merged")],
    "breakdown": lambda r, w: ["breakdown", str(r)],
    "recover": lambda r, w: ["recover", str(r)],
}


def _misplaced_runner(src: Path, what: str, verb: str):
    def runner(work: Path, _argv: list[str]) -> tuple[int, str, list[str]]:
        run = _copy(src, work / "run")
        planted = plant(run, what)
        p = _cli(COMMANDS[verb](run, work), work)
        problems = []
        if _names(verb, what) and str(planted) not in p.stderr:
            problems.append(f"the planted file {planted.name} is not named: {p.stderr.strip()[-300:]!r}")
        if verb == "export" and p.returncode == 0:
            n = export_spans(work / "out.json")
            if n != SPANS_IN_RUN:
                problems.append(f"the export holds {n} spans, the run {SPANS_IN_RUN}")
        if verb == "merge" and p.returncode == 0:
            copied = sorted(x.name for x in (work / "merged").rglob("*planted*"))
            if copied:
                problems.append(f"merge copied the planted file: {copied}")
        if not planted.exists():
            problems.append("the planted file was deleted (nothing recorded may be lost)")
        return p.returncode, p.stderr, problems
    return runner


def _names(verb: str, what: str) -> bool:
    """Whether the command reads the folder the file was planted in (recover compacts journals
    only; breakdown reads the spans only), and so must name it."""
    return verb != "recover" and not (verb == "breakdown" and what == "spans-in-samples")


def misplaced_cases(src: Path, Case) -> list:
    out = []
    for what, says in (("samples-in-spans", "is not a spans file"),
                       ("spans-in-samples", "is not a samples file")):
        for verb in COMMANDS:
            out.append(Case("misplaced", f"{what}-{verb}", lambda w: [], codes=(0,),
                            says=says if _names(verb, what) else "",
                            runner=_misplaced_runner(src, what, verb)))
    return out


# -- range --------------------------------------------------------------------------------------

def _set(doc: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    for k in head:
        doc = doc.setdefault(k, {})
    doc[last] = value


RANGE_EDITS = {     # name: (field, value, what stderr must name)
    "start-10e400": ("start_ns", 10**400, "start_ns"),
    "end-inf": ("end_ns", float("inf"), "end_ns"),
    "duration-neg": ("duration_ns", -10**30, "duration_ns"),
    "rank-10e30": ("rank", 10**30, "rank"),
    "started-2e70": ("workload.started_ns", 2**70, "workload.started_ns"),
    "config-10e400": ("collectors.host.config.interval_ms", 10**400, "interval_ms"),
}


def _range_runner(src: Path, dotted: str, value, verb: str, field: str):
    def runner(work: Path, _argv: list[str]) -> tuple[int, str, list[str]]:
        run = _copy(src, work / "run")
        meta = json.loads((run / "meta.json").read_text())
        _set(meta, dotted, value)
        (run / "meta.json").write_text(json.dumps(meta, allow_nan=True))
        args = ["compare", str(src), str(run)] if verb == "compare" else COMMANDS[verb](run, work)
        p = _cli(args, work)
        problems = []
        if field not in p.stderr:
            problems.append(f"stderr does not name {field}: {p.stderr.strip()[-300:]!r}")
        if verb == "merge" and (work / "merged").exists():
            problems.append("merge made its output before refusing")
        return p.returncode, p.stderr, problems
    return runner


def range_cases(src: Path, Case, quick: bool) -> list:
    out = []
    edits = list(RANGE_EDITS.items())[:2] if quick else list(RANGE_EDITS.items())
    for name, (dotted, value, field) in edits:
        for verb in [*COMMANDS, "compare"]:
            if verb == "breakdown":          # reads only the spans: not the meta's numbers
                continue
            out.append(Case("range", f"{name}-{verb}", lambda w: [],
                            codes=(2,) if verb == "compare" else (1,),
                            says="is not a counterprof run's metadata",
                            runner=_range_runner(src, dotted, value, verb, field)))
    return out


# -- memory -------------------------------------------------------------------------------------

def _memory_runner(src: Path, verb: str, limit_kb: int, env: dict | None = None,
                   one_line: bool = False):
    def runner(work: Path, _argv: list[str]) -> tuple[int, str, list[str]]:
        run = _copy(src, work / "run")
        if verb == "run":
            args = ["run", "-q", "-o", str(work / "new"), "--", "true"]
        else:
            args = COMMANDS[verb](run, work)
        p = _cli(args, work, env=env, limit_kb=limit_kb)
        problems = []
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        if p.returncode != 0 and "out of memory under" not in p.stderr and \
                "raise it to at least" not in p.stderr:
            problems.append(f"exit {p.returncode} without naming the memory limit: {p.stderr.strip()[-300:]!r}")
        if one_line and len(lines) != 1:
            problems.append(f"{len(lines)} lines on stderr, not one: {p.stderr.strip()[-400:]!r}")
        return p.returncode, p.stderr, problems
    return runner


def memory_cases(src: Path, Case, quick: bool) -> list:
    out = []
    readers = ["report", "export", "history", "merge"]
    for limit_kb in (1_000_000, 2_000_000):        # a batch job's 1 and 2 GB: they work
        for verb in readers:
            out.append(Case("memory", f"{verb}-{limit_kb // 1000}MB", lambda w: [], codes=(0,),
                            runner=_memory_runner(src, verb, limit_kb)))
    for verb in readers:      # below what a reader needs: refused at once, one line
        out.append(Case("memory", f"{verb}-200MB-refused", lambda w: [], codes=(1,),
                        says="raise it to at least",
                        runner=_memory_runner(src, verb, 200_000, one_line=True)))
    # the refusal lowered: memory runs out inside the libraries (an ImportError of a library
    # that cannot be mapped, DuckDB's or Arrow's out of memory): one line all the same
    for verb in readers if not quick else ["report"]:
        for limit_kb in (150_000, 300_000):
            out.append(Case("memory", f"{verb}-{limit_kb // 1000}MB-runs-out", lambda w: [],
                            codes=(0, 1),
                            runner=_memory_runner(src, verb, limit_kb, env={"COUNTERPROF_MIN_AS_MB": "1"})))
    out.append(Case("memory", "run-60MB", lambda w: [], codes=(1,), says="out of memory under",
                    runner=_memory_runner(src, "run", 60_000, one_line=True)))
    return out


def files_memory_cases(p, quick: bool, Case) -> list:
    src = regions_run(p.finished.parent / "regions")
    return misplaced_cases(src, Case) + range_cases(src, Case, quick) + memory_cases(src, Case, quick)
