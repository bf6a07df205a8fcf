"""counterprof top's process table: the machine's busiest processes, polled with psutil once
a second on a thread (`ProcessPoller`), ranked by the CPU they used between two polls."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from collections.abc import Mapping


@dataclass
class ProcessRow:
    pid: int
    name: str
    cpu_pct: float | None       # percent of one CPU over the last poll interval
    rss: float | None


def top_processes(prev: Mapping[int, tuple[str, float, float | None]],
                  cur: Mapping[int, tuple[str, float, float | None]],
                  seconds: float, n: int) -> list[ProcessRow]:
    """The n busiest processes between two polls. prev/cur: pid -> (name, cpu seconds, rss)."""
    rows = []
    for pid, (name, cpu, rss) in cur.items():
        before = prev.get(pid)
        pct = None if before is None or seconds <= 0 else max(0.0, 100.0 * (cpu - before[1]) / seconds)
        rows.append(ProcessRow(pid, name, pct, rss))
    rows.sort(key=lambda r: (-(r.cpu_pct or 0.0), -(r.rss or 0.0), r.pid))
    return rows[:n]


class ProcessPoller:
    """The busiest processes of the machine, polled with psutil once a second on a thread.
    rows() is the latest list (a new list object per poll)."""

    def __init__(self, n: int, period_s: float = 1.0):
        self.n, self.period_s = n, period_s
        self._rows: list[ProcessRow] = []
        self._prev: dict[int, tuple[str, float, float | None]] = {}
        self._prev_t = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def rows(self) -> list[ProcessRow]:
        return self._rows

    def poll(self) -> None:
        import psutil

        cur: dict[int, tuple[str, float, float | None]] = {}
        for p in psutil.process_iter(["name", "cpu_times", "memory_info"], ad_value=None):
            ct, mem = p.info["cpu_times"], p.info["memory_info"]
            if ct is None:
                continue
            cur[p.pid] = (p.info["name"] or "?", ct.user + ct.system, mem.rss if mem else None)
        now = time.monotonic()
        rows = top_processes(self._prev, cur, now - self._prev_t, self.n)
        self._prev, self._prev_t = cur, now
        for r in rows:               # the command line says more than the name, for the few shown
            try:
                cmd = psutil.Process(r.pid).cmdline()
                if cmd:
                    r.name = " ".join(cmd)
            except psutil.Error:
                pass
        self._rows = rows

    def start(self) -> None:
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="counterprof-top-procs", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.poll()
            except Exception:       # a vanished process or /proc hiccup: try again next second
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
