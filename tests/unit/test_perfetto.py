"""`counterprof export` on hand-made run directories (exact counts, values and times), the
nesting lanes against a brute-force model, and bad input."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.cli import main as cli_main
from counterprof.render.perfetto import _us, nesting_lanes
from counterprof.ground.schema import SAMPLES_SCHEMA, SPANS_SCHEMA, samples_batch, spans_batch
from perfetto_check import check, ns
from helpers import rank_files, table_file

T0 = 1_796_000_000_000_000_000           # the run's start (epoch ns)
S = 1_000_000_000

CATALOG = [
    {"name": "task-clock", "unit": "ns", "kind": "delta", "description": "", "source": "perf"},
    {"name": "page-faults", "unit": "count", "kind": "delta", "description": "", "source": "perf"},
    {"name": "proc.rss", "unit": "bytes", "kind": "gauge", "description": "", "source": "host"},
    {"name": "system.cpu_util", "unit": "percent", "kind": "ratio", "description": "", "source": "host"},
    {"name": "gpu.util", "unit": "percent", "kind": "gauge", "description": "", "source": "nvml"},
]


def make_run(path: Path, ranks=(0, 1), seconds=10, start_ns=T0, meta_start_ns=None) -> Path:
    """A run: per rank, samples every 100 ms (deltas over 100 ms, a gauge, a ratio, a GPU
    gauge with some nulls), and spans: a step a second on the main thread, a kernel launch
    (runtime call + kernel with one correlation) every second, a region."""
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"id": path.name, "status": "complete",
                                                "command": ["test"],
                                                "start_ns": meta_start_ns or start_ns}))
    (path / "catalog.json").write_text(json.dumps(CATALOG))
    for r in ranks:
        n = seconds * 10
        t = [start_ns + (k + 1) * S // 10 for k in range(n)]
        rows = [samples_batch(t, [S // 10] * n, "perf", ["task-clock"] * n, ["process"] * n,
                              [0.05 * S * (1 + k % 3) for k in range(n)]),
                samples_batch(t, [S // 10] * n, "perf", ["page-faults"] * n, ["process"] * n,
                              [float(k) for k in range(n)]),
                samples_batch(t, [None] * n, "host", ["proc.rss"] * n, ["process"] * n,
                              [1e6 + k for k in range(n)]),
                samples_batch(t, [S // 10] * n, "host", ["system.cpu_util"] * n, ["system"] * n,
                              [50.0] * n),
                samples_batch(t, [None] * n, "nvml", ["gpu.util"] * n, [f"gpu:{r}"] * n,
                              [None if k % 10 == 0 else float(k % 100) for k in range(n)])]
        pq.write_table(pa.Table.from_batches(rows, SAMPLES_SCHEMA), table_file(path, "samples", r))
        st, en, name, cat, dev, stream, tid, corr = [], [], [], [], [], [], [], []
        for k in range(seconds):
            s0 = start_ns + k * S
            st += [s0, s0 + 1000, s0 + 5000, s0 + 100_000]
            en += [s0 + S // 2, s0 + 3000, s0 + 9000, s0 + 200_000]
            name += [f"ProfilerStep#{k}", "cudaLaunchKernel", "gemm", "work"]
            cat += ["step", "runtime", "kernel", "region"]
            dev += [None, None, r, None]
            stream += [None, None, 7, None]
            tid += [100 + r, 100 + r, None, 100 + r]
            corr += [None, 1000 + k, 1000 + k, None]
        spans = spans_batch(st, en, name, cat, device=dev, stream=stream, pid=[100 + r] * len(st),
                            tid=tid, correlation=corr)
        i = SPANS_SCHEMA.get_field_index("kernel_class")
        spans = spans.set_column(i, SPANS_SCHEMA.field(i), pa.array(
            [None, None, "compute", None] * seconds).dictionary_encode())
        pq.write_table(pa.Table.from_batches([spans], SPANS_SCHEMA), table_file(path, "spans", r))
    return path


def export(run, out, *args):
    return cli_main(["export", str(run), "--perfetto", str(out), *args])


@pytest.fixture
def run2(tmp_path):
    return make_run(tmp_path / "run")


def events(trace, ph):
    return [e for e in trace.raw["traceEvents"] if e["ph"] == ph]


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_layout_values_and_times(run2, tmp_path, capsys, name):
    out = tmp_path / name
    assert export(run2, out) == 0
    t = check(out)
    assert sorted(t.processes.values()) == ["rank 0", "rank 0 · GPU 0", "rank 1", "rank 1 · GPU 1"]
    host, gpu = t.process("rank 0"), t.process("rank 0 · GPU 0")
    assert sorted(t.threads_of(host).values()) == ["main thread (pid 100)", "regions (pid 100)",
                                                   "steps (pid 100)"]
    assert list(t.threads_of(gpu).values()) == ["stream 7"]
    assert t.counter_names(host) == {"perf task-clock process [ns/s]", "perf page-faults process [/s]",
                                     "host proc.rss process [bytes]",
                                     "host system.cpu_util system [percent]"}
    assert t.counter_names(gpu) == {"nvml gpu.util gpu:0 [percent]"}
    # deltas: a rate per second at the start of the interval; gauges at their instant;
    # ratios at the start of their interval
    tc = t.counters[(host, "perf task-clock process [ns/s]")]
    assert tc[0] == (0.0, 0.5 * S) and tc[1] == (100_000.0, 1.0 * S) and len(tc) == 100
    assert t.counters[(host, "perf page-faults process [/s]")][3] == (300_000.0, 30.0)
    assert t.counters[(host, "host proc.rss process [bytes]")][0] == (100_000.0, 1e6)
    assert t.counters[(host, "host system.cpu_util system [percent]")][0] == (0.0, 50.0)
    assert len(t.counters[(gpu, "nvml gpu.util gpu:0 [percent]")]) == 90        # 10 nulls
    # spans: exact ns times, the kernel on its stream with its args, one flow per launch
    x = t.slices
    kernels = [e for e in x[(gpu, next(iter(t.threads_of(gpu))))]]
    assert len(kernels) == 10 and kernels[0]["ts"] == 5.0 and kernels[0]["dur"] == 4.0
    assert kernels[0]["args"] == {"rank": 0, "kernel_class": "compute", "correlation": 1000}
    assert len(t.flows) == 20                      # 10 launches per rank, 2 ranks
    assert len(events(t, "X")) == 80 and len(events(t, "C")) == 2 * (4 * 100 + 90)
    err = capsys.readouterr().err
    assert "80 spans" in err and "20 launch→GPU flows" in err and "980 samples on 10 counter tracks" in err
    assert "20 samples with unknown (null) values" in err


def test_window_and_ranks_cut_exactly(run2, tmp_path, capsys):
    out = tmp_path / "w.json"
    assert export(run2, out, "--window", "2.5:4.5", "--ranks", "1") == 0
    t = check(out)
    assert sorted(t.processes.values()) == ["rank 1", "rank 1 · GPU 1"]
    # samples timed in [2.5 s, 4.5 s]: ticks 2.5, 2.6 ... 4.5 = 21 of each series, and the GPU
    # series' nulls at 3.0 and 4.0 left out
    assert len(events(t, "C")) == 4 * 21 + 19
    # spans overlapping it: steps 2, 3, 4 (step 2 ends at 2.5 s), one launch, kernel and region
    # in seconds 3 and 4
    names = sorted(e["name"] for e in events(t, "X"))
    assert names == sorted(["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
                           + ["cudaLaunchKernel", "gemm", "work"] * 2)
    assert len(t.flows) == 2
    err = capsys.readouterr().err
    assert "kept 9 of 40 spans" in err and "and 105 of 500 samples" in err
    assert "2 samples with unknown (null) values" in err
    assert "--ranks left out rank(s) 0: 40 spans, 500 samples" in err
    # open-ended windows
    assert export(run2, out, "--window", "9.45:") == 0
    assert len(events(check(out), "C")) == 2 * 5 * 6              # 9.5 ... 10.0 s
    assert export(run2, out, "--window", ":0.1") == 0
    assert len(events(check(out), "C")) == 2 * 4                  # 0.1 s (the GPU's is null)


def test_nothing_in_the_window_is_an_error_and_leaves_no_file(run2, tmp_path, capsys):
    out = tmp_path / "w.json"
    assert export(run2, out, "--window", "100:200") == 1
    assert not out.exists() and not list(tmp_path.glob(".w.json*"))
    assert "the run covers 0.000 to 10.000 s" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--window", "5"], "expected START:END"),
    (["--window", "5:1"], "END must be after START"),
    (["--window", "a:b"], "expected START:END"),
    (["--ranks", "x"], "expected ranks like"),
    (["--ranks", "7"], "the run has rank(s) 0-1 only"),
    (["--window", ":"], "expected START:END"),             # neither side: not "the whole run"
    (["--window", " : "], "expected START:END"),
    (["--window", "1_0:20"], "expected START:END"),        # float() takes 1_0 as 10
    (["--window", "nan:"], "expected START:END"),
    (["--window", ":inf"], "expected START:END"),
    (["--window", "1e300:"], "no time in a run"),
    (["--ranks", "1_0"], "expected ranks like"),
])
def test_bad_arguments_exit_2(run2, tmp_path, capsys, args, message):
    assert export(run2, tmp_path / "o.json", *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.count("counterprof:") == 1
    assert not (tmp_path / "o.json").exists()


def test_missing_ranks_are_named(run2, tmp_path, capsys):
    assert export(run2, tmp_path / "o.json", "--ranks", "1,5") == 0
    assert "the run has no rank(s) 5" in capsys.readouterr().err
    assert export(run2, tmp_path / "o.json", "--ranks", "0-1,1-3,7") == 0
    assert "the run has no rank(s) 2-3, 7; exporting the others" in capsys.readouterr().err


def test_a_huge_rank_range_is_cheap(run2, tmp_path):
    """--ranks 0-999999999 is two numbers, not a set of a billion ranks: under a 1 GB address
    space limit it exports ranks 0 and 1 at once."""
    import resource
    import subprocess
    import sys

    def export_ranks(ranks):       # in a child, so that a set of a billion ranks fails there
        return subprocess.run([sys.executable, "-m", "counterprof", "export", str(run2), "--perfetto",
                               str(out), "--ranks", ranks], capture_output=True, text=True,
                              preexec_fn=limit, timeout=120)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    out = tmp_path / "o.json"
    proc = export_ranks("0-999999999")
    assert proc.returncode == 0, proc.stderr
    assert "the run has no rank(s) 2-999999999; exporting the others" in proc.stderr
    assert sorted(check(out).processes.values()) == ["rank 0", "rank 0 · GPU 0", "rank 1",
                                                     "rank 1 · GPU 1"]
    out.unlink()
    proc = export_ranks("5-999999999")             # naming no rank of the run: a usage error
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.endswith("counterprof: --ranks 5-999999999: the run has rank(s) 0-1 only\n")
    assert not out.exists()


@pytest.mark.parametrize("inside", ["meta.json", "samples/rank=0/samples-a.parquet", "_ranks/rank=1/new.json",
                                    ".", "link/meta.json"])
def test_an_output_inside_the_run_is_refused(run2, tmp_path, capsys, inside):
    (tmp_path / "link").symlink_to(run2)                 # a symlink into the run counts too
    before = {f: f.read_bytes() for f in run2.rglob("*") if f.is_file()}
    out = (tmp_path if inside.startswith("link") else run2) / inside
    assert export(run2, out) == 2
    err = capsys.readouterr().err
    assert "is inside the run directory" in err and "Traceback" not in err
    assert {f: f.read_bytes() for f in run2.rglob("*") if f.is_file()} == before
    # and through a symlink to the run as the run argument
    assert export(tmp_path / "link", run2 / "x.json") == 2
    assert not (run2 / "x.json").exists()


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_small_outputs_are_not_0_0_mb(run2, tmp_path, capsys, name):
    assert export(run2, tmp_path / name) == 0
    err = capsys.readouterr().err
    assert "0.0 MB" not in err and "in 0.0 s" not in err
    assert re.search(r"; [0-9.]+ KB of JSON" + (r", [0-9.]+ KB gzip'd" if name.endswith(".gz") else "")
                     + r", in ([0-9]+ ms|[1-9][0-9.]* s)", err), err


def test_not_a_run_and_an_empty_run_exit_1(tmp_path, capsys):
    assert export(tmp_path, tmp_path / "o.json") == 1
    assert "not a counterprof run" in capsys.readouterr().err
    assert export(tmp_path / "nope", tmp_path / "o.json") == 1
    assert "no such run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    rank_files(empty, 0).mkdir(parents=True)
    (empty / "meta.json").write_text('{"status": "complete", "start_ns": 1}')
    assert export(empty, tmp_path / "o.json") == 1
    assert "holds no samples or spans" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_a_corrupt_partition_is_skipped_and_named(run2, tmp_path, capsys):
    bad = table_file(run2, "samples", 1)
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])                   # cut off: no footer
    cut = table_file(run2, "spans", 0)
    cut.write_bytes(b"PAR1 this is not parquet PAR1")
    out = tmp_path / "o.json"
    assert export(run2, out) == 0
    err = capsys.readouterr().err
    assert f"{bad} is unreadable" in err and f"{cut} is unreadable" in err
    t = check(out)
    assert len(events(t, "C")) == 490                         # rank 0's samples only
    assert len(events(t, "X")) == 40                          # rank 1's spans only
    assert "Traceback" not in err


def test_a_damaged_row_group_costs_only_its_rows(run2, tmp_path, capsys):
    for table, rows in (("samples", 500), ("spans", 40)):
        f = table_file(run2, table, 0)
        pq.write_table(pq.read_table(f), f, row_group_size=rows // 2)      # two row groups
        rg = pq.ParquetFile(f).metadata.row_group(1)
        at = min(rg.column(i).data_page_offset for i in range(rg.num_columns))
        data = bytearray(f.read_bytes())
        data[at:at + 64] = b"\xff" * 64             # the second group's first page header
        f.write_bytes(bytes(data))
    out = tmp_path / "o.json"
    assert export(run2, out) == 0
    err = capsys.readouterr().err
    for table in ("samples", "spans"):
        assert f"{table_file(run2, table, 0)}: row group 2 of 2 is unreadable" in err
    t = check(out)
    assert len(events(t, "C")) == 490 + 250     # rank 1's, and rank 0's first 250 rows (no nulls)
    assert len(events(t, "X")) == 40 + 20
    assert "Traceback" not in err


def test_samples_out_of_order_are_counted(tmp_path, capsys):
    run = make_run(tmp_path / "run", ranks=(0,))
    # a second writer of the same series in the partition, overlapping the first in time
    t = [T0 + 5 * S // 10 + k for k in range(3)]
    pq.write_table(pa.Table.from_batches([samples_batch(t, [None] * 3, "host", ["proc.rss"] * 3,
                                                        ["process"] * 3, [1.0] * 3)]),
                   table_file(run, "samples", 0, "b"))
    out = tmp_path / "o.json"
    assert export(run, out) == 0
    assert "3 samples came out of time order" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="not monotonic"):
        check(out)                       # the checker sees it too


def test_data_before_the_runs_start_gets_negative_times(tmp_path):
    run = make_run(tmp_path / "run", ranks=(0,), meta_start_ns=T0 + S // 2 + 123)
    out = tmp_path / "o.json"
    assert export(run, out) == 0
    t = check(out)
    steps = [e for e in events(t, "X") if e["name"] == "ProfilerStep#0"]
    assert steps[0]["ts"] == -500000.123


def test_overlapping_slices_go_to_overlap_tracks(tmp_path, capsys):
    """A step boundary inside optimizer.step: on one thread Perfetto would drop a slice."""
    run = tmp_path / "run"
    make_run(run, ranks=(0,), seconds=1)
    sp = spans_batch([T0, T0 + 10, T0 + 20, T0 + 30], [T0 + 15, T0 + 25, T0 + 28, T0 + 40],
                     ["a", "b", "c", "d"], ["cpu_op"] * 4, pid=[7] * 4, tid=[8] * 4)
    pq.write_table(pa.Table.from_batches([sp]), table_file(run, "spans", 0, "b"))
    out = tmp_path / "o.json"
    assert export(run, out) == 0
    t = check(out)                       # nests on every track
    host = t.process("rank 0")
    names = {n: tid for tid, n in t.threads_of(host).items()}
    assert "thread 8 (pid 7)" in names and "thread 8 (pid 7) (overlap 1)" in names
    on = {k: sorted(e["name"] for e in v) for k, v in t.slices.items()}
    assert on[(host, names["thread 8 (pid 7)"])] == ["a", "c", "d"]      # first lane it nests in
    assert on[(host, names["thread 8 (pid 7) (overlap 1)"])] == ["b"]
    assert "1 spans overlap another" in capsys.readouterr().err


def _nests(intervals) -> bool:
    """Brute force: no two intervals partially overlap (half-open, zero-length never do)."""
    for a0, a1 in intervals:
        for b0, b1 in intervals:
            if a1 > a0 and b1 > b0 and a0 < b0 < a1 < b1:
                return False
    return True


@pytest.mark.parametrize("seed", range(200))
def test_nesting_lanes_against_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 25)
    track = np.array([rng.randint(0, 2) for _ in range(n)], np.int64)
    start = np.array([rng.randint(0, 30) for _ in range(n)], np.int64)
    end = start + np.array([rng.choice([0, 1, 2, 5, 10, 30]) for _ in range(n)], np.int64)
    lanes = nesting_lanes(track, start, end)
    by_track = {}
    for i in range(n):
        by_track.setdefault(track[i], []).append((int(start[i]), int(end[i])))
    if lanes is None:        # claims every track nests as it is
        assert all(_nests(v) for v in by_track.values())
        return
    assert not all(_nests(v) for v in by_track.values())
    for tr in set(track.tolist()):
        rows = [i for i in range(n) if track[i] == tr]
        if _nests([(int(start[i]), int(end[i])) for i in rows]):
            assert all(lanes[i] == 0 for i in rows)         # a track that nests is left alone
        for lane in set(lanes[rows].tolist()):
            assert _nests([(int(start[i]), int(end[i])) for i in rows if lanes[i] == lane])


def test_microseconds_are_exact():
    values = np.array([0, 1, 999, 1000, 1_234_567_891_234, -1, -1500], np.int64)
    whole, frac = _us(values, "}")
    text = [w + f for w, f in zip(whole.to_pylist(), frac.to_pylist())]
    assert text == ["0.000}", "0.001}", "0.999}", "1.000}", "1234567891.234}", "-0.001}", "-1.500}"]
    assert [ns(float(x[:-1])) for x in text] == values.tolist()


@pytest.mark.parametrize("bad, rule", [
    ([{"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 1, "name": "a"}], "no process_name"),
    ([{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "p"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 1, "name": "a"}], "no thread_name"),
    ([{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "p"}},
      {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "t"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "name": "a"}], "event 2"),
    ([{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "p"}},
      {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "t"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 5, "name": "a"},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 3, "dur": 5, "name": "b"}], "without nesting"),
    ([{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "p"}},
      {"ph": "C", "pid": 1, "tid": 1, "ts": 2, "name": "c", "args": {"v": 1}},
      {"ph": "C", "pid": 1, "tid": 1, "ts": 1, "name": "c", "args": {"v": 1}}], "not monotonic"),
    ([{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "p"}},
      {"ph": "C", "pid": 1, "tid": 1, "ts": 2, "name": "c", "args": {"v": "x"}}], "event 1"),
    ([{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "p"}},
      {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "t"}},
      {"ph": "s", "pid": 1, "tid": 2, "ts": 0, "id": 1, "cat": "x", "name": "l"}], "flow 1"),
])
def test_the_checker_rejects_broken_traces(tmp_path, bad, rule):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": bad}))
    with pytest.raises(AssertionError, match=rule):
        check(path)


def test_an_output_that_cannot_be_written_is_one_line(run2, tmp_path, capsys):
    assert export(run2, tmp_path / "no" / "such" / "dir" / "t.json") == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and "Traceback" not in err
    assert export(run2, tmp_path) == 2            # a directory
    assert "is a directory" in capsys.readouterr().err
