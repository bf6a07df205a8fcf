"""Step and DataLoader timings the torch driver writes -> spans (categories step and input).

The driver (bootstrap/_counterprof_torch_driver.py) times every step and every DataLoader
`next()` of its process for the whole run, traced or not, and appends them once a second to
rank=<r>/traces/<host>_<pid>.steps (its docstring has the format; times are already on the
run's clock). Each file is read in complete lines from where the last read stopped: the torch
collector while it runs (holding the file's claim, claim.py, for as long as it reads it), and
`counterprof recover` for what a killed profiler had not read (recover_steps).

One span per step, named ProfilerStep#N (N counts the process's steps from 0, as torch.profiler
names them), pid and tid (the OS thread id of the thread that marked it) filled. A process that
writes a steps file has its steps and DataLoader waits from here only: its traces' own
ProfilerStep#N and enumerate(DataLoader) spans are dropped when converted (convert.py
drop_marks), so no step is counted twice and every step is measured the same way.
"""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import field
from pathlib import Path
from typing import Any

import pyarrow as pa

from counterprof.ground.schema import spans_batch
from counterprof.store import rundir, safepath
from counterprof.store.journal import read_segment, segments

from .claim import Claim
from counterprof.ground.record import record

SUFFIX = ".steps"


def steps_files(run: Path) -> list[Path]:
    """Every steps file of the run (no link followed: a planted link is not ours)."""
    return rundir.trace_files(Path(run), "*" + SUFFIX)
HEADER = "counterprof-steps"
# the rows a process's steps file gives (pysample: its main thread's Python, sampled)
MARK_CATEGORIES = ("step", "input", "pysample")
READ_BYTES = 8 * 1024 * 1024       # at most this much of a file per read (memory stays bounded)
WCOSTS_KEPT = 4096                 # the windows' accounts kept per file (one a window: seconds apart)


def steps_file_of_trace(trace: Path) -> bool:
    """Does the process that wrote this trace (<host>_<pid>.<n>.pt.trace.json) time its own
    steps (a <host>_<pid>.steps file in any rank of the run)? The driver creates that file
    before its first trace."""
    prefix = trace.name.split(".", 1)[0]
    run = rundir.run_of_rank(trace.parent.parent)      # [_ranks/]rank=<r>/traces/<file>
    return bool(rundir.trace_files(run, prefix + SUFFIX))


def window_account(parts: list[str]) -> dict[str, float]:
    """A wcost line's fields (split at tabs) as numbers ('-' and the like left out)."""
    out: dict[str, float] = {}
    for kv in parts[4].split():
        k, _, v = kv.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            continue
    try:
        out["start_ns"], out["end_ns"] = int(parts[1]), int(parts[2])
    except ValueError:
        pass
    return out


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def window_cost(files: list[StepsFile], convert_s: list[float]) -> dict[str, Any]:
    """The windows' cost, for the collector's details (meta.json collectors.torch.window_cost):
    step windows' first one (the profiler's one-time set-up in it) apart from the steady ones,
    the medians of a steady one's phases in ms, and the duty (the windows' cost over the time
    from the first step to the last; steady: from the first window's end); time windows' medians;
    the collector's conversion of each trace (in the profiler's process, not the workload's)."""
    out: dict[str, Any] = {}
    step = [(sf, w) for sf in files for w in sf.wcosts if not w.get("time")]
    if step:
        out["step_windows"] = len(step)
        first = [w for _, w in step if w.get("n") == 1]
        steady = [w for _, w in step if w.get("n", 0) > 1]
        if first:
            out["first_cost_ms"] = round(first[0].get("cost_us", 0) / 1e3, 3)
            out["first_start_ms"] = round(first[0].get("start_us", 0) / 1e3, 3)
        for key in ("start", "step_calls", "stop", "export", "recorded_excess", "cost", "wall"):
            vals = [w[key + "_us"] for w in steady if key + "_us" in w]
            if vals:
                out[f"steady_{key}_ms"] = round(_median(vals) / 1e3, 3)
        if steady:
            out["steps_per_window"] = _median([w.get("steps", 0) for w in steady])
        spans = all_cost = steady_span = steady_cost = 0.0
        for sf in files:
            mine = [w for f, w in step if f is sf]
            if not mine or sf.first_step_ns is None or sf.last_step_ns is None:
                continue
            spans += max(1, sf.last_step_ns - sf.first_step_ns)
            all_cost += sum(w.get("cost_us", 0) for w in mine) * 1e3
            after = [w for w in mine if w.get("n", 0) > 1]
            first_end = min((w.get("end_ns", 0) for w in mine if w.get("n") == 1), default=sf.first_step_ns)
            if after and sf.last_step_ns > first_end:
                steady_span += sf.last_step_ns - first_end
                steady_cost += sum(w.get("cost_us", 0) for w in after) * 1e3
        if spans:
            out["duty"] = round(all_cost / spans, 5)
        if steady_span:
            out["steady_duty"] = round(steady_cost / steady_span, 5)
    timed = [w for sf in files for w in sf.wcosts if w.get("time")]
    if timed:
        out["time_windows"] = len(timed)
        for key in ("start", "stop", "export", "cost"):
            vals = [w[key + "_us"] for w in timed if key + "_us" in w]
            if vals:
                out[f"time_{key}_ms"] = round(_median(vals) / 1e3, 3)
    if convert_s:
        out["convert_ms"] = round(_median(convert_s) * 1e3, 3)
        out["convert_s_total"] = round(sum(convert_s), 3)
    return out


@record
class StepsFile:
    """One process's steps file and what has been read of it."""

    path: Path
    offset: int = 0
    pid: int | None = None
    marks: list[str] = field(default_factory=list)      # what marked its steps, in order
    stopped: list[str] = field(default_factory=list)    # why profiling stopped in it
    steps: int = 0
    inputs: int = 0
    windows: dict[str, int] = field(default_factory=dict)   # its time windows' account, at exit
    # each finished window's account (the driver's `wcost` lines): its fields as numbers, with
    # start_ns and end_ns; and the first step's start and the last step's end (run clock ns)
    wcosts: list[dict[str, float]] = field(default_factory=list)
    first_step_ns: int | None = None
    last_step_ns: int | None = None
    claim: Claim | None = None

    def __post_init__(self) -> None:
        if self.pid is None:
            try:
                self.pid = int(self.path.name[: -len(SUFFIX)].rsplit("_", 1)[1])
            except (IndexError, ValueError):
                self.pid = None

    @property
    def rank(self) -> int:
        return rundir.rank_of_dir(self.path.parent.parent)

    def read(self) -> pa.RecordBatch | None:
        """The spans of the complete lines written since the last read (None: none)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(READ_BYTES)
        except FileNotFoundError:
            return None
        end = data.rfind(b"\n")
        if end < 0:
            return None
        self.offset += end + 1
        cols: dict[str, list[Any]] = {"start": [], "end": [], "name": [], "category": [], "tid": []}
        for line in data[:end].decode("utf-8", "replace").split("\n"):
            parts = line.split("\t")
            kind = parts[0]
            if kind in MARK_CATEGORIES and len(parts) == 5:
                try:
                    start, stop, tid = int(parts[1]), int(parts[2]), int(parts[3])
                except ValueError:
                    continue
                cols["start"].append(start)
                cols["end"].append(stop)
                cols["tid"].append(tid)
                cols["name"].append(parts[4])
                cols["category"].append(kind)
                if kind == "step":
                    self.steps += 1
                    if self.first_step_ns is None:
                        self.first_step_ns = start
                    self.last_step_ns = max(stop, self.last_step_ns or stop)
                elif kind == "input":
                    self.inputs += 1
            elif kind == "marks" and len(parts) == 2:
                self.marks.append(parts[1])
            elif kind == "wcost" and len(parts) == 5:
                if len(self.wcosts) < WCOSTS_KEPT:
                    self.wcosts.append(window_account(parts))
            elif kind == "stopped" and len(parts) == 2:
                self.stopped.append(parts[1])
            elif kind == "windows" and len(parts) == 2:
                try:
                    self.windows = {k: int(v) for k, v in (w.split("=", 1) for w in parts[1].split())}
                except ValueError:
                    pass
            elif kind.startswith(HEADER):
                for p in parts[1:]:
                    if p.startswith("pid="):
                        try:
                            self.pid = int(p[4:])
                        except ValueError:
                            pass
        if not cols["start"]:
            return None
        n = len(cols["start"])
        return spans_batch(cols["start"], cols["end"], cols["name"], cols["category"],
                           pid=[self.pid] * n, tid=cols["tid"])

    def batches(self) -> Iterator[pa.RecordBatch]:
        while True:
            before = self.offset
            batch = self.read()
            if batch is not None:
                yield batch
            if self.offset == before:
                return

    # -- the claim: who reads it, and up to where -----------------------------------------

    def take(self) -> bool:
        """Take the file's claim (False: another process reads it now); start after what a
        recovery already converted."""
        claim = Claim.take_or_skip(self.path)
        if claim is None:
            return False
        self.claim = claim
        state = claim.converted_by or {}
        if isinstance(state.get("offset"), int) and state["offset"] > self.offset:
            self.offset = state["offset"]
            self.steps, self.inputs = state.get("steps", 0), state.get("inputs", 0)
            self.marks = list(state.get("marks", []))
            self.stopped = list(state.get("stopped", []))
        return True

    def release(self, by: str | None) -> None:
        """Say how far it was read (by: who read it; None: leave the claim as it was)."""
        if self.claim is None:
            return
        try:
            if by is not None:
                data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "by": by,
                                   "offset": self.offset, "steps": self.steps,
                                   "inputs": self.inputs, "marks": self.marks,
                                   "stopped": self.stopped[:5]}).encode()
                os.ftruncate(self.claim.fd, 0)
                os.pwrite(self.claim.fd, data + b"\n", 0)
        finally:
            self.claim.release()
            self.claim = None


# -- recovery ---------------------------------------------------------------------------------

def _present(part: Path, pid: int) -> set[tuple[str, int, int]]:
    """(category, start, tid) of the step and input spans of process `pid` the partition
    holds (its Parquet files and journals not compacted yet)."""
    import pyarrow.compute as pc     # here, not at import: the registry loads this module in every run
    import pyarrow.parquet as pq     # (and pyarrow.fs, ssl: ~12 ms of `counterprof import`)
    found: set[tuple[str, int, int]] = set()
    cols = ["start", "category", "pid", "tid"]

    def add(t: pa.Table) -> None:
        cat = t["category"].cast(pa.string())
        keep = pc.and_(pc.equal(t["pid"], pid), pc.is_in(cat, value_set=pa.array(MARK_CATEGORIES)))
        keep = pc.fill_null(keep, False)
        if not pc.any(keep).as_py():
            return
        t = t.filter(keep)
        found.update(zip(t["category"].cast(pa.string()).to_pylist(),
                         pc.cast(t["start"], pa.int64()).to_pylist(), t["tid"].to_pylist()))

    for s in segments(part):
        if s.table == "spans":
            for b in read_segment(s.path):
                add(b.select(cols))
    for f in rundir.parquet_files(rundir.table_dir(part, "spans"), "spans"):
        try:
            add(pq.read_table(f, columns=cols, filters=[("pid", "=", pid)]))
        except (pa.ArrowInvalid, OSError):
            continue
    return found


def recover_steps(run_path: Path) -> list[str]:
    """Convert what the steps files hold beyond what the run has (a killed profiler stopped
    reading them; the workload may have gone on timing steps). Idempotent: rows already in the
    partition are left out, so a recovery interrupted anywhere is finished by the next."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    lines = []
    for path in steps_files(run_path):
        sf = StepsFile(path)
        if not sf.take():
            lines.append(f"{path.name} (rank {sf.rank}): being read by another process; left to it")
            continue
        try:
            start = sf.offset
            batches = list(sf.batches())
            if not batches or sf.pid is None:
                sf.release("recover" if batches or sf.offset > start else None)
                continue
            table = pa.Table.from_batches(batches)
            part = path.parent.parent
            have = _present(part, sf.pid)
            keys = zip(table["category"].cast(pa.string()).to_pylist(),
                       pc.cast(table["start"], pa.int64()).to_pylist(), table["tid"].to_pylist())
            missing = [k not in have for k in keys]
            added = sum(missing)
            if added:
                out = table.filter(pa.array(missing))
                folder = rundir.make_dirs(rundir.table_dir(part, "spans"), rundir.run_of_rank(part))
                target = folder / f"spans-recovered-{path.name}-{start}-{sf.offset}.parquet"
                # a dot name until renamed: dataset readers skip it
                tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                safepath.unlink_in_run(tmp)
                safepath.create_private(tmp)              # 0600 from its first byte; no link
                pq.write_table(out, tmp, compression="zstd")
                os.chmod(tmp, 0o600)
                os.replace(tmp, target)
                steps = pc.sum(pc.equal(out["category"].cast(pa.string()), "step")).as_py() or 0
                lines.append(f"timed {path.name}: {steps:,} steps and {added - steps:,} DataLoader "
                             f"waits into rank {sf.rank}")
            sf.release("recover")
        except BaseException:
            sf.release(None)
            raise
    return lines
