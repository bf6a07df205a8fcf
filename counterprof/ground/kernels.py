r"""Kernel classes: what a span on the GPU spends its time on.

    compute        kernels doing arithmetic on the SMs/CUs (GEMMs, elementwise, reductions, Triton...)
    communication  collective kernels (NCCL, RCCL, MSCCL)
    memory         copies and fills (cudaMemcpy/cudaMemset activities, DMA, HIP's blit kernels)
    other          busy on a stream without doing work: CUDA synchronization (cuda_sync events)

Host spans (cpu_op, runtime, annotation, step, collective, window) have no class (null).

The rules start from HTA 0.5.0's (hta/utils/utils.py: get_kernel_type), which classify by name
only, and differ on purpose where HTA's names miss a case. `hta_kernel_class` reproduces HTA's
rules exactly, so the breakdowns can be checked against HTA on the same classes.

| span                                         | HTA 0.5.0     | counterprof   | why |
|----------------------------------------------|---------------|---------------|-----|
| cuda_sync "Stream Wait Event"                | COMPUTATION   | other         | a stream waiting on an event does no arithmetic |
| cuda_sync "Stream Sync", "Context Sync", ... | OTHER (name matches `.*Sync`) | other | same class, by category rather than by name |
| gpu_memcpy / gpu_memset whose name does not start with Memcpy/Memset (older ROCm/roctracer: "CopyHostToDevice", "FillBuffer") | COMPUTATION | memory | the category says what it is |
| kernel "__amd_rocclr_copyBuffer", "__amd_rocclr_fillBufferAligned", ... | COMPUTATION | memory | HIP implements hipMemcpy/hipMemset with these blit kernels |
| kernel "void ncclKernel...", "rcclKernel...", "mscclKernel..." | COMPUTATION | communication | HTA's `^nccl.*Kernel` needs the name to start with "nccl" |
| kernel whose name contains "Sync", or "Memcpy" after its start (e.g. "...cudaMemcpyKernel...") | OTHER | compute | a kernel launched on the SMs computes; HTA's `(.*(Memcpy)\|(Memset))\|(.*Sync)` is meant for the activities above |

NCCL >= 2.19 names its kernels `ncclDevKernel_<Coll>_<Op>_<type>_<algo>_<proto>` and
`ncclDevKernel_Generic*`: HTA's `^nccl.*Kernel` already matches them, and so do these rules.
"""
from __future__ import annotations

import re

COMPUTE = "compute"
COMMUNICATION = "communication"
MEMORY = "memory"
OTHER = "other"
CLASSES = (COMPUTE, COMMUNICATION, MEMORY, OTHER)

# span categories on the GPU timeline; the classes above apply to these
GPU_CATEGORIES = ("kernel", "memcpy", "memset", "sync")

_COMMUNICATION = re.compile(r"^(?:void\s+)?(?:nccl|rccl|msccl)\w*kernel", re.IGNORECASE)
_MEMORY_KERNEL = re.compile(r"^(?:Memcpy|Memset|dma)|^(?:void\s+)?__amd_rocclr_(?:copy|fill)")
# the collective in a communication kernel's name: ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_AllGather_RING_LL, ncclAllReduceRingLLKernel_sum_f32
_COLLECTIVE_IN_NAME = re.compile(
    r"(AllReduce|AllGather|ReduceScatter|Reduce|Broadcast|AllToAll|SendRecv|Send|Recv)")


def kernel_class(category: str, name: str) -> str | None:
    """counterprof's class of one span (None for host spans)."""
    if category in ("memcpy", "memset"):
        return MEMORY
    if category == "sync":
        return OTHER
    if category != "kernel":
        return None
    if _COMMUNICATION.match(name):
        return COMMUNICATION
    if _MEMORY_KERNEL.match(name):
        return MEMORY
    return COMPUTE


def collective_in_kernel_name(name: str) -> str | None:
    """'AllReduce' from an NCCL/RCCL kernel's name, when it says."""
    m = _COLLECTIVE_IN_NAME.search(name)
    return m.group(1) if m else None


# ---- HTA 0.5.0's rules, verbatim (hta/utils/utils.py), for comparisons ----------------------

_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_kernel_class(category: str, name: str) -> str | None:
    """HTA 0.5.0's get_kernel_type(name), in counterprof's class names. HTA applies it to every
    event that has a GPU stream, whatever its category; here it applies to the GPU categories."""
    if category not in GPU_CATEGORIES:
        return None
    if _HTA_COMM.match(name):
        return COMMUNICATION
    if _HTA_MEMORY.match(name):
        return MEMORY
    if not _HTA_NOT_COMPUTE.match(name):
        return COMPUTE
    return OTHER


RULES = {"counterprof": kernel_class, "hta": hta_kernel_class}
