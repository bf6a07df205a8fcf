"""counterprof merge RUN... -o OUT: one run from the runs of several hosts (or jobs).

Each input's rank partitions (its tables' files and its own folder) are copied into OUT, in
the current layout whatever the input's (a rank may come from one input only); each keeps the
meta.json of the process that wrote it (its host, its collectors), and the catalogs are merged,
so `counterprof report OUT` sees every rank, estimates the hosts' clock skew from collective end
times, and finds the stragglers across hosts.
"""
from __future__ import annotations

from .common import ArgumentParser, UsageFailure, err, guarded


def main(argv: list[str]) -> int:
    return guarded(lambda: _main(argv), reads_runs=True)   # sized to the memory limits first


def _main(argv: list[str]) -> int:
    p = ArgumentParser(prog="counterprof merge", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories")
    from .arguments import output_path
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the merged run (new)",
                   type=output_path("name the merged run's new directory"))
    p.add_argument("--force", action="store_true", help="replace OUT if it holds a run")
    args = p.parse_args(argv)

    from ..store.merge import MergeConflict, merge_runs
    try:
        m = merge_runs(args.runs, args.output, replace=args.force)
    except MergeConflict as exc:      # overlapping runs: said with the usage, like a bad argument
        raise UsageFailure(str(exc), p.format_usage()) from None
    err(f"merged {m.ranks} ranks from {m.runs} runs on {len(m.hosts)} host(s) into {m.path}")
    return 0
