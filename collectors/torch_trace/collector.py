"""torch collector: torch.profiler in the workload's processes, Kineto traces -> spans.

Off unless asked for (`counterprof run --torch`, collectors=[..., "torch"]): it runs code inside
the workload (a bootstrap on PYTHONPATH for launched commands), records traces of hundreds of MB,
and costs the profiled steps real time. `counterprof list` says whether torch is installed here.

Where things happen:
- In the workload's Python processes (bootstrap/_counterprof_torch_driver.py): torch.profiler
  records a window of steps every N; torch writes each finished window as a Kineto JSON file
  into <run>/_ranks/rank=<rank>/traces/ (rundir.traces_dir; temporary name, then renamed).
- In the profiler (this collector's thread): each complete trace file is converted in a stream
  (convert.py) and emitted as spans into its rank's partition, ending with the trace's window
  span; then the next file. The workload pays for torch's own export only; conversion, the
  expensive part, runs in the profiler process (for counterprof.profile(), the same process, on
  the collector's thread: the native scanner releases the GIL). `counterprof run` converts
  every rank's traces; counterprof.profile() only those its own process wrote (in a job whose
  ranks each run profile() into one run, each rank converts its own).
- Every step and DataLoader next(), traced or not: the driver appends their times once a second
  to <run>/_ranks/rank=<r>/traces/<host>_<pid>.steps; this collector reads each such file as it grows
  (steps.py) and emits them as `step` and `input` spans into that rank's partition. A
  process's traces then give no step or input spans of their own (no step counted twice).
- Each trace is converted by one process, once: a converter first takes the trace's claim
  (claim.py: an flock on traces/.<trace>.claim, which then records who converted it), so
  several profilers of one run and a recovery running meanwhile never convert a trace twice.

Data loss: a window is on disk once torch has written it, so a killed workload loses only the
window it was recording (it lives in torch's memory until then). A killed profiler loses
nothing either: the trace files stay in the run, and `counterprof recover` converts the ones
whose spans are not complete (recovery.py: a trace's window span is emitted last, so a trace
without one was cut off; its partial rows are replaced), and the step times it had not read.

Nothing recorded: when --torch was asked and no trace came, the status is "empty" and the
reason says why (no process imported torch; torch imported but nothing marked a step, ran a
module or lasted until a time window; profiling stopped on an error), so no reader shows "ok"
for a run without traces.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from counterprof.collector import Availability, PollingCollector, SessionContext, native_available
from counterprof.ground.errors import CounterprofError, UsageError
from counterprof.store import rundir
from .options import TorchOptions


if TYPE_CHECKING:
    from .steps import StepsFile

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
DRIVER = "_counterprof_torch_driver"


def load_driver() -> ModuleType:
    """The driver module, under the name counterprof.step() looks for."""
    mod = sys.modules.get(DRIVER)
    if mod is None:
        spec = importlib.util.spec_from_file_location(DRIVER, BOOTSTRAP / f"{DRIVER}.py")
        assert spec is not None and spec.loader is not None     # a .py file's
        mod = importlib.util.module_from_spec(spec)
        sys.modules[DRIVER] = mod
        spec.loader.exec_module(mod)
    return mod


class TorchCollector(PollingCollector):
    name = "torch"
    options = TorchOptions
    default_on = False
    DEFAULTS = {"every": 50, "active": 5, "warmup": 1, "record_shapes": True,
                "with_stack": False, "profile_memory": False, "poll_s": 0.5,
                "window_s": 2.0, "window_every_s": 20.0}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        # the default schedule adapts (the driver's first window warms up, windows are paced
        # by their cost); one the user gave is followed to the step
        self.paced = not any(k in (config or {}) for k in ("every", "active", "warmup"))
        # so does the time schedule (the first window ~1 s after torch's import, then paced by
        # its cost); one the user gave (window_s, window_every_s) is followed exactly
        self.time_paced = not any(k in (config or {}) for k in ("window_s", "window_every_s"))
        self.run_path: Path | None = None
        self.driver = None
        self.done: set[str] = set()
        self.traces = 0          # converted here
        self.seen = 0            # found complete (converted here or by another process)
        self.spans = 0
        self.problems: list[str] = []
        self.steps_files: dict[str, StepsFile] = {}
        self.convert_s: list[float] = []     # each trace's conversion, here (window_cost)

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
            raise UsageError("torch: every, active and warmup are whole numbers of steps") from None
        if active < 1 or warmup < 0 or every < active + warmup:
            raise UsageError(f"torch: a window of {active} active step(s) after {warmup} warm-up "
                             f"step(s) does not fit in every {every} steps "
                             "(need active >= 1 and every >= active + warmup)")
        try:
            window_s, window_every_s = float(cfg["window_s"]), float(cfg["window_every_s"])
        except (TypeError, ValueError):
            raise UsageError("torch: window_s and window_every_s are seconds") from None
        if not 0 < window_s <= window_every_s:
            raise UsageError(f"torch: a time window of {window_s:g} s does not fit in every "
                             f"{window_every_s:g} s (need 0 < window_s <= window_every_s)")

    @classmethod
    def inventory(cls, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from importlib import metadata     # ~9 ms: not on `counterprof import`'s path
        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            version = ("not installed in counterprof's Python; --torch needs it in the workload's "
                       "(pip install torch there)")
        cfg = cls.with_defaults(config)
        return [{"title": "torch profiler", "columns": ["setting", "value"],
                 "rows": [["torch", version],
                          ["window", f"{cfg['active']} steps every {cfg['every']} "
                                     f"(after {cfg['warmup']} warm-up)"],
                          ["time window", (f"{cfg['window_s']:g} s every {cfg['window_every_s']:g} s"
                                           if any(k in (config or {}) for k in ("window_s", "window_every_s")) else
                                           "the first ~1 s after torch's import, then paced by "
                                           f"its cost (at most {cfg['window_s']:g} s each)")
                                          + " (without step marks or module forwards)"],
                          ["record_shapes", str(cfg["record_shapes"])]],
                 "note": "on with `counterprof run --torch`; steps are marked by counterprof.step(), "
                         "your own prof.step(), optimizer.step() or else each outermost module "
                         "forward; every step is timed, traced or not"}]

    def driver_config(self) -> dict[str, Any]:
        keys = ("every", "active", "warmup", "record_shapes", "with_stack", "profile_memory",
                "window_s", "window_every_s")
        return {**{k: self.config[k] for k in keys}, "paced": self.paced,
                "time_paced": self.time_paced}

    def launch_environment(self, run_path: Path) -> dict[str, str]:
        self.run_path = Path(run_path)
        existing = os.environ.get("PYTHONPATH", "")
        return {
            "PYTHONPATH": str(BOOTSTRAP) + (os.pathsep + existing if existing else ""),
            "COUNTERPROF_TORCH": json.dumps({"run": str(Path(run_path).resolve()),
                                             **self.driver_config()}),
        }

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        if self.run_path is None:
            raise CounterprofError("torch: no run directory (launch_environment was not called)")
        kind = ctx.target.kind
        if kind == "pid":
            raise CounterprofError("torch traces need the workload launched by counterprof "
                                   "(`counterprof run --torch -- CMD`) or counterprof.profile(); "
                                   "it cannot attach to a running process")
        if kind == "self":
            try:
                importlib.import_module("torch")
            except ImportError as exc:
                raise CounterprofError(f"torch is not importable in this process ({exc}); "
                                       "pip install 'counterprof[torch]'") from None
            drv = load_driver()
            self.driver = drv.create(str(self.run_path.resolve()), rank=ctx.rank, start_now=True,
                                     clock_offset_ns=ctx.clock.offset_ns, **self.driver_config())
            flusher = getattr(self.driver, "_flusher", None)     # the thread writing step times
            if flusher is not None and flusher.native_id is not None:
                with ctx.lock:
                    ctx.profiler_tids.add(flusher.native_id)
        self.start_polling(ctx)

    def poll(self) -> None:
        period = float(self.config["poll_s"])
        while not self._stop.wait(period):
            self.sweep()

    def candidates(self) -> list[Path]:
        """The trace files this collector converts. `counterprof run` (one profiler for the
        whole launched tree): every rank's. counterprof.profile(): only those this process's
        torch wrote; in a multi-rank job every rank has its own profile() and converts its own,
        and the other ranks' traces are theirs."""
        if self.ctx.target.kind == "self":
            if self.driver is None:
                return []
            assert self.run_path is not None      # start() checked it
            root = str(self.run_path.resolve()) + os.sep
            return [Path(p) for p in list(self.driver.written) if p.startswith(root)]
        from .trace_files import TRACE_PATTERNS   # here: a run without --torch loads none of it
        assert self.run_path is not None          # start() checked it
        return rundir.trace_files(self.run_path, *TRACE_PATTERNS)      # no link followed

    def sweep(self) -> int:
        """Convert the complete trace files not converted yet; returns how many. Each is taken
        through its claim first (claim.py): one being converted by another process (a recovery,
        another profiler of the run) is looked at again next time, one already converted is
        left alone."""
        from .claim import Claim
        found = []
        for path in self.candidates():
            if str(path) not in self.done:
                try:
                    found.append((path.stat().st_mtime_ns, path))
                except FileNotFoundError:
                    continue
        self.sweep_steps()           # before the traces: each trace's steps file exists
        converted = 0
        for _, path in sorted(found):
            claim = Claim.take_or_skip(path)
            if claim is None:
                continue                 # another process converts it right now
            with claim:
                self.done.add(str(path))
                self.seen += 1
                if claim.converted_by is not None:
                    continue             # converted by another process (recovery, a rank's own)
                self.convert(path)
                claim.mark_converted("torch collector")
                converted += 1
        return converted

    def steps_candidates(self) -> list[Path]:
        if self.ctx.target.kind == "self":
            if self.driver is None:
                return []
            return [Path(p) for p in list(self.driver.steps_paths)]
        from .steps import steps_files
        assert self.run_path is not None          # start() checked it
        return steps_files(self.run_path)

    def sweep_steps(self) -> int:
        """Emit the step and input spans written since the last sweep; returns how many. Each
        steps file's claim is held from its first read to stop (a recovery meanwhile leaves
        it to us)."""
        from .steps import StepsFile
        rows = 0
        for path in self.steps_candidates():
            sf = self.steps_files.get(str(path))
            if sf is None:
                candidate = StepsFile(path)
                if not candidate.take():
                    continue             # a recovery reads it right now: next time
                sf = self.steps_files[str(path)] = candidate
            for batch in sf.batches():
                self.ctx.emit("spans", batch, rank=sf.rank)
                rows += batch.num_rows
        self.spans += rows
        return rows

    def convert(self, path: Path) -> None:
        from .convert import TraceConversion
        from .scan import TraceFileError
        from .steps import steps_file_of_trace
        from .trace_files import rank_of_trace_dir
        rank = rank_of_trace_dir(path)
        conv = TraceConversion(path, default_rank=rank, spill_dir=path.parent,
                               drop_marks=steps_file_of_trace(path))
        t = time.perf_counter()
        try:
            for batch in conv:
                self.ctx.emit("spans", batch, rank=rank)
                self.spans += batch.num_rows
        except TraceFileError as exc:
            conv.problems.append(str(exc))
        self.convert_s.append(time.perf_counter() - t)
        self.traces += 1
        for p in conv.problems:
            msg = f"torch: {path.name}: {p}"
            self.problems.append(msg)
            self.ctx.warn(msg)

    @classmethod
    def recover(cls, run_path: Path) -> list[str]:
        """Convert the trace files a killed profiler left unconverted (or half converted),
        and the step times it had not read."""
        from .recovery import recover_traces
        from .steps import recover_steps
        return recover_steps(Path(run_path)) + recover_traces(Path(run_path))

    def stop(self) -> None:
        # not the base's: the driver writes its last window before the thread's last sweep,
        # and a failed sweep fails the collector (traces would be missing)
        if not self.polling:
            return
        if self.driver is not None:
            self.driver.close()        # writes the window in progress
            if self.driver.stopped and self.driver.stopped != "closed":
                self.problems.append(f"torch profiling stopped: {self.driver.stopped}")
        self.halt()
        try:
            self.sweep()
        except Exception as exc:
            self.ctx.fail(self.name, f"{type(exc).__name__}: {exc}")
        files = list(self.steps_files.values())
        for sf in files:
            sf.release("torch collector")
            for why in sf.stopped:
                msg = f"torch profiling stopped in pid {sf.pid}: {why}"
                if msg not in self.problems:
                    self.problems.append(msg)
        marks = sorted({m for sf in files for m in sf.marks})
        self.details.update(traces=self.traces, spans=self.spans, problems=self.problems[:20],
                            steps=sum(sf.steps for sf in files),
                            dataloader_waits=sum(sf.inputs for sf in files),
                            processes=len(files), step_marks=marks)
        windows: dict[str, int] = {}
        for sf in files:
            for k, v in sf.windows.items():
                windows[k] = windows.get(k, 0) + v
        if windows:
            self.details["time_windows"] = windows      # started, kept, empty, recording_at_exit
        from .steps import window_cost
        cost = window_cost(files, self.convert_s)
        if cost:
            self.details["window_cost"] = cost          # where the windows' cost went (steps.py)
        if self.seen == 0:
            self.status, self.reason = "empty", self.nothing_recorded(files)
            self.ctx.warn(f"torch: no trace was recorded: {self.reason}")

    def nothing_recorded(self, files: list[StepsFile]) -> str:
        """Why no trace came, in words a user can act on."""
        stopped = [f"pid {sf.pid}: {why}" for sf in files for why in sf.stopped
                   if why not in ("closed", "forked child")]
        if self.driver is not None and self.driver.stopped not in ("", "closed", "forked child"):
            stopped.append(self.driver.stopped)
        if stopped:
            return "profiling stopped: " + "; ".join(stopped[:3])
        if not files and self.ctx.target.kind == "launch":
            return ("the workload never imported torch (no Python process of it did; "
                    "`python -I`/`-S` skip the bootstrap)")
        steps = sum(sf.steps for sf in files)
        if steps:
            return (f"{steps} step(s) timed but no trace written (the process was killed "
                    "before its first window ended?)")
        if self.time_paced:
            when = ("time windows start ~1 s after torch's import and keep only those that "
                    "caught a torch op: the process ended first, or ran no op")
        else:
            when = f"a time window starts after {float(self.config['window_every_s']):g} s without them"
        return ("torch imported but no step, forward or window was seen (no counterprof.step(), "
                f"prof.step(), optimizer.step() or nn.Module call; {when})")
