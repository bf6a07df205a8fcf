"""The sequence of one profiled run, for `counterprof run` and `counterprof top`: the session
started around the workload, the live view (if any) drawn in between, and what meta.json says
of how it ended.

    launch:  spawn (paused before exec) -> session.start -> view -> release (exec) -> wait
             -> view closed -> session.stop
    observe: session.start -> view -> a signal, the duration, the pid's end or q
             -> view closed -> session.stop

The session is prepared by the caller (bad input fails there, before anything runs); once
started it is stopped on every path, so the run on disk says how it ended.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable

from .workload import Workload, WorkloadResult, WorkloadStartError, wait_for_stop

if TYPE_CHECKING:
    from .session import Session


class View(Protocol):
    """A live view over the session (cli.common.LiveViewSlot), drawn from open() to close()."""

    def open(self, session: Session) -> threading.Event:
        """Start drawing; the event is set when the user asks to stop profiling (q)."""
        ...

    def close(self) -> dict[str, Any] | None:
        """Give the terminal back (again is harmless); the view's facts for meta.json."""
        ...


def _stderr(message: str) -> None:
    print(f"counterprof: {message}", file=sys.stderr, flush=True)


def launch(session: Session, command: list[str], view: View | None = None,
           say: Callable[[str], None] = _stderr) -> WorkloadResult:
    """Run `command` under the prepared session, counted from its exec; the workload's result.
    q in the view stops profiling (the run is written) and then waits for the workload to end;
    say: where that is told."""
    env = {**os.environ, **session.launch_env} if session.launch_env else None
    workload = Workload(command, env=env)
    pid = workload.spawn()
    try:
        session.start(launched_pid=pid)
    except BaseException:
        workload.abort()
        session.stop(workload={"status": "not started"})
        raise
    quit_requested = view.open(session) if view is not None else None
    started_ns = session.clock.now_ns()        # the workload's life on the run's axis
    try:
        try:
            workload.release()
        except WorkloadStartError as exc:
            _close(view)
            session.stop(workload={"status": "exec failed", "error": str(exc),
                                   "exit_status": exc.exit_code})
            raise
        try:
            result = workload.wait(stop=quit_requested)
        except BaseException:
            _close(view)
            session.stop(workload={"status": "profiler error while waiting", "pid": pid})
            raise
    finally:
        _close(view, session)     # the terminal is given back on every path
    if result is None:
        # q in the live view: stop profiling now, write the run, let the workload finish
        session.stop(workload={"status": "running when profiling stopped", "pid": pid,
                               "profiling_stopped": "q pressed in the live view"})
        say(f"profiling stopped (q); run written to {session.path}; "
            f"waiting for the workload (pid {pid}) to finish")
        result = workload.wait()
        session.update_meta(workload_exit={"status": "exited", **result.to_json()})
    else:
        session.stop(workload={"status": "exited", **result.to_json(),
                               "started_ns": started_ns, "ended_ns": session.clock.now_ns()})
    return result


def observe(session: Session, pid: int | None, duration_s: float | None,
            view: View | None = None, compact: bool = True) -> str:
    """Profile what is already running (pid, or the machine when None) until a signal, the
    duration, the pid's end or q in the view; why it stopped (also in meta.json).
    compact=False: leave the journal as it is (a run about to be removed)."""
    session.start()
    why = "profiler error"
    try:
        quit_requested = view.open(session) if view is not None else None
        why = wait_for_stop(pid, duration_s, stop=quit_requested)
    finally:
        _close(view, session)
        session.note(stopped_because=why)
        session.stop(workload=None, compact=compact)
    return why


def _close(view: View | None, session: Session | None = None) -> None:
    """Close the view; with the session, its facts go into meta.json."""
    if view is None:
        return
    facts = view.close()
    if session is not None and facts is not None:
        session.note(live_view=facts)
