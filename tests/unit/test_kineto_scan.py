"""The streaming Kineto scanner: native and reference decoders, chunking, layouts, bad input."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pytest

from counterprof.collectors.torch_trace import scan
from counterprof.collectors.torch_trace.scan import KinetoScanner, TraceFileError
from kineto_traces import X, needs_shared_traces, shared, shared_traces, write_trace


def table(scanner: KinetoScanner) -> pa.Table:
    batches = [pa.RecordBatch.from_pydict(b.columns) for b in scanner]
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)


def events_of(path, **kw):
    s = KinetoScanner(path, **kw)
    return table(s), s


@needs_shared_traces
@pytest.mark.parametrize("path", shared_traces(), ids=lambda p: p.name)
def test_native_and_reference_decoders_agree_on_every_real_trace(path):
    native, s1 = events_of(path, native=True, chunk_bytes=1 << 16)
    ref, s2 = events_of(path, native=False, chunk_bytes=1 << 20)
    assert native.num_rows > 0 and native.equals(ref)
    assert s1.meta == s2.meta and s1.skipped == s2.skipped
    assert not s1.problems and not s1.truncated


@needs_shared_traces
def test_every_complete_event_is_kept_and_nothing_else():
    path = shared("a100_nccl_rank0of2.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    t, s = events_of(path)
    assert t.num_rows == len(complete)
    assert s.skipped == len(doc["traceEvents"]) - len(complete)
    assert t["name"].to_pylist() == [e["name"] for e in complete]
    assert t["correlation"].to_pylist() == [e.get("args", {}).get("correlation") for e in complete]
    assert s.meta["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]   # a key after traceEvents


@needs_shared_traces
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunk_boundaries_anywhere_give_the_same_events(chunk):
    path = shared("a100_triton_example.json.gz")
    whole, _ = events_of(path, chunk_bytes=1 << 24)
    assert events_of(path, chunk_bytes=chunk)[0].equals(whole)
    assert events_of(path, chunk_bytes=chunk, native=False)[0].equals(whole)


def test_times_are_exact_ns_from_the_text(tmp_path):
    # 1712195495519695.8 µs has more digits than a double keeps
    evs = [X("cpu_op", "a", 1712195495519695.8, 0.0005), X("cpu_op", "b", 123, 1),
           {"ph": "X", "cat": "cpu_op", "name": "c", "ts": 1.5e3, "dur": 2.0004}]
    for native in (True, False):
        t, _ = events_of(write_trace(tmp_path / "t.json", evs), native=native)
        assert t["ts_ns"].to_pylist() == [1712195495519695800, 123000, 1500000]
        assert t["dur_ns"].to_pylist() == [1, 1000, 2000]     # 0.5 ns rounds up, 0.4 down


def test_metadata_before_or_after_the_events_and_gzip_or_not(tmp_path):
    evs = [X("cpu_op", f"op{i}", 1000 + i, 1) for i in range(50)]
    meta = {"schemaVersion": 1, "distributedInfo": {"rank": 3}, "baseTimeNanoseconds": 17}
    results = []
    for after in ((), ("baseTimeNanoseconds", "distributedInfo")):
        for gz in (False, True):
            p = write_trace(tmp_path / f"t{len(results)}.json", evs, meta, after=after, gz=gz, indent=2)
            t, s = events_of(p)
            assert s.meta == meta and s.compressed == gz
            results.append(t)
    assert all(r.equals(results[0]) for r in results)


def test_json_array_format(tmp_path):
    t, s = events_of(write_trace(tmp_path / "a.json", [X("cpu_op", "a", 1, 2)], array_format=True))
    assert t["name"].to_pylist() == ["a"] and s.meta == {}


def test_strings_are_decoded_like_json(tmp_path):
    names = ['quote " back \\ slash', "tab\tnew\nline", "é ü 漢字 🎉", "\u2028", "lone \ud800 surrogate"]
    evs = [X("cpu_op", n, i, 1) for i, n in enumerate(names)]
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"traceEvents": evs}, ensure_ascii=True))
    t, _ = events_of(p)
    expected = [n.encode("utf-8", "replace").decode() for n in names[:4]] + ["lone \ufffd surrogate"]
    assert t["name"].to_pylist() == expected


def test_invalid_utf8_in_a_name_becomes_replacement_characters(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a\xff\xfeb", "ts": 1, "dur": 1}]}')
    t, _ = events_of(p)
    assert t["name"].to_pylist() == ["a\ufffd\ufffdb"]


def test_elements_that_are_not_complete_events_are_skipped_and_counted(tmp_path):
    evs = [X("cpu_op", "keep", 1, 1), {"ph": "i", "name": "instant", "ts": 1},
           {"ph": "X", "name": "no dur", "ts": 1}, {"ph": "X", "name": "str ts", "ts": "1", "dur": 1},
           {"ph": "M", "name": "process_name", "args": {"name": "python"}}, 42, [1, 2], None,
           {"ph": "X", "name": "nan", "ts": float("nan"), "dur": 1}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    for native in (True, False):
        t, s = events_of(p, native=native)
        assert t["name"].to_pylist() == ["keep"] and s.skipped == len(evs) - 1


def test_args_integers_and_their_absence(tmp_path):
    evs = [X("kernel", "k", 1, 1, stream=7, device=0, correlation=5, bytes=10),
           X("kernel", "k2", 1, 1, stream="0x0", correlation=7.0),
           {"ph": "X", "name": "no args", "ts": 1, "dur": 1, "args": None}]
    evs[0]["args"]["External id"] = 9
    t, _ = events_of(write_trace(tmp_path / "t.json", evs))
    assert t["stream"].to_pylist() == [7, None, None]
    assert t["correlation"].to_pylist() == [5, None, None]
    assert t["external_id"].to_pylist() == [9, None, None]


# ---- bad input ------------------------------------------------------------------------------

def test_empty_file(tmp_path):
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    with pytest.raises(TraceFileError, match="is empty"):
        list(KinetoScanner(p))


def test_not_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b"\x00\x01binary")
    with pytest.raises(TraceFileError, match="not a JSON trace"):
        list(KinetoScanner(p))


def test_missing_file(tmp_path):
    with pytest.raises(TraceFileError, match="No such file"):
        list(KinetoScanner(tmp_path / "nope.json"))


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("gz", [False, True])
def test_a_cut_off_trace_keeps_the_events_before_the_cut(tmp_path, native, gz):
    evs = [X("cpu_op", f"op{i}", i, 1) for i in range(1000)]
    data = json.dumps({"schemaVersion": 1, "traceEvents": evs}).encode()
    cut = data[: len(data) * 2 // 3]
    p = tmp_path / "cut.json"
    p.write_bytes(gzip.compress(data)[: len(gzip.compress(data)) * 2 // 3] if gz else cut)
    t, s = events_of(p, native=native, chunk_bytes=4096)
    assert 100 < t.num_rows < 1000 and s.truncated
    assert t["name"].to_pylist() == [f"op{i}" for i in range(t.num_rows)]
    assert any("cut off" in p for p in s.problems)


@pytest.mark.parametrize("native", [True, False])
def test_damaged_json_keeps_the_events_before_the_damage(tmp_path, native):
    evs = [X("cpu_op", f"op{i}", i, 1) for i in range(100)]
    text = json.dumps({"traceEvents": evs})
    pos = text.index('"op50"')
    p = tmp_path / "bad.json"
    p.write_text(text[:pos - 8] + "}}}}" + text[pos:])
    t, s = events_of(p, native=native)
    assert t.num_rows == 49 or t.num_rows == 50
    assert s.problems and "damaged" in s.problems[0]


def test_an_unclosed_string_does_not_read_the_whole_file_into_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "MAX_VALUE_CHARS", 1 << 16)
    p = tmp_path / "open.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "never closed' + "x" * (1 << 20))
    t, s = events_of(p, chunk_bytes=4096)
    assert t.num_rows == 0 and "runs past" in s.problems[0]


def test_damaged_gzip(tmp_path):
    data = bytearray(gzip.compress(json.dumps({"traceEvents": [X("cpu_op", "a", 1, 1)] * 1000}).encode()))
    data[len(data) // 2] ^= 0xFF
    p = tmp_path / "bad.json.gz"
    p.write_bytes(bytes(data))
    t, s = events_of(p)
    assert s.problems and ("damaged" in s.problems[0] or "cut off" in s.problems[0])


def test_long_names_fill_the_name_buffer_and_end_batches_early(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "NAME_BYTES", 1 << 16)
    names = [f"kernel_{i}_" + "x" * 3000 for i in range(200)]
    p = write_trace(tmp_path / "long.json", [X("kernel", n, i, 1) for i, n in enumerate(names)])
    s = KinetoScanner(p, chunk_bytes=1 << 14)
    batches = list(s)
    assert len(batches) > 5 and sum(b.num_rows for b in batches) == 200
    assert [n for b in batches for n in b.columns["name"].to_pylist()] == names
    # a name longer than any buffer (valid JSON): that event is left out and said, the next kept
    p = write_trace(tmp_path / "huge.json", [X("kernel", "y" * (1 << 17), 1, 1), X("kernel", "next", 2, 1)])
    s = KinetoScanner(p)
    assert [n for b in s for n in b.columns["name"].to_pylist()] == ["next"]
    assert s.problems == ["1 event(s) left out: a name or category longer than 65,536 bytes"]


def test_scan_ahead_hands_each_batch_the_metadata_of_its_time(tmp_path):
    """scan_ahead's thread reads on past a batch; the batch still comes with the metadata as
    it was when the batch was scanned (keys after traceEvents not yet there), then the end's."""
    import time
    events = [X("cpu_op", f"op{i}", i * 10, 5) for i in range(20)]
    path = write_trace(tmp_path / "late.json", events, {"schemaVersion": 1, "baseTimeNanoseconds": 7},
                       after=("baseTimeNanoseconds",))
    scanner = scan.KinetoScanner(path, batch_rows=4)
    batches = scan.scan_ahead(scanner, depth=100)
    first, first_meta = next(batches)
    deadline = time.monotonic() + 30
    while "baseTimeNanoseconds" not in scanner.meta and time.monotonic() < deadline:
        time.sleep(0.01)                  # the thread has read the whole file
    assert "baseTimeNanoseconds" in scanner.meta
    assert "baseTimeNanoseconds" not in first_meta and first_meta["schemaVersion"] == 1
    rest = list(batches)
    assert first.num_rows + sum(b.num_rows for b, _ in rest) == 20
    assert scanner.events == 20


@pytest.mark.parametrize("gz", [False, True])
def test_a_raw_control_character_in_a_string_is_read_by_both_decoders(tmp_path, gz):
    """JSON forbids a raw tab inside a string, yet traces carry them (a device's name, a
    trace name, an op's argument): the reference decoder reads them (strict=False), and the
    native one read the top-level values with a strict json.loads, so the whole import of
    every trace given stopped with a traceback."""
    evs = [X("cpu_op", "aten::mm", 10, 20, **{"Input Dims": [[2, 3], [3, 4]], "note": "a\u0001b"}),
           X("kernel", "gemm", 40, 5)]
    p = write_trace(tmp_path / "t.json", evs, {"traceName": "x\u0002y", "deviceProperties": [{"name": "H\u0003100"}]},
                    after=("deviceProperties",))
    text = p.read_text().replace("\\u0001", "\t").replace("\\u0002", "\t").replace("\\u0003", "\t")
    assert text.count("\t") == 3
    if gz:
        p = tmp_path / "t.json.gz"
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
    native, s1 = events_of(p, native=True)
    ref, s2 = events_of(p, native=False)
    assert native.num_rows == 2 and native.equals(ref)
    assert s1.meta == s2.meta
    assert s1.meta["traceName"] == "x\ty" and s1.meta["deviceProperties"][0]["name"] == "H\t100"
    assert not s1.problems and not s2.problems


def test_a_top_level_value_the_decoder_refuses_is_named_not_raised(tmp_path, monkeypatch):
    """Should the skipper pass a value the decoder then refuses, the scan says where the JSON
    is damaged and keeps what came before it, as for any other damage."""
    p = write_trace(tmp_path / "t.json", [X("kernel", "gemm", 40, 5)], {"traceName": "n"},
                    after=("traceName",))

    class Refusing(json.JSONDecoder):
        def decode(self, s, *a, **k):
            if s == '"n"':             # the trace name's value, after the events
                raise json.JSONDecodeError("refused here", s, 0)
            return super().decode(s, *a, **k)

    monkeypatch.setattr(scan, "_META_DECODER", Refusing(strict=False))
    t, s = events_of(p, native=True)
    assert t.num_rows == 1
    assert any("damaged" in problem and "refused here" in problem for problem in s.problems)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("gz", [False, True])
def test_text_after_the_trace_is_said_not_dropped(tmp_path, native, gz):
    """Two traces in one file (`cat a.json.gz b.json.gz > c.json.gz`: gzip members one after
    another): the first is read, and the rest is named as not read."""
    a = write_trace(tmp_path / "a.json", [X("kernel", "gemm", 40, 5)])
    b = write_trace(tmp_path / "b.json", [X("kernel", "gemv", 50, 5), X("kernel", "gemv", 60, 5)])
    both = tmp_path / ("c.json.gz" if gz else "c.json")
    if gz:
        both.write_bytes(gzip.compress(a.read_bytes()) + gzip.compress(b.read_bytes()))
    else:
        both.write_bytes(a.read_bytes() + b"\n" + b.read_bytes())
    t, s = events_of(both, native=native)
    assert t.num_rows == 1
    assert len(s.problems) == 1 and "follows the trace's end" in s.problems[0], s.problems
    alone, s1 = events_of(a, native=native)      # whitespace after the end is no problem
    assert alone.num_rows == 1 and not s1.problems
    trailing = tmp_path / "d.json"
    trailing.write_bytes(a.read_bytes() + b"\n\n  \t\n")
    assert not events_of(trailing, native=native)[1].problems
