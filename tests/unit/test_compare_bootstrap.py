"""compare's bootstrap spread over worker processes (analysis/compare_bootstrap.py): the same changes,
figure for figure, as one process's, whatever the workers do (tests/unit/test_workers.py: the
workers themselves)."""
from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

from counterprof.analysis import compare_bootstrap as bootstrap
from counterprof.analysis import workers as wk
from counterprof.analysis.compare import compare
from counterprof.analysis.run_figures import RunFigures


def _jobs(seed: int, n: int) -> list[bootstrap.Job]:
    """Rows of the shapes compare makes: odd and even counts, several runs a side, a pooled
    all-ranks row, a zero median (no relative change), one value."""
    rng = np.random.default_rng(seed)
    jobs: list[bootstrap.Job] = []
    for i in range(n):
        shape = i % 5
        if shape == 0:
            b, c = [rng.normal(10, 1, 200)], [rng.normal(10.3, 1, 201)]
        elif shape == 1:
            b = [rng.exponential(1, int(rng.integers(5, 40))) for _ in range(3)]
            c = [rng.exponential(1.1, int(rng.integers(5, 40))) for _ in range(2)]
        elif shape == 2:
            b, c = [rng.normal(5, 2, 5000)], [rng.normal(5, 2, 4000)]
        elif shape == 3:
            b, c = [np.zeros(10)], [np.ones(10)]
        else:
            b, c = [np.array([1.0])], [rng.normal(1, 0.1, 7)]
        jobs.append((b, c, f"metric:x@{i}"))
    return jobs


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap, "PARALLEL_MIN_ROWS", 10)


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_give_one_process_changes(small_pool: None, workers: int) -> None:
    jobs = _jobs(workers, 60)
    alone = bootstrap.median_changes(jobs, seed=4, workers=1)
    before = wk.fallbacks
    spread = bootstrap.median_changes(jobs, seed=4, workers=workers)
    assert wk.fallbacks == before                           # every worker gave its rows back
    assert spread == alone
    assert len({c.ci for c in alone if c.ci}) > 30          # the rows differ: a shuffle would show


def test_the_split_follows_the_rows_cost() -> None:
    jobs = _jobs(1, 50)
    parts = bootstrap._split(jobs, 3)
    assert [j for p in parts for j in p] == jobs
    assert all(parts) and len(parts) == 3


def test_compare_is_the_same_with_any_number_of_workers(small_pool: None) -> None:
    rng = np.random.default_rng(9)

    def fig(shift: float) -> RunFigures:
        ranks = list(range(8))
        return RunFigures(path="p", run_id="r", command=["train.py"], ranks=ranks, window_s=1.0, start_ns=0,
                          end_ns=10**10, times={"step_time": {r: rng.normal(0.1 * shift, 0.01, 30) for r in ranks}},
                          metrics={f"m{k}": {r: rng.normal(100, 5, 50) for r in ranks} for k in range(4)},
                          units={f"m{k}": "/s" for k in range(4)}, kinds={f"m{k}": "delta" for k in range(4)})
    base, cand = fig(1.0), fig(1.1)
    one = compare([base], [cand], workers=1).to_json()
    before = wk.fallbacks
    assert compare([base], [cand], workers=2).to_json() == one
    assert wk.fallbacks == before
    assert len(one["rows"]) > bootstrap.PARALLEL_MIN_ROWS


def test_a_worker_that_fails_costs_nothing(small_pool: None, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: os.PathLike[str]) -> None:
    jobs = _jobs(5, 40)
    alone = bootstrap.median_changes(jobs, workers=1)
    garbage = os.path.join(tmp_path, "fake-python")
    with open(garbage, "w") as f:        # reads its rows, answers something else
        f.write("#!/bin/sh\ncat > /dev/null\necho not a pickle\n")
    os.chmod(garbage, 0o755)
    # as the CLI leaves it: a write to a dead worker's pipe would kill this process
    before = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        for exe in (garbage, "/bin/false", os.path.join(tmp_path, "missing")):
            monkeypatch.setattr(sys, "executable", exe)
            assert bootstrap.median_changes(jobs, workers=2) == alone
    finally:
        signal.signal(signal.SIGPIPE, before)
