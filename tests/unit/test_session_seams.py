"""The session's seams for the CLI and the rank watcher: one way to start a collector, the
launched pid given to start(), facts noted for meta.json."""
import json
import os

import pytest

from counterprof.ground.clock import Clock
from counterprof.collector import Collector, SessionContext, Target
from counterprof.ground.errors import CounterprofError
from counterprof.session import Session


def context() -> SessionContext:
    return SessionContext(clock=Clock(), target=Target("self"), config={}, rank=0,
                          emit=lambda *a, **k: None, add_metrics=lambda m: None,
                          fail=lambda n, r: None, warn=lambda m: None)


class Failing(Collector):
    name = "failing"

    def __init__(self, exc):
        super().__init__()
        self.exc, self.stopped = exc, False

    def start(self, ctx):
        raise self.exc

    def stop(self):
        self.stopped = True
        raise RuntimeError("a stop that fails too is not the reason")


class Starting(Collector):
    name = "starting"

    def start(self, ctx):
        self.ctx = ctx


def test_start_collector_says_why_and_releases_what_failed():
    ctx = context()
    ours = Failing(CounterprofError("no PMU here"))
    assert ctx.start_collector(ours) == "no PMU here" and ours.stopped
    theirs = Failing(KeyError("x"))
    assert ctx.start_collector(theirs) == "KeyError: 'x'"
    ok = Starting()
    assert ctx.start_collector(ok) is None and ok.ctx is ctx


def test_a_session_is_prepared_once_and_gives_its_run_path_to_collectors(tmp_path):
    s = Session(tmp_path / "r", collectors=[], rank=0, on_warning=lambda m: None)
    assert not s.prepared and s.plan == [] and s.journals is None
    s.start()                               # prepares when not prepared
    assert s.prepared and s.rank_context(1, Target("pid", os.getpid())).run_path == s.path
    s.note(stopped_because="test")
    s.stop()
    assert json.loads((s.path / "meta.json").read_text())["stopped_because"] == "test"


def test_the_launched_pid_is_for_a_launch_target_only(tmp_path):
    s = Session(tmp_path / "r", collectors=[], target=Target("pid", os.getpid()), rank=0)
    with pytest.raises(ValueError):
        s.start(launched_pid=1)
    launch = Session(tmp_path / "l", collectors=[], target=Target("launch", None, system_wide=True),
                     rank=0, on_warning=lambda m: None)
    launch.start(launched_pid=os.getpid())
    try:
        assert launch.target == Target("launch", os.getpid(), system_wide=True)
    finally:
        launch.stop()
