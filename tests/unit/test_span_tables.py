"""store/span_tables.py and `counterprof collectives` over many ranks: the run's files are listed
once for all its ranks, not once per rank (a listing walks every rank's folders: per rank it
was quadratic, 1024 ranks x 1 h took 66 s, 12 s without it), and what is read is what a
rank-by-rank read gives: damaged files named, journal segments read, one compacted mid-read
found."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from counterprof.analysis.collectives import COLUMNS, NEEDED
from counterprof.cli import collectives
from counterprof.ground.schema import SPANS_SCHEMA, spans_batch
from counterprof.store.compact import compact_rank
from counterprof.store.journal import JournalWriter
from counterprof.store.reader import Run
from counterprof.store.span_tables import spans_by_rank, spans_rank_by_rank
from helpers import count_listings as _listings, rank_files, table_file

T0 = 1_796_000_000_000_000_000
MS = 1_000_000
STEPS = 4


def _spans(rank: int, ranks: int) -> pa.RecordBatch:
    """STEPS steps of 100 ms, each with a 4 MiB gloo all_reduce of every rank that this rank
    reaches `rank` ms late, and an annotation (a category collectives does not read)."""
    rows = []
    for i in range(STEPS):
        t = T0 + i * 100 * MS
        rows += [(t, t + 100 * MS, f"ProfilerStep#{i}", "step", None, None, None),
                 (t + (10 + rank) * MS, t + 60 * MS, "gloo:all_reduce", "collective", "all_reduce",
                  4 << 20, ranks),
                 (t + MS, t + 5 * MS, "forward", "annotation", None, None, None)]
    start, end, name, category, coll, nbytes, group = (list(c) for c in zip(*rows))
    return spans_batch(start, end, name, category, collective=coll, bytes=nbytes, group_size=group,
                       tid=[7] * len(rows))


def _run(path: Path, ranks: int, journal_rank: int | None = None, damaged_rank: int | None = None) -> Path:
    """A run of `ranks` ranks of spans in Parquet files; journal_rank's in a journal segment
    instead (a killed profiler's, not yet compacted); damaged_rank's with a second, unreadable
    Parquet file beside its own."""
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"status": "complete", "start_ns": T0,
                                                "end_ns": T0 + 10 * 10**9}))
    for r in range(ranks):
        b = _spans(r, ranks)
        if r == journal_rank:
            rank_files(path, r).mkdir(parents=True)
            w = JournalWriter(rank_files(path, r), "99999999-a")       # a writer long gone
            w.write("spans", b)
            w.close()
        else:
            pq.write_table(pa.Table.from_batches([b], SPANS_SCHEMA), table_file(path, "spans", r))
        if r == damaged_rank:
            table_file(path, "spans", r, writer="b").write_bytes(b"PAR1 not a parquet file PAR1")
    return path


def test_collectives_lists_the_runs_files_once_however_many_ranks(tmp_path, monkeypatch, capsys):
    counts = {}
    for n in (3, 12):
        run = _run(tmp_path / f"r{n}", n)
        seen = _listings(monkeypatch, run)
        assert collectives._main([str(run), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["ranks"] == list(range(n)) and len(doc["calls"]) == STEPS
        assert [c["last_rank"] for c in doc["calls"]] == [n - 1] * STEPS
        counts[n] = seen["spans"]
        monkeypatch.undo()
    # rank by rank, 12 ranks listed <run>/spans 4 times as often as 3 did (and more than once each)
    assert counts[12] == counts[3] < 12, counts


def test_breakdown_reads_every_rank_from_one_listing(tmp_path, monkeypatch):
    run = _run(tmp_path / "r", 12)
    seen = _listings(monkeypatch, run)
    got = spans_by_rank(Run(run), COLUMNS, NEEDED)
    assert sorted(got) == list(range(12)) and seen["spans"] < 12, seen


def test_one_listing_reads_what_rank_by_rank_reads(tmp_path):
    run = _run(tmp_path / "r", 5, journal_rank=1, damaged_rank=3)
    whole = Run(run, skip_unreadable=True)
    together = spans_by_rank(whole, COLUMNS, NEEDED)
    alone = Run(run, skip_unreadable=True)
    each = {r: t for rank in alone.ranks() for r, t in spans_by_rank(alone, COLUMNS, NEEDED, [rank]).items()}
    assert sorted(together) == sorted(each) == [0, 1, 2, 3, 4]
    for r in together:
        assert together[r].equals(each[r]), r
        assert together[r].num_rows == 2 * STEPS          # steps and calls; annotations left on disk
        assert together[r].schema.field("name").type == pa.dictionary(pa.int32(), pa.string())
    assert whole.skipped == alone.skipped and len(whole.skipped) == 1
    assert "rank=3" in whole.skipped[0] and "spans-b.parquet" in whole.skipped[0]


def test_a_subset_of_ranks_reads_only_those(tmp_path):
    run = _run(tmp_path / "r", 5, damaged_rank=3)
    r = Run(run, skip_unreadable=True)
    assert sorted(spans_by_rank(r, COLUMNS, NEEDED, [0, 4])) == [0, 4]
    assert not r.skipped                  # rank 3's damaged file is not read, so not named


def test_a_segment_compacted_after_the_listing_is_read_from_its_part(tmp_path):
    # a live run: the listing found rank 2's journal segment; by the time rank 2 is read, its
    # compaction has moved the rows into a Parquet part and deleted the segment
    run = _run(tmp_path / "r", 4, journal_rank=2)
    ranks = spans_rank_by_rank(Run(run), COLUMNS, NEEDED)
    first, _ = next(ranks)
    assert first == 0
    compact_rank(rank_files(run, 2))
    assert not list((rank_files(run, 2)).rglob("*.arrows"))
    rest = dict(ranks)
    assert sorted(rest) == [1, 2, 3] and rest[2].num_rows == 2 * STEPS
