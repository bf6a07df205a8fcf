"""counterprof: hardware performance counters, GPU metrics and PyTorch traces on one
clock, in Parquet, with the evidence for what held a workload back.

    import counterprof
    with counterprof.profile(events="task-clock,page-faults", interval_ms=10) as run:
        work()
    run.samples()   # pyarrow.Table, samples schema (+ rank when the run has several)
    run.summary()   # totals per event, like perf stat
"""
__version__ = "0.1.0"

# Attributes load on first use: `import counterprof` (and so `counterprof --help`, whose
# console script imports this package first) must not pay for pyarrow and numpy.
_LAZY = {"profile": ".api", "step": ".api", "region": ".regions", "Run": ".api", "load": ".api"}

__all__ = ["profile", "region", "step", "load", "Run", "__version__"]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'counterprof' has no attribute {name!r}")
    import importlib

    from .ground.gil import quick_handoffs
    with quick_handoffs():     # the first use imports pyarrow and numpy: beside a busy thread too
        value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
