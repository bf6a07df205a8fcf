"""What every subcommand shares: error printing and exit codes in one place."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..errors import CounterprofError

EXIT_ERROR = 1
EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors with exit code 2 through a return value."""

    def error(self, message: str):
        raise UsageFailure(message, self.format_usage())


class UsageFailure(Exception):
    def __init__(self, message: str, usage: str):
        super().__init__(message)
        self.usage = usage


def err(message: str) -> None:
    print(f"counterprof: {message}", file=sys.stderr, flush=True)


class WarningRoute:
    """Where session warnings go: stderr, or the live view while it owns the terminal
    (a line printed under the dashboard would tear it)."""

    def __init__(self):
        self.view = None

    def __call__(self, message: str) -> None:
        view = self.view
        if view is not None:
            view.warn(message)
        else:
            err(message)


def guarded(fn: Callable[[], int]) -> int:
    """Run a subcommand body; counterprof errors become one line and an exit code."""
    try:
        return fn()
    except UsageFailure as exc:
        sys.stderr.write(exc.usage)
        err(str(exc))
        return EXIT_USAGE
    except CounterprofError as exc:
        err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (`counterprof report RUN | head`): stop quietly, like a shell
        # tool killed by SIGPIPE, and keep Python from complaining when it flushes stdout
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def use_system_allocator() -> None:
    """In counterprof's own process, Arrow allocates through malloc rather than its default
    mimalloc pool, which keeps freed memory around: compaction and the summary at the end of a
    long run peak ~30 MB lower. (The context manager leaves the user's process alone.)"""
    import pyarrow as pa
    pa.set_memory_pool(pa.system_memory_pool())


def open_run(path: str, skip_unreadable: bool = False):
    """A Run, recovered first when a killed profiler left it (and saying so): what every
    subcommand that reads a run opens it with. skip_unreadable: leave out unreadable Parquet
    files (the subcommand names them from run.skipped)."""
    from ..store.reader import Run
    from ..store.recover import needs_recovery, recover
    run = Run(path, skip_unreadable=skip_unreadable)
    if needs_recovery(run.meta):
        rep = recover(run.path)
        err(f"{run.path}: the profiler that wrote it is gone; recovered {rep.rows} rows from its journal")
    return run
