"""Shared fixtures; helpers live in tests/helpers.py."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "run"
