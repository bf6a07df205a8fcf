"""The torch collector's flags on `counterprof run`: --torch turns it on (it is off by default).

Loaded for run's parser before pyarrow: the standard library and counterprof.collector only.
"""
from __future__ import annotations

import argparse
from typing import Any

from counterprof.collector import CollectorOptions
from counterprof.ground.errors import UsageError


class TorchOptions(CollectorOptions):
    title = "torch collector (torch.profiler traces)"
    help_order = 60
    finds_ranks = True          # the driver announces a rank after init_process_group

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--torch", action="store_true",
                           help="record torch.profiler traces in every Python process of the command "
                                "that imports torch (a window of steps every N), converted into spans")
        group.add_argument("--torch-window", metavar="ACTIVE/EVERY", default=None,
                           help="with --torch: record ACTIVE steps every EVERY steps, exactly "
                                "(default: 5 every 50 or more, paced so the windows' measured "
                                "cost stays under 2%% of the run)")
        group.add_argument("--torch-time-window", metavar="SECONDS/EVERY", default=None,
                           help="with --torch, in a process with no step marks and no module "
                                "forwards: record SECONDS every EVERY seconds, exactly (default: the "
                                "first window ~1 s after torch's import, the next ones paced so the "
                                "profiler's own calls take under 5%% of the run, each at most 2 s)")

    @classmethod
    def turned_on(cls, args: argparse.Namespace) -> bool:
        return bool(args.torch)

    @classmethod
    def config_from_args(cls, args: argparse.Namespace) -> dict[str, Any] | None:
        if not args.torch:
            return None
        config: dict[str, Any] = {}
        if args.torch_window is not None:      # given: followed to the step (else the paced default)
            active, _, every = args.torch_window.partition("/")
            if not (active.isdigit() and every.isdigit()):
                raise UsageError(f"--torch-window {args.torch_window!r}: give ACTIVE/EVERY, e.g. 5/50")
            config = {"active": int(active), "every": int(every)}
        if args.torch_time_window is not None:   # given: followed exactly (else paced)
            seconds, _, every_s = args.torch_time_window.partition("/")
            try:
                config.update(window_s=float(seconds), window_every_s=float(every_s))
            except ValueError:
                raise UsageError(f"--torch-time-window {args.torch_time_window!r}: give "
                                 "SECONDS/EVERY, e.g. 2/20") from None
        return config
