"""The nvml collector's flags on `counterprof run`.

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions, named_collectors
from counterprof.ground.errors import UsageError


class NvmlOptions(CollectorOptions):
    title = "nvml collector (NVIDIA GPUs)"
    help_order = 40

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--gpus", metavar="LIST",
                           help="GPUs to sample, by CUDA ordinal as the workload sees them (after "
                                "CUDA_VISIBLE_DEVICES), comma separated (default: every visible GPU)")
        group.add_argument("--nvml-interval-ms", type=float, default=100.0, metavar="MS",
                           help="GPU (NVML) sampling interval in ms (default 100)")
        group.add_argument("--gpm-interval-ms", type=float, default=100.0, metavar="MS",
                           help="GPM window in ms, Hopper and newer (default 100; at least 100)")

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        config: dict[str, Any] = {"interval_ms": args.nvml_interval_ms,
                                  "gpm_interval_ms": args.gpm_interval_ms}
        if args.gpus is not None:
            chosen = named_collectors(args.collectors)
            if chosen is not None and "nvml" not in chosen:
                raise UsageError("--gpus selects GPUs for the nvml collector, which --collectors "
                                 "leaves out")
            config["gpus"] = args.gpus
        return config
