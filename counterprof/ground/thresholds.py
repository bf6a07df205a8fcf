"""Every threshold the classifier uses, in one table, each with where it comes from.

Change a value here and the evidence lines in reports quote the new one: nothing else in
counterprof holds a bottleneck threshold.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Threshold:
    value: float
    unit: str
    why: str


T = {
    # --- CPU as the compute device -------------------------------------------------------
    "cpu_busy": Threshold(
        0.5, "CPUs",
        "task-clock / wall: below half a CPU the workload's driving thread spends most of its "
        "time off-CPU, waiting: held back by the host, not by compute (our choice)"),
    "ipc_compute": Threshold(
        1.0, "insn/cycle",
        "Gregg, 'CPU Utilization is Wrong' (2017): IPC above 1.0 is likely instruction-bound"),
    "ipc_memory": Threshold(
        0.5, "insn/cycle",
        "Gregg (2017): IPC below 1.0 is likely stall-bound (memory); below 0.5 leaves little doubt "
        "on modern 4-wide cores"),
    "llc_mpki_memory": Threshold(
        10.0, "misses/kilo-insn",
        "LLC misses per kilo-instruction: ~10 is the usual cut-off for 'memory-intensive' in "
        "studies of SPEC CPU workloads (our reading of that literature, not one paper's rule)"),
    "backend_stall_memory": Threshold(
        0.5, "of cycles",
        "stalled-cycles-backend / cycles: perf stat colours 'backend cycles idle' at 20/50/75% "
        "(tools/perf/util/stat-shadow.c); from 50% on, waiting dominates"),
    "topdown_backend": Threshold(
        0.2, "of slots",
        "Yasin, 'A Top-Down Method for Performance Analysis' (ISPASS 2014); Intel TMA / pmu-tools "
        "toplev flag Backend_Bound above 0.2"),
    "topdown_memory": Threshold(
        0.2, "of slots",
        "Intel TMA / toplev: Memory_Bound above 0.2 (with Backend_Bound flagged) is memory-bound"),
    "topdown_retiring": Threshold(
        0.5, "of slots",
        "Intel TMA: Retiring above 0.5 means most slots do useful work: compute-bound if anything"),
    "contention_share": Threshold(
        0.05, "of time",
        "the main thread runnable but not running (or blocked) for over 5% of the time is named "
        "in the evidence: below that it is scheduler noise on a shared machine (our choice)"),
    "loader_saturated": Threshold(
        0.8, "of worker time",
        "DataLoader workers on-CPU over 80% of their time while the main thread waits: the "
        "workers are the bottleneck, more of them (or cheaper items) would help; below it they "
        "wait too (IPC, prefetch depth) (our choice)"),
    "loader_blocked": Threshold(
        0.5, "of worker time",
        "DataLoader workers neither on a CPU nor waiting for one over half their time while the "
        "main thread waits: they wait on I/O (storage, network) or a lock, one item at a time "
        "each, which a deeper prefetch does not overlap; more workers or concurrent reads do "
        "(our choice)"),
    # --- GPU -------------------------------------------------------------------------------
    "gpu_in_use": Threshold(
        0.05, "of time",
        "a GPU busy less than 5% of the run is not the device doing the work (our choice)"),
    "gpu_idle_host": Threshold(
        0.3, "of active span",
        "idle share of the GPU-active span (HTA's temporal breakdown): above ~30% the GPU "
        "waits on the host more than anything else can cost (our choice)"),
    "tensor_util_compute": Threshold(
        0.3, "of peak",
        "GPM any-tensor utilization: tensor cores busy a third of the time mark a "
        "matmul-dominated phase (our choice; dense bf16 GEMM loops reach 0.6-0.9)"),
    "dram_util_memory": Threshold(
        0.6, "of peak",
        "GPM DRAM bandwidth utilization above 60% of peak: the memory system sets the pace "
        "(our choice; streaming copies reach 0.8-0.9)"),
    "nvml_util_busy": Threshold(
        0.5, "of time",
        "NVML utilization (share of time a kernel runs) below 50%: the GPU waits half the time "
        "(our choice)"),
    "short_kernel_us": Threshold(
        10.0, "µs",
        "kernels shorter than ~10 µs cost about as much to launch as to run (CUDA launch "
        "overhead is ~5 µs): a launch-bound pattern"),
    "power_limit": Threshold(
        0.95, "of limit",
        "drawing over 95% of the enforced power limit: clocks will be capped (secondary finding)"),
    # --- the roofline (op FLOPs and bytes against measured ceilings) ------------------------
    "roofline_modelled": Threshold(
        0.5, "of op time",
        "the roofline splits busy time into compute and memory only when ops with a cost model "
        "hold at least half of the ops' time; below that the unmodelled ops could tip it "
        "(our choice)"),
    "roofline_over_roof": Threshold(
        1.05, "of the ceiling",
        "an op, a step or the MFU above 105% of its ceiling means the ceilings do not fit the run "
        "(measured on a loaded machine, another machine, a ceiling the op's dtype or cache level "
        "does not have): the roofline is not used for the verdict. 5% is room for the spread of "
        "a calibration (its figure is the median of repeats) and of a run's timing (our choice)"),
    "roofline_over_roof_share": Threshold(
        0.02, "of op time",
        "an op above its ceiling counts only when it holds 2% of the op time or more: below that "
        "a short op's timer granularity can put it anywhere (our choice, as evidence_share)"),
    "calibrate_others_share": Threshold(
        0.25, "of the CPUs measured on",
        "`counterprof calibrate` does not save ceilings measured while other processes held a "
        "quarter of the CPUs it ran on (in its busiest step) without --force: on this project's "
        "2-core VM that is half a core, and a matmul on both cores then measures ~25% low, so "
        "every run held to it would look that much nearer its roof (our choice). Measured there "
        "with `calibrate --quick`: beside two busy loops others held 83-88%; alone while three "
        "other engineers' tests ran (load average 4.5-6), 16-68% (its busiest step 28-75%); an "
        "observer outside calibrate agreed within 2 points (tests/integration/test_ceilings_fit.py)"),
    # --- collectives ------------------------------------------------------------------------
    "collective_share": Threshold(
        0.3, "of time",
        "collectives not hidden behind compute for over 30% of the time dominate a step "
        "(our choice, in the spirit of HTA's comm/comp overlap analysis)"),
    # --- what the evidence names (a finding below its cut-off is noise, not evidence) ----------
    "evidence_share": Threshold(
        0.02, "of time",
        "a wait (input pipeline) shorter than 2% of the time is not worth a line (our choice)"),
    "loader_in_main": Threshold(
        0.2, "of time",
        "waiting in DataLoader next() over 20% of the time with no worker processes: the "
        "loading runs on the main thread, and workers would overlap it (our choice)"),
    "helper_cpus": Threshold(
        0.05, "CPUs",
        "a helper role (intra-op, DataLoader, communication threads) using under 0.05 CPUs is "
        "left out of the evidence (our choice)"),
    "off_cpu_named": Threshold(
        0.2, "of time",
        "off-CPU over 20% of the time: say why (switches, I/O, iowait, run delay) (our choice)"),
    "run_delay_named": Threshold(
        0.05, "of time",
        "run-queue delay over 5% of the wall time: the machine is oversubscribed (our choice)"),
    "io_bytes_named": Threshold(
        1e6, "bytes/s",
        "storage I/O over 1 MB/s is named as a reason for blocking (our choice)"),
    "iowait_named": Threshold(
        0.05, "of CPU time",
        "system iowait over 5% of CPU time is named (our choice; `top` shows it from 0.1%)"),
    "short_kernel_majority": Threshold(
        0.5, "of kernels",
        "most kernels shorter than short_kernel_us, with the GPU idle over 10%: launch-bound "
        "(our choice)"),
    "launch_bound_idle": Threshold(
        0.1, "of active span",
        "the idle share from which many short kernels are called launch-bound (our choice)"),
    "memcpy_named": Threshold(
        0.01, "of active span",
        "memcpy/memset over 1% of the GPU-active span gets an evidence line (our choice)"),
    "major_faults_named": Threshold(
        10.0, "/s",
        "over 10 major page faults a second: the workload reads its memory from disk "
        "(secondary finding; our choice)"),
    "host_wait_named": Threshold(
        0.05, "of time",
        "a GPU run whose host share is over 5% gets the host-wait line of its idle time "
        "(our choice)"),
    "next_step_share": Threshold(
        0.2, "of time",
        "a class with over 20% of the time gets its 'what to look at next' line (our choice)"),
    "confidence_full": Threshold(
        0.5, "share",
        "confidence is the leader's margin over the runner-up, full (1.0) at a 50-point lead "
        "(our choice)"),
    # --- counterprof top's machine view (no workload: plain system figures) -------------------
    "machine_gpu_busy": Threshold(
        80.0, "percent",
        "a GPU busy this share of the time is the thing to look at first (nvidia-smi's "
        "utilization is the share of time a kernel ran, so it overstates how full the SMs are)"),
    "machine_busy": Threshold(
        90.0, "percent",
        "the machine this busy overall: CPU-bound (our choice)"),
    "machine_iowait": Threshold(
        20.0, "percent",
        "this share of all CPU time idle waiting for I/O (system-wide) points at storage"),
    "machine_idle": Threshold(
        10.0, "percent",
        "a machine with less than this share of its CPUs busy is idle (our choice)"),
    # --- the verdict itself --------------------------------------------------------------------
    "verdict_margin": Threshold(
        0.1, "share",
        "the leading class must lead the next by 10 points of time share to be called; closer is "
        "'mixed' and reported as unknown with both candidates (our choice)"),
    # --- compare: when the machine explains a change -------------------------------------------
    "contention_wait_points": Threshold(
        0.05, "of wall time",
        "a main thread's share of time runnable but waiting for a CPU must differ by 5 points "
        "between the runs for the machine to have moved: unchanged reruns of a CPU-bound step "
        "workload pinned to CPU 0 of this project's shared 2-core VM differed by 0-2 points, once "
        "by 8 at load average 11 (its steps 24% faster, which that wait explained); one sharing "
        "CPU 0 with a busy loop waits 53% against 5% on a quiet machine, 86% against 72% at load "
        "11 (measured; tests/integration/test_compare_contention.py)"),
    "contention_unexplained_share": Threshold(
        0.5, "of the change the wait implies",
        "a change is explained when, with the added CPU wait taken out, what is left is under the "
        "threshold or under half the change the wait alone implies: sharing a core also "
        "lengthens the on-CPU time (caches refilled after each switch) and one run a side is "
        "noisy: 6-14% of the implied change was left in runs sharing CPU 0 with a busy loop on "
        "this VM with a Python loop, and up to 30% with a GPT-2 training step (a working set that "
        "the busy neighbour's time slices evict), on some runs 67-72% (left as partly: that is what "
        "a real regression on a contended core looks like); a small wait still cannot hide a large change "
        "(a 5% wait implies +5%: half of it leaves 2.6%) (our choice; --strict fails on all)"),
    "contention_own_share": Threshold(
        0.5, "of the added wait",
        "when the workload's own CPU use rose by half the added wait (in CPUs) or more, its own "
        "threads may be what its main threads waited for: not the machine (our choice)"),
    "contention_other_share": Threshold(
        0.25, "of the machine's CPUs",
        "other processes' CPU use must differ by a quarter of the machine for compare to say "
        "the machine moved without a wait to show for it: on this shared 2-core VM it swings "
        "by ~20 points between unchanged reruns (measured)"),
}


def value(name: str) -> float:
    return T[name].value
