"""The cyclic collector is off while `run` and `import` load their libraries and set up, and on
again after (start-up's objects frozen): pause_gc/resume_gc undo only what they did, and a run
called in-process (a test, a script) leaves the collector on as it found it, on a usage error
too."""
from __future__ import annotations

import gc

import pytest

from counterprof.cli import main
from counterprof.cli import process_setup
from counterprof.session import Session


@pytest.fixture
def collecting():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_pause_and_resume(collecting):
    process_setup.pause_gc()
    assert not gc.isenabled()
    process_setup.resume_gc()
    assert gc.isenabled()
    process_setup.resume_gc()              # a second resume changes nothing
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_caller_stays_off(collecting):
    gc.disable()
    process_setup.pause_gc()
    process_setup.resume_gc()
    assert not gc.isenabled()


def test_off_until_the_run_is_prepared_then_on(collecting, tmp_path, monkeypatch):
    seen = {}
    prepare, start = Session.prepare, Session.start

    def watched_prepare(self):
        seen["prepare"] = gc.isenabled()
        prepare(self)

    def watched_start(self, *a, **k):
        seen["start"] = gc.isenabled()
        start(self, *a, **k)

    monkeypatch.setattr(Session, "prepare", watched_prepare)
    monkeypatch.setattr(Session, "start", watched_start)
    assert main(["run", "-q", "-e", "task-clock", "-o", str(tmp_path / "r"), "--", "true"]) == 0
    assert seen == {"prepare": False, "start": True}
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0        # start-up's objects out of the collector's passes


def test_on_again_after_a_usage_error(collecting, tmp_path):
    assert main(["run", "-q", "-e", "no-such-event", "-o", str(tmp_path / "r"), "--", "true"]) == 2
    assert gc.isenabled()
    assert main(["run", "--duration", "-1", "-o", str(tmp_path / "r2"), "--", "true"]) == 2
    assert gc.isenabled()
