"""The measurements behind `counterprof calibrate`: what this machine can do.

Each measurement warms up, then times at least `repeats` runs (each long enough to time well)
and keeps the median, with min, max and spread ((max - min) / median) beside it; the CPU's
clock and load (or the GPU's clocks, power and throttle reasons, through NVML) are sampled
around it. Functions return plain dicts; `progress(label)` is called before each step.

CPU: dense matmul FLOP/s per dtype (fp32; bf16 where the CPU has it) over a sweep of square
shapes, the best shape's median kept; STREAM copy (a = b) and triad (a = b + s*c) over arrays
at least 4x the last-level cache, all cores (torch's parallel kernels, or numpy chunks on
threads), each the best of short repetitions, not their median (STREAM's choice; cpu_stream
says why); gloo all_reduce / all_gather / reduce_scatter bus bandwidth (nccl-tests' formulas)
between `world` processes on loopback, and the small-message latency.
GPU (CUDA/ROCm torch): matmul per dtype (fp32, tf32, bf16, fp16, fp8) timed with CUDA events,
device-to-device copy, host<->device pinned and pageable, peer-to-peer, NCCL collectives.
"""
from __future__ import annotations

import os
import statistics
import time
from functools import partial
from types import ModuleType
from typing import Any
from collections.abc import Callable

Progress = Callable[[str], None]


def _quiet(label: str) -> None:
    pass


def summarize(values: list[float]) -> dict[str, Any]:
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / med if med else None, "repeats": len(values)}


# How long a matmul size runs before it is timed (see cpu_matmul)
WARMUP_S = 0.25


def _timed(fn: Callable[[], object], min_s: float, sync: Callable[[], None] = lambda: None) -> float:
    """Seconds per call of fn, over as many calls as fill min_s."""
    n, total = 0, 0.0
    sync()
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        sync()
        total = time.perf_counter() - t0
        if total >= min_s:
            return total / n


def cpu_conditions() -> dict[str, Any]:
    """The CPU's clock and the machine's load: a busy machine measures lower ceilings."""
    out: dict[str, Any] = {"loadavg_1m": os.getloadavg()[0]}
    try:
        import psutil
        f = psutil.cpu_freq()
        if f is not None:
            out["cpu_mhz"] = round(f.current)
        out["cpu_percent"] = psutil.cpu_percent(interval=None)
    except Exception:          # psutil without cpu_freq on this platform: the load is enough
        pass
    return out


def llc_bytes() -> int | None:
    """The largest cache's size (sysfs), e.g. the L3."""
    best = None
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * mult
            best = size if best is None else max(best, size)
    except OSError:
        return None
    return best


def _torch() -> ModuleType | None:
    try:
        import torch
        return torch
    except ImportError:
        return None


# ---- CPU compute -----------------------------------------------------------------------------

def cpu_matmul(dtype: str, sizes: list[int], repeats: int, min_s: float,
               progress: Progress = _quiet) -> dict[str, Any]:
    """Dense square matmul FLOP/s (2 n^3 per call) at each size; the best size's median is the peak."""
    torch = _torch()
    # two square operands of side n, and their product: numpy arrays or torch tensors
    make: Callable[[int], tuple[Any, Any]]
    mul: Callable[[Any, Any], Any]
    if torch is None:
        if dtype != "fp32":
            return {"skipped": "needs torch"}
        import numpy as np
        make = lambda n: (np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32))  # noqa: E731
        mul = np.matmul
        threads = os.cpu_count()
        impl = "numpy"
    else:
        tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        if dtype == "bf16" and not _cpu_has_bf16(torch):
            return {"skipped": "this CPU has no bf16 instructions (avx512_bf16/amx_bf16): bf16 "
                               "matmul would be emulated"}
        make = lambda n: (torch.randn(n, n, dtype=tdtype), torch.randn(n, n, dtype=tdtype))  # noqa: E731
        mul = torch.matmul
        threads = torch.get_num_threads()
        impl = "torch"
    per_size: dict[str, Any] = {}
    for n in sizes:
        progress(f"CPU {dtype} matmul {n}x{n}")
        a, b = make(n)
        # warm-up for a while, not one call: a fresh process's first ~0.1 s of matmuls (the thread
        # pool's start, first-touch page faults) ran 20% under its later rate on the 2-core VM,
        # and a quick calibration took that as its peak (a job's 1024^2 mm then at 113% of it)
        _timed(partial(mul, a, b), max(min_s, WARMUP_S))
        cond = cpu_conditions()
        rates = [2 * n ** 3 / _timed(partial(mul, a, b), min_s) for _ in range(repeats)]
        per_size[str(n)] = {**summarize(rates), "conditions": cond}
    best = max(per_size, key=lambda k: per_size[k]["median"])
    return {"flops_per_s": per_size[best]["median"], **{k: v for k, v in per_size[best].items()},
            "best_shape": [int(best)] * 3, "sizes": per_size, "threads": threads, "impl": impl}


def _cpu_has_bf16(torch: ModuleType) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and \
        bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())


# ---- CPU memory ------------------------------------------------------------------------------

# One timed repetition of STREAM copy or triad (cpu_stream keeps the best): STREAM times single
# passes; 20 ms is 1-4 passes over 128 MiB arrays on a 2-core VM (5-17 ms each)
STREAM_REP_S = 0.02


def cpu_stream(repeats: int, min_s: float, array_bytes: int | None = None,
               progress: Progress = _quiet, rep_s: float = STREAM_REP_S) -> dict[str, Any]:
    """STREAM copy and triad, fp64 arrays of at least 4x the LLC each, all cores.
    Bytes counted as STREAM does: copy 2 arrays, triad 3 (write-allocate traffic not counted).

    Each kernel gets the time of `repeats` runs of `min_s`, cut into short repetitions (`rep_s`
    each, a few passes over the arrays) with copy and triad alternating, and its figure
    ("bytes_per_s") is the best repetition, as STREAM reports the best of its runs: a ceiling,
    what the memory does when nothing holds it back. On a VM the vCPUs' placement on the host
    moves the all-core bandwidth (on the README's 2-core VM copy is 29-36 or 45-58 GB/s while
    one thread holds 24-30 GB/s), switching within a second or holding for minutes; a median of
    five 0.2 s runs reported whichever mode those runs fell in, the best of short repetitions
    reports the fast mode whenever the machine visits it while it measures. The
    median, min, max and spread of the repetitions stand beside it."""
    llc = llc_bytes()
    size = array_bytes or max(4 * (llc or 32 << 20), 64 << 20)
    n = size // 8
    progress(f"CPU memory arrays (3 x {n * 8 >> 20} MiB)")
    torch = _torch()
    copy: Callable[[], object]
    triad: Callable[[], object]
    if torch is not None:
        a, b, c = torch.empty(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64), \
            torch.rand(n, dtype=torch.float64)
        a.fill_(0)
        copy = lambda: a.copy_(b)                                # noqa: E731
        triad = lambda: torch.add(b, c, alpha=3.0, out=a)        # noqa: E731
        threads, impl = torch.get_num_threads(), "torch"
    else:
        copy, triad, threads = _numpy_stream(n)
        impl = "numpy threads"
    out: dict[str, Any] = {"array_bytes": n * 8, "llc_bytes": llc, "threads": threads, "impl": impl}
    kernels = (("copy", copy, 2), ("triad", triad, 3))
    progress(f"CPU memory copy and triad ({n * 8 >> 20} MiB arrays)")
    for _name, fn, _arrays in kernels:
        fn()                                                     # warm-up
    cond = cpu_conditions()
    rates: dict[str, list[float]] = {name: [] for name, _, _ in kernels}
    spent = dict.fromkeys(rates, 0.0)
    while min(spent.values()) < repeats * min_s or min(map(len, rates.values())) < repeats:
        for name, fn, arrays in kernels:
            t0 = time.perf_counter()
            rates[name].append(arrays * n * 8 / _timed(fn, rep_s))
            spent[name] += time.perf_counter() - t0
    after = cpu_conditions()
    for name, _, _ in kernels:
        out[name] = {"bytes_per_s": max(rates[name]), **summarize(rates[name]),
                     "rep_s": rep_s, "conditions": {**cond, **{f"{k}_after": v for k, v in after.items()}}}
    out["bytes_per_s"] = max(out["copy"]["bytes_per_s"], out["triad"]["bytes_per_s"])
    return out


def _numpy_stream(n: int) -> tuple[Callable[[], None], Callable[[], None], int]:
    """copy and triad on os.cpu_count() threads over contiguous chunks (numpy releases the GIL)."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor
    threads = os.cpu_count() or 1
    a, b, c = np.zeros(n), np.random.rand(n), np.random.rand(n)
    bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    pool = ThreadPoolExecutor(threads)

    def run(body: Callable[[int, int], None]) -> None:
        list(pool.map(lambda lo_hi: body(*lo_hi), bounds))

    def copy() -> None:
        run(lambda lo, hi: np.copyto(a[lo:hi], b[lo:hi]))

    def triad() -> None:
        def part(lo: int, hi: int) -> None:
            np.multiply(c[lo:hi], 3.0, out=a[lo:hi])
            np.add(a[lo:hi], b[lo:hi], out=a[lo:hi])   # (two passes: numpy has no fused triad)
        run(part)
    return copy, triad, threads


# ---- collectives (gloo on the CPU, NCCL on GPUs) -----------------------------------------------

# nccl-tests' bus bandwidth: algbw x factor(n) (doc/PERFORMANCE.md)
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def collectives(backend: str, world: int, sizes: list[int], repeats: int, timeout_s: float = 120,
                progress: Progress = _quiet, fork: bool = False) -> dict[str, Any]:
    """Run the collectives benchmark in `world` fresh processes on loopback (rank 0's figures)."""
    import json
    import socket
    import tempfile
    if _torch() is None:
        return {"skipped": "needs torch (torch.distributed)"}
    import torch.distributed as dist
    if not dist.is_available():
        return {"skipped": "this torch has no torch.distributed"}
    if backend == "nccl":
        import torch
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            return {"skipped": "NCCL collectives need 2 or more GPUs"}
    progress(f"{backend} collectives, {world} processes")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        if fork and backend == "gloo" and hasattr(os, "fork"):
            errors = _forked(world, port, backend, sizes, repeats, out, timeout_s)
        else:
            errors = _spawned(world, port, backend, sizes, repeats, out, timeout_s)
        if errors or not os.path.exists(out):
            return {"skipped": f"the {backend} benchmark failed: {errors[0] if errors else 'no result'}"}
        with open(out) as f:
            raw = json.load(f)
    return _busbw(raw, backend, world, repeats)


def _forked(world: int, port: int, backend: str, sizes: list[int], repeats: int, out: str,
            timeout_s: float) -> list[str]:
    """The ranks as forks of this process (torch already imported: no seconds of start-up).
    Safe only before this process has run a parallel torch op (an OpenMP pool does not survive
    fork): calibrate() measures the collectives first."""
    from . import collective_worker
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    pids = []
    for r in range(world):
        pid = os.fork()
        if pid == 0:               # the child: run the rank, never return into the caller
            code = 1
            try:
                os.environ["OMP_NUM_THREADS"] = "1"
                code = collective_worker.run(backend, sizes, repeats, out, r, world)
            except BaseException as exc:
                try:
                    with open(f"{out}.err{r}", "w") as f:
                        f.write(f"{type(exc).__name__}: {exc}")
                except OSError:
                    pass
            finally:
                os._exit(code)
        pids.append(pid)
    errors = []
    deadline = time.monotonic() + timeout_s
    for r, pid in enumerate(pids):
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                errors.append(f"timed out after {timeout_s:.0f} s")
                break
            time.sleep(0.05)
        if done and os.waitstatus_to_exitcode(status):
            try:
                with open(f"{out}.err{r}") as f:
                    errors.append(f.read())
            except OSError:
                errors.append(f"rank {r} exited with {os.waitstatus_to_exitcode(status)}")
    return errors


def _spawned(world: int, port: int, backend: str, sizes: list[int], repeats: int, out: str,
             timeout_s: float) -> list[str]:
    import json
    import subprocess
    import sys
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "counterprof.calibrate.collective_worker", backend,
           json.dumps(sizes), str(repeats), out]
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    errors = []
    deadline = time.monotonic() + timeout_s
    if True:
        for p in procs:
            try:
                _, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                _, stderr = p.communicate()
                errors.append(f"timed out after {timeout_s:.0f} s")
                continue
            if p.returncode:
                errors.append(((stderr or "").strip().splitlines() or [f"exit {p.returncode}"])[-1])
    return errors


def _busbw(raw: dict[str, Any], backend: str, world: int, repeats: int) -> dict[str, Any]:
    result: dict[str, Any] = {"backend": backend, "world_size": world}
    for coll, per_size in raw.items():
        if isinstance(per_size, str):
            result[coll] = {"skipped": per_size}
            continue
        factor = BUSBW_FACTOR[coll](world)
        rows = {}
        for size, times in per_size.items():
            alg = [int(size) / t for t in times]
            rows[size] = {"algbw_bytes_per_s": statistics.median(alg),
                          "busbw_bytes_per_s": statistics.median(alg) * factor,
                          "time_s": summarize(times)}
        small, big = min(rows, key=int), max(rows, key=int)
        result[coll] = {"busbw_bytes_per_s": rows[big]["busbw_bytes_per_s"], "bytes": int(big),
                        "latency_s": rows[small]["time_s"]["median"], "latency_bytes": int(small),
                        "spread": rows[big]["time_s"]["spread"], "repeats": repeats, "sizes": rows}
    return result


# ---- GPUs ------------------------------------------------------------------------------------

def gpu_available() -> tuple[bool, str]:
    torch = _torch()
    if torch is None:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"no CUDA/ROCm device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return True, ""


class _NvmlSampler:
    """Clocks, power and throttle reasons of one GPU around a measurement (NVML), when there."""

    def __init__(self, index: int):
        self.handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:        # no NVML (ROCm, no driver library): conditions go unreported
            self.handle = None

    def sample(self) -> dict[str, Any]:
        if self.handle is None:
            return {}
        n, h = self.nvml, self.handle
        out: dict[str, Any] = {}
        probes: tuple[tuple[str, Callable[[], object]], ...] = (
            ("sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            ("mem_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            ("power_w", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000),
            ("temperature_c", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            ("throttle_reasons", lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
        for key, fn in probes:
            try:
                out[key] = fn()
            except Exception:
                pass
        return out


def _cuda_time(torch: ModuleType, fn: Callable[[], object], min_s: float) -> float:
    """Seconds per call, timed with CUDA events over as many calls as fill min_s."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 1
    while True:
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        s: float = start.elapsed_time(end) / 1000
        if s >= min_s or n >= 1 << 16:
            return s / n
        n = max(n * 2, int(n * min_s / max(s, 1e-6)) + 1)


def gpu_device(index: int, sizes: list[int], repeats: int, min_s: float,
               progress: Progress = _quiet) -> dict[str, Any]:
    """One GPU's ceilings: matmul per dtype, D2D copy, H2D/D2H pinned and pageable."""
    import torch
    dev = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(index)
    nvml = _NvmlSampler(index)
    out: dict[str, Any] = {"device": props.name, "kind": "gpu", "index": index,
                           "arch": getattr(props, "gcnArchName", None), "matmul": {}, "skipped": {}}
    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for name, dt in dtypes.items():
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        per_size = {}
        for n in sizes:
            progress(f"GPU{index} {name} matmul {n}x{n}")
            a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
            torch.matmul(a, b)
            cond = nvml.sample()
            rates = [2 * n ** 3 / _cuda_time(torch, partial(torch.matmul, a, b), min_s)
                     for _ in range(repeats)]
            per_size[str(n)] = {**summarize(rates), "conditions": {**cond, **_after(nvml)}}
        best = max(per_size, key=lambda k: per_size[k]["median"])
        out["matmul"][name] = {"flops_per_s": per_size[best]["median"], **per_size[best],
                               "best_shape": [int(best)] * 3, "sizes": per_size}
    torch.backends.cuda.matmul.allow_tf32 = False
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None and torch.cuda.get_device_capability(index) >= (8, 9):
        try:
            n = max(sizes)
            a = torch.randn(n, n, device=dev).to(fp8)
            b = torch.randn(n, n, device=dev).to(fp8).t()
            one = torch.tensor(1.0, device=dev)
            mm: Callable[[], object] = partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one,
                                               out_dtype=torch.bfloat16)
            progress(f"GPU{index} fp8 matmul {n}x{n}")
            mm()
            rates = [2 * n ** 3 / _cuda_time(torch, mm, min_s) for _ in range(repeats)]
            out["matmul"]["fp8"] = {"flops_per_s": statistics.median(rates), **summarize(rates),
                                    "best_shape": [n] * 3}
        except Exception as exc:        # fp8 GEMM not supported by this build/device
            out["skipped"]["fp8"] = f"torch._scaled_mm failed: {exc}"
    else:
        out["skipped"]["fp8"] = "fp8 matmul needs compute capability 8.9 or newer"
    nbytes = 1 << 30
    x = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    progress(f"GPU{index} device-to-device copy")
    y.copy_(x)
    rates = [2 * nbytes / _cuda_time(torch, partial(y.copy_, x), min_s) for _ in range(repeats)]
    out["memory"] = {"d2d": {"bytes_per_s": statistics.median(rates), **summarize(rates),
                             "bytes": nbytes, "counted": "read + write"},
                     "bytes_per_s": statistics.median(rates)}
    del x, y                           # 2 GiB back before the host buffers
    host_bytes = 256 << 20
    out["host_device"] = {}
    for pinned in (True, False):
        h = torch.empty(host_bytes, dtype=torch.uint8, pin_memory=pinned)
        d = torch.empty(host_bytes, dtype=torch.uint8, device=dev)
        for direction, fn in (("h2d", partial(d.copy_, h, non_blocking=pinned)),
                              ("d2h", partial(h.copy_, d, non_blocking=pinned))):
            label = f"{direction}_{'pinned' if pinned else 'pageable'}"
            progress(f"GPU{index} {label}")
            fn()
            rates = [host_bytes / _cuda_time(torch, fn, min_s) for _ in range(repeats)]
            out["host_device"][label] = {"bytes_per_s": statistics.median(rates), **summarize(rates)}
    out["peaks"] = {k: v["flops_per_s"] for k, v in out["matmul"].items()}
    out["bandwidth_bytes_per_s"] = out["memory"]["bytes_per_s"]
    return out


def _after(nvml: _NvmlSampler) -> dict[str, Any]:
    return {f"{k}_after": v for k, v in nvml.sample().items()}


def gpu_p2p(repeats: int, min_s: float, progress: Progress = _quiet) -> dict[str, Any]:
    """Copy bandwidth between each pair of GPUs (peer access where enabled)."""
    import torch
    n = torch.cuda.device_count()
    if n < 2:
        return {"skipped": "one GPU: no peer-to-peer"}
    out: dict[str, Any] = {}
    nbytes = 256 << 20
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            progress(f"P2P GPU{i} -> GPU{j}")
            src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}")
            dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")
            with torch.cuda.device(i):
                rates = [nbytes / _cuda_time(torch, partial(dst.copy_, src), min_s)
                         for _ in range(repeats)]
            out[f"{i}->{j}"] = {"bytes_per_s": statistics.median(rates), **summarize(rates),
                                "peer_access": torch.cuda.can_device_access_peer(i, j)}
    return out
