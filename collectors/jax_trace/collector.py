"""jax collector: jax.profiler in the workload's processes, its profiles -> spans.

Off unless asked for (`counterprof run --jax`): it runs code inside the workload (the bootstrap
`--torch` uses, on PYTHONPATH), records profiles of MBs, and costs the traced steps time.

Where things happen:
- In the workload's Python processes (bootstrap/_counterprof_jax_driver.py, loaded by the torch
  collector's sitecustomize.py once the process imports jax): every StepTraceAnnotation step is
  timed into <run>/_ranks/rank=<r>/traces/<host>_<pid>.jax.steps, and jax.profiler records
  windows of steps (or, with no step annotation, windows of time) into
  <run>/_ranks/rank=<r>/traces/<host>_<pid>.<n>[.time].jaxprof/ (jax's own profile folder,
  renamed into place once complete, with .counterprof.json: the window's bounds and pid).
- In the profiler (this collector's thread): each steps file is read as it grows (the torch
  collector's StepsFile: the same format) and emitted as `step` spans; each complete profile
  folder is converted (convert.py's convert_profile) and emitted into its rank's partition,
  without its step spans (the steps file is the one source of a process's steps), ending
  with the window's span; then the next (at nice 10 while the workload runs: it yields the
  cores the workload fills; the rest at stop). Each profile is taken through its claim first
  (torch_trace/claim.py: an flock on traces/.<profile>.claim), so a recovery running meanwhile
  never converts it twice.

Data loss: a window is on disk once jax has written it; a killed workload loses the window it
was recording. A killed profiler loses nothing: `counterprof recover` converts the profiles
whose window span is not in the run (recover(), rows of a cut-off conversion replaced), and
the torch collector's recovery reads the step times not read yet (its steps files are
`*.steps`, these among them).

Nothing recorded: when --jax was asked and no profile came, the status is "empty" and the
reason says why (no process imported jax; jax imported but no step annotation and no jitted
call lasted until a time window; profiling stopped on an error).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterprof.collector import Availability, PollingCollector, SessionContext, native_available
from counterprof.ground.errors import CounterprofError, UsageError
from counterprof.store import rundir, safepath
from .options import JaxOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from ..torch_trace.claim import Claim
    from ..torch_trace.steps import StepsFile

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
DRIVER = "_counterprof_jax_driver"
# the torch collector's bootstrap folder: its sitecustomize.py loads the jax driver too, so
# --torch and --jax together put one folder on PYTHONPATH
SITE = Path(__file__).resolve().parent.parent / "torch_trace" / "bootstrap"
ENV = "COUNTERPROF_JAX"
STEPS_PATTERN = "*.jax.steps"
PROFILE_SUFFIX = ".jaxprof"
TIME_PROFILE_SUFFIX = ".time.jaxprof"
META = ".counterprof.json"     # hidden: a walk for trace files (counterprof import) skips it
STOPPED_DIR = ".jax"
CONVERT_NICE = 10


def profile_folders(run: Path, rank: int | None = None) -> list[Path]:
    """The complete profile folders of the run (hidden ones are still being written; no link
    followed)."""
    out = []
    for r, d in rundir.rank_dirs(Path(run)):
        if rank is not None and r != rank:
            continue
        for p in safepath.children(d / rundir.TRACES):
            if p.name.endswith(PROFILE_SUFFIX) and not p.name.startswith(".") \
                    and safepath.plain_dir(p, report=False):
                out.append(p)
    return sorted(out)


def read_window(folder: Path) -> dict[str, Any]:
    """The driver's .counterprof.json of a profile folder ({} when missing or unreadable)."""
    path = folder / META
    if not safepath.plain_file(path):
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def converted_profile(folder: Path) -> tuple[pa.Table | None, str | None]:
    """The profile's spans for the run: convert_profile's, less its step spans (the steps file
    holds the process's steps), every row with the process's pid where the converter had
    none, and the window's span last. (None, why) when it cannot be converted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from counterprof.ground.schema import SPANS_SCHEMA, spans_batch
    try:
        from .convert import convert_profile
    except ImportError as exc:
        return None, f"the jax profile converter is missing ({exc})"
    try:
        table = convert_profile(folder)
    except Exception as exc:        # one bad profile must not stop the others
        return None, f"{type(exc).__name__}: {exc}"
    win = read_window(folder)
    pid = win.get("pid") if isinstance(win.get("pid"), int) else None
    if table.num_rows:
        table = table.filter(pc.fill_null(pc.not_equal(table["category"].cast(pa.string()), "step"), True))
    if pid is not None and table.num_rows and table["pid"].null_count:
        table = table.set_column(table.schema.get_field_index("pid"), "pid",
                                 pc.fill_null(table["pid"], pa.scalar(pid, pa.int64())))
    start, end = win.get("start_ns"), win.get("end_ns")
    if table.num_rows:
        lo = pc.cast(pc.min(table["start"]), pa.int64()).as_py()
        hi = pc.cast(pc.max(table["end"]), pa.int64()).as_py()
        # the window holds every span it recorded (device work may end after the stop)
        start = lo if not isinstance(start, int) else min(start, lo)
        end = hi if not isinstance(end, int) else max(end, hi)
    if isinstance(start, int) and isinstance(end, int):
        attrs = json.dumps({"source": "jax", "kind": win.get("kind"), "spans": table.num_rows},
                           separators=(",", ":"))
        window = spans_batch([start], [end], [folder.name], ["window"], pid=[pid], attrs=[attrs])
        table = pa.concat_tables([table.cast(SPANS_SCHEMA), pa.Table.from_batches([window])],
                                 promote_options="permissive") if table.num_rows \
            else pa.Table.from_batches([window])
    return table, None


class JaxCollector(PollingCollector):
    name = "jax"
    options = JaxOptions
    default_on = False
    DEFAULTS = {"every": 50, "active": 5, "warmup": 1, "poll_s": 0.5, "window_s": 2.0,
                "window_every_s": 20.0, "python_tracer": False}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        # the default schedules adapt (paced by their cost); one the user gave is followed
        self.paced = not any(k in (config or {}) for k in ("every", "active", "warmup"))
        self.time_paced = not any(k in (config or {}) for k in ("window_s", "window_every_s"))
        self.run_path: Path | None = None
        self.done: set[str] = set()
        self.profiles = 0        # converted here
        self.seen = 0            # found complete (converted here or by another process)
        self.failed = 0          # found, but the converter could not read them
        self.spans = 0
        self.problems: list[str] = []
        self.steps_files: dict[str, StepsFile] = {}

    # -- contract ---------------------------------------------------------------------------

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        return native_available()

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        cfg = cls.with_defaults(config)
        try:
            every, active, warmup = int(cfg["every"]), int(cfg["active"]), int(cfg["warmup"])
        except (TypeError, ValueError):
            raise UsageError("jax: every, active and warmup are whole numbers of steps") from None
        if active < 1 or warmup < 0 or every < active + warmup:
            raise UsageError(f"jax: a window of {active} step(s) after {warmup} warm-up step(s) "
                             f"does not fit in every {every} steps "
                             "(need active >= 1 and every >= active + warmup)")
        try:
            window_s, window_every_s = float(cfg["window_s"]), float(cfg["window_every_s"])
        except (TypeError, ValueError):
            raise UsageError("jax: window_s and window_every_s are seconds") from None
        if not 0 < window_s <= window_every_s:
            raise UsageError(f"jax: a time window of {window_s:g} s does not fit in every "
                             f"{window_every_s:g} s (need 0 < window_s <= window_every_s)")

    @classmethod
    def inventory(cls, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from importlib import metadata
        try:
            version = metadata.version("jax")
        except metadata.PackageNotFoundError:
            version = "not installed in this Python"
        cfg = cls.with_defaults(config)
        steps = f"{cfg['active']} steps every {cfg['every']} (after {cfg['warmup']})"
        if not any(k in (config or {}) for k in ("every", "active", "warmup")):
            steps += ", paced so the profiler's start and stop take under 5% of the run"
        return [{"title": "jax profiler", "columns": ["setting", "value"],
                 "rows": [["jax", version], ["window", steps],
                          ["time window", "without step annotations: the first ~0.5 s after the "
                                          "first XLA compile, then paced by its cost (at most "
                                          f"{cfg['window_s']:g} s each)"],
                          ["python tracer", str(bool(cfg["python_tracer"]))]],
                 "note": "on with `counterprof run --jax`; steps are jax.profiler.StepTraceAnnotation "
                         "blocks, every one timed, traced or not"}]

    def driver_config(self) -> dict[str, Any]:
        keys = ("every", "active", "warmup", "window_s", "window_every_s", "python_tracer")
        return {**{k: self.config[k] for k in keys}, "paced": self.paced,
                "time_paced": self.time_paced}

    def launch_environment(self, run_path: Path) -> dict[str, str]:
        self.run_path = Path(run_path)
        existing = os.environ.get("PYTHONPATH", "")
        return {
            # the same value the torch collector gives: --torch --jax put one folder there
            "PYTHONPATH": str(SITE) + (os.pathsep + existing if existing else ""),
            ENV: json.dumps({"run": str(Path(run_path).resolve()), **self.driver_config()}),
        }

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        if self.run_path is None:
            raise CounterprofError("jax: no run directory (launch_environment was not called)")
        if ctx.target.kind != "launch":
            raise CounterprofError("jax profiles need the workload launched by counterprof "
                                   "(`counterprof run --jax -- CMD`); it cannot attach to a "
                                   "running process or run inside counterprof.profile()")
        self.start_polling(ctx)

    def poll(self) -> None:
        # the conversions run while the workload does: on a machine whose cores the workload
        # fills (XLA's pool), they yield to it, as the background compaction does (Linux: a
        # thread's nice is its own); what is left is converted at stop at full speed
        try:
            import threading
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CONVERT_NICE)
        except (OSError, AttributeError):
            pass
        period = float(self.config["poll_s"])
        while not self._stop.wait(period):
            self.sweep()

    # -- sweeping -----------------------------------------------------------------------------

    def sweep(self) -> int:
        """Emit the step times written since the last sweep, then convert the complete
        profiles not converted yet; returns how many profiles."""
        from ..torch_trace.claim import Claim
        if self.run_path is None:
            return 0
        self.sweep_steps()            # first: a profile's steps file exists before it
        found = []
        for path in profile_folders(self.run_path):
            if str(path) not in self.done:
                try:
                    found.append((path.stat().st_mtime_ns, path))
                except FileNotFoundError:
                    continue
        converted = 0
        for _, path in sorted(found):
            claim = Claim.take_or_skip(path)
            if claim is None:
                continue                 # a recovery converts it right now
            with claim:
                self.done.add(str(path))
                self.seen += 1
                if claim.converted_by is not None:
                    continue
                self.convert(path)
                claim.mark_converted("jax collector")
                converted += 1
        return converted

    def sweep_steps(self) -> int:
        from ..torch_trace.steps import StepsFile
        rows = 0
        if self.run_path is None:
            return 0
        for path in rundir.trace_files(self.run_path, STEPS_PATTERN):
            sf = self.steps_files.get(str(path))
            if sf is None:
                candidate = StepsFile(path)
                if not candidate.take():
                    continue             # another reader holds it (a recovery): next time
                sf = self.steps_files[str(path)] = candidate
            for batch in sf.batches():
                self.ctx.emit("spans", batch, rank=sf.rank)
                rows += batch.num_rows
        self.spans += rows
        return rows

    def convert(self, path: Path) -> None:
        rank = rundir.rank_of_dir(path.parent.parent)     # [_ranks/]rank=<r>/traces/<profile>
        table, problem = converted_profile(path)
        self.profiles += 1
        if table is None:
            self.failed += 1
            msg = f"jax: {path.name}: not converted: {problem}"
            self.problems.append(msg)
            self.ctx.warn(msg)
            return
        for batch in table.to_batches(max_chunksize=64 * 1024):
            self.ctx.emit("spans", batch, rank=rank)
            self.spans += batch.num_rows

    # -- the end ------------------------------------------------------------------------------

    def stop(self) -> None:
        # not the base's: a failed last sweep fails the collector (profiles would be missing)
        if not self.polling:
            return
        self.halt()
        try:
            self.sweep()
        except Exception as exc:
            self.ctx.fail(self.name, f"{type(exc).__name__}: {exc}")
        files = list(self.steps_files.values())
        for sf in files:
            sf.release("jax collector")
        stopped = self.stopped_reasons(files)
        self.problems += [f"jax profiling stopped in {s}" for s in stopped
                          if f"jax profiling stopped in {s}" not in self.problems]
        windows: dict[str, int] = {}
        for sf in files:
            for k, v in sf.windows.items():
                windows[k] = windows.get(k, 0) + v
        self.details.update(profiles=self.profiles - self.failed, spans=self.spans, problems=self.problems[:20],
                            steps=sum(sf.steps for sf in files), processes=len(files),
                            step_marks=sorted({m for sf in files for m in sf.marks}))
        if windows:
            # started = kept + empty (no XLA execution) + dropped (before the first step)
            self.details["time_windows"] = windows
        if self.seen == self.failed:
            self.status, self.reason = "empty", self.nothing_recorded(files, stopped)
            self.ctx.warn(f"jax: no profile was recorded: {self.reason}")

    def stopped_reasons(self, files: list[StepsFile]) -> list[str]:
        """'pid N: why' for each process whose profiling stopped on an error: from its steps
        file, or from <run>/.jax/ where the steps file could not be written."""
        out = [f"pid {sf.pid}: {why}" for sf in files for why in sf.stopped
               if why not in ("closed", "forked child")]
        if self.run_path is None:
            return out
        folder = self.run_path / STOPPED_DIR
        for f in safepath.files(folder) if safepath.plain_dir(folder, report=False) else []:
            if not f.name.endswith(".stopped"):
                continue
            pid = f.name[: -len(".stopped")].rsplit("_", 1)[-1]
            try:
                why = f.read_text(errors="replace").strip()
            except OSError:
                continue
            line = f"pid {pid}: {why}"
            if why and line not in out:
                out.append(line)
        return out

    def nothing_recorded(self, files: list[StepsFile], stopped: list[str]) -> str:
        """Why no profile came, in words a user can act on."""
        if self.failed:
            return (f"{self.failed} profile(s) written but none could be converted: "
                    + "; ".join(self.problems[:2]))
        if stopped:
            return "profiling stopped: " + "; ".join(stopped[:3])
        if not files:
            return ("the workload never imported jax (no Python process of it did; "
                    "`python -I`/`-S` skip the bootstrap)")
        steps = sum(sf.steps for sf in files)
        if steps:
            return (f"{steps} step(s) timed but no profile written (the process was killed "
                    "before its first window ended?)")
        if self.time_paced:
            when = ("a time window starts ~0.5 s after the first XLA compile and is kept only "
                    "if it caught an XLA execution: the process ended first, or ran none")
        else:
            when = (f"a time window starts {float(self.config['window_every_s']):g} s after the "
                    "first XLA compile")
        return ("jax imported but no step or window was seen (no jax.profiler.StepTraceAnnotation; "
                f"{when})")

    # -- recovery -----------------------------------------------------------------------------

    @classmethod
    def recover(cls, run_path: Path) -> list[str]:
        """Convert the profiles a killed profiler left unconverted (or half converted) into
        their own Parquet files. The step times are the torch collector's recovery's (the
        steps files are `*.steps`)."""
        from ..torch_trace.claim import Claim, claim_path
        from ..torch_trace.recovery import converted_traces
        run = Path(run_path)
        lines: list[str] = []
        done: set[tuple[int, str]] | None = None
        for path in profile_folders(run):
            rank = rundir.rank_of_dir(path.parent.parent)
            if safepath.is_link(claim_path(path)):
                safepath.skipped_link(claim_path(path))
                continue
            claim = Claim.take_or_skip(path)
            if claim is None:
                lines.append(f"{path.name} (rank {rank}): being converted by another process; left to it")
                continue
            with claim:
                if claim.converted_by_live_process():
                    continue
                if done is None:
                    done = converted_traces(run)
                if (rank, path.name) not in done and claim.converted_by is not None:
                    done |= converted_traces(run, rank)
                if (rank, path.name) in done:
                    continue
                lines.append(_recover_one(path, rank, claim))
        return lines


def _recover_one(path: Path, rank: int, claim: Claim) -> str:
    """One profile into spans-recovered-<profile>.parquet, the rows of a cut-off conversion
    (the process's, of the profile's categories, inside its window) dropped first."""
    import fcntl

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from counterprof.store.compact import compact_rank

    from ..torch_trace.recovery import _drop_rows
    table, problem = converted_profile(path)
    if table is None:
        return f"{path}: not converted: {problem}"
    part = path.parent.parent
    folder = rundir.make_dirs(rundir.table_dir(part, "spans"), rundir.run_of_rank(part))
    target = folder / f"spans-recovered-{path.name}.parquet"
    staging = target.with_name(f".{target.name}.tmp")
    safepath.unlink_in_run(staging)
    safepath.create_private(staging)
    pq.write_table(table, staging, compression="zstd")
    win = table.filter(pc.equal(table["category"].cast(pa.string()), "window"))
    pid = win["pid"][0].as_py() if win.num_rows else None
    dropped = 0
    if pid is not None:
        start = pc.cast(win["start"], pa.int64())[0].as_py()
        end = pc.cast(win["end"], pa.int64())[0].as_py()
        cats = pc.unique(table["category"].cast(pa.string()))
        lock = safepath.open_lock(part / rundir.TRACES / ".recover.lock")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            compact_rank(part)
            for f in rundir.parquet_files(folder, "spans"):
                if f != target:
                    dropped += _drop_rows(f, pid, start, end, categories=cats)
            os.replace(staging, target)
        finally:
            os.close(lock)
    else:
        os.replace(staging, target)
    claim.mark_converted("recover")
    note = f" (replacing {dropped:,} rows of a cut-off conversion)" if dropped else ""
    return f"converted {path.name}: {table.num_rows:,} spans into rank {rank}{note}"
