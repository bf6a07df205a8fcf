"""Shared fixtures; helpers live in tests/helpers.py."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI (.ci/run sets COUNTERPROF_CI): the property tests draw the same examples every run, so that a
# submission's CI is reproducible; slow machines do not trip the speed health check.
settings.register_profile("ci", derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("COUNTERPROF_CI"):
    settings.load_profile("ci")

# Hermetic: a developer's `counterprof calibrate` cache would give every run measured ceilings
# (and so roofline verdicts) that CI's fresh machine does not have. Tests that want ceilings
# make their own cache.
import tempfile  # noqa: E402
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="counterprof-test-cache-")


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "run"


# ---- skips: counted by reason at the end; a `required` test may not skip in CI ---------------
# A test marked `required` is a main case the suite's claims rest on (the README's figures, the
# shared GPU traces, the contended-core verdict): where CI runs (COUNTERPROF_CI or CI set, as
# .ci/run does) a skip of one is reported as a failure with the skip's reason, so a green CI never
# hides that it did not run. Everywhere the summary ends with every skip's reason and count.
IN_CI = bool(os.environ.get("COUNTERPROF_CI")) or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config):
    # the shared GPU traces are a fixture like perf and chromium: required, they must be here
    # before anything runs (kineto_traces raises with the reason), not skipped test by test
    if os.environ.get("COUNTERPROF_REQUIRE_TRACES"):
        try:
            import kineto_traces  # noqa: F401
        except RuntimeError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config, items):
    # every test that skips without the shared GPU traces (kineto_traces.needs_shared_traces) is
    # required: the traces are a fixture CI has, like perf and chromium
    kineto_traces = sys.modules.get("kineto_traces")
    if kineto_traces is None:
        return
    for item in items:
        if any(m.kwargs.get("reason") == kineto_traces.MISSING for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.required)


def _skip_reason(rep) -> str:
    longrepr = rep.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("required") is not None:
        reason = _skip_reason(rep)
        rep.user_properties.append(("required_skip", reason))
        if IN_CI:
            rep.outcome = "failed"
            rep.longrepr = (f"{item.nodeid} is a required test (marked `required`: a main case) and skipped "
                            f"where CI runs (COUNTERPROF_CI/CI set): {reason}")
    return rep


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    skipped = [r for r in stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    required = [r for key in ("skipped", "failed", "error") for r in stats.get(key, [])
                if any(k == "required_skip" for k, _ in getattr(r, "user_properties", ()))]
    if not skipped and not required:
        return
    by_reason: dict[str, list] = {}
    for r in skipped:
        by_reason.setdefault(_skip_reason(r), []).append(r)
    terminalreporter.section(f"skips by reason: {len(skipped)} skipped", sep="-")
    for reason, reps in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        where = reps[0].nodeid or (reps[0].location[0] if getattr(reps[0], "location", None) else "")
        more = f" and {len(reps) - 1} more" if len(reps) > 1 else ""
        terminalreporter.write_line(f"{len(reps):5d}  {reason}  [{where}{more}]")
    if required:
        what = "failed: CI requires them" if IN_CI else "skipped here; in CI they fail"
        terminalreporter.write_line(f"required tests that skipped ({what}): {len(required)}")
        for r in required:
            reason = next(v for k, v in r.user_properties if k == "required_skip")
            terminalreporter.write_line(f"  {r.nodeid}: {reason}")
