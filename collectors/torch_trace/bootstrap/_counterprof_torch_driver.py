"""counterprof's torch.profiler driver, running inside the workload's Python processes.

Loaded by the bootstrap (sitecustomize.py next to this file) in processes launched by
`counterprof run --torch`, and by the torch collector itself for `counterprof.profile(...)`.
It needs only the standard library and torch: the workload's Python need not have counterprof.
Always imported under the name `_counterprof_torch_driver`, so counterprof.step() finds it.

Windows: the profiler records `active` steps every `every` steps (warming up `warmup` steps
before each window), step 0 being the first step mark. Step marks, in order of preference:
counterprof.step(), the step() of a torch.profiler.profile the script runs itself, every
optimizer.step() (a global post hook), so an unmodified training script is windowed with no
change, and, when none of those comes, each outermost call of an nn.Module that has parameters
(an inference loop, a benchmark). A higher kind of mark replaces a lower one for the rest of the
process (no step counted twice). A process with none of them is
recorded in time windows instead (started and stopped in the main thread through a SIGURG
handler, recording every thread). The default time schedule adapts (`time_paced`): the first
window starts FIRST_WINDOW_AFTER_S after torch's import finished (or when the main thread next
runs Python) and is a short probe (PROBE_WINDOW_S); a window that caught no torch op is dropped
and tried again EMPTY_RETRY_S later, twice as long (a script that imports more libraries, or
reads its data, before its first op; ops longer than the probe); once one caught ops, each next
window waits until the last one's cost (the main thread's time in the profiler's start, stop
and export) is under WINDOW_COST_SHARE of the time since, and lasts what would cost about
WINDOW_STALL_S to stop and export at the last one's rate (MIN_WINDOW_S to `window_s`): torch
keeps every event in memory and stopping costs ~10-20x recording them, so a loop of µs ops gets
windows of tens of ms, a loop of ms ops 2 s ones. A window also ends early once the process grew
by WINDOW_GROWTH_BYTES (ops became much faster than in the last window). Each adaptive window's
trace is held back under a hidden name for HOLD_S and dropped if a step mark comes meanwhile (a
training job's set-up is not left as a trace), else written; at exit every one held is written,
the one still recording first, so a job shorter than a window still leaves a trace. A schedule
the user gives is followed exactly: `window_s` seconds every `window_every_s`, the first after
`window_every_s`, each written as it ends. A script that runs its own torch.profiler keeps it:
counterprof stands down and keeps a copy of each trace the script exports from that profiler
instead.

Window cost (issue 35): the default step schedule is paced by each window's measured cost,
what it added to the loop (its wall time from the profiler's start to the end of its stop and
export, less as many steps at the loop's median step time outside windows; at least its calls
into the profiler): the next window waits until that cost is under STEP_WINDOW_COST_SHARE of the
time since. The first window, started before any step time is known, is paced by its calls
alone; it holds the profiler's one-time set-up, told apart in the account. Our profilers are
made trace_only where torch has it (2.12+, not with with_stack): their stop builds no Python
event objects, the bulk of a short window's stop on a serving loop.

Every step, traced or not, and every DataLoader `next()` is timed (two clock reads) and
buffered; a thread of the driver appends them once a second (and at exit) to
<run>/rank=<rank>/traces/<host>_<pid>.steps, one tab-separated line each, on the run's clock
($COUNTERPROF_CLOCK_OFFSET_NS):
    counterprof-steps 1<TAB>pid=<pid><TAB>host=<host>     (first line)
    step<TAB><start ns><TAB><end ns><TAB><tid><TAB>ProfilerStep#<n>
    input<TAB><start ns><TAB><end ns><TAB><tid><TAB>enumerate(DataLoader)#<iterator class>.__next__
    marks<TAB><what marks the steps: counterprof, profiler, optimizer, forward or window>
    stopped<TAB><why profiling stopped in this process>
    wcost<TAB><start ns><TAB><end ns><TAB><tid><TAB><key=value ...>
tid is the OS thread id, as Kineto writes it on Linux. A wcost line is one finished window's
account, from its profiler's start to the end of its stop and export: a step window's n, steps
(marks while it recorded), start_us, step_calls_us, stop_us, export_us (its profiler calls),
recorded_excess_us (what its steps took over the loop's median step, '-' before one is known),
step_us (that median), wall_us, cost_us (what pacing counts) and next_after_s; a time window's
time=1, start_us, stop_us, export_us, recorded_us, cost_us and empty.
A step ends at its mark and starts at
the previous one; the first at the first outermost forward before it (else it opens the count).
A step marked by a forward is that forward call.

Each finished window is written by torch (export_chrome_trace) to
<run>/_ranks/rank=<rank>/traces/<host>_<pid>.<n>.pt.trace.json (a time window's
<host>_<pid>.<n>.time.pt.trace.json) under a temporary name, then renamed: the profiler
converts only complete files. rank: torch.distributed's rank when
initialised (or the last one it had, after destroy_process_group), else $RANK, else the
configured rank, else 0.

Asked windows (`counterprof trace RUN --steps N | --ms T`): each process under `counterprof
run` registers in <run>/_control/drivers/<host>_<pid>.json; the flusher looks once a second for
asks in <run>/_control/trace/<id>.json. A process that marks steps traces N steps from its next
step boundary at or after the ask's start_step (the same step number on every rank), warming up
one step first; one that marks none traces a time window of T ms (N steps asked: window_s).
The trace is <host>_<pid>.<n>.ask-<id>.pt.trace.json (a time window's .ask-<id>.time.pt.trace.json),
and the process answers in <run>/_control/answers/<id>/<host>_<pid>.json: traced (steps, bytes,
file), or not reached and why. One ask at a time per process; the others wait their turn.

Outermost forwards (issue 35): global forward hooks find them, but while any global hook is
registered every module call in the process takes nn.Module's slow path (~3 us each here, on
top of the hooks' own calls): a batch-1 serving loop was ~7% slower between windows for it. So
the global hooks only find the loop's outermost modules (its roots): once forwards mark the
steps and ROOT_AFTER_FORWARDS outermost forwards were seen, each root's calls are timed by a
wrapper of that module alone (its instance's `_compiled_call_impl`, which nn.Module calls in
place of `_call_impl`: no hook on any module, and pickling or copying a module drops it) and
the global hooks are removed; every other module call takes the fast path again. Between
windows (before next_window_at, no ask, no profiler of the script's) a root's call only appends
its start, end and thread to an array (no lock, no object kept), counted in order by _drain when
the next call has more to do, at a mark, a flush or the end; a call due for more (a window may
start, one records) goes through _root_starts, as under the global hooks. A loop that
calls a module seen first after that (a reloaded model) stops marking steps: after
REDISCOVER_S with no root call and no thread inside a module call, the flusher registers the
global hooks again (the wrappers idle meanwhile) and the roots are found anew.

Nothing here may raise into the workload: a failure stops profiling in this process, with one
line on stderr.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import warnings
import weakref
from array import array

TYPE_CHECKING = False     # (typing.TYPE_CHECKING without importing typing into the workload)
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import FrameType, ModuleType
    from typing import Any, Literal

    from torch.profiler import ProfilerAction

    _LoaderBase = Loader
else:
    _LoaderBase = object

ENV = "COUNTERPROF_TORCH"
WINDOW_COST_SHARE = 0.05       # the most of a run's time that time windows' profiler calls may take
# Step windows (the paced default): the most of the loop's time that their measured cost may
# take. A window's cost is what it added to the loop: its wall time, from the profiler's start
# to the end of its stop and export, less as many steps at the loop's median step time outside
# windows (so the recorded steps' own slowdown counts, and a set-up that lands in the first
# recorded step, CUPTI's lazy one, too), and never less than its calls into the profiler.
STEP_WINDOW_COST_SHARE = 0.02
STEP_INTERVALS_KEPT = 64       # the loop's last step times outside windows, for its median
DEFAULTS = {"every": 50, "active": 5, "warmup": 1, "record_shapes": True, "with_stack": False,
            "profile_memory": False, "rank": None, "start_now": False, "window_s": 2.0,
            "window_every_s": 20.0, "clock_offset_ns": None, "time_paced": False}
# The adaptive time windows (time_paced: no time schedule given), for a process that never marks
# a step: a benchmark's loop of raw ops, a collective benchmark, a 5-second job.
FIRST_WINDOW_AFTER_S = 1.0     # after torch's import finished: the first window (not the imports)
PROBE_WINDOW_S = 0.05          # the first window: short, what it costs per second recorded sets
                               # the next one's length
EMPTY_RETRY_S = 0.5            # after a window that caught no op: the next one, twice as long
                               # (ops longer than the window are not in it), up to window_s
MIN_WINDOW_S = 0.05            # the shortest window the cost rule makes
WINDOW_STALL_S = 0.25          # what one window's stop and export should cost the workload, about
WINDOW_GROWTH_BYTES = 16 << 20 # a window ends once the process grew this much (ops got faster)
WINDOW_POLL_S = 0.05           # how often the end and the growth are checked while one records
HOLD_S = 3.0                   # an adaptive window's trace is held back this long for a step mark
EMPTY_TRACE_CHECK_BYTES = 1 << 20   # a time window's trace under this is read for an op
ENV_CLOCK_OFFSET = "COUNTERPROF_CLOCK_OFFSET_NS"      # counterprof.regions.ENV_CLOCK_OFFSET
FLUSH_EVERY_S = 1.0
CONTROL = "_control"           # <run>/_control/{drivers,trace,answers}: `counterprof trace`'s channel
ASK_LATE_S = 3600.0            # an ask this old is not served (a process started long after it)
# The main thread's Python stack, sampled while a trace records: where its time outside torch
# ops went by file and line, for jobs without regions (pyinstrument's view, at 50 Hz: one
# sys._current_frames() and a walk of the main thread's frames, ~20-40 us each)
PYSAMPLE_S = 0.02
# what marks steps, lowest first: a higher kind seen once replaces the lower ones
RANKS = {"forward": 1, "optimizer": 2, "profiler": 3, "counterprof": 3}
# outermost forwards with no mark between them before they are taken as the steps (a training
# step with two forwards before its optimizer.step() must not count them)
FORWARDS_TO_TRUST = 3
# outermost forwards seen under the global forward hooks (with forwards marking the steps) before
# the roots found are timed by wrappers of their own and the global hooks removed
ROOT_AFTER_FORWARDS = 8
# the roots were called not once in this long and no thread is inside a module call: the global
# hooks look for the loop's outermost modules again (a model replaced by another one)
REDISCOVER_S = 2.0
WINDOW_SIGNAL = signal.SIGURG           # ignored by default, unused by Python programs
_monotonic_ns = time.monotonic_ns
try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096
_native_id = threading.get_native_id
_ident = threading.get_ident
_thread_ids = threading.local()       # .tid: this thread's OS id, read once (no gettid per step)


def _tid() -> int:
    try:
        return int(_thread_ids.tid)
    except AttributeError:
        tid = _thread_ids.tid = _native_id()
        return tid


def _new_thread_ids() -> None:
    global _thread_ids
    _thread_ids = threading.local()   # a forked child's main thread has an id of its own


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_thread_ids)


def _compiling() -> bool:     # torch.compiler.is_compiling, once torch is imported
    return False

_driver: Driver | None = None


_IN_PROFILER_CALL: list[int] = []      # non-empty while the driver calls into a torch profiler


class _kineto_markers_filtered:
    """Kineto (torch's profiler library) writes a line to stderr at every profiler start and
    stop, at its USDT level (`USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
    profiler_start`): markers for tracing tools, which no KINETO_LOG_LEVEL silences without
    silencing its errors too. The driver's windows start and stop the profiler every few
    seconds, so these lines would land on the workload's stderr, two per window. Around the
    driver's calls into the profiler, fd 2 goes to a memory file; what was written there
    meanwhile (by kineto, or by another of the workload's threads) is written back to stderr
    after the call, less those marker lines. Nested and concurrent calls share one redirect."""

    _lock = threading.Lock()
    _depth = 0
    _memfd = -1
    _saved = -1

    def __enter__(self) -> _kineto_markers_filtered:
        cls = type(self)
        with cls._lock:
            if cls._depth == 0 and not cls._begin():
                return self
            cls._depth += 1
            self.entered = True
        return self

    @classmethod
    def _begin(cls) -> bool:
        try:
            if cls._memfd < 0:
                cls._memfd = os.memfd_create("counterprof-kineto-stderr", os.MFD_CLOEXEC)
            try:
                sys.stderr.flush()
            except Exception:
                pass
            cls._saved = os.dup(2)
            os.dup2(cls._memfd, 2)
            return True
        except (AttributeError, OSError):       # no memfd here: the lines go through
            if cls._saved >= 0:
                os.close(cls._saved)
                cls._saved = -1
            return False

    def __exit__(self, *exc: Any) -> Literal[False]:
        if not getattr(self, "entered", False):
            return False
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                cls._end()
        return False

    @classmethod
    def _end(cls) -> None:
        try:
            try:
                sys.stderr.flush()
            except Exception:
                pass
            os.dup2(cls._saved, 2)
        finally:
            os.close(cls._saved)
            cls._saved = -1
        size = os.fstat(cls._memfd).st_size
        if not size:
            return
        data = os.pread(cls._memfd, size, 0)
        os.ftruncate(cls._memfd, 0)
        os.lseek(cls._memfd, 0, os.SEEK_SET)     # the offset fd 2 wrote at, shared
        kept = b"".join(line for line in data.splitlines(keepends=True)
                        if not line.startswith(b"USDT:"))
        while kept:
            try:
                kept = kept[os.write(2, kept):]
            except OSError:
                break

    @classmethod
    def _in_forked_child(cls) -> None:
        """A process forked while the redirect was on (a DataLoader worker started beside a
        window's start) gets the real stderr back: its own lines are never held."""
        if cls._saved >= 0:
            try:
                os.dup2(cls._saved, 2)
                os.close(cls._saved)
            except OSError:
                pass
        cls._saved, cls._depth, cls._memfd = -1, 0, -1
        cls._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_kineto_markers_filtered._in_forked_child)


class _calling_profiler:
    """Around every call into a torch profiler the driver owns (start, step, stop): torch
    warns, once per process, that events do not accumulate across cycles. That is intended
    here, and the warning is not the workload's to read (torch 2.11 gives it from a start or
    a stop, 2.13 from a step). It also keeps inductor unloaded (below), and kineto's marker
    lines off the workload's stderr (_kineto_markers_filtered)."""

    def __enter__(self) -> _calling_profiler:
        _IN_PROFILER_CALL.append(1)
        self.markers = _kineto_markers_filtered().__enter__()
        self.filters = warnings.catch_warnings()
        self.filters.__enter__()
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        self.inductor = _inductor_left_unloaded().__enter__()
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        try:
            self.inductor.__exit__(*exc)
        finally:
            self.filters.__exit__(*exc)
            self.markers.__exit__(*exc)
            if _IN_PROFILER_CALL:
                _IN_PROFILER_CALL.pop()
        return False


class _inductor_left_unloaded:
    """torch.profiler's prepare_trace asks `hasattr(torch, "_inductor")`, and torch's lazy
    module __getattr__ answers by importing torch._inductor, dynamo and sympy (~820 modules,
    1.1 s on these VMs) inside the workload's step. Where the workload never imported inductor
    the answer is False (what torch means to ask: is inductor in use), without the import."""

    def __enter__(self) -> _inductor_left_unloaded:
        torch: Any = sys.modules.get("torch")
        self.torch = torch
        self.lazy = torch.__dict__.get("__getattr__") if torch is not None else None
        if self.lazy is None or "torch._inductor" in sys.modules:
            self.lazy = None
            return self
        lazy = self.lazy

        def unloaded(name: str) -> Any:
            if name == "_inductor" and "torch._inductor" not in sys.modules:
                raise AttributeError(name)
            return lazy(name)
        self.unloaded = unloaded
        torch.__getattr__ = unloaded
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        if self.lazy is not None and self.torch.__dict__.get("__getattr__") is self.unloaded:
            self.torch.__getattr__ = self.lazy
        return False


def _capturing() -> bool:
    """A CUDA graph is being captured on this thread's stream (a server capturing its decode
    step at start-up): a profiler started or stepped now would call into CUPTI inside the
    capture, so that step is left alone and the window comes a step later. torch.cuda is only
    asked where the script already initialized CUDA."""
    cuda = sys.modules.get("torch.cuda")
    try:
        return cuda is not None and cuda.is_initialized() and cuda.is_current_stream_capturing()
    except Exception:
        return False


def _us(seconds: float) -> int:
    return int(seconds * 1e6)


def _say(message: str) -> None:
    try:
        print(f"counterprof: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


class Driver:
    def __init__(self, run: str, **config: Any):
        cfg = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        self.run = run
        self.every = int(cfg["every"])
        self.active = int(cfg["active"])
        self.warmup = int(cfg["warmup"])
        self.record_shapes = bool(cfg["record_shapes"])
        self.with_stack = bool(cfg["with_stack"])
        self.profile_memory = bool(cfg["profile_memory"])
        self.rank = cfg["rank"]
        self.known_rank: int | None = None   # torch.distributed's, once seen initialised
        self.start_now = bool(cfg["start_now"])
        self.pid = os.getpid()
        self.host = socket.gethostname().split(".")[0]
        self.lock = threading.RLock()
        self.prof: Any = None         # our torch.profiler.profile, once the first window starts
        self.seq = 0                  # windows written
        self.explicit = False         # counterprof.step() or a profiler's step() was seen
        self.user_profilers = 0       # the script's own profilers running now
        self.adopted = False          # the script runs its own profiler: we export its traces
        self.stopped = ""             # why this process stopped profiling
        self.discard = False
        self.written: list[str] = []
        self._hooks: list[Any] = []      # torch's hook handles
        # step and input timing, for the whole run (see the module docstring)
        self.window_s = float(cfg["window_s"])
        self.window_every_s = float(cfg["window_every_s"])
        offset: Any = cfg["clock_offset_ns"] if cfg["clock_offset_ns"] is not None \
            else os.environ.get(ENV_CLOCK_OFFSET)
        try:
            self.offset_ns = int(offset)
        except (TypeError, ValueError):
            self.offset_ns = time.time_ns() - _monotonic_ns()
        self.marks = ""               # what marks the steps (RANKS), once known
        self.steps = 0                # steps recorded
        # The default schedule adapts; one the user gave (--torch-window) is followed to the step.
        # Adapting: the first window warms up too, so the profiler's own start (CUPTI's set-up on
        # a GPU: a recorded step 3x its length on an H200) is not recorded; and windows are paced
        # (WINDOW_COST_SHARE, in _stop_ours).
        self.paced = bool(cfg.get("paced", False))
        self.sched = self.every - self.warmup if self.paced and 0 < self.warmup < self.every else 0
        self.window_cost_s = 0.0      # time spent in torch.profiler calls for this window
        # the step window recording now, its account (_stop_ours writes it as a `wcost` line):
        # t0 (monotonic s before its start), start, calls (its step() calls), last (the last
        # step() call: stop and export), export, steps (marks while it recorded)
        self.win: dict[str, Any] | None = None
        self.win_count = 0            # step windows accounted for
        self.last_export_s = 0.0      # the last export_chrome_trace's time
        self._intervals: collections.deque[float] = collections.deque(maxlen=STEP_INTERVALS_KEPT)
        self._last_advance = 0.0      # monotonic s of the last step mark
        self._skip_interval = False   # the next step holds a window's stop and export
        self.next_window_at = 0.0     # monotonic s before which no step window starts
        self.open_start: int | None = None   # monotonic ns the step in progress started (mark kinds)
        self.forwards = 0             # outermost forwards seen
        self.pending: list[Any] | None = None    # [start, end, tid] of the last outermost forward
        self.held: list[list[Any]] = []   # forwards not yet trusted as steps (FORWARDS_TO_TRUST)
        self._depth: dict[int, int] = {}
        self._counted: dict[int, bool] = {}
        self._has_params: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._forward_hooks: list[Any] = []   # the global pair's handles, while registered
        self._global_pair: tuple[Any, Any] | None = None
        # the loop's roots (module docstring): found under the global hooks, then timed alone
        self._found: dict[int, weakref.ReferenceType[Any]] = {}    # id -> the outermost ones seen
        self._phase_forwards = 0      # outermost forwards since the global hooks were registered
        self._wrapped: dict[int, weakref.ReferenceType[Any]] = {}  # id -> the roots wrapped
        self._roots_on = [False]      # the wrappers time calls (else they only pass them on)
        self._root_depth: dict[int, int] = {}   # thread ident -> roots' calls in progress
        self._roots_never = False     # the global hooks stay (an older torch, a root not wrapped)
        self._roots_forwards = 0      # self.forwards at the flusher's last look (roots on)
        self._roots_quiet_since = 0.0
        self._sampling = threading.Event()   # set while a window records (the stack sampler)
        self._records: collections.deque[tuple[str, int, int, int, str | int]] = collections.deque()
        # (kind, start, end, tid, name or step number); the steps apart, allocating no object a
        # step: (start, end, tid) triples, the first one step number _step_base
        self._step_times = array("q")
        self._step_base = 0
        # the roots' calls timed and nothing more (module docstring), not yet counted: (start,
        # end, tid) triples, appended by the wrappers, taken in by _drain; and the monotonic ns
        # before which a root's call needs no more than that (0: every call does more)
        self._fast = array("q")
        self._due = [0]
        self._files: dict[str, int] = {}       # steps file -> fd
        self.steps_paths: list[str] = []
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self.window_prof: Any = None  # the time window's profiler while it records
        self.window_end = 0.0
        # the time schedule: adaptive by default (the module docstring), else the one given
        self.time_paced = bool(cfg["time_paced"])
        self.window_len = PROBE_WINDOW_S if self.time_paced else self.window_s
        self.next_window = time.monotonic() + (FIRST_WINDOW_AFTER_S if self.time_paced
                                               else self.window_every_s)
        self.window_started = 0.0     # monotonic s the time window recording now started
        self.window_start_cost_s = 0.0
        self.window_rss = 0           # the process's resident bytes when it started
        self.window_rss_first = False # the next reading is the window's first
        self.window_full = False      # it grew by WINDOW_GROWTH_BYTES once: end it if again
        self.window_empty = False     # the last time window caught no op (its trace dropped)
        self.windows = 0              # time windows started
        self.windows_kept = 0         # time windows written (they caught ops)
        self.held_windows: list[tuple[float, str, str]] = []  # (ended, hidden path, suffix) of adaptive ones held back
        self.holds = 0
        self.empty_windows = 0        # time windows dropped (no op)
        self._statm: int | None = None   # fd of /proc/self/statm, while time windows record
        self._window_signal = False   # our handler is installed for WINDOW_SIGNAL
        self._ticking = False
        self.closing = False          # close() has begun
        self._asked = 0.0             # monotonic s the flusher last asked the main thread to tick
        self.asks_seen: set[str] = set()
        self.ask: dict[str, Any] | None = None    # the ask being served (counterprof trace)
        self.ask_first = -1           # its first traced step (-1: not started)
        self.ask_window = False       # a time window recording now serves it
        self.ask_s = 0.0              # its length

    # -- the schedule ---------------------------------------------------------------------

    def schedule(self, step: int) -> ProfilerAction:
        from torch.profiler import ProfilerAction
        pos = step % self.every
        if pos < self.active - 1:
            return ProfilerAction.RECORD
        if pos == self.active - 1:
            return ProfilerAction.RECORD_AND_SAVE
        if pos >= self.every - self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.NONE

    # -- hooks into torch ---------------------------------------------------------------------

    def install(self) -> None:
        """Step marks from optimizers, module forwards and the script's own profilers, the
        DataLoader's next() timed, the thread that writes them (torch imported)."""
        import torch
        import torch.profiler as tp
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hooks.append(register_optimizer_step_post_hook(self._optimizer_hook))
        from torch.nn.modules import module as nn_module
        global _compiling
        _compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _compiling)
        # our hooks fire for a torch.compile'd module's wrapper and for the module: only the
        # outermost counts, so torch's warning about it is not the user's concern
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        self._global_pair = self._forward_hooks_pair()
        self._register_global_hooks(nn_module)
        _patch_dataloader()
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(WINDOW_SIGNAL) in (signal.SIG_DFL, None, _on_window_signal):
                    signal.signal(WINDOW_SIGNAL, _on_window_signal)
                    self._window_signal = True
            except (ValueError, OSError):
                pass
        self._flusher = threading.Thread(target=self._flush_loop, name="counterprof-steps",
                                         daemon=True)
        self._flusher.start()
        if threading.current_thread() is threading.main_thread():
            self._sampler = threading.Thread(target=self._pystack_loop, name="counterprof-pystack", daemon=True)
            self._sampler.start()
        cls: Any = tp.profile
        if not getattr(cls, "_counterprof_patched", False):
            original_start, original_stop, original_step = cls.start, cls.stop, cls.step

            def start(prof: Any, *a: Any, **k: Any) -> Any:
                drv = _driver
                if drv is not None and not getattr(prof, "_counterprof", False):
                    drv._user_profiler_starts(prof)
                return original_start(prof, *a, **k)

            def stop(prof: Any, *a: Any, **k: Any) -> Any:
                try:
                    return original_stop(prof, *a, **k)
                finally:
                    drv = _driver
                    if drv is not None and not getattr(prof, "_counterprof", False):
                        drv.user_profilers = max(0, drv.user_profilers - 1)

            def step(prof: Any, *a: Any, **k: Any) -> Any:
                drv = _driver
                if drv is not None and not getattr(prof, "_counterprof", False):
                    drv.explicit = True
                    drv.mark("profiler")
                return original_step(prof, *a, **k)

            cls.start, cls.stop, cls.step = start, stop, step
            cls._counterprof_patched = True
        atexit.register(self.close)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)
        del torch

    def _forked(self) -> None:
        # a forked child (DataLoader worker) inherits this state but must not export it
        self.stopped = self.stopped or "forked child"
        self.lock = threading.RLock()          # another thread may have held it at the fork
        self._records.clear()
        self._step_times = array("q")
        del self._fast[:]
        self._files = {}
        self.held_windows = []                       # the parent's to write
        self.ask, self.ask_window = None, False      # the parent's to serve
        statm, self._statm = self._statm, None       # the parent's /proc/<pid>/statm
        if statm is not None:
            try:
                os.close(statm)
            except OSError:
                pass
        try:
            self._remove_forward_hooks()
        except Exception:
            pass

    def _optimizer_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step("optimizer")

    # -- outermost module forwards ------------------------------------------------------------

    def _forward_hooks_pair(self) -> tuple[Callable[[Any, Any], None], Callable[[Any, Any, Any], None]]:
        """The global forward pre and post hooks, registered while the loop's roots are looked
        for (module docstring). They run for every module call, so the inner calls' path is a
        depth count per thread and nothing else (closures over locals). An outermost call of a
        module with parameters is noted as a root; once forwards mark the steps and
        ROOT_AFTER_FORWARDS were seen, the end of one hands over to the roots' wrappers."""
        depth, counted_by_tid, has_params = self._depth, self._counted, self._has_params
        compiling, ident, clock, starts = _compiling, _ident, _monotonic_ns, self._forward_starts
        found, ref = self._found, weakref.ref

        def pre(module: Any, args: Any) -> None:
            if compiling():
                return        # inside a torch.compile'd region: never an outermost call
            tid = ident()
            d = depth.get(tid, 0)
            depth[tid] = d + 1
            if d == 0:
                counted = has_params.get(module)
                if counted is None:
                    try:
                        counted = has_params[module] = next(module.parameters(), None) is not None
                    except Exception:
                        counted = False
                counted_by_tid[tid] = counted
                if counted:
                    seen = found.get(id(module))
                    if seen is None or seen() is not module:
                        found[id(module)] = ref(module)
                    starts()

        def post(module: Any, args: Any, output: Any) -> None:
            if compiling():
                return
            tid = ident()
            d = depth.get(tid, 1) - 1
            depth[tid] = d if d > 0 else 0
            if d == 0 and counted_by_tid.get(tid):
                pending = self.pending
                if pending is not None and pending[1] is None:
                    pending[1] = clock()
                if self._phase_forwards >= ROOT_AFTER_FORWARDS and self.marks == "forward" \
                        and not self._roots_never:
                    self._to_roots()

        return pre, post

    def _register_global_hooks(self, nn_module: Any = None) -> None:
        if nn_module is None:
            from torch.nn.modules import module as nn_module
        assert self._global_pair is not None      # (install made it)
        pre, post = self._global_pair
        self._depth.clear()
        self._counted.clear()
        self._phase_forwards = 0
        self._forward_hooks = [nn_module.register_module_forward_pre_hook(pre),
                               nn_module.register_module_forward_hook(post, always_call=True)]

    def _unregister_global_hooks(self) -> None:
        hooks, self._forward_hooks = self._forward_hooks, []
        for h in hooks:
            h.remove()

    def _forward_starts(self, now: int = 0) -> None:
        """An outermost forward of a module with parameters: the previous one, with no mark
        since, was a step. Once forwards are the marks it runs once per request of a serving
        loop, so the step is recorded here with no object made (three numbers appended, the
        pending list reused, the thread's id read once) and _advance's common case is inline."""
        now = now or _monotonic_ns()
        if self.stopped:
            return            # (a forked child is stopped: _forked)
        try:
            with self.lock:
                marks = self.marks
                if marks != "forward" and marks != "":
                    return
                self.forwards += 1
                self._phase_forwards += 1
                pending = self.pending
                if pending is not None and pending[1] is not None:
                    if marks:
                        # a step: recorded as three numbers, the same list kept for the next
                        times = self._step_times
                        if not times:
                            self._step_base = self.steps
                        times.extend(pending)
                        self.steps += 1
                        s = now / 1e9
                        step = self.sched
                        if self.prof is None and self.window_prof is None and self.ask is None \
                                and not (self.user_profilers or self._skip_interval) \
                                and (s < self.next_window_at
                                     or self.active <= step % self.every < self.every - self.warmup):
                            last, self._last_advance = self._last_advance, s   # (_advance's first
                            if last:                                             # lines, inline)
                                self._intervals.append(s - last)
                            self.sched = step + 1
                        else:
                            self._advance(s)
                        if self.pending is pending:
                            try:
                                tid = _thread_ids.tid
                            except AttributeError:
                                tid = _tid()
                            pending[0], pending[1], pending[2] = now, None, tid
                            return
                    else:
                        self._forward_was_a_step(pending)
                self.pending = [now, None, _tid()]
        except Exception as exc:
            self._fail(exc)

    def _forward_was_a_step(self, fwd: list[Any]) -> None:
        if self.marks == "forward":
            self._record_step(fwd[0], fwd[1], fwd[2])
            self._advance()
            return
        self.held.append(fwd)
        if len(self.held) >= FORWARDS_TO_TRUST:
            self._set_marks("forward")
            for f in self.held:
                self._record_step(f[0], f[1], f[2])
            self.held = []
            self._advance()

    def _to_roots(self) -> None:
        """At the end of an outermost forward (this thread is in no module call): the roots
        found are timed by wrappers of their own from here on, and the global hooks go, so every
        other module call takes nn.Module's fast path again. A root that cannot be wrapped
        leaves the global hooks on for the rest of the process."""
        try:
            with self.lock:
                if self._roots_on[0] or not self._forward_hooks or self.marks != "forward" \
                        or self.stopped or self._roots_never:
                    return
                if not _roots_supported():
                    self._roots_never = True
                    return
                roots = [m for m in (r() for r in list(self._found.values())) if m is not None]
                self._found.clear()
                if not roots:
                    return
                _patch_replicate()
                for module in roots:
                    self._wrap_root(module)
                self._unregister_global_hooks()
                self._root_depth.clear()
                self._roots_forwards, self._roots_quiet_since = self.forwards, time.monotonic()
                self._due[0] = 0          # (the first call sets it)
                self._roots_on[0] = True
        except Exception:
            self._roots_never = True          # (the wrappers made only pass calls on)

    def _wrap_root(self, module: Any) -> None:
        """Time every call of `module` from here on: a wrapper of its call in its instance's
        `_compiled_call_impl` (what nn.Module.__call__ calls when it is set; Module.__getstate__
        drops it, so a pickled or copied module has none, and a DataParallel replica loses it,
        _patch_replicate). Holds the module weakly."""
        d = module.__dict__
        current = d.get("_compiled_call_impl")
        if _root_wrapper_of(current) is self._roots_on:
            return            # wrapped already (found again after a rediscovery)
        had = "_compiled_call_impl" in d
        prior = current       # the module's own compiled call (module.compile()), if any
        ref = weakref.ref(module)
        on, depth, ident, compiling = self._roots_on, self._root_depth, _ident, _compiling
        clock, slow, driver, due, timed = _monotonic_ns, self._root_starts, self, self._due, self._fast.extend

        def root_call(*args: Any, **kwargs: Any) -> Any:
            call = prior if prior is not None else ref()._call_impl     # type: ignore[union-attr]
            if not on[0] or compiling():
                return call(*args, **kwargs)
            tid = ident()
            n = depth.get(tid, 0)
            depth[tid] = n + 1
            if n:             # a root called inside a root: not a step of its own
                try:
                    return call(*args, **kwargs)
                finally:
                    depth[tid] = n
            start = clock()
            if start < due[0]:
                # nothing due at this step (no window, no ask): its times, and nothing more
                try:
                    return call(*args, **kwargs)
                finally:
                    depth[tid] = 0
                    try:
                        os_tid = _thread_ids.tid
                    except AttributeError:
                        os_tid = _tid()
                    timed((start, clock(), os_tid))
            slow(start)
            try:
                return call(*args, **kwargs)
            finally:
                depth[tid] = 0
                pending = driver.pending
                if pending is not None and pending[1] is None:
                    pending[1] = clock()

        root_call.__dict__["_counterprof_root"] = on
        root_call.__dict__["_counterprof_prior"] = (had, prior)
        d["_compiled_call_impl"] = root_call
        self._wrapped[id(module)] = ref

    def _unwrap_roots(self) -> None:
        self._roots_on[0] = False
        wrapped, self._wrapped = self._wrapped, {}
        for ref in wrapped.values():
            module = ref()
            if module is not None and _root_wrapper_of(module.__dict__.get("_compiled_call_impl")) \
                    is self._roots_on:
                _unwrap(module.__dict__)

    def _root_starts(self, now: int) -> None:
        """A root's call with more to do than be timed (a window due or recording, an ask, a
        schedule given): the calls timed since are counted first, then it is an outermost
        forward as under the global hooks; the next calls' `due` set from what follows."""
        with self.lock:
            self._drain()
            self._forward_starts(now)
            self._refresh_due()

    def _refresh_due(self) -> None:
        """(Under self.lock.) The roots' calls before the next window may start need nothing
        but their times; a window recording, an ask, the script's own profiler, an exact
        schedule (next_window_at 0): every call goes through _root_starts."""
        quiet = self.prof is None and self.window_prof is None and self.ask is None \
            and not self.user_profilers and not self.stopped and self.marks == "forward"
        self._due[0] = int(self.next_window_at * 1e9) if quiet else 0

    def _drain(self) -> None:
        """(Under self.lock.) The roots' calls timed since the last drain, counted as
        _forward_starts would have counted them one by one (none of them was due for more):
        each one's start ends the step before it, the last one pending. The wrappers append
        without the lock: the triples taken are deleted from the front, what came meanwhile
        stays."""
        fast = self._fast
        n = len(fast) // 3 * 3
        if not n:
            return
        data = fast[:n]
        del fast[:n]
        if self.stopped or self.marks != "forward":
            return
        k = n // 3
        self.forwards += k
        self._phase_forwards += k
        starts = data[0::3]
        times = self._step_times
        if not times:
            self._step_base = self.steps
        pending = self.pending
        if pending is not None and pending[1] is not None:
            times.extend(pending)
            advances = starts
        else:
            advances = starts[1:]
        times.extend(data[:n - 3])
        self.steps += len(advances)
        last = self._last_advance
        for t in advances:            # _advance's bookkeeping, step by step
            now = t / 1e9
            if last and self.prof is None:
                if self._skip_interval:
                    self._skip_interval = False
                elif not self.user_profilers and self.window_prof is None:
                    self._intervals.append(now - last)
            last = now
        self._last_advance = last
        self.sched += len(advances)
        self.pending = [data[n - 3], data[n - 2], data[n - 1]]

    def step_records(self) -> list[tuple[int, int, int, int]]:
        """The steps recorded and not yet written: (step number, start, end, tid)."""
        with self.lock:
            self._drain()
            t, base = self._step_times, self._step_base
            return [(base + i // 3, t[i], t[i + 1], t[i + 2]) for i in range(0, len(t), 3)]

    def _check_roots(self, now: float) -> None:
        """The flusher, once a second: while the roots are timed but none was called for
        REDISCOVER_S (the loop moved to a module not seen before, or it waits), the global hooks
        look for the roots again, registered only where no other thread is inside a module call
        (a call begun before them would count its inner calls as outermost)."""
        if not self._roots_on[0] or self.stopped:
            return
        with self.lock:
            self._drain()
        if self.forwards != self._roots_forwards:
            self._roots_forwards, self._roots_quiet_since = self.forwards, now
            return
        if now - self._roots_quiet_since < REDISCOVER_S:
            return
        try:
            with self.lock:
                if not self._roots_on[0] or self.stopped or self.marks != "forward":
                    return
                self._roots_on[0] = False
                self._register_global_hooks()
                if _in_module_call():
                    self._unregister_global_hooks()
                    self._roots_on[0] = True
                    self._roots_quiet_since = now      # (tried again REDISCOVER_S later)
        except Exception as exc:
            self._fail(exc)

    def _remove_forward_hooks(self) -> None:
        self._unregister_global_hooks()
        self._unwrap_roots()
        self._found.clear()
        self.pending, self.held = None, []

    def _user_profiler_starts(self, prof: Any) -> None:
        """The script starts its own torch.profiler: ours makes way, and each trace the script
        exports from it (its on_trace_ready, tensorboard_trace_handler, or an explicit
        export_chrome_trace) is copied into the run. Kineto saves a trace only once, so we never
        export a script's profiler ourselves: that would make the script's own export fail."""
        with self.lock:
            self.user_profilers += 1
            self.adopted = True
            self._due[0] = 0
            if self.prof is not None:
                self._stop_ours(discard=True)
            if getattr(prof, "_counterprof_copies", False):
                return
            prof._counterprof_copies = True
            original = prof.export_chrome_trace

            def export_chrome_trace(path: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(path, *args, **kwargs)
                self._copy(str(path))
                return result

            prof.export_chrome_trace = export_chrome_trace

    def _copy(self, path: str) -> None:
        if os.getpid() != self.pid:
            return
        try:
            self.flush(touch=True)
            suffix = ".pt.trace.json.gz" if path.endswith(".gz") else ".pt.trace.json"
            target = self._next_path(suffix)
            tmp = target + ".tmp"
            shutil.copyfile(path, tmp)
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
            self.written.append(target)
        except Exception as exc:   # the script's own trace is written; only our copy is missing
            _say(f"could not copy the trace {path} into the run: {exc}")

    # -- steps ------------------------------------------------------------------------------

    def step(self, source: str = "counterprof") -> None:
        """A step mark: the step in progress ends now (counterprof.step(), optimizer.step())."""
        self.mark(source)

    def mark(self, source: str) -> None:
        now = _monotonic_ns()
        if self.stopped or os.getpid() != self.pid:
            return
        try:
            with self.lock:
                if self.stopped:
                    return
                self._drain()
                rank, ruling = RANKS[source], RANKS.get(self.marks, 0)
                if source != "optimizer" and source != "forward":
                    self.explicit = True
                if rank < ruling:
                    return            # explicit marks rule; optimizer steps would double count
                start = self.open_start
                if rank > ruling:
                    # the first mark of its kind: a step ended by an optimizer mark of this
                    # same loop is not counted again; before any mark, the step began with the
                    # first outermost forward since the last counted step
                    start = None
                    if ruling < RANKS["optimizer"]:
                        first = self.held[0] if self.held else self.pending
                        start = first[0] if first is not None else None
                    self._set_marks(source)
                    self._remove_forward_hooks()
                    if self.window_prof is not None and threading.current_thread() is threading.main_thread():
                        self._stop_window()   # steps mark the windows from here on
                if start is not None:
                    self._record_step(start, now, _native_id())
                self.open_start = now
                self._advance()
        except Exception as exc:
            self._fail(exc)

    def _set_marks(self, source: str) -> None:
        self.marks = source
        self._records.append(("marks", 0, 0, 0, source))
        if self.held_windows:
            self._drop_held()

    def _record_step(self, start: int, end: int, tid: int) -> None:
        """(Under self.lock.)"""
        times = self._step_times
        if not times:
            self._step_base = self.steps
        times.append(start)
        times.append(end)
        times.append(tid)
        self.steps += 1


    def record_input(self, start: int, end: int, name: str) -> None:
        if os.getpid() == self.pid and not self.stopped:
            self._records.append(("input", start, end, _native_id(), name))

    def _advance(self, now: float = 0.0) -> None:
        """A step of the schedule begins (at `now`, monotonic s; 0: read the clock). A torch
        profiler lives only from a window's warm-up to its end: between windows a step costs no
        call into torch."""
        now = now or time.monotonic()
        last, self._last_advance = self._last_advance, now
        step = self.sched
        if self.prof is None and self.window_prof is None and self.ask is None \
                and not (self.user_profilers or self._skip_interval) \
                and (now < self.next_window_at or self.active <= step % self.every < self.every - self.warmup):
            # between windows, none due (the rest of this method, in its common case)
            if last:
                self._intervals.append(now - last)
            self.sched = step + 1
            return
        if last and self.prof is None:
            if self._skip_interval:
                self._skip_interval = False
            elif not self.user_profilers and self.window_prof is None:
                self._intervals.append(now - last)    # the loop's own step time, no window in it
        step, self.sched = self.sched, self.sched + 1
        if self.user_profilers or self.window_prof is not None:
            return                    # the script's own profiler, or a time window, records
        if self.ask is not None and self.prof is None and self.ask_first < 0 and not _capturing() \
                and self.steps + 1 >= int(self.ask.get("start_step") or 0):
            self._start_ask()
            return
        if self.prof is not None:
            if _capturing():
                return
            win = self.win
            self.last_export_s = 0.0
            t = time.monotonic()
            with _calling_profiler():
                self.prof.step()
            took = time.monotonic() - t
            self.window_cost_s += took
            if win is not None:
                win["steps"] += 1
                win["calls"] += took
                win["last"], win["export"] = took, self.last_export_s
            from torch.profiler import ProfilerAction
            if self.prof.current_action == ProfilerAction.NONE:
                self._stop_ours(discard=True, account=True)   # written; none until the next
        elif not self.active <= step % self.every < self.every - self.warmup \
                and time.monotonic() >= self.next_window_at and not _capturing() and self.ask is None:
            self.start(step)          # (none while an ask waits: its step must find no window on)

    def start(self, step: int | None = None) -> None:
        """Start a profiler now, at schedule step `step` (None: now, as step 0, the steps
        marked from here on counting from 1: counterprof.profile())."""
        with self.lock:
            if self.prof is not None or self.stopped or self.user_profilers:
                return
            if step is None:
                step, self.sched = 0, 1
            first = step
            self._step_profiler(lambda n: self.schedule(first + n), self._export)

    def _step_profiler(self, schedule: Callable[[int], ProfilerAction], on_ready: Callable[[Any], Any]) -> None:
        """Our torch profiler, started now, stepped at each step mark (_advance)."""
        try:
            t0 = time.monotonic()
            import torch
            from torch.profiler import ProfilerActivity, profile
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)    # ROCm builds too
            prof: Any = profile(activities=activities, schedule=schedule, on_trace_ready=on_ready,
                                **self._profile_options())
            prof._counterprof = True
            t = time.monotonic()
            with _calling_profiler():
                prof.start()
            now = time.monotonic()
            self.window_cost_s = now - t
            self.win = {"t0": t0, "t0_ns": _monotonic_ns() - int((now - t0) * 1e9),
                        "start": now - t0, "calls": 0.0, "last": 0.0, "export": 0.0, "steps": 0}
            self.prof = prof
            self._sampling.set()
        except Exception as exc:
            self._fail(exc)

    def _profile_options(self, **experimental: Any) -> dict[str, Any]:
        """The keyword arguments of our torch.profiler.profile: the configured record_shapes,
        with_stack and profile_memory, and an experimental config with `experimental` and
        trace_only (torch >= 2.12, not with with_stack): the stop then builds no Python event
        objects, which the driver never reads (it only exports the trace, whose content is the
        same): a window of a batch-1 serving loop stops in a quarter of the time."""
        options: dict[str, Any] = {"record_shapes": self.record_shapes, "with_stack": self.with_stack,
                                   "profile_memory": self.profile_memory}
        try:
            from torch._C._profiler import _ExperimentalConfig
        except ImportError:
            return options
        tries = [experimental] if self.with_stack else [{**experimental, "trace_only": True}, experimental]
        for kwargs in tries:
            if not kwargs:
                break
            try:
                options["experimental_config"] = _ExperimentalConfig(**kwargs)
                break
            except TypeError:         # an older torch: not this option
                continue
        return options

    def _stop_ours(self, discard: bool, account: bool = False) -> None:
        prof, self.prof = self.prof, None
        win, self.win = self.win, None
        if prof is None:
            return
        self.discard = discard
        t = time.monotonic()
        try:
            with _calling_profiler():
                prof.stop()
        finally:
            self.discard = False
            now = time.monotonic()
            self.window_cost_s += now - t
            cost = self.window_cost_s
            if account and win is not None:
                cost = self._account_window(win, now, now - t)
            # pace the windows: what this one cost (paced: what it added to the loop) stays
            # under STEP_WINDOW_COST_SHARE of the time until the next one starts, so a loop of
            # 0.5 ms steps (batch-1 inference) is not traced every 50 ms
            if self.paced:
                self.next_window_at = now + cost / STEP_WINDOW_COST_SHARE

    def _account_window(self, win: dict[str, Any], end: float, stop_s: float) -> float:
        """A step window ended at `end` (monotonic s): what it cost the loop, in seconds (see
        STEP_WINDOW_COST_SHARE), written as a `wcost` line with its phases."""
        self.win_count += 1
        self._skip_interval = True
        steps = int(win["steps"])
        calls = float(win["start"] + win["calls"] + stop_s)
        wall = end - float(win["t0"])
        base = sorted(self._intervals)[len(self._intervals) // 2] if len(self._intervals) >= 3 else None
        added = wall - steps * base if base is not None else calls
        cost = max(calls, added)
        fields = [f"n={self.win_count}", f"steps={steps}", f"start_us={_us(win['start'])}",
                  f"step_calls_us={_us(win['calls'] - win['last'])}",
                  f"stop_us={_us(win['last'] - win['export'] + stop_s)}", f"export_us={_us(win['export'])}",
                  f"recorded_excess_us={_us(added - calls) if base is not None else '-'}",
                  f"cost_us={_us(cost)}", f"step_us={_us(base) if base is not None else '-'}",
                  f"wall_us={_us(wall)}",
                  f"next_after_s={cost / STEP_WINDOW_COST_SHARE if self.paced else 0:.3f}"]
        self._records.append(("wcost", int(win["t0_ns"]), int(win["t0_ns"] + wall * 1e9), _native_id(),
                              " ".join(fields)))
        return cost

    def close(self) -> None:
        """Stop recording; the window in progress is written (at exit, or by the collector),
        and the steps timed so far."""
        self.closing = True           # no time window starts from here (a tick inside close)
        try:
            with self.lock:
                if os.getpid() != self.pid:
                    return
                self._drain()
                if self.marks in ("", "forward") and not self.stopped:
                    # no mark came after the last forwards: they were the steps
                    if self.pending is not None and self.pending[1] is not None:
                        self.held.append(self.pending)
                    if self.held and not self.marks:
                        self._set_marks("forward")
                    for f in self.held:
                        self._record_step(f[0], f[1], f[2])
                    self.pending, self.held = None, []
                if self.ask is not None and self.ask_first < 0:
                    self._answer("not reached", why="the process ended before its window began")
                self._stop_ours(discard=False)
                at_exit = self.window_prof is not None
                self._stop_window()
                self._release_held(every=True)       # no step mark came: they were the job
                if self.windows:
                    # the time windows' account, for the collector's details: a short job's
                    # trace is explained (was one recording when it ended?), not guessed
                    self._records.append(("windows", 0, 0, 0,
                                          f"started={self.windows} kept={self.windows_kept} "
                                          f"empty={self.empty_windows} recording_at_exit={int(at_exit)}"))
                self.stopped = self.stopped or "closed"
                for h in self._hooks:
                    h.remove()
                self._hooks.clear()
                self._remove_forward_hooks()
        except Exception as exc:
            self._fail(exc)
        self.flush(final=True)
        self._wake.set()
        self._sampling.set()
        statm, self._statm = self._statm, None
        if statm is not None:
            try:
                os.close(statm)
            except OSError:
                pass
        with self._flush_lock:
            files, self._files = self._files, {}
            for fd in files.values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    # -- time windows (no step mark, no forward) ------------------------------------------------

    def _window_wanted(self, now: float) -> bool:
        """Time windows: only where nothing marks steps, in a process that runs the loop
        (not a DataLoader worker, nor another multiprocessing child unless it is a rank of
        torch.distributed: torch.multiprocessing.spawn's ranks run the loop)."""
        if self.marks or self.forwards or self.stopped or self.user_profilers or self.prof is not None \
                or self.closing:
            return False
        if not self._window_signal or os.getpid() != self.pid:
            return False
        if now < self.next_window and not (self.ask_window and self.ask_first < 0):
            return False
        if signal.getsignal(WINDOW_SIGNAL) is not _on_window_signal:
            return False              # the script took the signal for itself
        if self._in_dataloader_worker():
            return False
        mp = sys.modules.get("multiprocessing")
        if mp is None or mp.parent_process() is None:
            return True
        dist = sys.modules.get("torch.distributed")
        try:
            return dist is not None and dist.is_available() and dist.is_initialized()
        except Exception:
            return False

    def _window_tick(self) -> None:
        """In the main thread (the signal handler): start or end a time window."""
        if os.getpid() != self.pid or self._ticking:
            return                    # (a handler runs again inside a slow profiler start)
        self._ticking = True
        self._asked = 0.0
        try:
            with self.lock:
                now = time.monotonic()
                if self.window_prof is not None:
                    if now >= self.window_end or self.marks or self.forwards or self.stopped:
                        self._stop_window()
                    return
                if not self._window_wanted(now):
                    return
                t = time.monotonic()
                import torch
                from torch.profiler import ProfilerActivity, profile
                activities = [ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(ProfilerActivity.CUDA)
                # every thread's ops, not only the main thread's
                prof: Any = profile(activities=activities, on_trace_ready=self._export_time_window,
                                    **self._profile_options(profile_all_threads=True))
                prof._counterprof = True
                self.window_full = False
                self.window_rss = self._rss() if self.time_paced else 0
                self.window_rss_first = True
                with _calling_profiler():
                    prof.start()
                self.window_started = started = time.monotonic()
                self.window_start_cost_s = started - t
                self.window_end = started + self.window_len
                if self.ask is not None and self.ask_window:
                    self.window_end = started + self.ask_s
                    self.ask_first = 0
                self.window_prof = prof
                self._sampling.set()
                self.windows += 1
                # a schedule given: every window_every_s from one start to the next (an
                # adaptive one is set when the window ends, from what it cost)
                self.next_window = now + self.window_every_s
        except Exception as exc:
            self._fail(exc)
        finally:
            self._ticking = False

    def _set_marks_note(self, what: str) -> None:
        self._records.append(("marks", 0, 0, 0, what))

    def _stop_window(self, discard: bool = False) -> None:
        """End the time window recording now; discard: without writing it. An adaptive one is
        never written once steps are marked (it recorded the end of the set-up, and the
        windows held before it were dropped)."""
        prof, self.window_prof = self.window_prof, None
        if prof is None:
            return
        t = time.monotonic()
        self.window_empty = False
        discard = discard or (self.time_paced and bool(self.marks))
        if discard:
            self.discard = True
        self.last_export_s = 0.0
        try:
            with _calling_profiler():
                prof.stop()           # writes the window (on_trace_ready), or drops an empty one
        finally:
            if discard:
                self.discard = False
            now = time.monotonic()
            if not discard:
                        self._records.append((
                    "wcost", int((self.window_started - self.window_start_cost_s) * 1e9), int(now * 1e9),
                    _native_id(), f"time=1 start_us={_us(self.window_start_cost_s)} "
                    f"stop_us={_us(now - t - self.last_export_s)} export_us={_us(self.last_export_s)} "
                    f"recorded_us={_us(t - self.window_started)} cost_us={_us(self.window_start_cost_s + now - t)} "
                    f"empty={int(self.window_empty)}"))
            if self.time_paced:
                self._pace_time_windows(t, now)

    def _pace_time_windows(self, stopped: float, now: float) -> None:
        """The adaptive time schedule, once a window ended at `stopped` (and was written by
        `now`): an empty one is tried again soon; after one that caught ops, the next waits
        until this one's cost (start, stop and export, in the main thread) is under
        WINDOW_COST_SHARE of the time since, at least as long as it recorded, and lasts about
        what costs WINDOW_STALL_S to stop and write (within MIN_WINDOW_S..window_s)."""
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

    # -- the main thread's Python, sampled -------------------------------------------------------

    def _pystack_loop(self) -> None:
        """While a torch profiler records in this process, the main thread's innermost frame of
        the user's own code (not the standard library's, not an installed package's) every
        PYSAMPLE_S, as an instant "pysample" line: analysis keeps the ones that fall in the
        main thread's time outside ops (signals.host_where). Between windows the thread sleeps
        until the next one starts (self._sampling): no wake-up of its own in the workload's
        process, where 50 a second cost a loop of small ops GIL hand-overs."""
        main = threading.main_thread()
        ident, tid = main.ident, main.native_id
        assert ident is not None and tid is not None    # (the main thread runs)
        try:
            import sysconfig
            paths = sysconfig.get_paths()
            skip = tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                          if paths.get(k)} | {os.path.dirname(os.path.realpath(__file__)) + os.sep})
        except Exception:
            return
        labels: dict[tuple[str, int], str] = {}
        real: dict[str, str] = {}
        try:
            from importlib import _bootstrap
            bootstrap: Any = _bootstrap                 # (private: typeshed leaves it out)
            importing = bootstrap._module_locks         # a module's entry while it is imported
        except (ImportError, AttributeError):
            return
        while True:
            if self.prof is None and self.window_prof is None:
                # no window: asleep until one starts (no wake-up of its own between windows)
                self._sampling.clear()
                if self.prof is None and self.window_prof is None and not self._wake.is_set():
                    self._sampling.wait()
            if self._wake.wait(PYSAMPLE_S):
                return
            if os.getpid() != self.pid or self.stopped:
                return
            if self.prof is None and self.window_prof is None:
                continue
            if importing or _IN_PROFILER_CALL:
                # no frame taken from the main thread while it imports or calls the profiler:
                # a sample taken as the profiler's start imported torch._inductor.config left
                # that module half-initialized in 1 of 10 two-rank runs (never without sampling)
                continue
            try:
                frame = sys._current_frames().get(ident)
                while frame is not None:
                    code = frame.f_code
                    path = real.get(code.co_filename)
                    if path is None:
                        path = real[code.co_filename] = os.path.realpath(code.co_filename)
                    if not code.co_filename.startswith("<") and not path.startswith(skip):
                        key = (code.co_filename, frame.f_lineno)
                        label = labels.get(key)
                        if label is None:
                            if len(labels) > 4096:
                                labels.clear()
                            label = labels[key] = (f"{code.co_name} ({os.path.basename(code.co_filename)}"
                                                   f":{frame.f_lineno})").replace("\t", " ").replace("\n", " ")
                        t = _monotonic_ns()
                        self._records.append(("pysample", t, t, tid, label))
                        break
                    frame = frame.f_back
                frame = None
            except Exception:
                return            # sampling is evidence: it never costs the job anything more
            if len(real) > 4096:
                real.clear()

    # -- writing the steps --------------------------------------------------------------------

    def _flush_loop(self) -> None:
        flushed = time.monotonic()
        while not self._wake.wait(self._next_wake(flushed)):
            if os.getpid() != self.pid:
                return
            now = time.monotonic()
            if now - flushed >= FLUSH_EVERY_S:
                self.flush()
                flushed = now
                self._release_held()
                if self.ask is None:
                    self._poll_asks(now)
                self._check_roots(now)
            if self._ticking:
                continue
            if self.window_prof is not None:
                if self._window_grew():
                    self.window_end = min(self.window_end, now)
                due = now >= self.window_end
            else:
                due = self._window_wanted(now)
            if due:
                try:
                    import _thread
                    _thread.interrupt_main(WINDOW_SIGNAL)
                    self._asked = now
                except Exception:
                    self._window_signal = False
        self.flush()

    def _next_wake(self, flushed: float) -> float:
        """Seconds until the flusher next looks: the next flush, the next check of a window
        recording now (WINDOW_POLL_S, or FLUSH_EVERY_S / 4 for a schedule given), or the
        next time window's start."""
        now = time.monotonic()
        wait = max(0.01, flushed + FLUSH_EVERY_S - now)
        if self.time_paced and now - self._asked < FLUSH_EVERY_S:
            return min(wait, WINDOW_POLL_S)     # the main thread was asked: it starts or ends one
        if self.window_prof is not None:
            if not self.time_paced:
                return min(wait, FLUSH_EVERY_S / 4)
            return min(wait, WINDOW_POLL_S, max(0.002, self.window_end - now))
        if self.time_paced and not (self.marks or self.forwards or self.stopped) \
                and self.next_window > now:
            wait = min(wait, max(0.01, self.next_window - now))
        return wait

    def _rss(self) -> int:
        """The process's resident bytes (0: unknown), from a kept /proc/self/statm."""
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return 0

    def _window_grew(self) -> bool:
        """The adaptive time window recording now holds about WINDOW_GROWTH_BYTES of events:
        the process grew that much over the larger of its size at the window's start and at
        the first reading, in two readings in a row (a loop's tensors allocated and freed move
        the size up and down by their size; torch's events only add)."""
        if not self.time_paced or not self.window_rss:
            return False
        rss = self._rss()
        if self.window_rss_first:
            self.window_rss_first = False
            self.window_rss = max(self.window_rss, rss)
            return False
        grown = rss - self.window_rss
        if grown < WINDOW_GROWTH_BYTES:
            self.window_full = False      # (a flag from one reading only)
            return False
        if self.window_full:
            return True
        self.window_full = True           # the next reading decides
        return False

    def _traces_folder(self) -> str:
        # counterprof.store.rundir.traces_dir(run, rank): <run>/_ranks/rank=<r>/traces (this
        # module runs inside the workload and cannot import counterprof)
        return os.path.join(self.run, "_ranks", f"rank={self.current_rank()}", "traces")

    def _steps_fd(self) -> int:
        folder = self._traces_folder()
        path = os.path.join(folder, f"{self.host}_{self.pid}.steps")
        fd = self._files.get(path)
        if fd is None:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            self._files[path] = fd
            self.steps_paths.append(path)
            if os.fstat(fd).st_size == 0:
                os.write(fd, f"counterprof-steps 1\tpid={self.pid}\thost={self.host}\n".encode())
        return fd

    def flush(self, final: bool = False, touch: bool = False) -> None:
        """Append the buffered records to this process's steps file (the thread does it once a
        second, and so do close and each window; final: at exit, even with none; touch: create
        the file even with none: before a trace, whose step spans it replaces, convert.py)."""
        if os.getpid() != self.pid:
            return
        with self.lock:           # (taken before _flush_lock, never inside it: _export flushes
            self._drain()                                        # under self.lock)
            times, base = self._step_times, self._step_base
            if times:
                self._step_times = array("q")
        with self._flush_lock:
            records = self._records
            if not records and not times and not final and not touch:
                return
            if final and not records and not times and self._in_dataloader_worker():
                return                # a worker that timed nothing: no file of its own
            off = self.offset_ns
            lines = [f"step\t{times[i] + off}\t{times[i + 1] + off}\t{times[i + 2]}\tProfilerStep#{base + i // 3}\n"
                     for i in range(0, len(times), 3)]
            try:
                while True:
                    kind, start, end, tid, what = records.popleft()
                    if kind == "step":
                        lines.append(f"step\t{start + off}\t{end + off}\t{tid}\tProfilerStep#{what}\n")
                    elif kind == "input":
                        lines.append(f"input\t{start + off}\t{end + off}\t{tid}\t{what}\n")
                    elif kind == "pysample":
                        lines.append(f"pysample\t{start + off}\t{start + off}\t{tid}\t{what}\n")
                    elif kind == "wcost":
                        lines.append(f"wcost\t{start + off}\t{end + off}\t{tid}\t{what}\n")
                    else:
                        lines.append(f"{kind}\t{what}\n")
            except IndexError:
                pass
            try:
                fd = self._steps_fd()
                data = "".join(lines).encode()
                while data:
                    data = data[os.write(fd, data):]
            except Exception as exc:   # the run went away: timing stops, the workload goes on
                if not self.stopped or self.stopped == "closed":
                    _say(f"could not write step times in pid {os.getpid()}: {exc}")
                self.stopped = self.stopped or f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _in_dataloader_worker() -> bool:
        data = sys.modules.get("torch.utils.data")
        try:
            return data is not None and data.get_worker_info() is not None
        except Exception:
            return False

    # -- writing a window ---------------------------------------------------------------------

    def current_rank(self) -> int:
        """torch.distributed's rank while it is initialised, and the last one it had after
        (a window written at exit, after destroy_process_group), else $RANK, else the one
        configured, else 0."""
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                self.known_rank = int(dist.get_rank())
                return self.known_rank
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

    def _next_path(self, suffix: str) -> str:
        folder = self._traces_folder()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with self.lock:
            self.seq += 1
            seq = self.seq
        return os.path.join(folder, f"{self.host}_{self.pid}.{seq}{suffix}")

    def _export_time_window(self, prof: Any) -> None:
        """A time window's trace is named apart (<host>_<pid>.<n>.time.pt.trace.json): recorded
        while nothing marked steps, it may hold the first step, which the step verdict leaves
        out (analysis/signals.py). One that caught no torch op is dropped (the process was
        importing, or reading its data: the window is tried again). An adaptive one is held
        under a hidden name (the collector does not see it) until HOLD_S passed with no step
        mark, or the process exits: a training job's set-up, seconds before its first step, is
        not left as a trace (_drop_held)."""
        if self.ask_window and self.ask is not None and self.ask_first == 0:   # (started for the ask)
            self._answer_written(prof, f".ask-{self.ask['id']}.time.pt.trace.json")
            return
        held = self.time_paced
        if self._export(prof, ".time.pt.trace.json", keep=_caught_an_op, hold=held):
            if not held:
                self._window_written()
        elif not self.discard and os.getpid() == self.pid and not self.stopped:
            self.window_empty = True
            self.empty_windows += 1

    def _window_written(self) -> None:
        self.windows_kept += 1
        if self.windows_kept == 1:
            self._set_marks_note("window")

    def _export(self, prof: Any, suffix: str = ".pt.trace.json", keep: Callable[[str], bool] | None = None,
                hold: bool = False) -> bool:
        """Write the window's trace into the run (complete files only: a temporary name, then
        renamed); keep(temporary path) False: drop it instead; hold: leave it under its
        temporary name, in self.held_windows, for _release_held. True: written (or held)."""
        if self.discard or os.getpid() != self.pid:
            return False
        try:
            self.flush(touch=True)
            if hold:
                folder = self._traces_folder()
                os.makedirs(folder, mode=0o700, exist_ok=True)
                self.holds += 1
                tmp = os.path.join(folder, f".{self.host}_{self.pid}.held{self.holds}{suffix}.tmp")
            else:
                path = self._next_path(suffix)
                tmp = path + ".tmp"
            t = time.monotonic()
            prof.export_chrome_trace(tmp)
            self.last_export_s = time.monotonic() - t
            if keep is not None and not keep(tmp):
                os.unlink(tmp)
                return False
            os.chmod(tmp, 0o600)
            if hold:
                with self.lock:
                    self.held_windows.append((time.monotonic(), tmp, suffix))
                return True
            os.replace(tmp, path)        # the collector converts complete files only
            self.written.append(path)
            return True
        except Exception as exc:
            self._fail(exc)
            return False

    def _release_held(self, every: bool = False) -> None:
        """Rename the held time windows into place (the collector converts them), those held
        HOLD_S with no step mark since, or every one (at exit); in the traces folder of the
        rank the process has now (torch.multiprocessing.spawn's ranks learn theirs after
        torch's import)."""
        if os.getpid() != self.pid or not self.held_windows:
            return
        with self.lock:
            if self.marks:
                return                # (dropped by _set_marks)
            now = time.monotonic()
            due = [h for h in self.held_windows if every or now - h[0] >= HOLD_S]
            if not due:
                return
            self.held_windows = [h for h in self.held_windows if h not in due]
            for _, tmp, suffix in due:
                try:
                    path = self._next_path(suffix)
                    os.replace(tmp, path)
                    self.written.append(path)
                    self._window_written()
                except Exception as exc:
                    _say(f"could not write a time window of pid {self.pid}: {type(exc).__name__}: {exc}")

    def _drop_held(self) -> None:
        """Steps are marked from here on: the time windows held were the job's set-up."""
        held, self.held_windows = self.held_windows, []
        for _, tmp, _ in held:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    # -- asked windows (counterprof trace) -----------------------------------------------------------

    def register(self) -> None:
        """<run>/_control/drivers/<host>_<pid>.json: who `counterprof trace` may expect to answer."""
        try:
            _write_control(self.run, "drivers", f"{self.host}_{self.pid}.json",
                           {"pid": self.pid, "host": self.host, "rank": self.current_rank(),
                            "started_ns": time.time_ns(), "argv": sys.argv[:1]})
        except OSError:
            pass                      # (a run without the channel: asks never reach this process)

    def _poll_asks(self, now: float) -> None:
        """The flusher, once a second: the first ask not seen yet becomes the one to serve."""
        if self.stopped or self.closing:
            return
        doc = next_ask(self.run, self.asks_seen)
        if doc is not None:
            with self.lock:
                self.ask, self.ask_first = doc, -1
                self._due[0] = 0
                doc["seen_ns"] = time.time_ns()        # (how long the ask took to reach it)
                helper = self._helper_process()
                if helper:
                    self._answer("not reached", why=helper)
                    return
                if self.user_profilers or self.adopted:
                    self._answer("not reached", why="the script runs its own torch.profiler (counterprof "
                                                    "keeps a copy of each trace it exports)")
                    return
                if not (self.marks or self.forwards):
                    # no step marks: a time window of the asked length, started by the main thread
                    self.ask_s = (doc.get("ms") or 1000 * self.window_s) / 1000
                    self.ask_window = True     # (the flusher asks the main thread next)
                    if self.window_prof is not None:
                        self.window_end = now  # the window recording now ends first

    def _helper_process(self) -> str:
        """Why this process runs no windows of its own ("" when it does): a DataLoader worker,
        or a multiprocessing child that is no rank of torch.distributed."""
        if self._in_dataloader_worker():
            return "a DataLoader worker (its loop's process is traced)"
        mp = sys.modules.get("multiprocessing")
        if mp is not None and mp.parent_process() is not None:
            dist = sys.modules.get("torch.distributed")
            try:
                if dist is not None and dist.is_available() and dist.is_initialized():
                    return ""
            except Exception:
                pass
            if not (self.marks or self.forwards):
                return "a multiprocessing child that marks no steps and is no rank"
        return ""

    def _start_ask(self) -> None:
        """At a step boundary: a profiler that warms up one step, records the asked steps and
        writes them (the trace's name says which ask)."""
        assert self.ask is not None
        n = max(1, int(self.ask.get("steps") or 1))
        from torch.profiler import ProfilerAction

        def schedule(i: int) -> ProfilerAction:
            if i == 0:
                return ProfilerAction.WARMUP
            return ProfilerAction.RECORD if i < n else \
                ProfilerAction.RECORD_AND_SAVE if i == n else ProfilerAction.NONE
        suffix = f".ask-{self.ask['id']}.pt.trace.json"
        self.ask_first = self.steps + 1
        self._step_profiler(schedule, lambda p: self._answer_written(p, suffix))

    def _answer_written(self, prof: Any, suffix: str) -> None:
        """on_trace_ready of an asked window: write it and answer."""
        ask = self.ask
        if ask is None or self.discard:
            return
        n_before = len(self.written)
        ok = self._export(prof, suffix)
        if ok and len(self.written) > n_before:
            path = self.written[-1]
            try:
                size = os.path.getsize(path)
            except OSError:
                size = 0
            if self.ask_window:
                self._answer("traced", ms=round(1000 * (time.monotonic() - self.window_started)),
                             file=os.path.basename(path), bytes=size)
            else:
                self._answer("traced", steps=[self.ask_first, max(self.ask_first, self.steps - 1)],
                             file=os.path.basename(path), bytes=size)
        else:
            self._answer("not reached", why=f"the trace could not be written: {self.stopped or 'see stderr'}")

    def _answer(self, status: str, **fields: Any) -> None:
        """<run>/_control/answers/<id>/<host>_<pid>.json, and this process free for the next ask."""
        ask, self.ask, self.ask_window, self.ask_first = self.ask, None, False, -1
        if ask is None:
            return
        try:
            _write_control(self.run, os.path.join("answers", str(ask["id"])), f"{self.host}_{self.pid}.json",
                           {"pid": self.pid, "host": self.host, "rank": self.current_rank(), "status": status,
                            "seen_ns": ask.get("seen_ns"), "answered_ns": time.time_ns(), **fields})
        except OSError as exc:
            _say(f"could not answer counterprof trace in pid {self.pid}: {exc}")

    def _fail(self, exc: BaseException) -> None:
        if not self.stopped or self.stopped == "closed":
            self.stopped = f"{type(exc).__name__}: {exc}"
            _say(f"torch profiling stopped in pid {os.getpid()}: {self.stopped}")
            self._records.append(("stopped", 0, 0, 0, self.stopped.replace("\n", " ")))
        if self.ask is not None:
            self._answer("not reached", why=f"profiling stopped in this process: {self.stopped}")
        try:
            prof, self.prof = self.prof, None
            if prof is not None:
                self.discard = True
                with _calling_profiler():
                    prof.stop()
        except Exception:
            pass
        try:
            self._remove_forward_hooks()
        except Exception:
            pass


def _caught_an_op(path: str) -> bool:
    """Does this Kineto trace hold a torch op? A large one does; a small one is read for one
    event of category cpu_op (what Kineto writes for every op, `"cat": "cpu_op"`)."""
    try:
        if os.path.getsize(path) >= EMPTY_TRACE_CHECK_BYTES:
            return True
        with open(path, "rb") as f:
            return b'"cpu_op"' in f.read()
    except OSError:
        return True                   # kept: the export's own failure is not hidden here


def _on_window_signal(signum: int, frame: FrameType | None) -> None:
    """The flusher's ask to start or end a time window, run by Python on the main thread
    between two bytecodes, wherever it was. Not inside an import: torch.profiler's start reads
    torch._inductor.config, and a start while the main thread was importing that very module
    found it half-made (AttributeError, profiling stopped in 1 of 3 two-rank gloo runs). The
    flusher asks again."""
    drv = _driver
    if drv is None:
        return
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            return
        f = f.f_back
    drv._window_tick()


def _roots_supported() -> bool:
    """nn.Module.__call__ calls an instance's `_compiled_call_impl` when one is set (torch 2.2+):
    the roots' wrappers go there."""
    try:
        from torch.nn.modules.module import Module
        call: Any = Module.__dict__.get("_wrapped_call_impl")
        return "_compiled_call_impl" in Module.__dict__ and call is not None \
            and Module.__call__ is call and "_compiled_call_impl" in call.__code__.co_names
    except Exception:
        return False


def _root_wrapper_of(call: Any) -> Any:
    """The `on` flag of the driver whose root wrapper `call` is (None: no wrapper of ours)."""
    inner = getattr(call, "__dict__", None)
    return inner.get("_counterprof_root") if isinstance(inner, dict) else None


def _unwrap(state: dict[str, Any]) -> None:
    """A module's __dict__ given back what its `_compiled_call_impl` was before our wrapper."""
    had, prior = state["_compiled_call_impl"].__dict__["_counterprof_prior"]
    if had:
        state["_compiled_call_impl"] = prior
    else:
        state.pop("_compiled_call_impl", None)


def _in_module_call() -> bool:
    """Another thread is inside an nn.Module call now (a frame of Module.__call__'s on its stack)."""
    from torch.nn.modules.module import Module
    codes = {getattr(Module.__dict__.get(name), "__code__", None) for name in ("_wrapped_call_impl", "_call_impl")}
    me = _ident()
    for ident, frame in sys._current_frames().items():
        f: Any = frame
        while f is not None and ident != me:
            if f.f_code in codes:
                return True
            f = f.f_back
    return False


def _patch_replicate() -> None:
    """DataParallel's replicas are copies of their module's __dict__: a replica of a root must
    not keep the root's wrapper (it would call the root itself, on the replica's inputs)."""
    from torch.nn.modules.module import Module
    cls: Any = Module
    original = cls.__dict__.get("_replicate_for_data_parallel")
    if original is None or getattr(original, "_counterprof", False):
        return

    def _replicate_for_data_parallel(self: Any) -> Any:
        replica = original(self)
        state = replica.__dict__
        if _root_wrapper_of(state.get("_compiled_call_impl")) is not None:
            _unwrap(state)
        return replica

    _replicate_for_data_parallel.__dict__["_counterprof"] = True
    _replicate_for_data_parallel.__dict__["__wrapped__"] = original
    cls._replicate_for_data_parallel = _replicate_for_data_parallel


def _patch_dataloader() -> None:
    """Time every next() on a DataLoader iterator (the base class's: subclasses keep it)."""
    from torch.utils.data import dataloader
    cls: Any = dataloader._BaseDataLoaderIter
    if getattr(cls.__next__, "_counterprof", False):
        return
    original = cls.__next__

    def __next__(self: Any) -> Any:
        start = _monotonic_ns()
        try:
            return original(self)
        finally:
            drv = _driver
            if drv is not None:
                name = getattr(self, "_profile_name", None) or \
                    f"enumerate(DataLoader)#{type(self).__name__}.__next__"
                drv.record_input(start, _monotonic_ns(), name)

    __next__.__dict__["_counterprof"] = True
    __next__.__dict__["__wrapped__"] = original
    cls.__next__ = __next__


def get() -> Driver | None:
    return _driver


def step(source: str = "counterprof") -> None:
    if _driver is not None:
        _driver.step(source)


def create(run: str, **config: Any) -> Driver:
    """The process's driver (one per process), hooks installed; torch must be importable."""
    global _driver
    if _driver is not None and _driver.pid == os.getpid() and not _driver.stopped:
        return _driver
    _driver = Driver(run, **config)
    _driver.install()
    if ENV in os.environ:
        _driver.register()        # `counterprof trace` may ask it for a window
    _watch_for_rank(_driver)
    if _driver.start_now:
        _driver.start()
    return _driver


# -- the rank announcement ----------------------------------------------------------------
# A rank of torch.multiprocessing.spawn or a custom launcher has no RANK in its environment:
# it tells `counterprof run`'s rank watcher (counterprof/ranks.py) itself, once torch.distributed
# knows it, in <run>/.ranks/<pid>.json, written once per process.

_announced_pid = 0
_announce_hook: Any = None       # torch's hook handle


def _watch_for_rank(driver: Driver) -> None:
    """Announce this process's rank right after init_process_group returns (wrapped), else at
    the first optimizer step that finds torch.distributed initialised (a process group made
    through a reference to init_process_group taken before the wrap). Only under
    `counterprof run` (the environment variable): counterprof.profile() has no watcher."""
    global _announce_hook
    if ENV not in os.environ:
        return
    try:
        import functools
        import torch.distributed as dist
        if not dist.is_available():       # a build without distributed: no ranks to announce
            return
        from torch.distributed import distributed_c10d as c10d
        from torch.optim.optimizer import register_optimizer_step_post_hook
        original = c10d.init_process_group
        if not getattr(original, "_counterprof_announces", False):
            @functools.wraps(original)
            def init_process_group(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                _announce_rank()
                return result

            init_process_group.__dict__["_counterprof_announces"] = True
            modules: tuple[Any, ...] = (dist, c10d)
            for module in modules:
                if getattr(module, "init_process_group", None) is original:
                    module.init_process_group = init_process_group
        if _announce_hook is None:
            _announce_hook = register_optimizer_step_post_hook(lambda *_: _announce_rank())
        _announce_rank()        # torch.distributed initialised before the driver was created
    except Exception as exc:
        _say(f"ranks of pid {os.getpid()} will not be announced: {type(exc).__name__}: {exc}")


def _announce_rank() -> None:
    """Write <run>/.ranks/<pid>.json (0600, in a 0700 folder, never through a link) once
    torch.distributed is initialised in this process. Never raises."""
    global _announced_pid
    pid = os.getpid()
    drv = _driver
    if _announced_pid == pid or drv is None or drv.pid != pid:
        return                  # done, or a forked child (a DataLoader worker) of a rank
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        _announced_pid = pid
        local = os.environ.get("LOCAL_RANK", "")
        cuda = sys.modules.get("torch.cuda")     # set_device() before init, as NCCL jobs do
        device = cuda.current_device() if cuda is not None and cuda.is_initialized() else None
        doc = {"pid": pid, "rank": int(dist.get_rank()), "world_size": int(dist.get_world_size()),
               "local_rank": int(local) if local.isdigit() else None, "cuda_device": device,
               "host": drv.host}
        write_announcement(drv.run, doc)
    except Exception as exc:
        _say(f"could not announce the rank of pid {pid}: {type(exc).__name__}: {exc}")


def write_announcement(run: str, doc: dict[str, Any]) -> None:
    """<run>/.ranks/<doc's pid>.json (0600, in a 0700 folder, never through a link, renamed
    into place complete: the rank watcher, counterprof/ranks.py, reads whole files). The jax
    driver announces its ranks through this too. Raises OSError."""
    _write_whole(run, [".ranks"], f"{doc['pid']}.json", doc)


def next_ask(run: str, seen: set[str]) -> dict[str, Any] | None:
    """The first ask in <run>/_control/trace not in seen (added to it), or None; asks older than
    ASK_LATE_S and unreadable ones are passed over. The jax driver looks through this too."""
    folder = os.path.join(run, CONTROL, "trace")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        if not name.endswith(".json") or name[:-5] in seen:
            continue
        seen.add(name[:-5])
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                doc = json.loads(os.read(fd, 1 << 16))
            finally:
                os.close(fd)
            if isinstance(doc, dict) and time.time_ns() - int(doc["asked_ns"]) <= ASK_LATE_S * 1e9:
                return doc
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _write_control(run: str, sub: str, name: str, doc: dict[str, Any]) -> None:
    """<run>/_control/<sub>/<name>, as write_announcement writes (counterprof's
    store/control.py reads them; this module cannot import counterprof). Raises OSError."""
    _write_whole(run, [CONTROL, *sub.split(os.sep)], name, doc)


def _write_whole(run: str, parts: list[str], name: str, doc: dict[str, Any]) -> None:
    """<run>/<parts...>/<name>: 0600 in 0700 folders, never through a link, renamed into place
    complete."""
    folder = run
    for part in parts:
        folder = os.path.join(folder, part)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.write(fd, json.dumps(doc).encode())
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def _is_launcher() -> bool:
    """torchrun and torch.distributed.launch import torch but run no training."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if argv and os.path.basename(sys.argv[0] if sys.argv else "") in ("torchrun",):
        return True
    for i, a in enumerate(argv[:-1]):
        if a == "-m" and argv[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return True
    return False


def _on_torch_imported() -> None:
    try:
        if _is_launcher():
            return
        config = json.loads(os.environ[ENV])
        run = config.pop("run")
        create(run, **config)
    except Exception as exc:
        _say(f"torch profiling not started in pid {os.getpid()}: {type(exc).__name__}: {exc}")


class _TorchImportWatcher:
    """A meta path finder that runs _on_torch_imported once `import torch` has finished."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != "torch":
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
        _on_torch_imported()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def install_from_env() -> None:
    """From sitecustomize: profile this process once it imports torch."""
    if ENV not in os.environ:
        return
    if "torch" in sys.modules:
        _on_torch_imported()
        return
    if not any(isinstance(f, _TorchImportWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportWatcher())
