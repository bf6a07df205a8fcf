"""tests/gpu on a machine that must have a GPU: tests/gpu/device_checks.sh sets
COUNTERPROF_REQUIRE_GPU (and COUNTERPROF_CI), so every test here is `required` there and a skip
("torch has no CUDA device", a device not in the datasheet table) fails the run instead of
passing it green. Elsewhere (CI without a GPU) they skip with the reason, counted in the summary."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("COUNTERPROF_REQUIRE_GPU"):
        return
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.required)
