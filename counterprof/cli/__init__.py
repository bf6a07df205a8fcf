"""The command line: one module per subcommand, each with main(argv) -> int.

Exit codes: `run` returns the workload's status (128+N when it died of signal N,
127/126 when it could not be found/executed); counterprof's own errors are 1;
usage errors are 2.
"""
from __future__ import annotations

import sys

SUBCOMMANDS = {
    "run": "profile a command, a running process (--pid) or the whole machine (-a)",
    "list": "collectors and events usable here, and why not",
    "recover": "compact the journal a killed profiler left into Parquet",
    "report": "the verdict (compute, memory, collectives, host) with its evidence; --json, --html",
    "top": "a live view of this machine (GPUs, CPU, processes), or of one process (--pid)",
    "import": "turn torch profiler traces (.json, .json.gz) into a run directory",
    "breakdown": "where the GPU's time went: HTA-style breakdowns of a run's torch traces",
    "merge": "one run from the runs of several hosts (their rank partitions side by side)",
    "export": "the whole run as one Perfetto timeline (spans, counters, every rank)",
    "compare": "did a run get slower: median changes with bootstrap intervals, verdict changes",
    "history": "a DuckDB file of runs' summaries: add a run, show trends and change points",
    "calibrate": "measure this machine's ceilings (matmul FLOP/s, memory, links, collectives)",
    "roofline": "every torch op's FLOP/s and bytes/s against the ceilings: bound, share of roof, MFU",
}
MODULES = {"list": "list_events", "import": "import_trace"}   # where module names differ
# what starts other programs (a workload, calibration's workers): they would inherit a umask,
# so these create their files 0600 one by one instead (every other subcommand: private_umask)
LAUNCHES = {"run", "repeat", "calibrate", "top"}
USAGE = "usage: counterprof {" + ",".join(SUBCOMMANDS) + "} ...\n\n" + "\n".join(
    f"  {name:<9} {text}" for name, text in SUBCOMMANDS.items()) + \
    "\n\n`counterprof SUBCOMMAND --help` for its options."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from .. import __version__
        print(f"counterprof {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"counterprof: unknown subcommand '{name}'\n\n{USAGE}", file=sys.stderr)
        return 2
    import importlib
    if name not in LAUNCHES:
        from .common import private_umask
        private_umask()
    return importlib.import_module(f".{MODULES.get(name, name)}", __name__).main(rest)


# subcommands whose process ends without the interpreter's teardown: freeing a few hundred
# modules (numpy, pyarrow) one by one costs an import ~15-25 ms that its user waits for
QUICK_EXIT = {"import"}


def console_main() -> None:
    argv = sys.argv[1:]
    rc = main(argv)
    if argv[:1] and argv[0] in QUICK_EXIT:
        exit_now(rc)
    sys.exit(rc)


def exit_now(rc: int) -> None:
    """End the process with status rc, the atexit handlers run and the standard streams
    flushed, without the interpreter's teardown (every file the command wrote is closed)."""
    import atexit
    import os
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):      # a closed pipe: as the normal exit, nothing to do
            pass
    os._exit(rc)
