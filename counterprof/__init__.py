"""counterprof: hardware performance counters, GPU metrics and PyTorch traces on one
clock, in Parquet, with the evidence for what held a workload back.

    import counterprof
    with counterprof.profile(events="task-clock,page-faults", interval_ms=10) as run:
        work()
    run.samples()   # pyarrow.Table, samples schema (+ rank when the run has several)
    run.summary()   # totals per event, like perf stat
"""
__version__ = "0.1.0"

from .api import profile, step  # noqa: E402
from .regions import region  # noqa: E402
from .store.reader import Run, load  # noqa: E402

__all__ = ["profile", "region", "step", "load", "Run", "__version__"]
