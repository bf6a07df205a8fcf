"""errno -> counterprof errors: the message names the setting and the fix."""
import errno

import pytest

from counterprof.ground.errors import (EventNotSupported, PerfPermissionError, TargetGone, UsageError,
                                EventSyntaxError, perf_error)


def fake_proc(tmp_path, paranoid):
    d = tmp_path / "sys" / "kernel"
    d.mkdir(parents=True)
    (d / "perf_event_paranoid").write_text(f"{paranoid}\n")
    return str(tmp_path)


@pytest.mark.parametrize("err", [errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV])
def test_no_pmu_is_not_supported(err):
    e = perf_error(err, "cycles")
    assert isinstance(e, EventNotSupported)
    assert "cycles" in str(e) and "no PMU" in str(e)


def test_paranoid_too_high_names_setting_and_fix(tmp_path):
    e = perf_error(errno.EACCES, "task-clock:u", proc=fake_proc(tmp_path, 3))
    assert isinstance(e, PerfPermissionError)
    msg = str(e)
    assert "kernel.perf_event_paranoid is 3" in msg
    assert "sysctl kernel.perf_event_paranoid=2" in msg and "CAP_PERFMON" in msg


def test_kernel_counting_needs_paranoid_1(tmp_path):
    msg = str(perf_error(errno.EACCES, "cycles:k", kernel=True, proc=fake_proc(tmp_path, 2)))
    assert "counting kernel space" in msg and "perf_event_paranoid=1" in msg and ":u" in msg


def test_system_wide_needs_paranoid_0(tmp_path):
    msg = str(perf_error(errno.EACCES, "cycles", system_wide=True, proc=fake_proc(tmp_path, 2)))
    assert "system-wide" in msg and "perf_event_paranoid=0" in msg


def test_eperm_with_permissive_paranoid_is_seccomp(tmp_path):
    msg = str(perf_error(errno.EPERM, "task-clock", proc=fake_proc(tmp_path, 1)))
    assert "seccomp" in msg


def test_missing_paranoid_file_means_no_perf_events(tmp_path):
    msg = str(perf_error(errno.EACCES, "task-clock", proc=str(tmp_path)))
    assert "CONFIG_PERF_EVENTS" in msg


def test_other_errnos():
    assert isinstance(perf_error(errno.ESRCH, "x", pid=42), TargetGone)
    assert "process 42" in str(perf_error(errno.ESRCH, "x", pid=42))
    assert "ulimit -n" in str(perf_error(errno.EMFILE, "x"))
    assert "EINVAL" in str(perf_error(errno.EINVAL, "x"))
    assert "busy" in str(perf_error(errno.EBUSY, "x"))


def test_usage_errors_exit_2():
    assert EventSyntaxError("x").exit_code == 2 and UsageError("x").exit_code == 2
    assert perf_error(errno.ENOENT, "x").exit_code == 1
