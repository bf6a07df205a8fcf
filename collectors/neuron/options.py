"""The neuron collector's flags on `counterprof run`.

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions


class NeuronOptions(CollectorOptions):
    title = "neuron collector (AWS Neuron devices)"
    help_order = 50

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--neuron-interval-ms", type=float, default=1000.0, metavar="MS",
                           help="Neuron sampling interval in ms (default 1000): neuron-monitor "
                                "reports at most once a second, the Neuron sysfs counters at this "
                                "interval")

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {"interval_ms": args.neuron_interval_ms}
