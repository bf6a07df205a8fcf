"""Shared fixtures; helpers live in tests/helpers.py."""
from __future__ import annotations

import os
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
