"""counterprof recover RUN: compact what a killed profiler left in the journal.

Safe to run twice and safe to interrupt. Refuses while the profiler that writes
the run is still alive on this host (it will compact on its own when it stops).
Each collector then finishes what it left on disk (torch traces not converted yet):
the same recovery `report`, `export` and `compare` run on such a run, and run again
here on a run already recovered, for whatever was still left pending.
"""
from __future__ import annotations

from .common import EXIT_ERROR, ArgumentParser, err, guarded
from .process_setup import keep_pandas_out, use_system_allocator


def main(argv: list[str]) -> int:
    keep_pandas_out()
    use_system_allocator()
    return guarded(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    p = ArgumentParser(prog="counterprof recover", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run directory")
    p.add_argument("--force", action="store_true",
                   help="compact even though the profiler that writes the run seems alive")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary table")
    args = p.parse_args(argv)

    from ..store.reader import Run
    from ..recover import recover

    run = Run(args.run)
    report = recover(run.path, force=args.force)
    c = report.compaction
    err(f"recovered {c.rows} rows from {c.segments} journal segment(s) into "
        f"{len(c.files)} Parquet file(s) in {run.path}")
    for problem in c.truncated:
        err(f"cut-off segment (kept what was readable): {problem}")
    for problem in c.damaged:
        err(f"damaged segment (kept what was readable): {problem}")
    for line in report.lines:      # e.g. torch traces not converted yet
        err(line)
    for line in report.failed:
        err(line)
    if not args.quiet:
        from ..render.console import console
        from ..analysis.summary import run_summary
        from ..render.summary import summary_renderable
        console(stderr=True).print(summary_renderable(run_summary(run)))
        for why in run.left_out:
            err(why)
    return EXIT_ERROR if report.failed else 0
