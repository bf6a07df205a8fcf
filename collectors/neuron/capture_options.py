"""The neuron_profile collector's flag on `counterprof run`: --neuron-profile.

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions
from counterprof.ground.errors import UsageError

MODES = ("model", "session")


class NeuronProfileOptions(CollectorOptions):
    title = "neuron_profile collector (Neuron Explorer device and system profiles)"
    help_order = 55

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--neuron-profile", nargs="?", const="model", default=None, choices=MODES,
                           metavar="MODE",
                           help="capture the Neuron runtime's device and system profiles (NEURON_RT_INSPECT_*) "
                                "into the run, process them with neuron-explorer when it is on PATH, and import "
                                "the NeuronCores' engines, DMA and collectives; MODE model (default: the first "
                                "execution of each NEFF on each core) or session (every execution)")

    @classmethod
    def turned_on(cls, args: argparse.Namespace) -> bool:
        return args.neuron_profile is not None

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any] | None:
        if args.neuron_profile is None:
            return None
        # the Neuron docs: the runtime's capture (NEURON_RT_INSPECT_ENABLE) and the frameworks'
        # profiler APIs conflict ("use one or the other")
        for flag in ("torch", "jax"):
            if getattr(args, flag, False):
                raise UsageError(f"--neuron-profile and --{flag} cannot be used together: the Neuron runtime's "
                                 f"capture and the {flag} profiler conflict (Neuron's docs: use one or the "
                                 f"other); run once with each, or drop --{flag}")
        return {"mode": args.neuron_profile}
