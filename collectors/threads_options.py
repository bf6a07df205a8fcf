"""The threads collector's flags on `counterprof run` (threads.py is the collector).

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions

# The threads collector's thread wakes every interval: under -I 1 it was two thirds of the
# profiler's CPU (5% of a core against perf stat -I 1's 3.4%); 10 ms still resolves the
# verdict's 100 ms regions. --threads-interval-ms goes finer.
THREADS_FINEST_DEFAULT_MS = 10.0
# Under --sampling kernel nothing else wakes per interval: a 10 ms threads tick would be most
# of its cost (0.5-0.7% of a core on a VM, perf stat -I 10's whole cost is 0.9%), so its
# threads default to the verdict's 100 ms regions there.
THREADS_KERNEL_DEFAULT_MS = 100.0


class ThreadsOptions(CollectorOptions):
    title = "threads collector (thread states by role)"
    help_order = 30

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--threads-interval-ms", type=float, default=None, metavar="MS",
                           help="threads collector interval in ms (default: -I's, 10 at the finest; "
                                "100 at the finest under --sampling kernel): thread states by role, "
                                "which the verdict follows, so they sample as finely as the counters "
                                "down to 10 ms")

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {"interval_ms": interval_ms(args)}


def interval_ms(args: argparse.Namespace) -> float:
    """--threads-interval-ms, else run's -I, no finer than 10 ms (100 ms under perf's
    --sampling kernel: perf's option, absent where perf is not installed)."""
    if args.threads_interval_ms is not None:
        return float(args.threads_interval_ms)
    kernel = getattr(args, "sampling", "tick") == "kernel"
    finest = THREADS_KERNEL_DEFAULT_MS if kernel else THREADS_FINEST_DEFAULT_MS
    return max(float(args.interval_ms), finest)
