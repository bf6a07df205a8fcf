"""The host collector's flags on `counterprof run` (host.py is the collector).

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions


class HostOptions(CollectorOptions):
    title = "host collector (the process tree's and the system's CPU, memory, I/O)"
    help_order = 20

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--host-interval-ms", type=float, default=100.0, metavar="MS",
                           help="host collector interval in ms (default 100)")
        group.add_argument("--host-system-interval-ms", type=float, default=1000.0, metavar="MS",
                           help="the system's CPU and memory figures (/proc/stat, /proc/meminfo) "
                                "every MS (default 1000; 0: with every host sample)")

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {"interval_ms": args.host_interval_ms,
                "system_interval_ms": args.host_system_interval_ms}
