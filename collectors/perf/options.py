"""The perf collector's flags on `counterprof run`: perf stat's own (-e, -A, --per-thread) and
--sampling. -I is run's (every collector's default interval): perf counts at args.interval_ms.

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions


class PerfOptions(CollectorOptions):
    title = "perf collector (CPU counters)"
    help_order = 10

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("-e", "--events", action="append",
                           help="events in perf's syntax, comma separated; repeatable "
                                "(default: perf stat's: task-clock, context-switches, cpu-migrations, "
                                "page-faults, cycles, instructions, branches, branch-misses)")
        group.add_argument("--sampling", choices=("tick", "kernel"), default="tick",
                           help="how counters are sampled: tick (default) reads them every -I of wall "
                                "time; kernel has the kernel sample every -I of each thread's CPU time "
                                "(a launched command, Linux 6.12+; rows still land on the -I wall-time "
                                "grid, a thread's counts at its next sample; falls back to tick with a "
                                "warning)")
        group.add_argument("-A", "--no-aggr", action="store_true",
                           help="with -a: one series per CPU instead of their sum")
        group.add_argument("--per-thread", action="store_true",
                           help="with --pid: one series per thread instead of their sum")

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        config: dict[str, Any] = {"interval_ms": args.interval_ms, "per_thread": args.per_thread,
                                  "per_cpu": args.no_aggr, "sampling": args.sampling}
        if args.events:
            config["events"] = ",".join(args.events)
        return config
