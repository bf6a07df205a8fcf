"""The profiler's start and stop hand the GIL over quickly, and leave the process's own setting."""
import sys

import pytest

import counterprof
from counterprof import api
from counterprof.ground.gil import QUICK_SWITCH_S, quick_handoffs


@pytest.fixture
def switch_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_quick_within_and_the_default_after(switch_interval):
    with quick_handoffs():
        assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_restored_when_the_body_raises(switch_interval):
    with pytest.raises(RuntimeError), quick_handoffs():
        raise RuntimeError("collector failed")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_finer_setting_of_the_process_is_left_as_it_is(switch_interval):
    sys.setswitchinterval(0.0001)
    with quick_handoffs():
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert sys.getswitchinterval() == pytest.approx(0.0001)


def test_a_setting_made_meanwhile_is_kept(switch_interval):
    # a workload thread may set its own interval while the profiler starts: that one stays
    with quick_handoffs():
        sys.setswitchinterval(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_profile_starts_and_stops_with_quick_handoffs(switch_interval, tmp_path, monkeypatch):
    seen = {}
    for step in ("prepare", "start", "stop"):
        real = getattr(api.Session, step)

        def spy(self, *a, _step=step, _real=real, **kw):
            seen[_step] = sys.getswitchinterval()
            return _real(self, *a, **kw)
        monkeypatch.setattr(api.Session, step, spy)
    with counterprof.profile(path=tmp_path / "run", collectors=["host"]):
        assert sys.getswitchinterval() == pytest.approx(0.005)     # the workload runs at its own
    assert seen == {k: pytest.approx(QUICK_SWITCH_S) for k in ("prepare", "start", "stop")}
    assert sys.getswitchinterval() == pytest.approx(0.005)
