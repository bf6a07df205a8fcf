"""The command line: one module per subcommand, each with main(argv) -> int.

Exit codes: `run` returns the workload's status (128+N when it died of signal N,
127/126 when it could not be found/executed); counterprof's own errors are 1;
usage errors are 2.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    from collections.abc import Callable

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
    "collectives": "every collective call across ranks: size, skew, wait, busbw against the curve",
    "correlate": "hold a run against predictions (a model, a simulator, the roofline, another run)",
    "trace": "trace a running job's next steps now, on every rank (a run under `run --torch`)",
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
    subcommand: Callable[[list[str]], int] = importlib.import_module(
        f".{MODULES.get(name, name)}", __name__).main      # each subcommand's main(argv) -> int
    return subcommand(rest)


# Subcommands that end with os._exit once done (see exit_without_teardown): each has all it
# wrote closed by then; a run's exit is the workload's exit status, waited for by scripts, and
# an import's user waits for the prompt (teardown was ~15-25 ms of either).
FAST_EXIT = {"run", "import"}


def exit_without_teardown(status: int) -> None:
    """End the process the way the interpreter would, less its teardown: Python's exit joins
    the non-daemon threads (and concurrent.futures' workers), runs atexit, flushes stdout and
    stderr, then frees every module, which with numpy and pyarrow loaded (and Arrow's C++
    statics) is 20-50 ms of a `counterprof run -- true`. This does the first three and
    os._exit; it returns (the caller exits as usual) where a flush fails, so a closed pipe
    reads as Python says it."""
    import os
    import threading
    threading._shutdown()          # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    import atexit
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:
        return
    os._exit(status)


def console_main() -> None:
    try:
        status = main()
    except KeyboardInterrupt:    # Ctrl-C before a subcommand's own handling is in place (its imports)
        print("counterprof: interrupted", file=sys.stderr)
        sys.exit(130)
    # a profiler or tracer (python -m cProfile, coverage) writes its data at the usual exit
    traced = sys.getprofile() is not None or sys.gettrace() is not None
    if len(sys.argv) > 1 and sys.argv[1] in FAST_EXIT and isinstance(status, int) and not traced:
        exit_without_teardown(status)
    sys.exit(status)
