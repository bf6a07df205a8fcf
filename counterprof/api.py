"""The context manager / decorator over the current process."""
from __future__ import annotations

import contextlib
import os
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .collector import Target
from .ground.gil import quick_handoffs
from .session import Session, job_from_env

if TYPE_CHECKING:
    from .render.summary import ShownSummary
from .store import reader


class Run(reader.Run):
    """A run directory as a user reads it (counterprof.load, counterprof.profile): the store's
    tables, samples and meta, and summary(), perf stat's table."""

    def summary(self, rank: int | None = None) -> ShownSummary:
        """Totals per event and the workload's figures, like perf stat's table (print() it)."""
        from .analysis.summary import run_summary
        from .render.summary import shown
        return shown(run_summary(self, rank))


def load(path: str | os.PathLike[str]) -> Run:
    return Run(path)


def step() -> None:
    """Mark the end of a training step for the torch collector (its windows count steps).

    Cheap and safe anywhere: without the torch collector running in this process it does
    nothing. Scripts that call optimizer.step() need no marks; this one takes precedence."""
    driver = sys.modules.get("_counterprof_torch_driver")
    if driver is not None:
        driver.step("counterprof")


class profile(contextlib.ContextDecorator):
    """Profile the current process: all of its existing threads and those it starts.

        with counterprof.profile(events="task-clock,page-faults", interval_ms=10) as run:
            work()
        run.summary()

    As a decorator, each call makes a new run (so leave `path` unset, or pass replace=True).
    Without `path`, a new timestamped run directory is made in the current directory.
    """

    def __init__(self, events: str | None = None, interval_ms: float = 100.0, *,
                 path: str | os.PathLike[str] | None = None, collectors: list[str] | None = None,
                 host_interval_ms: float = 100.0, per_thread: bool = False,
                 rank: int | None = None, replace: bool = False, job: str | None = None,
                 config: dict[str, dict[str, Any]] | None = None):
        self.events = events
        self.interval_ms = interval_ms
        self.path = path
        self.collectors = collectors
        self.host_interval_ms = host_interval_ms
        self.per_thread = per_thread
        self.rank = rank
        self.replace = replace
        # the ranks of one job share `path` (each writes its partition): see session.job_from_env
        self.job = job
        self.extra_config = config or {}
        self.session: Session | None = None
        self.run: Run | None = None

    def _config(self) -> dict[str, dict[str, Any]]:
        perf: dict[str, Any] = {"interval_ms": self.interval_ms, "per_thread": self.per_thread}
        if self.events is not None:
            perf["events"] = self.events
        cfg = {"perf": perf, "host": {"interval_ms": self.host_interval_ms}}
        for name, extra in self.extra_config.items():
            cfg.setdefault(name, {}).update(extra)
        return cfg

    def __enter__(self) -> Run:
        self.session = Session(self.path, collectors=self.collectors, config=self._config(),
                               target=Target("self"), command=list(sys.argv), rank=self.rank,
                               replace=self.replace,
                               job=self.job or (job_from_env() if self.path is not None else None))
        with quick_handoffs():
            self.session.prepare()
            self.session.start()
        self.run = Run(self.session.path)
        return self.run

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if self.session is not None:
            with quick_handoffs():
                self.session.stop()
        return False
