"""What every subcommand shares: error printing and exit codes in one place."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..ground.errors import CounterprofError

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, NoReturn

    from ..live.view import LiveView
    from ..live.window import LiveWindow
    from ..session import Session
    from ..store.reader import Run

EXIT_ERROR = 1
EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors with exit code 2 through a return value."""

    def error(self, message: str) -> NoReturn:
        raise UsageFailure(message, self.format_usage())

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse finds its width through shutil, which imports bz2, lzma and zlib (~2 ms of
        # every run's start-up, as add_argument checks each option's format): the same width here
        # (typeshed's formatter_class protocol names prog only; every HelpFormatter takes width)
        formatter_class: Callable[..., argparse.HelpFormatter] = self.formatter_class
        return formatter_class(prog=self.prog, width=help_width())


def help_width() -> int:
    """argparse's help width: shutil.get_terminal_size's columns (COLUMNS, else stdout's
    terminal, else 80), less 2."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns   # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


class Terminated(Exception):
    """SIGTERM arrived (terminated_on_sigterm): the command ends as an interrupt does."""


class UsageFailure(Exception):
    def __init__(self, message: str, usage: str):
        super().__init__(message)
        self.usage = usage


def err(message: str) -> None:
    from ..render.inert import inert_lines    # names in messages print inert
    if sys.stderr is None:       # started with stderr closed: print(file=None) would use stdout
        return
    print(f"counterprof: {inert_lines(message)}", file=sys.stderr, flush=True)


class WarningRoute:
    """Where session warnings go: stderr, or the live view while it owns the terminal
    (a line printed under the dashboard would tear it)."""

    def __init__(self) -> None:
        self.view: LiveView | None = None
        self.seen: set[str] | None = None     # given (run -r): a warning said once, not per run

    def __call__(self, message: str) -> None:
        if self.seen is not None:
            if message in self.seen:
                return
            self.seen.add(message)
        view = self.view
        if view is not None:
            view.warn(message)
        else:
            err(message)


class LiveViewSlot:
    """The live view of `run --live` and `top`, for profile_run: drawn over the session's
    window from open() to close(); while drawn, the session's warnings go to it."""

    def __init__(self, window: LiveWindow, warnings: WarningRoute, title: str,
                 show_run_path: bool = True, **options: Any) -> None:
        self.window, self.warnings, self.title = window, warnings, title
        self.show_run_path = show_run_path
        self.options = options          # for live.view.LiveView: scope, cpus, keys_hint...
        self.view: LiveView | None = None
        from ..live.view import for_session    # imported now, at start-up: not in the run's time
        self._for_session = for_session

    def open(self, session: Session) -> threading.Event:
        from ..workload import wake_main_thread
        self.view = self._for_session(session, self.window, self.title, on_quit=wake_main_thread,
                                      **self.options)
        if not self.show_run_path:      # a temporary run, removed at the end: not worth naming
            self.view.run_path = None
        self.view.start()
        self.warnings.view = self.view
        return self.view.quit_requested

    def close(self) -> dict[str, Any] | None:
        if self.view is None:
            return None
        self.warnings.view = None
        self.view.close()
        return self.view.facts()


def guarded(fn: Callable[[], int], reads_runs: bool = False) -> int:
    """Run a subcommand body; counterprof errors become one line and an exit code.
    reads_runs: a command that reads runs (report, export, history, merge): the process is
    sized to its memory limits first (store/limits.py), before numpy, pyarrow and DuckDB load,
    and Arrow allocates through malloc (process_setup.use_system_allocator)."""
    from ..store import limits, safepath
    safepath.set_sink(err)          # a link planted in a run is named as it is skipped
    try:
        if reads_runs:
            limits.fit_process()
            from .process_setup import use_system_allocator
            use_system_allocator()
        else:
            limits.message()        # the out-of-memory line, built now: its path allocates nothing
        return fn()
    except limits.MemoryLimitTooSmall as exc:
        err(str(exc))
        return EXIT_ERROR
    except UsageFailure as exc:
        sys.stderr.write(exc.usage)
        err(str(exc))
        return EXIT_USAGE
    except CounterprofError as exc:
        err(str(exc))
        return exc.exit_code
    except OSError as exc:       # one a subcommand did not expect: still one line
        from ..ground.errors import os_error
        if limits.is_out_of_memory(exc):
            return _out_of_memory()
        if isinstance(exc, BrokenPipeError):
            return _broken_pipe()
        e = os_error(exc, doing="reading or writing it")
        err(str(e))
        return e.exit_code
    except MemoryError:
        return _out_of_memory()
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except Terminated:
        err("terminated (SIGTERM)")
        return 143
    except Exception as exc:     # DuckDB's OutOfMemoryException, an ImportError of a library
        if limits.is_out_of_memory(exc):       # that could not be mapped: memory ran out
            return _out_of_memory()
        raise


def _out_of_memory() -> int:
    """Memory ran out: the line built at start-up (store/limits.py: the limit and what to do),
    written as bytes; nothing allocated here (no formatting, no import)."""
    from ..store.limits import message      # (loaded already: guarded imported it)
    try:
        os.write(2, message())
    except OSError:
        pass
    return EXIT_ERROR


@contextmanager
def terminated_on_sigterm() -> Iterator[None]:
    """SIGTERM (`timeout`, a batch system, `docker stop`) raises Terminated in the main thread
    while the block runs, so the command cleans up as on Ctrl-C instead of dying where it
    stands; the handler before is restored after (a caller in-process keeps its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(_signum: int, _frame: FrameType | None) -> NoReturn:
        raise Terminated()

    before = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _broken_pipe() -> int:
    # the reader went away (`counterprof report RUN | head`): stop quietly, like a shell
    # tool killed by SIGPIPE, and keep Python from complaining when it flushes stdout
    import os
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def check_pid(pid: int, usage: str) -> None:
    """A --pid that names a live process, or a usage error that says what it is instead.
    psutil tells a zombie (exited, not yet reaped: /proc/PID still exists, but nothing runs
    there to count) from a live process."""
    import psutil
    try:
        zombie = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):       # ValueError: not a valid pid at all
        raise UsageFailure(f"no process with pid {pid}", usage) from None
    except psutil.AccessDenied:
        return              # it exists; whether it may be counted is the collectors' to say
    if zombie:
        raise UsageFailure(f"pid {pid} has exited (a zombie its parent has not reaped): "
                           "nothing runs there to profile", usage)


def open_run(path: str, skip_unreadable: bool = False) -> Run:
    """A Run, recovered first when a killed profiler left it (and saying so): what every
    subcommand that reads a run opens it with. skip_unreadable: leave out unreadable Parquet
    files (the subcommand names them from run.skipped)."""
    from ..repeat_set import is_set, members
    from ..store.reader import Run
    from ..recover import recover, run_needs_recovery
    if is_set(path):
        from ..ground.errors import UsageError
        runs = members(path)
        raise UsageError(f"{path} is a set of {len(runs)} runs (`counterprof run -r`): give one of "
                         f"them ({runs[0] if runs else path + '/run-1'}), or compare the set with another")
    run = Run(path, skip_unreadable=skip_unreadable)
    if run_needs_recovery(run.path):
        # the one recovery `counterprof recover` runs: the journal, then the collectors' leftovers
        from ..ground.errors import DiskFull
        try:
            rep = recover(run.path)
        except DiskFull as exc:     # the journal stays and reads as it is: go on without
            err(f"{exc} (read without recovering it)")
            return run
        err(f"{run.path}: the profiler that wrote it is gone; recovered {rep.compaction.rows} rows from its journal")
        shown = 10
        for line in rep.lines[:shown]:
            err(line)
        if len(rep.lines) > shown:
            err(f"... and {len(rep.lines) - shown} more like these")
        for line in rep.failed:
            err(line)
    return run


def check_output_file(path: str, option: str, inputs: Sequence[str] = ()) -> None:
    """Refuse an output file that cannot be written (a directory, a missing directory, no
    permission), or that is one of the inputs or lies inside one (a run directory: an --html
    over its meta.json would destroy it), before any work is done or anything is printed."""
    import os
    from pathlib import Path
    from ..ground.errors import UsageError
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give a file name")
    target = p.resolve()
    for given in inputs:
        src = Path(given).resolve()
        if target == src or (src.is_dir() and src in target.parents):
            raise UsageError(f"{option} {path}: it would overwrite " + (
                f"the input {given}" if target == src else f"a file inside the run {given}") +
                ": write it elsewhere")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(p if p.exists() else parent, os.W_OK):
        raise UsageError(f"{option} {path}: not writable (permission denied)")


def write_text_file(path: str, text: str, option: str) -> None:
    """Write an output file the user named (--html FILE, --csv FILE): created with the user's
    umask, as cp and perf -o create theirs (ground/outputs.py); a failure is one line, not a
    traceback."""
    from ..ground.errors import CounterprofError
    from ..ground.outputs import user_opener
    try:
        with open(path, "w", opener=user_opener) as f:
            f.write(text)
    except OSError as exc:
        import os
        if os.path.isfile(path):
            os.unlink(path)          # half a file (a full disk) is no output
        raise CounterprofError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def private_opener(path: str, flags: int) -> int:
    """open()'s opener for a file counterprof creates on its own behalf: 0600 (an existing file
    keeps the mode its owner gave it). The outputs the user names use ground/outputs.py's
    user_opener instead."""
    import os
    return os.open(path, flags | os.O_CLOEXEC, 0o600)


def private_umask() -> None:
    """Files and folders this process creates (DuckDB's history file and its WAL, a run) are
    its owner's only; the user's umask is kept for the outputs the user names. Not for the
    subcommands that launch a workload: it would inherit the mask."""
    from ..ground.outputs import private_umask as set_private
    set_private()
