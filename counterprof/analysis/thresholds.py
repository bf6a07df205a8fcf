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
    # --- collectives ------------------------------------------------------------------------
    "collective_share": Threshold(
        0.3, "of time",
        "collectives not hidden behind compute for over 30% of the time dominate a step "
        "(our choice, in the spirit of HTA's comm/comp overlap analysis)"),
    # --- the verdict itself --------------------------------------------------------------------
    "verdict_margin": Threshold(
        0.1, "share",
        "the leading class must lead the next by 10 points of time share to be called; closer is "
        "'mixed' and reported as unknown with both candidates (our choice)"),
}


def value(name: str) -> float:
    return T[name].value
