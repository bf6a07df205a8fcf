"""The polling-collector base: the loop's thread, its failure, and stop (host, threads, nvml,
torch are built on it); the defaults helper and the one "compiled part is missing" error."""
from __future__ import annotations

import errno
import threading

from counterprof.ground.clock import Clock
from counterprof.collector import Collector, PollingCollector, SessionContext, Target, native_available
from counterprof.ground.errors import (EventNotSupported, NativeUnavailable, PerfEventError, PerfPermissionError,
                                native_missing, perf_error)


def context(failed, warned):
    return SessionContext(clock=Clock(), target=Target("self"), config={}, rank=0,
                          emit=lambda *a: None, add_metrics=lambda m: None,
                          fail=lambda name, why: failed.append((name, why)), warn=warned.append)


class Ticker(PollingCollector):
    name = "ticker"
    DEFAULTS = {"interval_ms": 5.0, "proc": "/proc"}

    def __init__(self, config=None, fail_at=None, last_fails=False):
        super().__init__(config)
        self.samples, self.flushed, self.released = 0, [], 0
        self.fail_at, self.last_fails = fail_at, last_fails
        self.rows = 0

    def start(self, ctx):
        self.ctx = ctx
        self.start_polling(ctx)

    def poll(self):
        while not self._stop.wait(self.config["interval_ms"] / 1000):
            self.samples += 1
            self.rows += 1
            if self.samples == self.fail_at:
                raise RuntimeError("boom")

    def last_sample(self):
        if self.last_fails:
            raise OSError("gone")
        self.rows += 1

    def flush(self):
        self.flushed.append(self.rows)
        self.rows = 0

    def release(self):
        self.released += 1


def test_defaults_under_the_given_config():
    assert Ticker.with_defaults({"proc": "/x"}) == {"interval_ms": 5.0, "proc": "/x"}
    assert Ticker.with_defaults(None) == Ticker.DEFAULTS
    assert Ticker({"interval_ms": 1.0}).config == {"interval_ms": 1.0, "proc": "/proc"}
    assert Collector({"a": 1}).config == {"a": 1}


def test_stop_joins_takes_the_last_sample_flushes_and_releases_once():
    failed, warned = [], []
    col = Ticker()
    ctx = context(failed, warned)
    col.start(ctx)
    assert col.polling and col._thread.name == "counterprof-ticker"
    assert col._thread.native_id in ctx.profiler_tids
    threading.Event().wait(0.05)
    col.stop()
    col.stop()                                   # idempotent
    assert not col._thread.is_alive() and not col.polling
    assert col.released == 1 and len(col.flushed) == 1 and col.flushed[0] == col.samples + 1
    assert col.details["thread_cpu_s"] >= 0 and not failed and not warned


def test_a_failed_last_sample_is_a_warning():
    failed, warned = [], []
    col = Ticker(last_fails=True)
    col.start(context(failed, warned))
    col.stop()
    assert warned == ["ticker: final sample failed: gone"] and not failed and col.released == 1


def test_a_loop_that_raises_flushes_and_fails_the_collector():
    failed, warned = [], []
    col = Ticker(fail_at=2)
    col.start(context(failed, warned))
    col._thread.join(5)
    assert failed == [("ticker", "RuntimeError: boom")] and col.flushed == [2]


def test_stop_before_start_does_nothing():
    col = Ticker()
    col.stop()
    assert col.released == 0 and "thread_cpu_s" not in col.details


def test_one_message_for_the_missing_compiled_part():
    err = native_missing(ImportError("no module named counterprof._native"))
    assert isinstance(err, NativeUnavailable)
    assert str(err) == ("counterprof's compiled part is missing (no module named counterprof._native); "
                        "reinstall with `pip install .`")
    assert native_available()                     # built here


def test_perf_errors_named_by_errno_alone():
    for err, cls, word in ((errno.EINVAL, EventNotSupported, "EINVAL"), (errno.EBUSY, PerfEventError, "EBUSY"),
                           (errno.E2BIG, PerfEventError, "E2BIG"), (errno.ENOSYS, PerfPermissionError, "ENOSYS")):
        e = perf_error(err, "cycles")
        assert type(e) is cls and str(e).startswith("cycles: ") and word in str(e)
        assert (e.errno, e.event) == (err, "cycles")
