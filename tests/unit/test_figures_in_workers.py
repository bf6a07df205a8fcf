"""A big run's samples reduced by every CPU (compare_runs.figures: blocks of ranks in worker
processes, analysis/workers.py) give the figures one process gives, to the last bit, and the
same notes of what was left out; a damaged file stops a strict read as it would alone."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from counterprof.analysis import compare_runs, workers
from counterprof.analysis.compare import compare
from counterprof.analysis.run_figures import rank_blocks
from counterprof.ground.errors import RunDirectoryError
from counterprof.store.reader import Run

REPO = Path(__file__).resolve().parents[2]
SPREAD = workers.spread


@pytest.fixture(scope="module")
def run20(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("w") / "run"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "synthetic_run.py"), "-o", str(out),
                    "--ranks", "20", "--minutes", "1", "--hz", "10", "--metrics", "8"], check=True,
                   capture_output=True)
    return out


def _figures(path: Path, monkeypatch: pytest.MonkeyPatch, spread: bool, skip: bool = False):
    monkeypatch.setattr(compare_runs, "PARALLEL_MIN_RANK_SECONDS", 0.0 if spread else float("inf"))
    calls: list[int] = []

    def counted(fn, parts):
        calls.append(len(parts))
        return SPREAD(fn, parts)
    monkeypatch.setattr(workers, "spread", counted)
    if getattr(workers.cpus, "__name__", "") != "<lambda>":
        monkeypatch.setattr(workers, "cpus", lambda: 3)
    run = Run(path, skip_unreadable=skip)
    f = compare_runs.figures(run, lambda _w: None)
    return f, run, calls


def test_workers_give_the_figures_of_one_process(run20: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone, _, none = _figures(run20, monkeypatch, spread=False)
    before = workers.fallbacks
    spread, _, calls = _figures(run20, monkeypatch, spread=True)
    assert workers.fallbacks == before                     # both workers gave their blocks back
    assert none == [] and calls == [3]                   # three processes read the 20 ranks
    assert list(spread.metrics) == list(alone.metrics) and len(alone.metrics) == 8
    for name, by_rank in alone.metrics.items():
        assert list(spread.metrics[name]) == list(by_rank) == list(range(20))
        for r, vals in by_rank.items():
            assert np.array_equal(spread.metrics[name][r], vals)
    assert spread.totals == alone.totals
    assert spread.verdict == alone.verdict and spread.scope_verdicts == alone.scope_verdicts
    assert spread.scope_signals == alone.scope_signals and spread.contention == alone.contention
    assert compare([alone], [spread], workers=1).to_json()["rows"] == \
        compare([alone], [alone], workers=1).to_json()["rows"]


def test_the_all_ranks_sums_do_not_depend_on_the_workers() -> None:
    assert rank_blocks(list(range(20))) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13],
                                             [14, 15], [16, 17], [18, 19]]
    assert rank_blocks([3, 5]) == [[3], [5]]              # up to 16 ranks: one block each, as before
    assert rank_blocks([]) == []


def _damage(path: Path, rank: int) -> Path:
    victim = sorted(path.glob(f"samples/rank={rank}/*.parquet"))
    assert victim
    data = victim[0].read_bytes()
    victim[0].write_bytes(data[:len(data) // 2])              # cut: a killed copy
    return victim[0]


def test_a_damaged_file_read_by_a_worker_is_noted_or_stops_the_read(run20: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    run = tmp_path / "run"
    shutil.copytree(run20, run)
    cut = _damage(run, 17)                 # a rank the third worker reads
    _, alone, _ = _figures(run, monkeypatch, spread=False, skip=True)
    _, spread, calls = _figures(run, monkeypatch, spread=True, skip=True)
    assert calls == [3]
    assert any(str(cut) in w for w in spread.skipped)
    assert spread.skipped == alone.skipped
    with pytest.raises(RunDirectoryError, match="unreadable"):
        _figures(run, monkeypatch, spread=True, skip=False)


def test_blocks_too_big_to_hold_at_once_are_read_in_turn(run20: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone, _, _ = _figures(run20, monkeypatch, spread=False)
    monkeypatch.setattr(compare_runs, "MAX_CELLS_BYTES", 0)
    turn, _, calls = _figures(run20, monkeypatch, spread=True)
    assert calls == []                                   # no workers: each block in turn, here
    assert turn.totals == alone.totals and turn.verdict == alone.verdict


def test_one_cpu_reads_the_blocks_here_in_turn(run20: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone, _, _ = _figures(run20, monkeypatch, spread=False)
    turn, _, calls = _figures(run20, monkeypatch, spread=True)
    monkeypatch.setattr(workers, "cpus", lambda: 1)
    one, _, calls = _figures(run20, monkeypatch, spread=True)
    assert calls == [] and one.totals == alone.totals == turn.totals
