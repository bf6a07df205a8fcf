"""Bad bytes (issue 12, items 7-9): a flipped byte in a journal segment or a Parquet file, a
stored time of 1915, must never crash, hang or blow up a reader; what is bad is left out and
named, the rest is kept. The cases are tests/hostile/cases.py's (fixed seeds); run.py runs more."""
from __future__ import annotations

import pyarrow as pa
import pytest

from hostile.cases import (Pristine, finished_run, journal_cases, killed_run,
                           parquet_cases, run_case, span_cases)
from counterprof.ground.schema import samples_batch
from counterprof.store.journal import JournalWriter, SegmentRead, read_segment, segments

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Pristine:
    root = tmp_path_factory.mktemp("pristine")
    return Pristine(finished_run(root / "finished"), killed_run(root / "killed"))


def _check(case, tmp_path):
    res = run_case(case, tmp_path)
    assert res.ok, f"{case.klass}/{case.name}: {res.problems}\n{res.stderr[-2000:]}"
    return res


@pytest.mark.parametrize("i", range(8))
def test_a_flipped_byte_in_a_journal_segment_never_crashes_recover_or_report(runs, tmp_path, i):
    _check(journal_cases(runs, 8)[i], tmp_path)


@pytest.mark.parametrize("i", range(7))
def test_a_damaged_parquet_file_never_crashes_a_reader(runs, tmp_path, i):
    _check(parquet_cases(runs, 7)[i], tmp_path)


@pytest.mark.parametrize("i", range(12))
def test_times_outside_the_run_are_left_out_and_named_under_a_memory_limit(runs, tmp_path, i):
    _check(span_cases(runs)[i], tmp_path)


def _segment(tmp_path, batches: int = 4):
    w = JournalWriter(tmp_path, "99999999-a")    # a pid no process has: a dead writer
    for k in range(batches):
        w.write("samples", samples_batch([10**18 + k], [1], "perf", ["task-clock"], ["process"], [1.0]))
    w.close()
    return segments(tmp_path)[0].path


def test_a_batch_with_invalid_dictionary_indices_is_left_out_the_others_kept(tmp_path):
    """What one flipped byte in an index buffer makes: a batch whose metric index points past
    its dictionary (written unchecked, as the damaged bytes read back)."""
    path = _segment(tmp_path)
    clean = list(read_segment(path))
    good = clean[1]
    bad_metric = pa.DictionaryArray.from_arrays(pa.array([7], pa.int32()), good.column(3).dictionary,
                                                safe=False)
    bad = pa.RecordBatch.from_arrays([*good.columns[:3], bad_metric, *good.columns[4:]],
                                     schema=good.schema)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, good.schema) as w:
        for b in (clean[0], bad, clean[2], clean[3]):
            w.write_batch(b)
    report = SegmentRead()
    got = list(read_segment(path, report))
    assert report.damaged == 1 and "indices" in report.damage.lower()
    assert [b.column(0).to_pylist() for b in got] == [clean[k].column(0).to_pylist() for k in (0, 2, 3)]


def test_compaction_keeps_a_damaged_segment_aside_and_names_it(tmp_path):
    import pyarrow.parquet as pq
    from counterprof.store.compact import DAMAGED, compact_rank
    from counterprof.store import rundir
    rank = rundir.rank_dir(tmp_path, 0)
    path = _segment(rank)
    clean = list(read_segment(path))
    metric = pa.DictionaryArray.from_arrays(pa.array([9], pa.int32()), clean[1].column(3).dictionary,
                                            safe=False)
    bad = pa.RecordBatch.from_arrays([*clean[1].columns[:3], metric, *clean[1].columns[4:]],
                                     schema=clean[1].schema)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, clean[0].schema) as w:
        for b in (clean[0], bad, clean[2]):
            w.write_batch(b)
    rep = compact_rank(rank)
    assert rep.damaged and DAMAGED in rep.damaged[0] and "1 damaged batch" in rep.damaged[0]
    assert (path.parent / (path.name + DAMAGED)).exists() and not path.exists()
    assert pq.read_table(rep.files[0]).num_rows == 2


def test_report_judges_only_the_windows_with_data_when_a_run_spans_years():
    import numpy as np
    from counterprof.analysis.report import MAX_WINDOWS, window_starts
    from counterprof.analysis.signals import RunData, Series
    year = 365 * 86400 * 10**9
    ends = np.array([10**9, 2 * 10**9, 3 * year], np.int64)
    data = RunData(series={"m": Series("delta", ends - 10**8, ends, np.ones(3))},
                   start_ns=0, end_ns=3 * year + 10**9)
    step, starts = window_starts(data, 10**9)
    assert step == 10**9 and len(starts) <= 6
    dense = np.arange(0, 3 * year, year // 30000, dtype=np.int64)
    data.series["d"] = Series("delta", dense, dense + 1, np.ones(len(dense)))
    step, starts = window_starts(data, 10**9)
    assert len(starts) <= MAX_WINDOWS and step > 10**9
