"""`counterprof export --perfetto FILE.pftrace`: Perfetto's protobuf format, decoded with the
published protos (the `perfetto` package's perfetto_trace_pb2) and read as trace_processor reads
it (tests/perfetto_check.py: proto_timeline), compared event for event with the JSON export of
the same run."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterprof.ground.schema import SPANS_SCHEMA, spans_batch
from helpers import table_file
from perfetto_check import check, json_timeline, proto_timeline

pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def _json_tests():
    """The JSON export's tests' run maker (tests/unit is no package: loaded by its path)."""
    spec = importlib.util.spec_from_file_location("_export_json_tests", Path(__file__).with_name("test_perfetto.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_base = _json_tests()
S, T0, export, make_run = _base.S, _base.T0, _base.export, _base.make_run


@pytest.fixture
def run2(tmp_path):
    return make_run(tmp_path / "run")


def both(run, tmp_path, *args, proto="t.pftrace", proto_args=()):
    """(JSON timeline, protobuf timeline) of one run exported both ways with the same args."""
    assert export(run, tmp_path / "t.json", *args) == 0
    assert export(run, tmp_path / proto, *args, *proto_args) == 0
    return json_timeline(check(tmp_path / "t.json")), proto_timeline(tmp_path / proto)


def same(j, p):
    assert p.slices.keys() == j.slices.keys()
    for key in j.slices:
        assert p.slices[key] == j.slices[key], key
    assert p.counters.keys() == j.counters.keys()
    for key in j.counters:
        assert p.counters[key] == j.counters[key], key
    assert p.flows == j.flows
    assert p.args == j.args


@pytest.mark.parametrize("name,args", [("t.pftrace", []), ("t.perfetto-trace", []), ("t.pftrace.gz", []),
                                       ("t.trace", ["--format", "proto"])])
def test_the_protobuf_trace_is_the_json_event_for_event(run2, tmp_path, capsys, name, args):
    j, p = both(run2, tmp_path, proto=name, proto_args=args)
    same(j, p)
    assert sum(len(v) for v in p.slices.values()) == 80 and len(p.flows) == 20
    assert sum(len(v) for v in p.counters.values()) == 980
    assert ("rank 0 · GPU 0", "stream 7") in p.slices
    assert p.args[("rank 0 · GPU 0", "stream 7", T0 + 5000, "gemm")] == {"kernel_class": "compute",
                                                                         "correlation": 1000}
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / name}" in err and "of protobuf" in err and "Traceback" not in err
    if name.endswith(".gz"):
        assert (tmp_path / name).read_bytes()[:2] == b"\x1f\x8b" and "gzip'd" in err


def test_window_and_ranks_apply_to_both(run2, tmp_path):
    j, p = both(run2, tmp_path, "--window", "2.5:4.5", "--ranks", "1")
    same(j, p)
    assert {proc for proc, _ in p.slices} == {"rank 1", "rank 1 · GPU 1"}
    times = [t for v in p.counters.values() for t, _ in v]
    assert min(times) >= T0 + 2.5 * S - S // 10 and max(times) <= T0 + 4.5 * S
    assert len(times) == 21 * 4 + 19           # 21 points per series in 2.5-4.5 s (gpu.util: 2 nulls)


def test_counter_tracks_carry_typed_units(run2, tmp_path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    assert export(run2, tmp_path / "t.pftrace") == 0
    trace = pb.Trace()
    trace.ParseFromString((tmp_path / "t.pftrace").read_bytes())
    counters = {}
    for pkt in trace.packet:
        td = pkt.track_descriptor
        if pkt.HasField("track_descriptor") and td.HasField("counter"):
            counters.setdefault(td.name, td.counter)
    c = pb.CounterDescriptor
    assert counters["host proc.rss process"].unit == c.UNIT_SIZE_BYTES       # a gauge in bytes
    assert counters["perf task-clock process"].unit_name == "ns/s"          # a delta: a rate
    assert counters["perf page-faults process"].unit_name == "/s"
    assert counters["nvml gpu.util gpu:0"].unit_name == "percent"
    assert len(counters) == 6                  # 2 ranks: 4 host series each, a GPU's each


def test_a_quarter_of_the_json_bytes_or_less(run2, tmp_path, capsys):
    assert export(run2, tmp_path / "t.json") == 0
    assert export(run2, tmp_path / "t.pftrace") == 0
    json_bytes, proto_bytes = (tmp_path / "t.json").stat().st_size, (tmp_path / "t.pftrace").stat().st_size
    assert proto_bytes * 4 <= json_bytes, (proto_bytes, json_bytes)
    assert f"{proto_bytes / 1e3:.1f} KB of protobuf" in capsys.readouterr().err


def _spans_file(run, rank, suffix, rows):
    st, en, name = zip(*rows)
    sp = spans_batch(list(st), list(en), list(name), ["cpu_op"] * len(rows), pid=[7] * len(rows),
                     tid=[8] * len(rows))
    pq.write_table(pa.Table.from_batches([sp]).cast(SPANS_SCHEMA), table_file(run, "spans", rank, suffix))


def test_equal_times_pair_right_whatever_the_file_order(tmp_path):
    """Perfetto pairs BEGIN/END by a stack after a sort by time that keeps file order at ties:
    touching, zero-length and same-start slices written in reverse order, each in a file (a
    batch) of its own, must still come out as the JSON's complete events say."""
    run = make_run(tmp_path / "run", ranks=(0,), seconds=1)
    rows = [(T0 + 10, T0 + 20, "b"), (T0, T0 + 10, "a"),          # b starts where a ends
            (T0 + 10, T0 + 10, "z"),                              # zero length at that instant
            (T0 + 20, T0 + 25, "inner"), (T0 + 20, T0 + 30, "outer"),   # same start, nested
            (T0 + 30, T0 + 30, "z2"), (T0 + 25, T0 + 30, "tail")]
    for k, row in enumerate(rows):
        _spans_file(run, 0, f"x{k}", [row])
    j, p = both(run, tmp_path)
    same(j, p)
    on = sorted(p.slices[("rank 0", "thread 8 (pid 7)")], key=lambda s: (s[1], -s[2]))
    assert [(s[0], s[2]) for s in on] == [("a", 10), ("b", 10), ("z", 0), ("outer", 10), ("inner", 5),
                                          ("tail", 5), ("z2", 0)]


@pytest.mark.parametrize("seed", range(5))
def test_random_nesting_slices_in_random_file_order(tmp_path, seed):
    """Nested and touching slices on a few microseconds, shuffled over several files."""
    rng = random.Random(seed)
    rows = []

    def fill(lo, hi, depth):
        at = lo
        while at < hi and depth < 4:
            length = rng.choice([0, 1, 2, 3, 5])
            end = min(hi, at + length)
            rows.append((T0 + at, T0 + end, f"d{depth}@{at}-{end}#{len(rows)}"))
            if end > at:
                fill(at, end, depth + 1)
            at = end + rng.choice([0, 0, 1])
    fill(0, 40, 0)
    rng.shuffle(rows)
    run = make_run(tmp_path / "run", ranks=(0,), seconds=1)
    for k in range(0, len(rows), 7):
        _spans_file(run, 0, f"r{k}", rows[k:k + 7])
    j, p = both(run, tmp_path)
    same(j, p)


def test_overlapping_slices_take_the_same_overlap_tracks(tmp_path):
    run = make_run(tmp_path / "run", ranks=(0,), seconds=1)
    _spans_file(run, 0, "b", [(T0, T0 + 15, "a"), (T0 + 10, T0 + 25, "b"), (T0 + 20, T0 + 28, "c")])
    j, p = both(run, tmp_path)
    same(j, p)
    assert [s[0] for s in p.slices[("rank 0", "thread 8 (pid 7) (overlap 1)")]] == ["b"]


def test_data_before_the_runs_start_keeps_its_times(tmp_path, capsys):
    run = make_run(tmp_path / "run", ranks=(0,), meta_start_ns=T0 + S // 2 + 123)
    j, p = both(run, tmp_path)
    same(j, p)
    assert "before the trace's clock origin" not in capsys.readouterr().err


@pytest.mark.parametrize("name,fmt", [("t.pftrace", "json"), ("t.json.gz", "proto"), ("t.json", "proto")])
def test_a_format_that_contradicts_the_name_is_one_line(run2, tmp_path, capsys, name, fmt):
    assert export(run2, tmp_path / name, "--format", fmt) == 2
    err = capsys.readouterr().err
    assert f"--format {fmt}" in err and "Traceback" not in err
    assert not (tmp_path / name).exists()


def test_a_json_format_by_flag_for_any_other_name(run2, tmp_path):
    assert export(run2, tmp_path / "t.trace", "--format", "json") == 0
    assert (tmp_path / "t.trace").read_text().startswith('{"otherData"')


def test_help_says_how_the_format_is_chosen(capsys):
    from counterprof.cli import main as cli_main
    with pytest.raises(SystemExit):
        cli_main(["export", "--help"])
    out = capsys.readouterr().out
    assert ".pftrace" in out and "--format" in out and "protobuf" in out


def test_the_decoder_rejects_an_end_without_a_begin(run2, tmp_path):
    """The checker can fail: a trace whose END comes before its BEGIN on the sorted timeline."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    out = tmp_path / "t.pftrace"
    assert export(run2, out) == 0
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    ends = [p for p in trace.packet if p.HasField("track_event") and p.track_event.type == 2]
    ends[0].timestamp = 1                       # before every BEGIN
    bad = tmp_path / "bad.pftrace"
    bad.write_bytes(trace.SerializeToString())
    with pytest.raises(AssertionError, match="END with no open slice"):
        proto_timeline(bad)
