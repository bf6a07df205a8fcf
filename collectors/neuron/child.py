"""neuron-monitor (and neuron-ls) as the profiler's child process, its output read without trusting it.

The monitor is an outside program: it may print nothing, flood, write a line that never
ends, spam stderr, fork helpers that keep its pipes open, ignore SIGTERM, or outlive a
profiler that was SIGKILLed. So:

- it runs in its own session (process group), killed as a group at stop;
- PR_SET_PDEATHSIG: the kernel kills it when the thread that started it ends, so it is
  started from the reader thread, which lives until stop() (a SIGKILLed profiler's
  threads all end, and the monitor with them);
- stdout is read with select() and os.read() into a bounded buffer: a line longer than
  MAX_LINE is dropped as it arrives (memory stays bounded), and the reader notices stop()
  even when a grandchild holds the pipe open;
- stderr goes to a pipe of which the last STDERR_KEEP bytes are kept (not a file that grows).
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable

MAX_LINE = 16 << 20           # a report line of 64 NeuronCores and many models is ~1 MB
STDERR_KEEP = 4096
READ_CHUNK = 1 << 16
DRAIN_S = 1.0                 # after stop: what is already in the pipe, for at most this long
PR_SET_PDEATHSIG = 1

_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):      # not Linux/glibc: no death signal, the group kill stays
    _prctl = None


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:
        # `counterprof run` blocks the signals it takes with sigtimedwait; a blocked mask is
        # inherited across exec, so SIGTERM would not stop the monitor
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:      # the profiler died before the death signal was armed
            os._exit(1)
    return setup


class MonitorProcess:
    """One neuron-monitor child: spawn(), pump() its lines to callbacks, kill()."""

    def __init__(self, argv: list[str], max_line: int = MAX_LINE):
        self.argv = argv
        self.max_line = max_line
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr = bytearray()
        self.long_lines = 0
        self.partial_at_end = 0       # bytes of a last line cut off by the monitor's end

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, close_fds=True, start_new_session=True,
                                     preexec_fn=_child_setup(os.getpid()))

    def pump(self, on_line: Callable[[bytes], None], on_long: Callable[[int], None],
             on_idle: Callable[[], None], stopping: Callable[[], bool], idle_s: float = 0.25) -> None:
        """Until the monitor's stdout ends (or, once stopping(), until what is in the pipe is
        read): on_line(each complete line), on_long(bytes dropped) for a line over max_line,
        on_idle() every idle_s without output."""
        assert self.proc is not None and self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        open_fds = {out, err}
        buf = bytearray()
        skipping = 0                  # > 0: inside an over-long line, this many bytes dropped
        stop_seen: float | None = None
        while out in open_fds:
            if stopping() and stop_seen is None:
                stop_seen = time.monotonic()
            if stop_seen is not None and time.monotonic() - stop_seen > DRAIN_S:
                break                 # a grandchild may hold the pipe open: do not wait for EOF
            try:
                ready, _, _ = select.select(list(open_fds), [], [], idle_s)
            except InterruptedError:
                continue
            if not ready:
                if stop_seen is not None:
                    break             # stopped, and nothing more is coming now
                on_idle()
                continue
            for fd in ready:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    open_fds.discard(fd)
                    continue
                if fd == err:
                    self._stderr += chunk
                    del self._stderr[:-STDERR_KEEP]
                    continue
                start = 0
                while True:
                    nl = chunk.find(b"\n", start)
                    if nl < 0:
                        rest = len(chunk) - start
                        if skipping:
                            skipping += rest
                        elif len(buf) + rest > self.max_line:
                            skipping = len(buf) + rest
                            buf.clear()
                        else:
                            buf += chunk[start:]
                        break
                    if skipping:
                        self.long_lines += 1
                        on_long(skipping + nl - start)
                        skipping = 0
                    elif len(buf) + nl - start > self.max_line:
                        self.long_lines += 1
                        on_long(len(buf) + nl - start)
                        buf.clear()
                    else:
                        buf += chunk[start:nl]
                        line = bytes(buf)
                        buf.clear()
                        on_line(line)
                    start = nl + 1
        self.partial_at_end = len(buf) + skipping

    def stderr_tail(self) -> str:
        """The last non-empty line the monitor wrote to stderr (at most 300 characters)."""
        text = bytes(self._stderr).decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-1][-300:] if lines else ""

    def kill(self, wait_s: float) -> int | None:
        """SIGTERM to the monitor's group, then SIGKILL to it (a monitor that ignores SIGTERM,
        helpers it forked); the monitor's exit status."""
        proc = self.proc
        if proc is None:
            return None
        self._signal_group(proc, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            rc = None
        self._signal_group(proc, signal.SIGKILL)
        if rc is None:
            try:
                rc = proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                rc = None
        return rc

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self.proc is None:
            return
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
