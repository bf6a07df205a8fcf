"""counterprof calibrate: measure this machine's ceilings (the roofline's roofs) and save them.

    counterprof calibrate                 matmul FLOP/s per dtype, memory bandwidth, links, collectives
    counterprof calibrate --quick --json  the short sweep (under 30 s on 2 cores), as JSON

Saved to $XDG_CACHE_HOME/counterprof/ceilings/<host>-<device>.json; later runs on this host
copy them into their meta.json at their start, and `counterprof roofline` and `report` read
that copy. It records how loaded the machine was while it measured; when other processes held
a quarter of its CPUs or more (in its busiest step), the ceilings would be too low: it says so,
saves nothing and exits 1, unless --force.
"""
from __future__ import annotations

import json
import sys

from .common import ArgumentParser, err, guarded

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..calibrate import Doc


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = ArgumentParser(prog="counterprof calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer shapes and shorter timings (< 30 s on 2 cores)")
    p.add_argument("--json", action="store_true", help="print the ceilings as JSON on stdout")
    p.add_argument("--no-save", action="store_true", help="do not write the cache")
    p.add_argument("--force", action="store_true",
                   help="save the ceilings even when other processes held the CPUs while measuring")
    p.add_argument("--no-collectives", action="store_true", help="skip the gloo/NCCL collectives")
    p.add_argument("--no-gpu", action="store_true", help="measure the CPU only")
    p.add_argument("--world", type=int, default=2, metavar="N",
                   help="processes for the CPU collectives (default 2)")
    args = p.parse_args(argv)
    if args.world < 2:
        from .common import UsageFailure
        raise UsageFailure("--world must be 2 or more", p.format_usage())

    from .. import calibrate as cal
    from ..render.roofline import ceilings_table
    docs = _measure(args)
    load = cal.loaded(docs)
    refused = False
    if load is not None:
        err(loaded_message(load, saving=not args.no_save, force=args.force))
        if args.force and not args.no_save:
            load["saved_anyway"] = True
        refused = not args.force and not args.no_save
    if not args.no_save and not refused:
        for path in cal.save(docs):
            err(f"saved {path}")
    if args.json:
        print(json.dumps(docs, indent=1, default=float))
    else:
        ceilings_table(docs, sys.stdout)
    return 1 if refused else 0


def loaded_message(load: dict[str, Any], saving: bool, force: bool) -> str:
    """What a calibration on a loaded machine tells the user, and what to do."""
    from ..calibrate.load import words
    text = (f"the machine was busy while calibrate measured: {words(load)}; at "
            f"{100 * load['threshold']:.0f}% or more the ceilings come out too low, and every run "
            "held to them looks nearer its roof than it is.")
    if not saving:
        return text + " (--no-save: nothing saved)"
    if force:
        return text + " Saved anyway (--force); a roofline held to them names where they came from."
    return (text + " Not saved (the ceilings saved before, if any, stay): run `counterprof calibrate` "
            "again when the machine is quiet (`top` shows what holds the CPUs), or pass --force "
            "to save these.")


def _measure(args: argparse.Namespace) -> dict[str, Doc]:
    """calibrate() under a progress bar on stderr (when it is a terminal)."""
    from .. import calibrate as cal
    mode = cal.MODES[args.quick]
    steps = len(mode["cpu_sizes"]) + len(mode["bf16_sizes"]) + 2 + (0 if args.no_collectives else 1)
    if not sys.stderr.isatty():
        return cal.calibrate(args.quick, gpu=not args.no_gpu, collectives=not args.no_collectives,
                             world=args.world, fresh_process=True)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description:<40}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task("calibrating", total=steps)
        first = [True]

        def progress(label: str) -> None:
            if not first[0]:
                bar.advance(task)
            first[0] = False
            bar.update(task, description=label)
        return cal.calibrate(args.quick, progress, gpu=not args.no_gpu,
                             collectives=not args.no_collectives, world=args.world, fresh_process=True)
