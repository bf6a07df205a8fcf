"""The jax collector's flags on `counterprof run`: --jax turns it on (it is off by default).

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions
from counterprof.ground.errors import UsageError


class JaxOptions(CollectorOptions):
    title = "jax collector (jax.profiler profiles)"
    help_order = 70
    finds_ranks = True          # the driver announces a rank after jax.distributed.initialize

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--jax", action="store_true",
                           help="record jax.profiler profiles in every Python process of the command "
                                "that imports jax (a window of StepTraceAnnotation steps every N, else "
                                "windows of time), converted into spans; every step is timed")
        group.add_argument("--jax-window", metavar="ACTIVE/EVERY", default=None,
                           help="with --jax: record ACTIVE steps every EVERY steps, exactly (default: "
                                "5 every 50 or more, after the first step, paced so the profiler's "
                                "start and stop take under 5%% of the run)")

    @classmethod
    def turned_on(cls, args: argparse.Namespace) -> bool:
        return bool(args.jax)

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any] | None:
        if args.jax_window is not None and not args.jax:
            raise UsageError("--jax-window applies with --jax")
        if not args.jax:
            return None
        if args.pid is not None or not any(c != "--" for c in args.command):
            raise UsageError("--jax profiles a command counterprof launches (`counterprof run "
                             "--jax -- CMD`), not a running process")
        if args.jax_window is None:             # the paced default
            return {}
        active, _, every = args.jax_window.partition("/")      # given: followed to the step
        if not (active.isdigit() and every.isdigit()):
            raise UsageError(f"--jax-window {args.jax_window!r}: give ACTIVE/EVERY, e.g. 5/50")
        return {"active": int(active), "every": int(every)}
