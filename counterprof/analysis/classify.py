"""The verdict: what held a stretch of the run back, how sure, and why.

classify(signals) -> Verdict, for any scope (the run, a window, a region). Time is shared
out between the classes (compute, memory, collectives, host); the verdict is the class
that clearly leads. When the signals that separate two classes are missing, the share
goes to both ("compute|memory") and the verdict is unknown, naming the counters that
would decide it: it never guesses. Thresholds live in thresholds.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..ground import units
from .signals import Signal
from ..ground.thresholds import value
from .xla import HOST_PART as XLA_HOST

CLASSES = ("compute", "memory", "collectives", "host")
NEXT_STEPS = {
    "host": "the host: look at the input pipeline (DataLoader workers, pin_memory, prefetch) and the "
            "Python between kernels (CUDA graphs or torch.compile cut launch overhead); for I/O and "
            "sleeps, find where the process blocks (an off-CPU profile)",
    "compute": "compute: use the fast units (bf16/fp8 tensor cores, matmul shapes in multiples of "
               "64), check achieved FLOP/s against peak; on the CPU, vectorization and threads",
    "memory": "memory: fuse elementwise ops (torch.compile), cut bytes moved (lower precision, "
              "fewer copies), compare achieved bandwidth to peak; on the CPU, data layout and "
              "cache blocking",
    "collectives": "collectives: overlap communication with compute (DDP bucket size, FSDP prefetch), "
                   "compare bus bandwidth to the link's peak, look for stragglers",
}

# the host's next step by its leading part (what the user would change)
HOST_NEXT_STEPS = {
    "Python outside torch ops": "the host: the main thread's Python between ops (tokenization, collation, "
                                "augmentation in the loop): move it into DataLoader workers (num_workers > 0) "
                                "or do it once ahead (pre-tokenize the dataset); for framework overhead between "
                                "small ops, torch.compile or larger batches",
    "CPU contention": "the host: the main thread waits for a CPU that other processes hold: a machine "
                      "(or cores: taskset, cgroups) to itself",
    "oversubscribed by its own threads": "the host: the job's own threads outnumber the CPUs: "
                                         "torch.set_num_threads / OMP_NUM_THREADS at most the cores "
                                         "each rank has, or fewer ranks per host",
    XLA_HOST: "the host: XLA's threads wait on the Python loop: build batches ahead of the step (a "
              "prefetching iterator, data-loading workers), jit larger pieces of work (fewer dispatches: "
              "lax.scan over steps), and keep block_until_ready / device_get out of the step",
}


@dataclass
class Evidence:
    metric: str
    value: float | None
    threshold: float | None
    source: str
    text: str


@dataclass
class Verdict:
    scope: str
    verdict: str                         # compute | memory | collectives | host | unknown
    device: str                          # the compute device: cpu | gpu | neuron | none
    shares: dict[str, float] = field(default_factory=dict)    # share of time per class
    confidence: float = 0.0
    evidence: list[Evidence] = field(default_factory=list)
    secondary: list[Evidence] = field(default_factory=list)   # worth knowing, not the verdict
    undecided: list[str] = field(default_factory=list)        # classes it cannot tell apart
    missing: list[str] = field(default_factory=list)          # what would decide it
    # the host share's parts (input pipeline, CPU contention, blocked), when the main thread's
    # states are known: each a share of the scope's time
    host_parts: dict[str, float] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ev(sig: dict[str, Signal], key: str, threshold: str | None, text: str) -> Evidence:
    s = sig[key]
    return Evidence(key, round(s.value, 6), value(threshold) if threshold else None, s.source, text)


def _read(sig: dict[str, Signal], ev: list[Evidence], key: str, threshold: str,
          words: Callable[[float], str]) -> float | None:
    """A signal that may be missing: its value, with its evidence appended to ev (None, and no
    evidence, when the run lacks it)."""
    if key not in sig:
        return None
    ev.append(_ev(sig, key, threshold, words(sig[key].value)))
    return sig[key].value


def classify(sig: dict[str, Signal], scope: str = "run", facts: dict[str, Any] | None = None) -> Verdict:
    """facts: what the evidence may name (meta.json's threads details: the main threads'
    pids, the other processes that used the CPUs)."""
    if "wall_s" not in sig:
        return Verdict(scope, "unknown", "none", missing=["samples or spans covering this time"])
    gpu_used = (sig.get("gpu_active_share") and sig["gpu_active_share"].value >= value("gpu_in_use")) or \
        (sig.get("gpu_util") and sig["gpu_util"].value >= value("gpu_in_use"))
    neuron_used = sig.get("neuron_util") and sig["neuron_util"].value >= value("gpu_in_use")
    neuron_traced = sig.get("neuron_active_share") and sig["neuron_active_share"].value >= value("gpu_in_use")
    xla_used = sig.get("xla_active_share") and sig["xla_active_share"].value >= value("gpu_in_use")
    if gpu_used:
        v = _classify_gpu(sig, scope, facts)
    elif neuron_traced:
        v = _classify_neuron_profile(sig, scope)
    elif neuron_used:
        v = _classify_neuron(sig, scope, facts)
    elif xla_used:
        v = _classify_xla(sig, scope, facts)
    elif "main_running" in sig:
        v = _classify_main_thread(sig, scope, facts or {})
    else:
        v = _classify_cpu(sig, scope, facts)
    v.shares = {k: round(s, 6) for k, s in v.shares.items() if s > 0}
    excess = round(sum(v.shares.values()) - 1.0, 6)
    if excess > 0:          # three roundings can add to 1.000001: the largest gives it back
        top = max(v.shares, key=v.shares.__getitem__)
        v.shares[top] = round(v.shares[top] - excess, 6)
    v.host_parts = {k: round(s, 6) for k, s in v.host_parts.items() if s > 0}
    _secondary(sig, v)
    return v


# ---- the CPU as the compute device: the critical thread's time ------------------------------

def _who(sig: dict[str, Signal], facts: dict[str, Any]) -> str:
    mains = [m for m in facts.get("main_threads") or [] if isinstance(m, dict)]
    ranks = sig["ranks"].value if "ranks" in sig else 1.0
    if ranks > 1:
        return "the main thread of each rank"
    launchers = {m.get("launcher") for m in mains if m.get("launcher") is not None}
    workers = [m for m in mains if m.get("launcher") is not None]
    if len(launchers) == 1 and len(workers) > 1:
        return (f"the main threads of its {len(workers)} workers (children of pid {launchers.pop()}, "
                "which only waits for them)")
    if len(mains) == 1 and mains[0].get("pid") is not None:
        m = mains[0]
        name = f"{m.get('comm')}, " if m.get("comm") else ""
        return f"the main thread ({name}pid {m['pid']})"
    return "the main thread"


def _classify_main_thread(sig: dict[str, Signal], scope: str, facts: dict[str, Any]) -> Verdict:
    """A step's wall time is its main (training or serving) thread's time. Its states share
    that time out: waiting for the input pipeline, waiting on collectives with no op of its
    own, runnable without a CPU (contention), blocked otherwise (host); on-CPU in its own work
    (compute or memory). Helper threads' CPU (intra-op pools, DataLoader workers, gloo) is
    evidence, never the step's time."""
    v = Verdict(scope, "unknown", "cpu")
    run, ready, blocked = (sig[f"main_{k}"].value for k in ("running", "runnable", "blocked"))
    coll = sig["cpu_collective_exposed"].value if "cpu_collective_exposed" in sig else 0.0
    inp = sig["input_wait"].value if "input_wait" in sig else 0.0
    # the waits come out of the blocked time first (waiting is blocking), then out of the
    # running time (a loader without workers loads on the main thread; a collective may spin)
    waits = min(1.0, coll + inp)
    from_blocked = min(blocked, waits)
    from_running = min(run, waits - from_blocked)
    from_ready = min(ready, waits - from_blocked - from_running)
    blocked, run, ready = blocked - from_blocked, run - from_running, ready - from_ready
    # on-CPU outside torch ops is the loop's Python (tokenization, collation, framework
    # overhead): host, however busy the CPU was; only time inside ops is compute or memory
    python = run * (1 - sig["main_in_ops"].value) if "main_in_ops" in sig else 0.0
    # inside ops, the part the collectives caused (ops slowed beside the all-reduce, the sync's
    # own ops: comm_cost.py) is the collectives' cost, not compute or memory
    in_comm = min(run - python, run * sig["main_in_comm_ops"].value) if "main_in_comm_ops" in sig else 0.0
    run -= python + in_comm
    # runnable without a CPU: the CPUs were held by someone, and the time lost is theirs
    lost = _who_held_the_cpus(sig, ready)
    v.host_parts = {"input pipeline": inp + lost["loader"], PYTHON: python,
                    "CPU contention": lost["others"], OVERSUBSCRIBED: lost["own"], "blocked": blocked}
    coll += lost["comm"] + in_comm
    v.shares = {"collectives": coll, "host": inp + python + ready - lost["comm"] + blocked}
    who = _who(sig, facts)
    v.evidence.append(Evidence(
        "main_thread", round(sig["main_running"].value, 6), None, "threads",
        f"{who}: on-CPU {units.share(sig['main_running'].value)}, blocked {units.share(sig['main_blocked'].value)}, "
        f"runnable but not running {units.share(sig['main_runnable'].value)} of the time"))
    if inp >= value("evidence_share"):
        text = f"waiting for the input pipeline (DataLoader next()) {units.share(inp)} of the time"
        if "loader_busy" in sig:
            busy, workers = sig["loader_busy"].value, sig["loader_workers"].value
            text += (f"; its {workers:.0f} worker{'s' if round(workers) != 1 else ''} busy "
                     f"{units.share(busy)} of their time")
            ready = sig["loader_runnable"].value if "loader_runnable" in sig else 0.0
            if busy >= value("loader_saturated"):
                text += ": saturated: more workers (num_workers) or cheaper per-item work would help"
            elif busy + ready >= value("loader_saturated"):
                text += (f", runnable but without a CPU {units.share(ready)}: the workers are starved of CPU "
                         "(more workers will not help on this machine; fewer other processes would)")
            elif (idle := max(0.0, 1.0 - busy - ready)) >= value("loader_blocked") and \
                    sig["main_blocked"].value >= inp / 2:
                # the workers blocked while the main thread was too (not unpickling or pinning
                # on its own CPU): each worker makes one item at a time, so a deeper prefetch
                # queues more items behind the same wait; more workers or concurrent reads overlap it
                text += (f", blocked {units.share(idle)} (neither on a CPU nor waiting for one): they wait "
                         "on I/O (storage, the network) or a lock: more workers (num_workers) or concurrent "
                         "reads inside __getitem__ overlap those waits (a deeper prefetch does not), and "
                         "faster or cached storage shortens them")
            else:
                text += (": not saturated: more prefetch (prefetch_factor), or look at what else the main "
                         "thread waits for (pin_memory, worker start-up, IPC of large batches)")
        elif inp >= value("loader_in_main"):
            text += "; the loading runs in the main process (num_workers=0?): workers would overlap it"
        v.evidence.append(_ev(sig, "input_wait", None, text))
    if coll > 0 or "cpu_collective" in sig:
        text = (f"waiting on collectives with no own compute {units.share(coll - lost['comm'] - in_comm)} "
                "of the time")
        if "cpu_collective_overlap" in sig:
            text += (f" ({units.share(sig['cpu_collective_overlap'].value)} of its collective time "
                     "overlapped by its own ops)")
        if "trace_coverage" in sig and sig["trace_coverage"].value < 0.99:
            text += (f", measured over the traced steps ({units.share(sig['trace_coverage'].value)} of the time) "
                     "and carried to every step")
        v.evidence.append(Evidence("cpu_collective_exposed", round(coll, 6), value("collective_share"),
                                   "spans", text))
    if in_comm >= value("evidence_share"):
        v.evidence.append(Evidence(
            "main_in_comm_ops", round(in_comm, 6), None, "spans",
            f"inside its own ops because of the collectives {units.share(in_comm)} of the time: ops that "
            "ran beside the all-reduce took longer than the same ops (name and shapes) alone, and the "
            "sync's own ops (DDP's reducer copying gradients to and from its buckets); the gradient "
            "sync's CPU and memory bandwidth, paid inside backward"))
    if "main_in_ops" in sig:
        v.evidence.append(_python_evidence(sig, python, facts))
    if ready >= value("contention_share"):
        v.evidence.append(_contention_evidence(sig, ready, lost, facts))
    if blocked >= value("contention_share"):
        why = [f"blocked {units.share(blocked)} of the time outside input and collective waits (sleep, I/O, locks)"]
        v.evidence.append(Evidence("main_blocked", round(blocked, 6), None, "threads",
                                   "; ".join(why + _blocking_reasons(sig))))
    helpers = [(THREAD_WORDS[r], sig[f"{r}_cpus"].value) for r in THREAD_WORDS
               if f"{r}_cpus" in sig and sig[f"{r}_cpus"].value >= value("helper_cpus")]
    if helpers or "cpu_busy" in sig:
        text = ""
        if "cpu_busy" in sig:
            text = (f"the whole process tree used {sig['cpu_busy'].value:.2f} CPUs over the wall time "
                    f"({sig['cpu_busy'].detail}); ")
        text += "meanwhile " + (", ".join(f"{name} {cpus:.2f} CPUs" for name, cpus in helpers)
                                if helpers else "no helper thread was busy")
        v.evidence.append(Evidence("helpers", round(sum(c for _, c in helpers), 6), None, "threads",
                                   text + ": evidence, not the step's time"))
    _split_busy(v, run, *_compute_or_memory_cpu(sig, facts))
    return v


PYTHON = "Python outside torch ops"
OVERSUBSCRIBED = "oversubscribed by its own threads"
# who held the CPUs while the main thread waited for one: (signal, words, where the time goes)
HOLDERS = (("comm_cpus", "its communication threads", "comm"),
           ("intraop_cpus", "its intra-op threads", "own"),
           ("other_ranks_cpus", "its other ranks", "own"),
           ("other_cpus", "its other threads", "own"),
           ("loader_cpus", "its DataLoader workers", "loader"),
           ("others_cpus", "other processes", "others"))


def _holders(sig: dict[str, Signal]) -> list[tuple[str, str, float]]:
    """(words, where the time goes, CPUs held over the scope) of everyone who ran beside the
    main thread: the job's own threads by role, its other ranks' main threads, other processes."""
    cpus = {k: sig[k].value for k, _, _ in HOLDERS if k in sig}
    if "other_ranks_cpus" not in cpus and "main_threads" in sig and "main_running" in sig:
        cpus["other_ranks_cpus"] = sig["main_running"].value * max(0.0, sig["main_threads"].value - 1)
    return [(words, to, cpus[k]) for k, words, to in HOLDERS if cpus.get(k, 0.0) > 0]


def _who_held_the_cpus(sig: dict[str, Signal], ready: float) -> dict[str, float]:
    """The main thread's runnable time shared out in proportion to the CPU time each holder
    took meanwhile: the job's communication threads (collectives: on a CPU a collective costs
    the step the CPU its threads take), its own intra-op threads and other ranks
    (oversubscription), its DataLoader workers (input), other processes (contention). Without
    any of those figures it all stays contention, as before."""
    lost = {"comm": 0.0, "own": 0.0, "loader": 0.0, "others": 0.0}
    held = _holders(sig)
    total = sum(c for _, _, c in held)
    if not total:
        lost["others"] = ready
        return lost
    for _, to, c in held:
        lost[to] += ready * c / total
    return lost


def _contention_evidence(sig: dict[str, Signal], ready: float, lost: dict[str, float],
                         facts: dict[str, Any]) -> Evidence:
    text = f"runnable but waiting for a CPU {units.share(ready)} of the time"
    held = sorted(_holders(sig), key=lambda h: -h[2])
    if held:
        text += "; the CPUs were held meanwhile by " + ", ".join(f"{w} {c:.2f} CPUs" for w, _, c in held
                                                                 if c >= 0.005)
        parts = [(lost["comm"], "collectives"), (lost["own"], "oversubscription"),
                 (lost["loader"], "input pipeline"), (lost["others"], "contention")]
        text += " (so " + ", ".join(f"{name} {units.share(x)}" for x, name in parts if x >= 0.005) + ")"
    others = [c for c in facts.get("contenders") or [] if isinstance(c, dict) and c.get("cpu_s")]
    if others and lost["others"] >= value("contention_share"):
        text += "; other processes: " + ", ".join(
            f"{c.get('comm', '?')} (pid {c.get('pid')}, {float(c['cpu_s']):.1f} CPU-s)" for c in others[:3])
    cpus, ranks = facts.get("cpus"), sig["ranks"].value if "ranks" in sig else 1.0
    if lost["own"] >= value("contention_share") and isinstance(cpus, int) and cpus > 0:
        text += (f"; the job runs more busy threads than its {cpus} CPUs ({cpus / ranks:g} per rank): "
                 "torch.set_num_threads / OMP_NUM_THREADS at most that, fewer ranks per host, or "
                 "fewer gloo threads")
    return Evidence("main_runnable", round(ready, 6), value("contention_share"), "threads", text)


def _python_evidence(sig: dict[str, Signal], python: float, facts: dict[str, Any]) -> Evidence:
    """The main thread's on-CPU time outside its own ops, and where it went: the user's regions
    and record_function annotations that cover it (facts' host_where)."""
    in_ops = sig["main_in_ops"].value
    text = (f"on-CPU outside torch ops {units.share(python)} of the time (the loop's Python: "
            f"tokenization, collation, framework overhead); inside ops {units.share(in_ops)} of its "
            "time outside waits")
    where = [(n, s) for n, s in facts.get("host_where") or [] if isinstance(n, str)]
    if where:
        text += "; of that time, " + ", ".join(f"{n} {units.share(s)}" for n, s in where)
    if "trace_coverage" in sig and sig["trace_coverage"].value < 0.99:
        text += (f" (measured over the traced {units.share(sig['trace_coverage'].value)} of the time "
                 "and carried to the rest)")
    return Evidence("main_in_ops", round(in_ops, 6), None, "spans", text)


def _blocking_reasons(sig: dict[str, Signal]) -> list[str]:
    """What the host figures say about blocking: switches, storage I/O, iowait."""
    why = []
    if "voluntary_switches_per_s" in sig:
        why.append(f"{sig['voluntary_switches_per_s'].value:,.0f} voluntary context switches/s (blocking)")
    elif "ctx_switches_per_s" in sig:
        why.append(f"{sig['ctx_switches_per_s'].value:,.0f} context switches/s")
    if "io_bytes_per_s" in sig and sig["io_bytes_per_s"].value > value("io_bytes_named"):
        why.append(f"{sig['io_bytes_per_s'].value / 1e6:,.1f} MB/s of storage I/O")
    if "system_iowait" in sig and sig["system_iowait"].value > value("iowait_named"):
        why.append(f"{units.share(sig['system_iowait'].value)} of CPU time in iowait")
    return why


THREAD_WORDS = {"intraop": "intra-op threads", "loader": "DataLoader workers",
                "comm": "communication threads", "other": "other threads"}


# ---- the CPU as the compute device, without thread states (older runs, imported traces) ----

def _classify_cpu(sig: dict[str, Signal], scope: str, facts: dict[str, Any] | None = None) -> Verdict:
    v = Verdict(scope, "unknown", "cpu")
    if "cpu_busy" not in sig:
        # e.g. an imported trace: spans, but no CPU counters
        v.missing = ["CPU time (task-clock or the host collector): profile with `counterprof run`"]
        v.evidence.append(Evidence("cpu_busy", None, None, "", "no CPU time was measured here"))
        if "cpu_collective" in sig:
            coll = sig["cpu_collective"].value
            v.shares = {"collectives": coll, "not measured": 1 - coll}
            v.evidence.insert(0, _ev(sig, "cpu_collective", "collective_share",
                                     f"{units.share(coll)} of the traced time inside CPU collectives (gloo)"))
            if coll - (1 - coll) >= value("verdict_margin"):     # dominates whatever the rest is
                v.verdict, v.confidence = "collectives", round(min(1.0, (2 * coll - 1) / value("confidence_full")), 3)
        return v
    coll = sig["cpu_collective"].value if "cpu_collective" in sig else 0.0
    busy_key = "cpu_busy_outside_collectives" if "cpu_busy_outside_collectives" in sig else "cpu_busy"
    ranks = sig["ranks"].value if "ranks" in sig else 1.0
    on_cpu = min(1.0, sig[busy_key].value / ranks)     # each rank's driving thread
    rest = max(0.0, 1.0 - coll)
    busy_share, host_share = rest * on_cpu, rest * (1 - on_cpu)
    v.shares = {"collectives": coll, "host": host_share}

    if coll > 0:
        where = ""
        if "trace_coverage" in sig and sig["trace_coverage"].value < 0.99:
            where = f", over the recorded trace windows ({units.share(sig['trace_coverage'].value)} of the time)"
        v.evidence.append(_ev(sig, "cpu_collective", "collective_share",
                              f"{units.share(coll)} of the time inside CPU collectives (gloo){where}"))
    busy_cpus = sig["cpu_busy"].value
    words = (f"the workload used {busy_cpus:.2f} CPUs over the wall time ({sig['cpu_busy'].detail})"
             + (f", {busy_cpus / ranks:.2f} per rank over {ranks:.0f} ranks" if ranks > 1 else "")
             + (f"; {sig[busy_key].value / ranks:.2f} per rank outside collectives"
                if busy_key != "cpu_busy" else ""))
    v.evidence.append(_ev(sig, busy_key, "cpu_busy", words))
    if host_share > value("off_cpu_named"):
        why = []
        if "run_queue_wait" in sig and sig["run_queue_wait"].value > value("run_delay_named"):
            why.append(f"{units.share(sig['run_queue_wait'].value)} of the time runnable but waiting for a "
                       "CPU (the machine is oversubscribed)")
        why += _blocking_reasons(sig)
        if why:
            v.evidence.append(Evidence("off_cpu", round(host_share, 6), None, "host",
                                       f"off-CPU {units.share(host_share)} of the time: " + ", ".join(why)))

    _split_busy(v, busy_share, *_compute_or_memory_cpu(sig, facts))
    return v


def _with_roofline(counters: tuple[float | None, list[Evidence], list[str]], facts: dict[str, Any] | None
                   ) -> tuple[float | None, list[Evidence], list[str]]:
    """The counters' split of busy time (PMU top-down, IPC, GPM) where they decide it; else the
    roofline's (the time-weighted bound of the ops inside it: analysis/roofline.busy_split),
    naming its top ops. Where both decide, both are shown, and a disagreement is flagged."""
    split, evidence, missing = counters
    roof = (facts or {}).get("roofline")
    if not roof:
        return counters
    r_split, r_evidence, r_missing = roof
    r_ev = [Evidence(**{k: d.get(k) for k in ("metric", "value", "threshold", "source", "text")})
            for d in r_evidence]
    if split is None:
        if r_split is None:
            return None, evidence + r_ev, missing + [m for m in r_missing if m not in missing]
        return r_split, evidence + r_ev, []
    if r_split is not None:
        evidence = evidence + r_ev
        if (split >= 0.5) != (r_split >= 0.5):
            evidence.append(Evidence(
                "roofline_disagrees", round(r_split, 6), 0.5, "roofline",
                f"the counters call {units.share(split)} of busy time compute-bound, the roofline of the ops "
                f"{units.share(r_split)}: they disagree (the counters decide; look at the top ops)"))
    return split, evidence, missing


def _compute_or_memory_cpu(sig: dict[str, Signal], facts: dict[str, Any] | None = None
                           ) -> tuple[float | None, list[Evidence], list[str]]:
    """Share of busy time that is compute (the rest memory); None when undecidable."""
    return _with_roofline(_counters_cpu(sig), facts)


def _counters_cpu(sig: dict[str, Signal]) -> tuple[float | None, list[Evidence], list[str]]:
    ev: list[Evidence] = []
    if "td_backend" in sig and "td_retiring" in sig:
        be, ret = sig["td_backend"].value, sig["td_retiring"].value
        mem = sig["td_memory"].value if "td_memory" in sig else None
        ev.append(_ev(sig, "td_retiring", "topdown_retiring", f"top-down: retiring {units.share(ret)} of slots"))
        ev.append(_ev(sig, "td_backend", "topdown_backend", f"top-down: backend-bound {units.share(be)} of slots"))
        if mem is not None:
            ev.append(_ev(sig, "td_memory", "topdown_memory", f"top-down: memory-bound {units.share(mem)}"))
            if be >= value("topdown_backend") and mem >= value("topdown_memory"):
                return max(0.0, 1 - mem / max(be, 1e-9)), ev, []
            return 1.0 if ret >= value("topdown_retiring") or mem < value("topdown_memory") else 0.5, ev, []
        # level 1 only: backend-bound does not say memory or core
        if be < value("topdown_backend") or ret >= value("topdown_retiring"):
            return 1.0, ev, []
        return None, ev, ["topdown-mem-bound (level 2) or stall_backend_mem to split backend-bound"]
    if "ipc" in sig:
        ipc = sig["ipc"].value
        ev.append(_ev(sig, "ipc", "ipc_compute", f"IPC {ipc:.2f} instructions per cycle"))
        mpki = _read(sig, ev, "llc_mpki", "llc_mpki_memory", lambda x: f"{x:.1f} LLC misses per 1000 instructions")
        stall = _read(sig, ev, "backend_stall", "backend_stall_memory",
                      lambda x: f"backend stalled {units.share(x)} of cycles")
        memory_signs = ((mpki is not None and mpki >= value("llc_mpki_memory"))
                        or (stall is not None and stall >= value("backend_stall_memory")))
        if ipc >= value("ipc_compute") and not memory_signs:
            return 1.0, ev, []
        if ipc < value("ipc_memory") or (memory_signs and ipc < value("ipc_compute")):
            return 0.0, ev, []
        return None, ev, ["LLC-load-misses or stalled-cycles-backend (IPC alone is in between)"]
    return None, ev, ["instructions and cycles (IPC), LLC-load-misses, or topdown-* events: this "
                      "machine has no hardware PMU (usual in VMs)"]


# ---- the GPU as the compute device -----------------------------------------------------------

def _classify_gpu(sig: dict[str, Signal], scope: str, facts: dict[str, Any] | None = None) -> Verdict:
    v = Verdict(scope, "unknown", "gpu")
    if "gpu_idle" in sig:      # kernel spans: time shares of the GPU-active span
        idle = sig["gpu_idle"].value
        comm = sig["gpu_comm_exposed"].value
        mem = sig["gpu_memory"].value
        comp = sig["gpu_compute"].value
        v.shares = {"host": idle, "collectives": comm}
        v.evidence.append(_ev(sig, "gpu_idle", "gpu_idle_host",
                              f"GPU idle {units.share(idle)} of the active span (waiting for the host)"))
        if "short_kernel_share" in sig and sig["short_kernel_share"].value > value("short_kernel_majority") \
                and idle > value("launch_bound_idle"):
            v.evidence.append(_ev(sig, "short_kernel_share", None,
                                  f"{units.share(sig['short_kernel_share'].value)} of kernels are shorter than "
                                  f"{value('short_kernel_us'):.0f} µs: launch-bound"))
        if comm > 0 or "comm_overlap" in sig:
            text = f"communication not hidden by compute {units.share(comm)} of the active span"
            if "comm_overlap" in sig:
                text += f" ({units.share(sig['comm_overlap'].value)} of communication overlapped)"
            v.evidence.append(_ev(sig, "gpu_comm_exposed", "collective_share", text))
        v.evidence.append(_ev(sig, "gpu_compute", None, f"compute kernels {units.share(comp)} of the active span"))
        if mem > value("memcpy_named"):
            v.evidence.append(_ev(sig, "gpu_memory", None, f"memcpy/memset {units.share(mem)} of the active span"))
        v.shares["memory"] = mem
        kernel_busy = max(0.0, 1 - idle - comm - mem)
        _split_busy(v, kernel_busy, *_with_roofline(_compute_or_memory_gpu(sig), facts))
        return v
    # NVML/GPM samples only
    util = sig["gpu_util"].value
    v.shares = {"host": 1 - util}
    v.evidence.append(_ev(sig, "gpu_util", "nvml_util_busy", f"GPU busy {units.share(util)} of the time (NVML)"))
    _split_busy(v, util, *_with_roofline(_compute_or_memory_gpu(sig), facts))
    if v.verdict != "host" and not v.undecided:
        v.missing.append("kernel traces (--torch) to separate collectives")
    return v


def _compute_or_memory_gpu(sig: dict[str, Signal]) -> tuple[float | None, list[Evidence], list[str]]:
    ev: list[Evidence] = []
    if "gpm_tensor" in sig or "gpm_dram" in sig:
        tensor = _read(sig, ev, "gpm_tensor", "tensor_util_compute",
                       lambda x: f"tensor cores busy {units.share(x)} (GPM)")
        dram = _read(sig, ev, "gpm_dram", "dram_util_memory",
                     lambda x: f"DRAM bandwidth {units.share(x)} of peak (GPM)")
        tensor_busy = tensor is not None and tensor >= value("tensor_util_compute")
        dram_busy = dram is not None and dram >= value("dram_util_memory")
        if dram_busy and not tensor_busy:
            return 0.0, ev, []
        if tensor_busy and not dram_busy:
            return 1.0, ev, []
        if tensor is not None and dram is not None:
            total = tensor / value("tensor_util_compute") + dram / value("dram_util_memory")
            return (tensor / value("tensor_util_compute")) / total if total else 0.5, ev, []
        return None, ev, ["both GPM tensor and DRAM utilization"]
    return None, ev, ["GPM metrics (tensor and DRAM utilization; Hopper and newer) to tell "
                      "compute-bound kernels from memory-bound ones"]


# ---- XLA's threads as the compute device (JAX on the CPU: analysis/xla.py) --------------------

def _classify_xla(sig: dict[str, Signal], scope: str, facts: dict[str, Any] | None = None) -> Verdict:
    """As the GPU from its kernel spans: XLA's ops on the host's threads are the device's work,
    the time none runs (within the span of its ops) is the device waiting on the host (the
    Python main thread dispatching, building the next batch). Busy time by the ops' HLO
    category (not a measured roofline: the ops carry no FLOPs or bytes on the CPU)."""
    v = Verdict(scope, "unknown", "cpu")
    idle = sig["xla_idle"].value
    comp, comm, mem, other = (sig[k].value if k in sig else 0.0
                              for k in ("xla_compute", "xla_comm", "xla_memory", "xla_other"))
    # the runtime's time between a dispatch and its ops is the executions' own: shared out as
    # their ops' time is
    runtime = sig["xla_runtime"].value if "xla_runtime" in sig else 0.0
    ops = comp + comm + mem + other
    raw_comp, raw_comm, raw_mem, raw_other = comp, comm, mem, other
    if runtime > 0 and ops > 0:
        comp, comm, mem, other = (x * (1 + runtime / ops) for x in (comp, comm, mem, other))
    v.shares = {"host": idle, "collectives": comm, "compute": comp, "memory": mem, "compute|memory": other}
    v.host_parts = {XLA_HOST: idle}
    v.evidence.append(_ev(sig, "xla_idle", "gpu_idle_host",
                          f"the XLA threads idle {units.share(idle)} of the span of their ops: waiting on "
                          "Python dispatch/input (the host)"))
    if runtime >= value("evidence_share"):
        v.evidence.append(_ev(sig, "xla_runtime", None,
                              f"no XLA op ran {units.share(runtime)} of that span while the Python waited on "
                              "an execution it had launched (XLA's runtime between dispatch and ops: "
                              "scheduling, buffer allocation, a worker waiting for a CPU): counted with "
                              "that execution's ops"))
    if comm > 0:
        v.evidence.append(_ev(sig, "xla_comm", "collective_share",
                              f"XLA collectives not hidden by compute {units.share(raw_comm)} of that span"))
    roof = (facts or {}).get("roofline")
    if roof and roof[0] is not None:
        # the roofline decides: each op's intensity (XLA's cost analysis: FLOPs / bytes accessed)
        # against the ceilings' ridge point, time-weighted over the ops' busy time
        r_split, r_evidence, _ = roof
        work = comp + mem + other
        v.shares.update({"compute": work * r_split, "memory": work * (1 - r_split), "compute|memory": 0.0})
        v.evidence += [Evidence(**{k: d.get(k) for k in ("metric", "value", "threshold", "source", "text")})
                       for d in r_evidence]
        v.evidence.append(Evidence(
            "xla_compute", round(raw_comp + raw_mem + raw_other, 6), None, "roofline",
            f"XLA ops' busy time {units.share(raw_comp + raw_mem + raw_other)} of that span, split compute vs "
            f"memory by the roofline ({units.share(r_split)} compute-bound: each op's FLOPs and bytes from "
            "XLA's cost analysis against the ceilings' ridge point), not by the ops' HLO category"))
        decide(v, None)
        return v
    why = (roof[2][0] if roof and roof[2] else "no roofline of the ops (XLA's cost analysis and ceilings)")
    v.evidence.append(Evidence(
        "xla_compute", round(raw_comp, 6), None, "spans",
        f"XLA ops by HLO category ({why}): dot/convolution {units.share(raw_comp)}, elementwise/reduction/copy "
        f"{units.share(raw_mem)}" + (f", other kinds {units.share(raw_other)}" if raw_other > 0 else "")
        + " of that span (compute vs memory told by the op's kind, not a measured roofline)"))
    if other >= value("evidence_share"):
        v.missing = ["per-op FLOPs and bytes (XLA's cost analysis of the run's HLO) and ceilings "
                     "(`counterprof calibrate`) to tell the other ops' compute from memory"]
    decide(v, None)
    return v


# ---- a Neuron device as the compute device -----------------------------------------------------

def _classify_neuron(sig: dict[str, Signal], scope: str, facts: dict[str, Any] | None = None) -> Verdict:
    """As the GPU from NVML alone: the time the NeuronCores did not run is the host's (they
    waited for it); their busy time is compute or memory, which neuron-monitor's utilization
    and FLOP/s cannot tell apart without the device's peak (the roofline's, where it exists)."""
    v = Verdict(scope, "unknown", "neuron")
    util = min(1.0, sig["neuron_util"].value)
    v.shares = {"host": 1 - util}
    v.evidence.append(_ev(sig, "neuron_util", "nvml_util_busy",
                          f"NeuronCores busy {units.share(util)} of the time (neuron-monitor)"))
    if "neuron_flops" in sig:
        v.evidence.append(_ev(sig, "neuron_flops", None,
                              f"{sig['neuron_flops'].value / 1e12:.2f} TFLOP/s per NeuronCore"))
    _split_busy(v, util, *_with_roofline(
        (None, [], ["the Neuron device's peak FLOP/s and memory bandwidth (not in neuron-monitor's "
                    "output) to tell compute-bound from memory-bound NeuronCore time"]), facts))
    return v


def _classify_neuron_profile(sig: dict[str, Signal], scope: str) -> Verdict:
    """From a NeuronCore's device profile (Neuron Explorer): the span of its activity split
    into compute (engines running instructions other than semaphore waits), collectives not
    hidden by them, DMA not hidden by either (memory: the engines wait on the data), and the
    time nothing ran (the device waiting on the host). The engines and DMA queues are the
    evidence; a share of the evidence names which engine and how fast the DMA moved."""
    v = Verdict(scope, "unknown", "neuron")
    idle, comp, comm, mem = (sig[k].value for k in ("neuron_idle", "neuron_compute", "neuron_comm_exposed",
                                                    "neuron_memory"))
    other = sig["neuron_other"].value if "neuron_other" in sig else 0.0
    v.shares = {"host": idle, "compute": comp, "collectives": comm, "memory": mem, "compute|memory": other}
    v.evidence.append(_ev(sig, "neuron_idle", "gpu_idle_host",
                          f"NeuronCore idle {units.share(idle)} of the span of its activity (no instruction, DMA or "
                          "collective running: waiting for the host)"))
    if "neuron_idle_in_runtime" in sig and idle >= value("evidence_share"):
        inside = sig["neuron_idle_in_runtime"].value
        v.evidence.append(_ev(sig, "neuron_idle_in_runtime", None,
                              f"while it was idle the host was inside a Neuron runtime call {units.share(inside)} of "
                              f"the time and outside any (the Python, the framework, input) {units.share(1 - inside)}"))
    engines = sorted(((k.split(":", 1)[1], s.value) for k, s in sig.items() if k.startswith("neuron_engine:")),
                     key=lambda kv: -kv[1])
    words = ", ".join(f"{e} {units.share(x)}" for e, x in engines[:4])
    v.evidence.append(_ev(sig, "neuron_compute", None, f"compute engines busy {units.share(comp)} of that span"
                          + (f" ({words}; busiest: {engines[0][0]})" if engines else "")))
    if comm > 0:
        v.evidence.append(_ev(sig, "neuron_comm_exposed", "collective_share",
                              f"collectives not hidden by compute {units.share(comm)} of that span"))
    if mem > 0:
        text = f"DMA not hidden by compute or collectives {units.share(mem)} of that span"
        if "neuron_wait_in_dma" in sig:
            text += (f"; an engine sat in a semaphore wait {units.share(sig['neuron_wait_in_dma'].value)} of that "
                     "DMA time (waiting on the data)")
        v.evidence.append(_ev(sig, "neuron_memory", None, text))
    if "neuron_dma_rate" in sig:
        rate = sig["neuron_dma_rate"].value
        text = f"DMA moved {units.si(rate, 'B/s')} while moving"
        if "neuron_dma_of_peak" in sig:
            text += f", {units.share(sig['neuron_dma_of_peak'].value)} of the HBM peak the profile states"
        v.evidence.append(_ev(sig, "neuron_dma_of_peak" if "neuron_dma_of_peak" in sig else "neuron_dma_rate",
                              None, text))
    for key, what in (("neuron_mfu", "MFU"), ("neuron_mbu", "MBU")):
        if key in sig:
            v.evidence.append(_ev(sig, key, None, f"{what} {units.share(sig[key].value)} (Neuron Explorer's estimate)"))
    if "neuron_intensity" in sig and "neuron_ridge" in sig:
        ai, ridge = sig["neuron_intensity"].value, sig["neuron_ridge"].value
        bound = "memory-bound" if ai < ridge else "compute-bound"
        v.evidence.append(_ev(sig, "neuron_intensity", None,
                              f"roofline: the matmuls do {ai:,.0f} FLOP per DRAM byte against a ridge of {ridge:,.0f} "
                              f"(peak Tensor FLOP/s over peak DRAM bandwidth, Explorer's Summary): {bound} by "
                              "intensity"))
    decide(v, ("compute", "memory"))
    return v


# ---- shared -------------------------------------------------------------------------------

def _split_busy(v: Verdict, busy: float, split: float | None, evidence: list[Evidence],
                missing: list[str]) -> None:
    """Share the device's busy time out between compute and memory (or both, undecided),
    then call the verdict."""
    v.evidence.extend(evidence)
    if split is None:
        v.shares["compute|memory"] = busy
        v.missing = missing
    else:
        v.shares["compute"] = v.shares.get("compute", 0.0) + busy * split
        v.shares["memory"] = v.shares.get("memory", 0.0) + busy * (1 - split)
    decide(v, ("compute", "memory") if split is None else None)


def decide(v: Verdict, undecided_pair: tuple[str, str] | None) -> None:
    """The leading class, if it leads clearly; else unknown, naming the candidates."""
    ranked = sorted(v.shares.items(), key=lambda kv: kv[1], reverse=True)
    if not ranked:
        return
    top, top_share = ranked[0]
    second, second_share = ranked[1] if len(ranked) > 1 else (None, 0.0)
    margin = top_share - second_share
    v.confidence = round(max(0.0, min(1.0, margin / value("confidence_full"))), 3)
    if top == "compute|memory" and margin >= value("verdict_margin"):
        v.verdict, v.undecided = "unknown", list(undecided_pair or ("compute", "memory"))
    elif margin < value("verdict_margin"):
        names: list[str] = []
        for n in (top, second):
            names += ["compute", "memory"] if n == "compute|memory" else [n] if n else []
        v.verdict, v.undecided = "unknown", sorted(set(names))
    else:
        v.verdict = top


def _secondary(sig: dict[str, Signal], v: Verdict) -> None:
    if "major_faults_per_s" in sig and sig["major_faults_per_s"].value > value("major_faults_named"):
        v.secondary.append(_ev(sig, "major_faults_per_s", None,
                               f"{sig['major_faults_per_s'].value:,.0f} major page faults/s (reading from disk)"))
    if "power_ratio" in sig and sig["power_ratio"].value >= value("power_limit"):
        v.secondary.append(_ev(sig, "power_ratio", "power_limit",
                               f"drawing {units.share(sig['power_ratio'].value)} of the power limit: clocks capped"))
    if "throttle" in sig and sig["throttle"].value > 0:
        v.secondary.append(_ev(sig, "throttle", None, "clock throttling reported by the driver"))
    if "neuron_exec_errors" in sig and sig["neuron_exec_errors"].value > 0:
        v.secondary.append(_ev(sig, "neuron_exec_errors", None,
                               f"{sig['neuron_exec_errors'].value:,.0f} execution errors reported by the "
                               "Neuron runtime (neuron.exec_errors_*)"))
    for key, what in (("neuron_ecc_uncorrected", "uncorrected"), ("neuron_ecc_corrected", "corrected")):
        if key in sig and sig[key].value > 0:
            v.secondary.append(_ev(sig, key, None, f"{sig[key].value:,.0f} {what} ECC events on the "
                                                   "Neuron devices (neuron.ecc_*)"))


def describe(v: Verdict) -> str:
    """The verdict in one phrase (what would decide an unknown one is in v.missing)."""
    if v.verdict == "host" and v.host_parts:
        part, share = max(v.host_parts.items(), key=lambda kv: kv[1])
        if share >= 0.5 * v.shares.get("host", 0):
            return f"host-bound ({units.share(v.shares.get('host', 0))} of the time; {part} {units.share(share)})"
    if v.verdict == "unknown":
        if v.undecided and set(v.undecided) == {"compute", "memory"}:
            return f"unknown (busy {v.device.upper()}: compute vs memory cannot be told apart)"
        if v.undecided:
            # the two leaders with their shares: they are within the margin, not indistinct
            ranked = sorted(v.shares.items(), key=lambda kv: -kv[1])[:2]
            words = " vs ".join(f"{'busy ' + v.device.upper() if k == 'compute|memory' else k} {units.share(x)}"
                                for k, x in ranked)
            return f"unknown (mixed: {words}, within the {100 * value('verdict_margin'):.0f}-point margin)"
        return "unknown (" + ("; ".join(v.missing) or "no signal") + ")"
    return f"{v.verdict}-bound ({units.share(v.shares.get(v.verdict, 0))} of the time)"
