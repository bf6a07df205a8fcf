"""counterprof list: which collectors work on this machine and why not, and what each
offers here (the perf collector tries every event for real: opened disabled on this
process, then closed, so "supported" means this kernel, PMU and setting accept it).
"""
from __future__ import annotations

import json

from .common import ArgumentParser, guarded


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = ArgumentParser(prog="counterprof list", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)

    from ..inventory import collector_inventory
    collectors = collector_inventory()
    if args.json:
        print(json.dumps({"collectors": collectors}, indent=2))
        return 0
    from ..render.inventory import print_inventory
    print_inventory(collectors)
    return 0
