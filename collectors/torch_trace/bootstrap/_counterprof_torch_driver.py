"""counterprof's torch.profiler driver, running inside the workload's Python processes.

Loaded by the bootstrap (sitecustomize.py next to this file) in processes launched by
`counterprof run --torch`, and by the torch collector itself for `counterprof.profile(...)`.
It needs only the standard library and torch: the workload's Python need not have counterprof.
Always imported under the name `_counterprof_torch_driver`, so counterprof.step() finds it.

Windows: the profiler records `active` steps every `every` steps (warming up `warmup` steps
before each window), step 0 being the first step mark. Step marks, in order of preference:
counterprof.step(), the step() of a torch.profiler.profile the script runs itself, and
otherwise every optimizer.step() (a global post hook), so an unmodified training script is
windowed with no change. A script that runs its own torch.profiler keeps it: counterprof stands
down and keeps a copy of each trace the script exports from that profiler instead.

Each finished window is written by torch (export_chrome_trace) to
<run>/_ranks/rank=<rank>/traces/<host>_<pid>.<n>.pt.trace.json under a temporary name, then
renamed: the profiler converts only complete files. rank: torch.distributed's rank when
initialised, else $RANK, else the configured rank, else 0.

Nothing here may raise into the workload: a failure stops profiling in this process, with one
line on stderr.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import sys
import threading
import warnings

ENV = "COUNTERPROF_TORCH"
DEFAULTS = {"every": 50, "active": 5, "warmup": 1, "record_shapes": True, "with_stack": False,
            "profile_memory": False, "rank": None, "start_now": False}

_driver: "Driver | None" = None


def _step_quietly(prof) -> None:
    """torch warns at every window that events do not accumulate across cycles: intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        prof.step()


def _say(message: str) -> None:
    try:
        print(f"counterprof: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


class Driver:
    def __init__(self, run: str, **config):
        cfg = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        self.run = run
        self.every = int(cfg["every"])
        self.active = int(cfg["active"])
        self.warmup = int(cfg["warmup"])
        self.record_shapes = bool(cfg["record_shapes"])
        self.with_stack = bool(cfg["with_stack"])
        self.profile_memory = bool(cfg["profile_memory"])
        self.rank = cfg["rank"]
        self.start_now = bool(cfg["start_now"])
        self.pid = os.getpid()
        self.host = socket.gethostname().split(".")[0]
        self.lock = threading.RLock()
        self.prof = None              # our torch.profiler.profile, once the first window starts
        self.seq = 0                  # windows written
        self.explicit = False         # counterprof.step() or a profiler's step() was seen
        self.user_profilers = 0       # the script's own profilers running now
        self.adopted = False          # the script runs its own profiler: we export its traces
        self.stopped = ""             # why this process stopped profiling
        self.discard = False
        self.written: list[str] = []
        self._hooks = []

    # -- the schedule ---------------------------------------------------------------------

    def schedule(self, step: int):
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
        """Step marks from optimizers and from the script's own profilers (torch imported)."""
        import torch
        import torch.profiler as tp
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hooks.append(register_optimizer_step_post_hook(self._optimizer_hook))
        cls = tp.profile
        if not getattr(cls, "_counterprof_patched", False):
            original_start, original_stop, original_step = cls.start, cls.stop, cls.step

            def start(prof, *a, **k):
                drv = _driver
                if drv is not None and not getattr(prof, "_counterprof", False):
                    drv._user_profiler_starts(prof)
                return original_start(prof, *a, **k)

            def stop(prof, *a, **k):
                try:
                    return original_stop(prof, *a, **k)
                finally:
                    drv = _driver
                    if drv is not None and not getattr(prof, "_counterprof", False):
                        drv.user_profilers = max(0, drv.user_profilers - 1)

            def step(prof, *a, **k):
                drv = _driver
                if drv is not None and not getattr(prof, "_counterprof", False):
                    drv.explicit = True
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

    def _optimizer_hook(self, optimizer, args, kwargs) -> None:
        self.step("optimizer")

    def _user_profiler_starts(self, prof) -> None:
        """The script starts its own torch.profiler: ours makes way, and each trace the script
        exports from it (its on_trace_ready, tensorboard_trace_handler, or an explicit
        export_chrome_trace) is copied into the run. Kineto saves a trace only once, so we never
        export a script's profiler ourselves: that would make the script's own export fail."""
        with self.lock:
            self.user_profilers += 1
            self.adopted = True
            if self.prof is not None:
                self._stop_ours(discard=True)
            if getattr(prof, "_counterprof_copies", False):
                return
            prof._counterprof_copies = True
            original = prof.export_chrome_trace

            def export_chrome_trace(path, *args, **kwargs):
                result = original(path, *args, **kwargs)
                self._copy(str(path))
                return result

            prof.export_chrome_trace = export_chrome_trace

    def _copy(self, path: str) -> None:
        if os.getpid() != self.pid:
            return
        try:
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
        try:
            with self.lock:
                if self.stopped or os.getpid() != self.pid:
                    return
                if source != "optimizer":
                    self.explicit = True
                elif self.explicit:
                    return            # explicit marks rule; optimizer steps would double count
                if self.user_profilers:
                    return            # the script's own profiler is recording
                if self.prof is None:
                    self.start()
                else:
                    _step_quietly(self.prof)
        except Exception as exc:
            self._fail(exc)

    def start(self) -> None:
        """Start recording now (the first window)."""
        with self.lock:
            if self.prof is not None or self.stopped or self.user_profilers:
                return
            try:
                import torch
                from torch.profiler import ProfilerActivity, profile
                activities = [ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(ProfilerActivity.CUDA)    # ROCm builds too
                prof = profile(activities=activities, schedule=self.schedule,
                               on_trace_ready=self._export, record_shapes=self.record_shapes,
                               with_stack=self.with_stack, profile_memory=self.profile_memory)
                prof._counterprof = True
                prof.start()
                self.prof = prof
            except Exception as exc:
                self._fail(exc)

    def _stop_ours(self, discard: bool) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        self.discard = discard
        try:
            prof.stop()
        finally:
            self.discard = False

    def close(self) -> None:
        """Stop recording; the window in progress is written (at exit, or by the collector)."""
        try:
            with self.lock:
                if os.getpid() != self.pid:
                    return
                self._stop_ours(discard=False)
                self.stopped = self.stopped or "closed"
                for h in self._hooks:
                    h.remove()
                self._hooks.clear()
        except Exception as exc:
            self._fail(exc)

    # -- writing a window ---------------------------------------------------------------------

    def current_rank(self) -> int:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:
            pass
        for value in (os.environ.get("RANK"), self.rank):
            try:
                if value is not None:
                    return int(value)
            except ValueError:
                pass
        return 0

    def _next_path(self, suffix: str) -> str:
        # counterprof.store.rundir.traces_dir's path (this module cannot import counterprof)
        folder = os.path.join(self.run, "_ranks", f"rank={self.current_rank()}", "traces")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with self.lock:
            self.seq += 1
            seq = self.seq
        return os.path.join(folder, f"{self.host}_{self.pid}.{seq}{suffix}")

    def _export(self, prof) -> None:
        if self.discard or os.getpid() != self.pid:
            return
        try:
            path = self._next_path(".pt.trace.json")
            tmp = path + ".tmp"
            prof.export_chrome_trace(tmp)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)        # the collector converts complete files only
            self.written.append(path)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if not self.stopped or self.stopped == "closed":
            self.stopped = f"{type(exc).__name__}: {exc}"
            _say(f"torch profiling stopped in pid {os.getpid()}: {self.stopped}")
        try:
            prof, self.prof = self.prof, None
            if prof is not None:
                self.discard = True
                prof.stop()
        except Exception:
            pass


def get() -> "Driver | None":
    return _driver


def step(source: str = "counterprof") -> None:
    if _driver is not None:
        _driver.step(source)


def create(run: str, **config) -> Driver:
    """The process's driver (one per process), hooks installed; torch must be importable."""
    global _driver
    if _driver is not None and _driver.pid == os.getpid() and not _driver.stopped:
        return _driver
    _driver = Driver(run, **config)
    _driver.install()
    _watch_for_rank(_driver)
    if _driver.start_now:
        _driver.start()
    return _driver


# -- the rank announcement ----------------------------------------------------------------
# A rank of torch.multiprocessing.spawn or a custom launcher has no RANK in its environment:
# it tells `counterprof run`'s rank watcher (counterprof/ranks.py) itself, once torch.distributed
# knows it, in <run>/.ranks/<pid>.json, written once per process.

_announced_pid = 0
_announce_hook = None


def _watch_for_rank(driver) -> None:
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
            def init_process_group(*args, **kwargs):
                result = original(*args, **kwargs)
                _announce_rank()
                return result

            init_process_group._counterprof_announces = True
            for module in (dist, c10d):
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
        folder = os.path.join(drv.run, ".ranks")
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            tmp, name = f"{pid}.json.tmp", f"{pid}.json"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dfd)
            try:
                os.write(fd, json.dumps(doc).encode())
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)   # the watcher reads whole files
        finally:
            os.close(dfd)
    except Exception as exc:
        _say(f"could not announce the rank of pid {pid}: {type(exc).__name__}: {exc}")


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

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util
        sys.meta_path.remove(self)          # one shot; the real finders do the finding
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExec(spec.loader)
        return spec


class _AfterExec:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader          # leave no trace of the wrapper
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        _on_torch_imported()

    def __getattr__(self, name):
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
