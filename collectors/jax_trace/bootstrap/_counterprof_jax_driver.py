"""counterprof's JAX driver, running inside the workload's Python processes.

Loaded by the bootstrap `counterprof run --jax` puts on PYTHONPATH (the torch collector's
sitecustomize.py, which loads this file when $COUNTERPROF_JAX is set) once the process has
imported jax; processes that never import jax are left alone. It needs only the standard
library and jax: the workload's Python need not have counterprof.

Steps: every outermost `jax.profiler.StepTraceAnnotation` is timed (its class's __enter__ and
__exit__ are wrapped: two clock reads), traced or not, whatever the code that opens it (the
script, Flax, a trainer library). Nested annotations on one thread are one step. A step is
named `<annotation name>#<step_num>` (`#<n>`, the process's count from 0, without step_num),
so the ranks of a job name their steps alike. A thread of the driver appends them once a second
(and at exit) to <run>/_ranks/rank=<r>/traces/<host>_<pid>.jax.steps, in the torch driver's
steps-file format (collectors/torch_trace/steps.py reads both), on the run's clock
($COUNTERPROF_CLOCK_OFFSET_NS):
    counterprof-steps 1<TAB>pid=<pid><TAB>host=<host>     (first line)
    step<TAB><start ns><TAB><end ns><TAB><tid><TAB><name>#<step>
    marks<TAB><what marks the steps: annotation, or window>
    windows<TAB>started=<n> kept=<n> empty=<n> dropped=<n> recording_at_exit=<0|1>
    stopped<TAB><why profiling stopped in this process>

Step windows: jax.profiler.start_trace at the __enter__ of a step, stop_trace at the __exit__ of
the `active`-th step after it (each once the work dispatched so far has ended: jax dispatches
asynchronously, and the window holds its steps' device work), in the step's own thread, outside
the steps' timed spans: a window starts at step n when n % every == warmup (step 0 compiles;
the default is 5 steps every 50 after 1). The default schedule is paced: the next window waits
until this one's start and stop (the waits and the export included) are under
WINDOW_COST_SHARE of the time since. A schedule the user gives (--jax-window) is followed to
the step.

Time windows, for a process that marks no step (a benchmark's jitted loop, an inference
server): jax's profiler records every thread of the process, so the driver's own thread starts
and stops them. The first starts FIRST_WINDOW_AFTER_S after the process's first XLA compile
ends (jax.monitoring's backend_compile event: the first jitted call, or eager op), and is a
short probe; one that caught no XLA execution is dropped and tried again EMPTY_RETRY_S later,
twice as long; once one caught some, the next waits until the last one's cost (its start,
stop and export) is under WINDOW_COST_SHARE of the time since, and lasts what would cost about
WINDOW_STALL_S to stop and export at the last one's rate (MIN_WINDOW_S to `window_s`); a
window also ends once the process grew by WINDOW_GROWTH_BYTES. Each is held back under a
hidden name for HOLD_S and dropped if a step annotation comes meanwhile (a training job's
set-up is not left as a trace); at exit every one held is written, the one still recording
first. A time schedule given (`window_s` every `window_every_s`, the first `window_every_s`
after the first compile) is followed exactly.

Windows are recorded without jax's Python tracer (python_tracer_level 0: it records every
Python call, which would cost a Flax step more than its ops; `python_tracer` turns it on).
Each finished window is jax's own profile folder (plugins/profile/<session>/<host>.xplane.pb
and what jax writes beside it), recorded under a hidden name and renamed, once complete, to
<run>/_ranks/rank=<r>/traces/<host>_<pid>.<n>.jaxprof (a time window's:
<host>_<pid>.<n>.time.jaxprof), with .counterprof.json inside: pid, host, kind, and the
window's start and end on the run's clock. rank: jax.distributed's process_id once it is
initialized, else jax's process_index where the backends span several processes, else $RANK,
else the configured rank, else 0.

The script's own trace comes first: its jax.profiler.start_trace (jax.profiler.trace too) stops
a window of counterprof's that is recording (written as far as it got), and no window starts
until the script's stop_trace; its own trace is written where it asked, as without counterprof.

Nothing here may raise into the workload: a failure stops profiling in this process, with one
line on stderr, a `stopped` line in the steps file and <run>/.jax/<host>_<pid>.stopped (read
by the collector when the steps file itself could not be written); windows already written
are kept.
"""
from __future__ import annotations

import atexit
import collections
import functools
import json
import os
import shutil
import socket
import sys
import threading
import time

TYPE_CHECKING = False     # (typing.TYPE_CHECKING without importing typing into the workload)
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    _LoaderBase = Loader
else:
    _LoaderBase = object

ENV = "COUNTERPROF_JAX"
ENV_CLOCK_OFFSET = "COUNTERPROF_CLOCK_OFFSET_NS"      # counterprof.regions.ENV_CLOCK_OFFSET
STEPS_SUFFIX = ".jax.steps"
PROFILE_SUFFIX = ".jaxprof"
TIME_PROFILE_SUFFIX = ".time.jaxprof"
META = ".counterprof.json"     # hidden: a walk for trace files (counterprof import) skips it
STOPPED_DIR = ".jax"            # <run>/.jax/<host>_<pid>.stopped
DEFAULTS = {"every": 50, "active": 5, "warmup": 1, "paced": False, "window_s": 2.0,
            "window_every_s": 20.0, "time_paced": False, "python_tracer": False, "rank": None,
            "clock_offset_ns": None}
WINDOW_COST_SHARE = 0.05       # the most of a run's time that windows' start and stop may take
FIRST_WINDOW_AFTER_S = 0.5     # after the first compile ended: the first time window
PROBE_WINDOW_S = 0.1           # the first time window: what it costs per second sets the next
EMPTY_RETRY_S = 0.5            # after a window that caught no XLA execution (twice as long)
MIN_WINDOW_S = 0.05
WINDOW_STALL_S = 0.25          # what one time window's stop and export should cost, about
WINDOW_GROWTH_BYTES = 32 << 20 # a time window ends once the process grew this much
WINDOW_POLL_S = 0.05           # how often a time window's end and growth are checked
HOLD_S = 3.0                   # a time window is held back this long for a step annotation
EMPTY_TRACE_CHECK_BYTES = 1 << 20   # an xplane under this is read for an execution
EXECUTION_MARK = b"Execute"    # in every PjRt client's host events of an executable's run
FLUSH_EVERY_S = 1.0
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_monotonic_ns = time.monotonic_ns
_native_id = threading.get_native_id
_ident = threading.get_ident
try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096

_driver: Driver | None = None
# jax's own start_trace and stop_trace, before the wrappers (counterprof's windows call these)
_start_trace: Callable[..., Any] | None = None
_stop_trace: Callable[..., Any] | None = None


def _say(message: str) -> None:
    try:
        print(f"counterprof: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


class _Why(Exception):
    """A failure whose message says it all (no exception type in front of it)."""


def _reason(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, _Why) else f"{type(exc).__name__}: {exc}"
    return text.replace("\n", " ").replace("\t", " ")


def _make_folder(folder: str) -> None:
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise _Why(f"cannot create the run's traces folder {folder}: {exc.strerror or exc}") from None


def _rmtree(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def _backends_ready() -> bool:
    """A window starts only once jax has its backends: start_trace would otherwise create them,
    from counterprof's code, before the script's jax.distributed.initialize."""
    xb = sys.modules.get("jax._src.xla_bridge")
    try:
        return xb is not None and bool(xb.backends_are_initialized())
    except Exception:
        return False


def _someone_traces() -> bool:
    """jax's profiler session is taken (by a trace counterprof did not see start)."""
    jp = sys.modules.get("jax._src.profiler")
    state = getattr(jp, "_profile_state", None)
    return state is not None and getattr(state, "profile_session", None) is not None


def _drain_device() -> None:
    """Wait for the work dispatched so far (jax dispatches asynchronously: a step's __exit__ may
    come before its device work ends), so a step window holds its steps' device work and no
    earlier step's. At a window's start and end, outside the steps' timed spans; its time counts
    in the window's cost."""
    jax = sys.modules.get("jax")
    try:
        arrays = jax.live_arrays() if jax is not None else []
    except Exception:
        return
    for a in arrays:
        try:
            a.block_until_ready()
        except Exception:
            pass                      # deleted or donated meanwhile: nothing to wait for


def _caught_an_execution(folder: str) -> bool:
    """Did this profile record an XLA executable's run? A large one did; a small one is read
    for the host event every PjRt client records around one."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if not name.endswith(".xplane.pb"):
                continue
            path = os.path.join(root, name)
            try:
                if os.path.getsize(path) >= EMPTY_TRACE_CHECK_BYTES:
                    return True
                with open(path, "rb") as f:
                    if EXECUTION_MARK in f.read():
                        return True
            except OSError:
                return True           # kept: a read problem is not hidden as an empty window
    return False


class Driver:
    def __init__(self, run: str, **config: Any):
        cfg = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        self.run = run
        self.every = int(cfg["every"])
        self.active = int(cfg["active"])
        self.warmup = int(cfg["warmup"])
        self.paced = bool(cfg["paced"])
        self.time_paced = bool(cfg["time_paced"])
        self.window_s = float(cfg["window_s"])
        self.window_every_s = float(cfg["window_every_s"])
        self.python_tracer = bool(cfg["python_tracer"])
        self.rank = cfg["rank"]
        self.known_rank: int | None = None
        self.announced = False        # the rank watcher was told this process's rank
        self.pid = os.getpid()
        self.host = socket.gethostname().split(".")[0]
        offset: Any = cfg["clock_offset_ns"] if cfg["clock_offset_ns"] is not None \
            else os.environ.get(ENV_CLOCK_OFFSET)
        try:
            self.offset_ns = int(offset)
        except (TypeError, ValueError):
            self.offset_ns = time.time_ns() - _monotonic_ns()
        self.lock = threading.RLock()   # counterprof's trace session and the windows' state
        self.stopped = ""             # why this process stopped profiling
        self.closing = False
        self.marks = ""               # "annotation" once a StepTraceAnnotation was seen
        self.steps = 0                # outermost step annotations entered
        self._depth: dict[int, int] = {}
        self.user_traces = 0          # the script's own traces recording now
        # counterprof's trace session, while one records
        self.session = ""             # "step" or "time"
        self.session_dir = ""         # its hidden folder
        self.session_started_ns = 0   # monotonic
        self.window_steps = 0         # steps ended in the step window recording now
        self.window_cost_s = 0.0      # the step window's start (its stop is added at the end)
        self.next_window_at = 0.0     # monotonic s before which no paced step window starts
        self.step_windows = 0
        # time windows (no step annotation)
        self.compiled_at: float | None = None
        self.window_len = PROBE_WINDOW_S if self.time_paced else self.window_s
        self.next_window = float("inf")   # set at the first compile
        self.window_end = 0.0
        self.window_started = 0.0
        self.window_start_cost_s = 0.0
        self.window_rss = 0
        self.window_rss_first = False
        self.window_full = False
        self.window_empty = False
        self.windows = 0              # time windows started
        self.windows_kept = 0
        self.empty_windows = 0
        self.dropped_windows = 0      # recorded before the first step annotation: dropped
        self.held: list[tuple[float, str]] = []   # (ended, hidden folder) of time windows held
        self.hidden = 0               # hidden folders made (their names)
        self.seq = 0                  # profiles written
        self.written: list[str] = []
        # the steps file
        self._records: collections.deque[tuple[str, int, int, int, str]] = collections.deque()
        self._files: dict[str, int] = {}
        self.steps_paths: list[str] = []
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._statm: int | None = None
        # `counterprof trace` asks (the torch driver's docstring): the one being served
        self.asks_seen: set[str] = set()
        self.ask: dict[str, Any] | None = None
        self.ask_first = -1           # its first traced step (-1: not started)
        self.ask_time = False         # a time window serves it (no step annotations)

    # -- installing ---------------------------------------------------------------------------

    def install(self) -> None:
        """Wrap the step annotation and the profiler's start and stop, listen for the first
        compile, start the thread that writes the steps and runs the time windows."""
        import jax.monitoring as monitoring
        from jax._src import profiler as jp
        _patch_steps(jp)
        _patch_profiler(jp)
        _patch_distributed()
        monitoring.register_event_duration_secs_listener(_on_duration_event)
        self._thread = threading.Thread(target=self._loop, name="counterprof-jax", daemon=True)
        self._thread.start()
        if ENV in os.environ:         # `counterprof trace` may ask it for a window
            self._control("drivers", {"rank": self.current_rank(), "started_ns": time.time_ns(),
                                      "argv": sys.argv[:1], "framework": "jax"})
        atexit.register(self.close)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # a forked child inherits this state, not the thread: it profiles nothing
        self.stopped = self.stopped or "forked child"
        self.lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._records.clear()
        self._files = {}
        self.held = []
        self.session = ""
        self._statm = None
        self.ask, self.ask_time = None, False    # the parent's to serve

    # -- steps --------------------------------------------------------------------------------

    def step_enters(self, ann: Any) -> None:
        tid = _ident()
        depth = self._depth.get(tid, 0)
        self._depth[tid] = depth + 1
        if depth or self.stopped or os.getpid() != self.pid:
            return                    # an inner annotation: the outer one is the step
        try:
            if not self.marks:
                self._first_mark()
            n = self.steps
            self.steps = n + 1
            if self.ask is not None and not self.ask_time and self.ask_first < 0 and not self.session \
                    and n >= int(self.ask.get("start_step") or 0):
                self._start_ask(n)
            elif not self.session and self._step_window_due(n):
                self._start_step_window()
            ann._counterprof = (n, _monotonic_ns())
        except Exception as exc:
            self._fail(exc)

    def step_exits(self, ann: Any) -> None:
        now = _monotonic_ns()
        tid = _ident()
        depth = self._depth.get(tid, 1) - 1
        if depth > 0:
            self._depth[tid] = depth
            return
        self._depth.pop(tid, None)
        try:
            begun = ann.__dict__.pop("_counterprof", None)
            if begun is None or self.stopped or os.getpid() != self.pid:
                return
            n, start = begun
            name, num = getattr(ann, "_counterprof_name", ("step", None))
            self._records.append(("step", start, now, _native_id(),
                                  f"{name}#{num if num is not None else n}"))
            if self.session == "step":
                self.window_steps += 1
                if self.window_steps >= self.active:
                    self._stop_step_window()
            elif self.session == "ask":
                self.window_steps += 1
                if self.ask is not None and self.window_steps >= max(1, int(self.ask.get("steps") or 1)):
                    self._finish_ask()
        except Exception as exc:
            self._fail(exc)

    def _first_mark(self) -> None:
        """Steps are annotated: time windows end (the driver's thread drops the one recording)
        and those held were the job's set-up."""
        self.marks = "annotation"
        self._records.append(("marks", 0, 0, 0, "annotation"))
        self._wake.set()
        if self.held:
            with self.lock:
                held, self.held = self.held, []
                self.dropped_windows += len(held)
            for _, folder in held:
                _rmtree(folder)

    def _step_window_due(self, n: int) -> bool:
        if self.user_traces or self.closing or n % self.every != self.warmup or self.ask is not None:
            return False
        return not self.paced or time.monotonic() >= self.next_window_at

    def _start_step_window(self) -> None:
        # never wait on the driver's thread (it may be stopping a time window): the next
        # period's step tries again
        if not self.lock.acquire(blocking=False):
            return
        try:
            if self.session or self.stopped or not _backends_ready() or _someone_traces():
                return
            t = time.monotonic()
            _drain_device()           # the window holds its own steps' work, not a backlog's
            self._start_session("step")
            self.window_steps = 0
            self.window_cost_s = time.monotonic() - t
            self.step_windows += 1
        finally:
            self.lock.release()

    def _stop_step_window(self) -> None:
        with self.lock:
            if self.session != "step":
                return
            t = time.monotonic()
            _drain_device()
            folder = self._stop_session(keep=True)
            self._publish(folder, PROFILE_SUFFIX)
            now = time.monotonic()
            self.window_cost_s += now - t
            if self.paced:
                self.next_window_at = now + self.window_cost_s / WINDOW_COST_SHARE

    # -- counterprof's trace session ------------------------------------------------------------

    def _start_session(self, kind: str) -> None:
        folder = self._traces_folder()
        _make_folder(folder)
        self.hidden += 1
        hidden = os.path.join(folder, f".{self.host}_{self.pid}.rec{self.hidden}.tmp")
        _rmtree(hidden)
        options = None
        try:
            from jax._src.profiler import ProfileOptions
            options = ProfileOptions()
            options.python_tracer_level = 1 if self.python_tracer else 0
        except (ImportError, AttributeError):
            pass                      # an older jax: its default options
        start_trace = _start_trace
        assert start_trace is not None          # set by _patch_profiler, at install
        if options is not None:
            start_trace(hidden, profiler_options=options)
        else:
            start_trace(hidden)
        self.session, self.session_dir = kind, hidden
        self.session_started_ns = _monotonic_ns()

    def _stop_session(self, keep: bool) -> str | None:
        """End counterprof's session; its hidden folder with .counterprof.json written (keep),
        or None (dropped)."""
        kind, folder, started = self.session, self.session_dir, self.session_started_ns
        self.session, self.session_dir = "", ""
        if not kind:
            return None
        ended = _monotonic_ns()
        stop_trace = _stop_trace
        assert stop_trace is not None           # set by _patch_profiler, at install
        try:
            stop_trace()              # writes the profile into the folder
        except BaseException:
            _rmtree(folder)
            raise
        if not keep:
            _rmtree(folder)
            return None
        doc = {"pid": self.pid, "host": self.host, "kind": kind,
               "start_ns": started + self.offset_ns, "end_ns": ended + self.offset_ns}
        with open(os.path.join(folder, META), "w") as f:
            json.dump(doc, f)
        return folder

    def _publish(self, folder: str | None, suffix: str) -> None:
        """Rename a complete profile folder into place: the collector converts only those."""
        if not folder:
            return
        self.flush(touch=True)        # the steps file exists before the profile (collector)
        target = self._next_path(suffix)
        os.rename(folder, target)
        self.written.append(target)

    # -- the script's own traces ----------------------------------------------------------------

    def user_trace_starts(self) -> None:
        """The script starts its own trace: counterprof's window recording now ends first
        (written), and none starts until the script's stop_trace."""
        if os.getpid() != self.pid:
            return
        self.user_traces += 1
        try:
            with self.lock:
                if self.session == "step":
                    self._publish(self._stop_session(keep=True), PROFILE_SUFFIX)
                elif self.session == "time":
                    self._end_time_window(self._stop_session(keep=True), time.monotonic())
        except Exception as exc:
            self._fail(exc)

    def user_trace_ended(self) -> None:
        if self.user_traces > 0:
            self.user_traces -= 1

    # -- time windows (no step annotation) ------------------------------------------------------

    def compiled(self) -> None:
        """The process's first XLA compile ended: time windows may start."""
        if self.compiled_at is not None:
            return
        self.compiled_at = now = time.monotonic()
        self.next_window = now + (FIRST_WINDOW_AFTER_S if self.time_paced else self.window_every_s)
        self._wake.set()

    def _time_window_wanted(self, now: float) -> bool:
        due = now >= self.next_window or (self.ask_time and self.ask_first < 0)
        return (not self.marks and not self.stopped and not self.closing and not self.session
                and not self.user_traces and due and os.getpid() == self.pid
                and _backends_ready() and not _someone_traces())

    def _window_tick(self, now: float) -> None:
        with self.lock:
            if self.closing:
                return                # close() writes the window recording now
            if self.session == "time":
                if self.marks:
                    self._stop_session(keep=False)     # steps came: their windows from here
                    self.dropped_windows += 1
                elif now >= self.window_end or self._window_grew():
                    stopped = time.monotonic()
                    if self.ask_time and self.ask is not None and self.ask_first == 0:
                        self._finish_ask()
                    else:
                        self._end_time_window(self._stop_session(keep=True), stopped)
                return
            if not self._time_window_wanted(now):
                return
            t = time.monotonic()
            self.window_full = False
            self.window_rss = self._rss() if self.time_paced else 0
            self.window_rss_first = True
            self._start_session("time")
            self.window_started = started = time.monotonic()
            self.window_start_cost_s = started - t
            self.window_end = started + self.window_len
            if self.ask_time and self.ask is not None:
                self.window_end = started + (self.ask.get("ms") or 1000 * self.window_s) / 1000
                self.ask_first = 0
            self.windows += 1
            self.next_window = now + self.window_every_s     # a schedule given; paced: at its end

    def _end_time_window(self, folder: str | None, stopped: float) -> None:
        """A time window's profile is written (folder, hidden): dropped if it caught no
        execution, held (the adaptive schedule) or renamed into place (a schedule given); the
        next window is paced by what this one cost."""
        self.window_empty = False
        if folder is not None and not _caught_an_execution(folder):
            _rmtree(folder)
            folder = None
            self.window_empty = True
            self.empty_windows += 1
        if folder is not None:
            if self.time_paced and not self.closing:
                self.held.append((time.monotonic(), folder))
            else:
                self._publish(folder, TIME_PROFILE_SUFFIX)
                self._window_kept()
        if self.time_paced:
            self._pace_time_windows(stopped, time.monotonic())

    def _window_kept(self) -> None:
        self.windows_kept += 1
        if self.windows_kept == 1:
            self._records.append(("marks", 0, 0, 0, "window"))

    def _pace_time_windows(self, stopped: float, now: float) -> None:
        """The adaptive schedule: an empty window is tried again soon, twice as long; after one
        that caught executions, the next waits until this one's cost is under
        WINDOW_COST_SHARE of the time since (at least as long as it recorded), and lasts what
        costs about WINDOW_STALL_S to stop and export at this one's rate."""
        if self.window_empty:
            self.next_window = now + EMPTY_RETRY_S
            self.window_len = min(self.window_s, self.window_len * 2)
            return
        recorded = max(stopped - self.window_started, 1e-3)
        cost = self.window_start_cost_s + (now - stopped)
        per_s = cost / recorded
        self.window_len = self.window_s if per_s <= 0 else \
            min(self.window_s, max(MIN_WINDOW_S, WINDOW_STALL_S / per_s))
        self.next_window = now + max(recorded, cost / WINDOW_COST_SHARE)

    def _release_held(self, every: bool = False) -> None:
        """Rename the held time windows into place: those held HOLD_S with no step annotation
        since, or every one (at exit)."""
        if not self.held or os.getpid() != self.pid:
            return
        with self.lock:
            if self.marks:
                return                # (dropped by _first_mark)
            now = time.monotonic()
            due = [h for h in self.held if every or now - h[0] >= HOLD_S]
            self.held = [h for h in self.held if h not in due]
            for _, folder in due:
                self._publish(folder, TIME_PROFILE_SUFFIX)
                self._window_kept()

    def _rss(self) -> int:
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return 0

    def _window_grew(self) -> bool:
        """The time window holds about WINDOW_GROWTH_BYTES of events: the process grew that
        much over its size at the window's first reading, in two readings in a row (a loop's
        arrays allocated and freed move the size both ways; the profiler's events only add)."""
        if not self.time_paced or not self.window_rss:
            return False
        rss = self._rss()
        if self.window_rss_first:
            self.window_rss_first = False
            self.window_rss = max(self.window_rss, rss)
            return False
        if rss - self.window_rss < WINDOW_GROWTH_BYTES:
            self.window_full = False
            return False
        if self.window_full:
            return True
        self.window_full = True
        return False

    # -- the driver's thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        flushed = time.monotonic()
        while True:
            self._wake.wait(self._next_wake(flushed))
            self._wake.clear()
            if self.closing or os.getpid() != self.pid:
                return
            now = time.monotonic()
            try:
                if now - flushed >= FLUSH_EVERY_S:
                    flushed = now
                    self.flush()
                    self._release_held()
                    if self.ask is None:
                        self._poll_asks()
                if not self.stopped:
                    self._window_tick(time.monotonic())
            except Exception as exc:
                self._fail(exc)

    def _next_wake(self, flushed: float) -> float:
        now = time.monotonic()
        wait = max(0.01, flushed + FLUSH_EVERY_S - now)
        if self.session == "time":
            return min(wait, WINDOW_POLL_S, max(0.002, self.window_end - now))
        if not (self.marks or self.stopped) and self.next_window > now:
            wait = min(wait, max(0.01, self.next_window - now))
        return wait

    # -- the end --------------------------------------------------------------------------------

    def close(self) -> None:
        """At exit: the window recording now is written, then every held one, then the steps."""
        if os.getpid() != self.pid:
            return
        self.closing = True
        self._wake.set()
        try:
            with self.lock:
                if self.session == "ask" or (self.ask_time and self.ask_first == 0 and self.session == "time"):
                    self._finish_ask()
                elif self.ask is not None:
                    self._answer("not reached", why="the process ended before its window began")
                at_exit = self.session == "time"
                if self.session == "step":
                    self._publish(self._stop_session(keep=True), PROFILE_SUFFIX)
                elif at_exit:
                    stopped = time.monotonic()
                    self.dropped_windows += bool(self.marks)
                    self._end_time_window(self._stop_session(keep=not self.marks), stopped)
                self._release_held(every=True)
                if self.windows:
                    self._records.append(("windows", 0, 0, 0,
                                          f"started={self.windows} kept={self.windows_kept} "
                                          f"empty={self.empty_windows} dropped={self.dropped_windows} "
                                          f"recording_at_exit={int(at_exit)}"))
                self.stopped = self.stopped or "closed"
        except Exception as exc:
            self._fail(exc)
        self.flush(final=True)
        with self._flush_lock:
            files, self._files = self._files, {}
        for fd in [*files.values(), self._statm]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._statm = None

    # -- asked windows (counterprof trace) --------------------------------------------------------

    def _control(self, sub: str, doc: dict[str, Any]) -> None:
        try:
            from _counterprof_torch_driver import _write_control    # the bootstrap's folder
            _write_control(self.run, sub, f"{self.host}_{self.pid}.json", {"pid": self.pid, "host": self.host, **doc})
        except Exception as exc:
            _say(f"counterprof trace: pid {self.pid} could not write {sub}: {type(exc).__name__}: {exc}")

    def _poll_asks(self) -> None:
        """The driver's thread, once a second: the first ask not seen yet is served."""
        if self.stopped or self.closing:
            return
        from _counterprof_torch_driver import next_ask     # the bootstrap's folder
        doc = next_ask(self.run, self.asks_seen)
        if doc is not None:
            with self.lock:
                doc["seen_ns"] = time.time_ns()
                self.ask, self.ask_first = doc, -1
                if self.user_traces:
                    self._answer("not reached", why="the script runs its own jax.profiler trace")
                    return
                self.ask_time = not self.marks          # no step annotations: a time window
                if self.ask_time and self.session == "time":
                    self.window_end = time.monotonic()  # the window recording now ends first

    def _start_ask(self, n: int) -> None:
        if not self.lock.acquire(blocking=False):
            return                    # (the next step tries again)
        try:
            if self.session or self.stopped or not _backends_ready() or _someone_traces():
                return
            _drain_device()
            self._start_session("ask")
            self.window_steps, self.ask_first = 0, n
        finally:
            self.lock.release()

    def _finish_ask(self) -> None:
        """Stop the asked window, write it (named after the ask) and answer."""
        with self.lock:
            ask = self.ask
            if ask is None:
                return
            _drain_device()
            folder = self._stop_session(keep=True)
            suffix = f".ask-{ask['id']}" + (TIME_PROFILE_SUFFIX if self.ask_time else PROFILE_SUFFIX)
            self._publish(folder, suffix)
            if not folder:
                self._answer("not reached", why="the trace could not be written")
                return
            path = self.written[-1]
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
            if self.ask_time:
                self._answer("traced", ms=round((_monotonic_ns() - self.session_started_ns) / 1e6),
                             file=os.path.basename(path), bytes=size)
            else:
                self._answer("traced", steps=[self.ask_first, self.ask_first + self.window_steps - 1],
                             file=os.path.basename(path), bytes=size)

    def _answer(self, status: str, **fields: Any) -> None:
        ask, self.ask, self.ask_time, self.ask_first = self.ask, None, False, -1
        if ask is not None:
            self._control(os.path.join("answers", str(ask["id"])),
                          {"rank": self.current_rank(), "status": status, "seen_ns": ask.get("seen_ns"),
                           "answered_ns": time.time_ns(), **fields})

    def _fail(self, exc: BaseException) -> None:
        """Profiling stops in this process, with the reason; the workload goes on."""
        if not self.stopped or self.stopped == "closed":
            self.stopped = _reason(exc)
            _say(f"jax profiling stopped in pid {os.getpid()}: {self.stopped}")
            self._records.append(("stopped", 0, 0, 0, self.stopped))
            self._note_stopped(self.stopped)
        if self.ask is not None:
            self._answer("not reached", why=f"profiling stopped in this process: {self.stopped}")
        try:
            with self.lock:
                self._stop_session(keep=False)     # the window recording now is dropped
        except Exception:
            pass

    def _note_stopped(self, reason: str) -> None:
        """Where the collector finds the reason when the steps file cannot be written."""
        try:
            folder = os.path.join(self.run, STOPPED_DIR)
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass
            fd = os.open(os.path.join(folder, f"{self.host}_{self.pid}.stopped"),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, reason.encode() + b"\n")
            finally:
                os.close(fd)
        except Exception:
            pass

    # -- where things go ------------------------------------------------------------------------

    def current_rank(self) -> int:
        try:
            dist = sys.modules.get("jax._src.distributed")
            state = getattr(dist, "global_state", None)
            if state is not None and getattr(state, "client", None) is not None:
                self.known_rank = int(state.process_id)
                self._announce(self.known_rank, getattr(state, "num_processes", None))
                return self.known_rank
            if self.known_rank is None and _backends_ready():
                import jax
                if jax.process_count() > 1:       # a multi-process backend set up without it
                    self.known_rank = int(jax.process_index())
        except Exception:
            pass
        if self.known_rank is not None:
            return self.known_rank
        for value in (os.environ.get("RANK"), self.rank):
            try:
                if value is not None:
                    return int(value)
            except ValueError:
                pass
        return 0

    def _announce(self, rank: int, world: int | None) -> None:
        """Tell the rank watcher (counterprof/ranks.py) this process is rank `rank`, once, as
        the torch driver does for torch.distributed: `run --jax`'s per-rank collectors then
        count each rank apart. Under `counterprof run` only; never raises."""
        if self.announced or ENV not in os.environ:
            return
        self.announced = True
        try:
            from _counterprof_torch_driver import write_announcement    # the bootstrap's folder
            local = os.environ.get("LOCAL_RANK", "")
            write_announcement(self.run, {
                "pid": self.pid, "rank": int(rank),
                "world_size": int(world) if isinstance(world, int) and world > rank else None,
                "local_rank": int(local) if local.isdigit() else None, "host": self.host,
                "source": "jax.distributed"})
        except Exception as exc:
            _say(f"could not announce the rank of pid {self.pid}: {type(exc).__name__}: {exc}")

    def _traces_folder(self) -> str:
        # counterprof.store.rundir.traces_dir(run, rank) (this module cannot import counterprof)
        return os.path.join(self.run, "_ranks", f"rank={self.current_rank()}", "traces")

    def _next_path(self, suffix: str) -> str:
        folder = self._traces_folder()
        _make_folder(folder)
        with self.lock:
            self.seq += 1
            seq = self.seq
        return os.path.join(folder, f"{self.host}_{self.pid}.{seq}{suffix}")

    def _steps_fd(self) -> int:
        folder = self._traces_folder()
        path = os.path.join(folder, f"{self.host}_{self.pid}{STEPS_SUFFIX}")
        fd = self._files.get(path)
        if fd is None:
            _make_folder(folder)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            self._files[path] = fd
            self.steps_paths.append(path)
            if os.fstat(fd).st_size == 0:
                os.write(fd, f"counterprof-steps 1\tpid={self.pid}\thost={self.host}\n".encode())
        return fd

    def flush(self, final: bool = False, touch: bool = False) -> None:
        """Append the buffered records to the steps file (the thread does it once a second;
        final: at exit, the file made even with none, so the collector knows jax was imported;
        touch: made before a profile is written)."""
        if os.getpid() != self.pid:
            return
        with self._flush_lock:
            records = self._records
            if not records and not final and not touch:
                return
            off = self.offset_ns
            lines = []
            try:
                while True:
                    kind, start, end, tid, what = records.popleft()
                    if kind == "step":
                        lines.append(f"step\t{start + off}\t{end + off}\t{tid}\t{what}\n")
                    else:
                        lines.append(f"{kind}\t{what}\n")
            except IndexError:
                pass
            try:
                fd = self._steps_fd()
                data = "".join(lines).encode()
                while data:
                    data = data[os.write(fd, data):]
            except Exception as exc:   # the run's folder cannot be written: the workload goes on
                if not self.stopped or self.stopped == "closed":
                    self.stopped = f"could not write the step times: {_reason(exc)}"
                    _say(f"jax profiling stopped in pid {os.getpid()}: {self.stopped}")
                    self._note_stopped(self.stopped)


# -- the wrappers -------------------------------------------------------------------------------

def _patch_steps(jp: Any) -> None:
    """Time every StepTraceAnnotation: its class's __init__ keeps the name and step_num,
    __enter__ and __exit__ time the step (subclasses inherit them)."""
    cls = jp.StepTraceAnnotation
    if cls.__dict__.get("_counterprof_patched"):
        return
    init, enter, leave = cls.__init__, cls.__enter__, cls.__exit__

    @functools.wraps(init)
    def __init__(self: Any, name: str, **kwargs: Any) -> None:
        init(self, name, **kwargs)
        try:
            self._counterprof_name = (name, kwargs.get("step_num"))
        except AttributeError:        # a subclass without a __dict__: named "step#<n>"
            pass

    def __enter__(self: Any) -> Any:
        drv = _driver
        if drv is not None:
            drv.step_enters(self)
        return enter(self)

    def __exit__(self: Any, *exc: Any) -> Any:
        try:
            return leave(self, *exc)
        finally:
            drv = _driver
            if drv is not None:
                drv.step_exits(self)

    cls.__init__, cls.__enter__, cls.__exit__ = __init__, __enter__, __exit__
    cls._counterprof_patched = True


def _patch_profiler(jp: Any) -> None:
    """The script's own start_trace / stop_trace (and jax.profiler.trace, which calls them)
    go first: counterprof's window makes way. counterprof calls jax's originals."""
    global _start_trace, _stop_trace
    if getattr(jp.start_trace, "_counterprof", False):
        return
    original_start, original_stop = jp.start_trace, jp.stop_trace
    _start_trace, _stop_trace = original_start, original_stop

    @functools.wraps(original_start)
    def start_trace(*args: Any, **kwargs: Any) -> Any:
        drv = _driver
        if drv is not None:
            drv.user_trace_starts()
        try:
            return original_start(*args, **kwargs)
        except BaseException:
            if drv is not None:
                drv.user_trace_ended()
            raise

    @functools.wraps(original_stop)
    def stop_trace(*args: Any, **kwargs: Any) -> Any:
        drv = _driver
        if drv is not None and drv.session and not drv.user_traces:
            # what jax says without counterprof: the session running is counterprof's
            raise RuntimeError("No profile started")
        try:
            return original_stop(*args, **kwargs)
        finally:
            if drv is not None:
                drv.user_trace_ended()

    start_trace.__dict__["_counterprof"] = stop_trace.__dict__["_counterprof"] = True
    public: Any = sys.modules.get("jax.profiler")
    for module in (jp, public):
        if module is None:
            continue
        if getattr(module, "start_trace", None) is original_start:
            module.start_trace = start_trace
        if getattr(module, "stop_trace", None) is original_stop:
            module.stop_trace = stop_trace
    original_fdo = getattr(jp, "stop_and_get_fdo_profile", None)
    if original_fdo is not None:
        @functools.wraps(original_fdo)
        def stop_and_get_fdo_profile(*args: Any, **kwargs: Any) -> Any:
            try:
                return original_fdo(*args, **kwargs)
            finally:
                drv = _driver
                if drv is not None:
                    drv.user_trace_ended()

        for module in (jp, public):
            if module is not None and getattr(module, "stop_and_get_fdo_profile", None) is original_fdo:
                module.stop_and_get_fdo_profile = stop_and_get_fdo_profile


def _on_duration_event(event: str, *args: Any, **kwargs: Any) -> None:
    # called inside jax's compile: it never raises into it
    if event == COMPILE_EVENT:
        drv = _driver
        if drv is not None and drv.compiled_at is None:
            try:
                drv.compiled()
            except Exception:
                pass


# -- start-up -----------------------------------------------------------------------------------

def get() -> Driver | None:
    return _driver


def _patch_distributed() -> None:
    """Announce the rank right after the script's jax.distributed.initialize returns (the
    flusher's once-a-second current_rank() would be up to a second late)."""
    import jax
    dist: Any = getattr(jax, "distributed", None)
    original = getattr(dist, "initialize", None)
    if original is None or getattr(original, "_counterprof", False):
        return

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        drv = _driver
        if drv is not None and drv.pid == os.getpid():
            drv.current_rank()
        return result

    initialize.__dict__["_counterprof"] = True
    dist.initialize = initialize


def create(run: str, **config: Any) -> Driver:
    """The process's driver (one per process), its wrappers installed; jax is imported."""
    global _driver
    if _driver is not None and _driver.pid == os.getpid() and not _driver.stopped:
        return _driver
    _driver = Driver(run, **config)
    _driver.install()
    return _driver


def _on_jax_imported() -> None:
    try:
        config = json.loads(os.environ[ENV])
        run = config.pop("run")
        create(run, **config)
    except Exception as exc:
        _say(f"jax profiling not started in pid {os.getpid()}: {type(exc).__name__}: {exc}")
        drv = _driver
        if drv is not None:
            drv._fail(exc)


class _JaxImportWatcher:
    """A meta path finder that runs _on_jax_imported once `import jax` has finished."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != "jax":
            return None
        import importlib.util
        sys.meta_path.remove(self)          # one shot; the real finders do the finding
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExec(spec.loader)
        return spec


class _AfterExec(_LoaderBase):
    def __init__(self, loader: Loader):
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader          # leave no trace of the wrapper
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        _on_jax_imported()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def install_from_env() -> None:
    """From sitecustomize: profile this process once it imports jax."""
    if ENV not in os.environ:
        return
    if "jax" in sys.modules:
        _on_jax_imported()
        return
    if not any(isinstance(f, _JaxImportWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _JaxImportWatcher())
