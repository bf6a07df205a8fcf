"""neuron collector: NeuronCore utilization and FLOP/s, device and host memory, the runtime's
executions, errors and latencies, ECC, from neuron-monitor and the driver's sysfs counters.

On by default wherever neuron-monitor is on PATH or the Neuron sysfs tree exists; elsewhere
"unavailable" with the reason, and the run goes on without it.

Config (config["neuron"]):
  interval_ms   sampling interval, default 1000. neuron-monitor runs at max(1 s, interval)
                (its periods are whole seconds in every documented example); the sysfs
                counters are read at the interval itself, so they are the finer path
  sysfs_root    the sysfs tree (default COUNTERPROF_NEURON_SYSFS, else /sys/devices/virtual/neuron_device)
  process_tag   the workload's NEURON_PROCESS_TAG (default: the one in this environment)

neuron-monitor is started by this collector, in the profiler's process: a child of the
profiler, never of the workload (under `counterprof run`; in-process, profile() runs it from
the workload's own process). One thread starts it and reads it (child.py: its own process
group, a death signal tied to that thread, bounded lines and stderr). A line that is not a JSON
object or is over child.MAX_LINE, the monitor's exit, its silence, or a flood marks the
collector failed with the reason; rows already taken are kept, and the run goes on (sysfs
sampling too). The workload's runtimes are those
whose pid is in the workload's process tree, or whose tag is the workload's NEURON_PROCESS_TAG.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from counterprof.collector import Availability, Collector, SessionContext
from counterprof.ground.errors import UsageError
from counterprof.ground.pathsearch import which
from counterprof.ground.proctree import environ, rank_of, tree_order
from counterprof.ground.schema import samples_batch

from . import monitor, sysfs
from .metrics import BY_NAME
from .options import NeuronOptions
from .topology import Topology, device_rows, neuron_ls, own_cores, sysfs_root

# one sample: (time_ns, duration_ns | None, metric, entity, value, rank)
_Sample = tuple[int, int | None, str, str, float, int]

if TYPE_CHECKING:
    from .child import MonitorProcess

MONITOR_COMMAND = "neuron-monitor"
SCAN_EVERY_NS = 1_000_000_000        # the workload's tree, its ranks and tags: once a second
MAX_TREE_PIDS = 256                  # environments read per scan, at most
STOP_WAIT_S = 2.0
SPAWN_WAIT_S = 10.0
MAX_ERRORS_KEPT = 64                 # distinct places with an error string, in meta.json
TMP_PREFIX = "counterprof-neuron-"     # + the profiler's pid + "-": a dead profiler's is swept
# neuron-monitor writes one line a period; a backlog read late comes in a burst, a flood
# (not the real monitor, or a broken one) is cut to LINES_PER_PERIOD a period
BURST_LINES = 10
LINES_PER_PERIOD = 2


def silent_after_s(period_s: float) -> float:
    """How long without a line before the monitor is said to be silent."""
    return max(5.0, 3 * period_s + 2.0)


def sweep_stale_dirs(tmp: str | None = None) -> list[str]:
    """Config directories left by profilers that were killed (SIGKILL runs no cleanup)."""
    import glob        # here, with tempfile and subprocess (child.py): a run without Neuron
    import tempfile    # devices imports none of them
    removed = []
    for d in glob.glob(os.path.join(tmp or tempfile.gettempdir(), TMP_PREFIX + "*-*")):
        pid = os.path.basename(d)[len(TMP_PREFIX):].partition("-")[0]
        if not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue              # its profiler is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        import shutil
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _monitor_path() -> str | None:
    return which(MONITOR_COMMAND)


class NeuronCollector(Collector):
    name = "neuron"
    options = NeuronOptions
    DEFAULTS = {"interval_ms": 1000.0, "sysfs_root": None, "process_tag": None}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rows: list[_Sample] = []
        self._threads: list[threading.Thread] = []
        self._mon: MonitorProcess | None = None
        self._spawned = threading.Event()
        self._spawn_error: BaseException | None = None
        self._tmp: str | None = None
        self._tokens = float(BURST_LINES)
        self._token_ns = 0
        self._last_line_ns = 0
        self._said_silent = False
        self._monitor_out = False            # it exited, or never printed: sysfs on its own
        self._failures: list[str] = []
        self._cataloged: set[str] = set()
        self._warned: set[str] = set()
        self.parser = monitor.Parser(Topology())
        self.lines = self.bad_lines = self.lines_dropped = 0
        self.errors: dict[str, str] = {}
        self.runtimes: dict[int, str | None] = {}
        # the workload's tree: pid -> rank, NeuronCore -> rank, tags; refreshed once a second
        self._tree: set[int] = set()
        self._pid_rank: dict[int, int] = {}
        self._core_rank: dict[int, int] = {}
        self._env_cores: set[int] = set()
        self._tags: set[str] = set()
        self._scanned_ns = 0

    # -- before the run ------------------------------------------------------------------

    @classmethod
    def availability(cls, config: dict[str, Any] | None = None) -> Availability:
        cfg = cls.with_defaults(config)
        root = sysfs_root(cfg)
        if _monitor_path() or sysfs.present(root):
            return Availability(True)
        return Availability(False, f"no Neuron device here: {MONITOR_COMMAND} is not on PATH and {root} "
                                   "has no neuronN device (install aws-neuronx-tools and the Neuron driver "
                                   "on a Trainium/Inferentia instance)")

    @classmethod
    def validate(cls, config: dict[str, Any]) -> None:
        cfg = cls.with_defaults(config)
        try:
            interval = float(cfg["interval_ms"])
        except (TypeError, ValueError):
            raise UsageError(f"neuron interval must be a number of ms, not {cfg['interval_ms']!r}") from None
        if not 10 <= interval <= 3_600_000:
            raise UsageError(f"neuron interval {interval:g} ms is out of range (10 ms to 1 h; "
                             "neuron-monitor itself reports at most once a second)")

    @classmethod
    def inventory(cls, config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cfg = cls.with_defaults(config)
        listed = neuron_ls()
        if listed is not None:
            return [{"title": "Neuron devices",
                     "columns": ["device", "pci bdf", "cores", "logical nc", "memory", "neuroncore ids", "processes"],
                     "rows": device_rows(listed),
                     "note": f"from neuron-ls -j; neuron-monitor {'on PATH' if _monitor_path() else 'not on PATH'}"}]
        root = sysfs_root(cfg)
        return [{"title": "Neuron devices", "columns": ["device", "name", "cores"],
                 "rows": sysfs.inventory_rows(root),
                 "note": f"from {root} (neuron-ls is not on PATH)"}]

    # -- the run ------------------------------------------------------------------------

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        t = ctx.target
        self.root = os.getpid() if t.kind == "self" else t.pid
        self.interval_ns = int(float(self.config["interval_ms"]) * 1e6)
        tag = self.config.get("process_tag") or os.environ.get("NEURON_PROCESS_TAG")
        if tag:
            self._tags.add(tag)
        self._scan()
        exe = _monitor_path()
        root = sysfs_root(self.config)
        self.sampler = sysfs.SysfsSampler(root) if sysfs.present(root) else None
        self.details.update({"monitor": exe, "sysfs_root": root if self.sampler else None})
        if exe is not None:
            try:
                self._start_monitor(exe, tag)
            except OSError as exc:
                self._remove_tmp()
                if self.sampler is None:
                    raise
                self._fail(f"{MONITOR_COMMAND} could not be started: {exc}; sysfs counters only")
        if self.sampler is not None:
            self._threads.append(ctx.start_thread("counterprof-neuron-sysfs", self._sample_sysfs))

    def _start_monitor(self, exe: str, tag: str | None) -> None:
        """The config in a directory of our own, the monitor started by its reader thread (its
        death signal follows that thread: see child.py); OSError when it cannot be started."""
        sweep_stale_dirs()
        self.period_s = max(monitor.MIN_PERIOD_S, self.interval_ns / 1e9)
        cfg = monitor.config(self.interval_ns / 1e9, tag)
        import tempfile
        from .child import MonitorProcess
        self._tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        path = os.path.join(self._tmp, "monitor.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self._mon = MonitorProcess([exe, "-c", path])
        self._last_line_ns = self._token_ns = time.monotonic_ns()
        self._threads.append(self.ctx.start_thread("counterprof-neuron-monitor", self._run_monitor))
        if not self._spawned.wait(SPAWN_WAIT_S):
            raise OSError(f"not started within {SPAWN_WAIT_S:g} s")
        if self._spawn_error is not None:
            self._mon = None
            raise self._spawn_error
        self.details.update({"monitor_pid": self._mon.pid, "monitor_config": cfg})

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            import shutil
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- the workload's tree ---------------------------------------------------------------

    def _scan(self) -> None:
        """The workload's processes: their ranks, the NeuronCores they were given, their tags."""
        self._scanned_ns = time.monotonic_ns()
        if self.root is None:
            return
        pids = tree_order(self.root)[:MAX_TREE_PIDS]
        if self._mon is not None:
            pids = [p for p in pids if p != self._mon.pid]     # in-process: our own child
        pid_rank: dict[int, int] = {}
        core_rank: dict[int, int] = {}
        env_cores: set[int] = set()
        for pid in pids:
            env = environ(pid)
            if env.get("NEURON_PROCESS_TAG"):
                self._tags.add(env["NEURON_PROCESS_TAG"])
            rank = rank_of(env)
            cores = own_cores(env) or []
            env_cores.update(cores)
            if rank is not None:
                pid_rank[pid] = rank
                for c in cores:
                    core_rank.setdefault(c, rank)
        self._tree = set(pids)
        self._pid_rank.update(pid_rank)
        self._core_rank.update(core_rank)
        self._env_cores |= env_cores

    def _wanted(self, pid: int | None, tag: str | None) -> bool:
        if pid is None and tag is None:
            return True          # older releases: the runtimes the monitor was configured with
        if (pid is not None and pid in self._tree) or (tag is not None and tag in self._tags):
            if pid is not None:
                self.runtimes.setdefault(pid, tag)
            return True
        return False

    def _rank(self, pid: int | None, core: int | None) -> int:
        """NeuronCores go to the rank that owns them (NEURON_RT_VISIBLE_CORES), a runtime's other
        rows to its process's rank, when the workload has several ranks; else the session's."""
        if len(set(self._pid_rank.values())) < 2:
            return self.ctx.rank
        if core is not None and core in self._core_rank:
            return self._core_rank[core]
        if pid is not None and pid in self._pid_rank:
            return self._pid_rank[pid]
        return self.ctx.rank

    # -- neuron-monitor --------------------------------------------------------------------

    def _run_monitor(self) -> None:
        mon = self._mon
        assert mon is not None
        try:
            mon.spawn()
        except BaseException as exc:       # start() raises it
            self._spawn_error = exc
            self._spawned.set()
            return
        self._spawned.set()
        try:
            mon.pump(self._on_line, self._on_long_line, self._on_idle, self._stop.is_set)
        except Exception as exc:      # never take the run down: say why and keep what we have
            self._fail(f"reading {MONITOR_COMMAND}: {type(exc).__name__}: {exc}")
            return
        if self._stop.is_set():
            return
        rc = mon.kill(STOP_WAIT_S)     # its output ended: it is gone, or it closed stdout
        if self._stop.is_set():
            return
        self._monitor_out = True
        how = (f"exited with status {rc}" if rc is not None and rc >= 0 else
               f"was killed by signal {-rc}" if rc is not None else "closed its output")
        tail = mon.stderr_tail()
        cut = (f"; its last line was cut off after {mon.partial_at_end} bytes" if mon.partial_at_end else "")
        self._fail(f"{MONITOR_COMMAND} {how} after {self.lines} line(s){cut}" + (f": {tail}" if tail else "")
                   + ("; sysfs counters go on" if self.sampler is not None else ""))

    def _on_line(self, line: bytes) -> None:
        if not line.strip():
            return
        now = self.ctx.clock.now_ns()
        mono = time.monotonic_ns()
        self.lines += 1
        self._last_line_ns = mono
        if self.lines == 1:
            self._remove_tmp()         # it has read its config; nothing is left if we are killed
        # a token bucket: BURST_LINES at once, LINES_PER_PERIOD a period on average
        self._tokens = min(float(BURST_LINES), self._tokens + (mono - self._token_ns) / 1e9
                           * LINES_PER_PERIOD / self.period_s)
        self._token_ns = mono
        if self._tokens < 1.0:
            self.lines_dropped += 1
            if self.lines_dropped == 1:
                self._fail(f"{MONITOR_COMMAND} writes far more than one report a period ({self.period_s:g} s): "
                           f"lines beyond {LINES_PER_PERIOD} a period are dropped (is the {MONITOR_COMMAND} "
                           "on PATH aws-neuronx-tools' own?)")
            return
        self._tokens -= 1.0
        try:
            obj = monitor.decode(line)
            if time.monotonic_ns() - self._scanned_ns >= SCAN_EVERY_NS:
                self._scan()
            rows, errors = self.parser.rows(obj, self._wanted, self.interval_ns / 1e9)
        except Exception as exc:       # ValueError from decode; anything else is a parser bug
            self._bad_line(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")
            return
        self._group_errors(errors)
        self._add(now, rows)
        self.flush()

    def _bad_line(self, why: str) -> None:
        self.bad_lines += 1
        if self.bad_lines == 1:
            self._fail(f"{MONITOR_COMMAND} printed a line that is not its report (line {self.lines}): {why}")

    def _on_long_line(self, size: int) -> None:
        mon = self._mon
        assert mon is not None                  # a callback of its pump
        self.lines += 1
        self._bad_line(f"a line of {size / 2**20:.1f} MiB, over the {mon.max_line >> 20} MiB a "
                       "report can be; dropped")

    def _on_idle(self) -> None:
        quiet = (time.monotonic_ns() - self._last_line_ns) / 1e9
        if not self._said_silent and quiet >= silent_after_s(self.period_s):
            self._said_silent = True
            self._monitor_out = self.lines == 0
            self._fail(f"{MONITOR_COMMAND} has printed nothing for {quiet:.0f} s (its period is "
                       f"{self.period_s:g} s): no NeuronCore, memory or execution figures from it"
                       + ("; sysfs counters go on" if self.sampler is not None else ""))

    def _group_errors(self, errors: dict[str, str]) -> None:
        for where, msg in errors.items():
            if where in self.errors or len(self.errors) < MAX_ERRORS_KEPT:
                self.errors[where] = msg
            key = f"{where}: {msg}"
            if key not in self._warned and len(self._warned) < 20:
                self._warned.add(key)
                self.ctx.warn(f"neuron: {MONITOR_COMMAND} reports an error in {key}")

    # -- sysfs -----------------------------------------------------------------------------

    def _sample_sysfs(self) -> None:
        sampler = self.sampler
        assert sampler is not None              # the thread starts only with one
        clock = self.ctx.clock
        next_tick = clock.now_ns()
        next_flush = next_tick + SCAN_EVERY_NS
        try:
            while True:
                now = clock.now_ns()
                self._add(now, sampler.tick(now, self._sysfs_cores()))
                if now >= next_flush:
                    self.flush()
                    next_flush = now + SCAN_EVERY_NS
                    if self._mon is None:
                        self._scan()
                next_tick = max(next_tick + self.interval_ns, clock.now_ns())
                if self._stop.wait(max(0.0, (next_tick - clock.now_ns()) / 1e9)):
                    break
        except Exception as exc:
            self._fail(f"reading {sampler.root}: {type(exc).__name__}: {exc}")
        finally:
            self.details["sysfs_thread_cpu_s"] = time.thread_time()

    def _sysfs_cores(self) -> set[int] | None:
        """The workload's NeuronCores: those its runtimes reported, and those it was given;
        with no monitor (none, or one that exited or never printed) and no
        NEURON_RT_VISIBLE_CORES, every core (the counters are the device's)."""
        known = self.parser.cores_seen | self._env_cores
        if known:
            return known
        return None if self._mon is None or self._monitor_out else set()

    # -- rows ------------------------------------------------------------------------------

    def _add(self, now: int, rows: list[monitor.Row]) -> None:
        if not rows:
            return
        with self._lock:          # the monitor's and the sysfs thread's rows
            new = {r.metric for r in rows} - self._cataloged
            self._cataloged |= new
        if new:                   # in the catalog before any row of it is written
            self.ctx.add_metrics([BY_NAME[m] for m in sorted(new) if m in BY_NAME])
        with self._lock:
            self._rows.extend((now, r.duration_ns, r.metric, r.entity, r.value, self._rank(r.pid, r.core))
                              for r in rows)

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
        by_rank: dict[int, list[_Sample]] = {}
        for r in rows:
            by_rank.setdefault(r[5], []).append(r)
        for rank, part in sorted(by_rank.items()):
            t, d, m, e, v, _ = zip(*part)
            self.ctx.emit("samples", samples_batch(list(t), list(d), self.name, list(m), list(e), list(v)), rank)

    def _fail(self, reason: str) -> None:
        """Failed, with every reason so far; the rows taken until now go out first."""
        self.flush()
        with self._lock:          # the monitor's and the sysfs thread's failures
            self._failures.append(reason)
            self.reason = " | ".join(self._failures)
        self.status = "failed"
        self._update_details()
        self.ctx.fail(self.name, self.reason)

    def _update_details(self) -> None:
        topo = self.parser.topology
        self.details.update({
            "lines": self.lines, "bad_lines": self.bad_lines, "lines_dropped": self.lines_dropped,
            "errors": dict(self.errors),
            "runtimes": [{"pid": p, "tag": t, **({"rank": self._pid_rank[p]} if p in self._pid_rank else {})}
                         for p, t in sorted(self.runtimes.items())],
            "cores_seen": sorted(self.parser.cores_seen),
        })
        self.run_facts["neuron"] = {"hardware": topo.facts, "devices_used": sorted(self.parser.devices_used),
                                    "cores_per_device": topo.cores_per_device}

    def stop(self) -> None:
        if self._stop.is_set() or not hasattr(self, "ctx"):
            return
        self._stop.set()
        mon = self._mon
        rc = mon.kill(STOP_WAIT_S) if mon is not None and mon.proc is not None else None
        for th in self._threads:
            th.join(timeout=5.0)
        if self.sampler is not None:       # the last partial interval
            now = self.ctx.clock.now_ns()
            self._add(now, self.sampler.tick(now, self._sysfs_cores()))
        if mon is not None and mon.proc is not None:
            if self.lines == 0 and not self._said_silent:
                self._on_idle()            # a run long enough for a report, and none came
            self.details["monitor_exit"] = rc
            if mon.long_lines:
                self.details["monitor_long_lines"] = mon.long_lines
            mon.close()
        self.flush()
        self._update_details()
        self._remove_tmp()


__all__ = ["NeuronCollector"]
