"""store/run_files.py: the one lister of a run's files, and its one damage policy, as each reader
of a run (Run, RunQuery, export) sees it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.ground.errors import RunDirectoryError
from counterprof.ground.schema import SAMPLES_SCHEMA, samples_batch
from counterprof.store.journal import JournalWriter
from counterprof.store.query import RunQuery
from counterprof.store.reader import Run
from counterprof.store.run_files import list_files
from helpers import journal_dir, rank_files, table_file

T0 = 1_796_000_000_000_000_000
ROWS = 200


def _run(path: Path) -> Path:
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0,
                                                "end_ns": T0 + 10**10}))
    t = [T0 + k * 10**6 for k in range(ROWS)]
    batch = samples_batch(t, [10**6] * ROWS, "perf", ["task-clock"] * ROWS, ["process"] * ROWS,
                          [1.0] * ROWS)
    pq.write_table(pa.Table.from_batches([batch], SAMPLES_SCHEMA), table_file(path, "samples", 0),
                   row_group_size=ROWS // 2)                  # two row groups
    return path


def _damage_second_group(f: Path) -> None:
    rg = pq.ParquetFile(f).metadata.row_group(1)
    at = min(rg.column(i).data_page_offset for i in range(rg.num_columns))
    data = bytearray(f.read_bytes())
    data[at:at + 64] = b"\xff" * 64
    f.write_bytes(bytes(data))


def test_what_is_not_the_runs_is_not_listed(tmp_path):
    run = _run(tmp_path / "r")
    folder = table_file(run, "samples", 0).parent
    (folder / ".samples-b.parquet.tmp").write_bytes(b"being compacted")
    os.symlink(table_file(run, "samples", 0), folder / "samples-link.parquet")
    rank_files(run, 3).mkdir(parents=True)
    w = JournalWriter(rank_files(run, 3), "99999999-a")
    w.write("samples", samples_batch([T0], [1], "perf", ["task-clock"], ["process"], [1.0]))
    w.close()
    seg = next(journal_dir(run, 3).iterdir())
    kept = seg.with_name(seg.name + ".damaged")
    kept.write_bytes(seg.read_bytes())
    files = list_files(run)
    assert sorted(files) == [0, 3]
    assert [f.path.name for f in files[0]] == ["samples-a.parquet"]
    assert [(f.path, f.journal) for f in files[3]] == [(seg, True)]


def test_a_damaged_row_group_costs_only_its_rows_in_every_reader(tmp_path):
    run = _run(tmp_path / "r")
    f = table_file(run, "samples", 0)
    _damage_second_group(f)
    with pytest.raises(RunDirectoryError, match="samples-a.parquet is unreadable"):
        Run(run).table("samples")                            # strict by default
    lenient = Run(run, skip_unreadable=True)
    assert lenient.table("samples").num_rows == ROWS // 2
    assert sum(b.num_rows for b in lenient.batches("samples", ["value"])) == ROWS // 2
    assert lenient.skipped == [lenient.skipped[0]] and "row group 2 of 2" in lenient.skipped[0]
    q = RunQuery(run, threads=1)
    try:
        assert q.groups()["value_count"].to_pylist() == [ROWS // 2]
    finally:
        q.close()
    assert q.files.skipped and all("row group 2 of 2" in s for s in q.files.skipped)
    part = list_files(run)[0][0]
    assert sum(b.num_rows for _, b in part.batches()) == ROWS // 2
    assert part.problems == [part.damage[0].sentence()] and "its rows are left out" in part.problems[0]
