"""What a scope's verdict is judged over: the headline is the steps' when a run has steps (the
time before the first and after the last judged apart, as start-up and tear-down), and a scope
too short for its sampling interval is judged from its trace or not at all. Shared by report,
compare and history, so that their verdicts are decided alike.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import intervals as iv
from .classify import Evidence, Verdict, classify, decide
from .signals import RunData, Signal, signals


def step_scope(data: RunData, whole: iv.Intervals) -> iv.Intervals:
    """The steps of every rank inside the workload's span, as one interval set ([] without
    steps)."""
    steps = iv.union(data.rank_steps.values())
    return iv.intersect(steps, whole) if steps else []


def headline(data: RunData, whole: iv.Intervals, facts_for: Callable[..., dict[str, Any]],
             bucket: int | None = None) -> tuple[Verdict, list[Verdict]]:
    """The headline verdict and the phases judged apart from it. A run with steps is judged by
    its steps (scope "steps"): a DataLoader-starved job's 2 s of imports before its first step
    are not what its steps are like. The stretch before the first step is "start-up", after the
    last "tear-down", each its own verdict when it lasts at least a second. bucket: the run's
    sampling resolution, below which steps apart from each other are judged from their trace."""
    steps = step_scope(data, whole)
    if iv.total(steps) <= 0:
        v = classify(signals(data, whole), "run", facts_for(whole))
        v.start_ns, v.end_ns = data.start_ns, data.end_ns
        return v, []
    sig = signals(data, steps, steps=True)
    v = classify(sig, "steps", facts_for(steps, True))
    if bucket:      # a server's 8 ms requests as steps, apart: their states are smeared
        v = too_short(v, sig, iv.total(steps) / len(steps), bucket)
    v.start_ns, v.end_ns = data.start_ns, data.end_ns     # the run's extent: times are told from its start
    phases = []
    lo, hi = whole[0][0], whole[-1][1]
    for name, (a, b) in (("start-up", (lo, steps[0][0])), ("tear-down", (steps[-1][1], hi))):
        if b - a >= 1_000_000_000:
            p = classify(signals(data, [(a, b)]), name, facts_for([(a, b)]))
            p.start_ns, p.end_ns = a, b
            phases.append(p)
    return v, phases


def too_short(v: Verdict, sig: dict[str, Signal], mean_ns: float, bucket: int) -> Verdict:
    """A scope whose occurrences last under three sampling intervals: its thread states and
    counters are smeared across its neighbours. Judged from its trace where it was traced (the
    main thread's time in ops, outside them, in waits: exact), else not judged ("too short at
    -I N"), never with the confidence of a long scope."""
    if mean_ns >= 3 * bucket or v.device != "cpu" or "xla_idle" in sig:
        return v        # a device's verdict comes from its kernel (or XLA op) spans: exact at any length
    why = (f"occurrences last {mean_ns / 1e6:.1f} ms on average, under three sampling intervals "
           f"({bucket / 1e6:g} ms): thread states and counters are smeared across neighbours")
    if "main_in_ops" not in sig:
        out = Verdict(v.scope, "unknown", v.device,
                      missing=[f"too short at -I {bucket / 1e6:g}: sample faster (-I 1) or trace it (--torch)"])
        out.evidence.append(Evidence("region_length", mean_ns / 1e9, 3 * bucket / 1e9, "spans", why))
        return out
    coll = sig["cpu_collective_exposed"].value if "cpu_collective_exposed" in sig else 0.0
    inp = sig["input_wait"].value if "input_wait" in sig else 0.0
    rest = max(0.0, 1.0 - coll - inp)
    ops = rest * sig["main_in_ops"].value
    v.host_parts = {k: round(x, 6) for k, x in {"input pipeline": inp, "Python outside torch ops": rest - ops}.items()
                    if x > 0}
    # the ops' time split as the classifier split the scope's busy time (counters or roofline)
    compute, memory = v.shares.get("compute", 0.0), v.shares.get("memory", 0.0)
    split = compute / (compute + memory) if compute + memory > 0 else None
    shares = {"collectives": coll, "host": inp + rest - ops}
    if split is None:
        shares["compute|memory"] = ops
    else:
        shares["compute"], shares["memory"] = ops * split, ops * (1 - split)
    v.shares = {k: round(x, 6) for k, x in shares.items() if x > 0}
    decide(v, ("compute", "memory") if split is None else None)
    v.confidence = round(min(v.confidence, 0.5), 3)
    v.secondary.append(Evidence("region_length", mean_ns / 1e9, 3 * bucket / 1e9, "spans",
                                why + "; judged from its trace (time in ops, outside them, in waits)"))
    return v
