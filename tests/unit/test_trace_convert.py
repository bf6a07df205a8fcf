"""Kineto trace -> spans: categories, GPU spans, collectives, time axis, rank, window span."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from counterprof.collectors.torch_trace.convert import TraceConversion, rank_from_name
from counterprof.ground.schema import SPANS_SCHEMA
from kineto_traces import X, launch, needs_shared_traces, shared, shared_traces, write_trace


def convert(path, **kw) -> tuple[pa.Table, TraceConversion]:
    conv = TraceConversion(path, **kw)
    batches = list(conv)
    for b in batches:
        assert b.schema.equals(SPANS_SCHEMA)
    return pa.Table.from_batches(batches, schema=SPANS_SCHEMA), conv


def pylist(t: pa.Table) -> list[dict]:
    """Rows, times as int ns (datetime has no ns)."""
    return t.set_column(0, "start", pc.cast(t["start"], pa.int64())) \
            .set_column(1, "end", pc.cast(t["end"], pa.int64())).to_pylist()


def rows(t: pa.Table, **where) -> list[dict]:
    out = pylist(t)
    return [r for r in out if all(r[k] == v for k, v in where.items())]


BASE = 1_700_000_000_000_000_000


def small_trace(tmp_path, **meta_kw):
    evs = [
        X("user_annotation", "ProfilerStep#7", 100, 500),
        X("cpu_op", "aten::mm", 110, 50, **{"External id": 3}),
        *launch("ampere_sgemm_128x64_nn", 120, 5, correlation=11, kernel_ts=130, kernel_dur=40, ext=3),
        X("cpu_op", "record_param_comms", 200, 30, **{
            "External id": 9, "Collective name": "allreduce", "In msg nelems": 1000,
            "Out msg nelems": 1000, "dtype": "Float", "Group size": 8, "Process Group Name": "0",
            "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}),
        *launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 210, 5,
                correlation=12, kernel_ts=220, kernel_dur=100, stream=20, ext=9),
        *launch("Memcpy HtoD (Pinned -> Device)", 300, 5, correlation=13, kernel_ts=310,
                kernel_dur=10, cat="gpu_memcpy", bytes=4096),
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 330, "dur": 5,
         "args": {"stream": 7, "device": 0, "correlation": 14}},
        X("gpu_user_annotation", "## forward ##", 130, 40, pid=0, tid=7),
        X("user_annotation", "gloo:all_reduce", 400, 90, tid=101,
          **{"Input Dims": [[256, 4]], "Input type": ["float"]}),
        X("python_function", "train.py(12): step", 100, 500),
        {"ph": "s", "id": 11, "pid": 100, "tid": 100, "ts": 120, "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 90, "dur": 600},
    ]
    meta = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 5, "world_size": 8},
            "baseTimeNanoseconds": BASE, **meta_kw}
    return write_trace(tmp_path / "t.json", evs, meta)


def test_categories_and_gpu_spans(tmp_path):
    t, conv = convert(small_trace(tmp_path))
    cats = {r["name"]: r["category"] for r in pylist(t)}
    assert cats["ProfilerStep#7"] == "step"
    assert cats["aten::mm"] == "cpu_op"
    assert cats["cudaLaunchKernel"] == "runtime"
    assert cats["record_param_comms"] == "collective"
    assert cats["gloo:all_reduce"] == "collective"
    assert cats["## forward ##"] == "annotation"
    assert cats["Stream Sync"] == "sync"
    assert cats["t.json"] == "window"
    assert "train.py(12): step" not in cats           # python_function: skipped and counted
    k = rows(t, name="ampere_sgemm_128x64_nn")[0]
    assert (k["category"], k["kernel_class"], k["device"], k["stream"], k["pid"], k["tid"],
            k["correlation"]) == ("kernel", "compute", 0, 7, 100, None, 11)
    rt = [r for r in rows(t, name="cudaLaunchKernel") if r["correlation"] == 11][0]
    assert (rt["pid"], rt["tid"], rt["device"], rt["kernel_class"]) == (100, 100, None, None)
    assert rows(t, name="Memcpy HtoD (Pinned -> Device)")[0]["bytes"] == 4096
    assert rows(t, name="Stream Sync")[0]["kernel_class"] == "other"
    gpu_annot = rows(t, name="## forward ##")[0]
    assert (gpu_annot["device"], gpu_annot["stream"], gpu_annot["pid"]) == (0, 7, 100)
    window = pylist(t)[-1]
    assert window["category"] == "window"
    info = json.loads(window["attrs"])
    assert info["skipped_categories"] == {"python_function": 1} and info["skipped"] == 1
    assert conv.rank == 5 and conv.rank_source == "distributedInfo"


def test_collective_metadata(tmp_path):
    t, _ = convert(small_trace(tmp_path))
    rpc = rows(t, name="record_param_comms")[0]
    assert (rpc["collective"], rpc["bytes"], rpc["group_size"]) == ("allreduce", 4000, 8)
    attrs = json.loads(rpc["attrs"])
    assert attrs["pg"] == "0" and attrs["dtype"] == "Float" and attrs["out_bytes"] == 4000
    nccl = [r for r in pylist(t) if r["name"].startswith("ncclDevKernel")][0]
    # NCCL >= 2.19 names, and the metadata of the record_param_comms that launched it
    assert (nccl["kernel_class"], nccl["collective"], nccl["bytes"], nccl["group_size"]) == \
        ("communication", "allreduce", 4000, 8)
    gloo = rows(t, name="gloo:all_reduce")[0]
    assert (gloo["collective"], gloo["bytes"], gloo["tid"]) == ("all_reduce", 256 * 4 * 4, 101)


def test_a_communication_kernel_without_record_param_comms_is_named_from_its_name(tmp_path):
    evs = launch("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                 1, 1, correlation=1, kernel_ts=5, kernel_dur=5)
    t, _ = convert(write_trace(tmp_path / "t.json", evs))
    k = rows(t, category="kernel")[0]
    assert (k["kernel_class"], k["collective"]) == ("communication", "AllGather")


def test_epoch_times_base_before_or_after_the_events(tmp_path):
    results = []
    for after in ((), ("baseTimeNanoseconds",)):
        p = small_trace(tmp_path)
        doc = json.loads(p.read_text())
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        p = write_trace(tmp_path / f"t{len(results)}.json", doc["traceEvents"], meta, after=after)
        t, conv = convert(p, spill_dir=tmp_path)
        results.append(t.drop_columns(["name", "attrs"]))
        k = rows(t, name="ampere_sgemm_128x64_nn")[0]
        assert k["start"] == BASE + 130_000 and k["end"] == BASE + 170_000
        window = pylist(t)[-1]
        assert (window["start"], window["end"]) == (BASE + 90_000, BASE + 690_000)
    assert results[0].equals(results[1])
    assert not list(tmp_path.glob("counterprof-spill-*"))      # the spill file is gone


def test_older_traces_have_absolute_microseconds(tmp_path):
    evs = [X("cpu_op", "a", 1661203462598738, 5), X("cpu_op", "b", 1661203462598740.5, 1)]
    t, _ = convert(write_trace(tmp_path / "old.json", evs))
    assert [r["start"] for r in rows(t, category="cpu_op")] == \
        [1661203462598738000, 1661203462598740500]


@pytest.mark.parametrize("name,rank", [("a100_rank3of8.json", 3), ("worker_rank-12.pt.trace.json", 12),
                                       ("RANK_4.json.gz", 4), ("host_1234.pt.trace.json", None)])
def test_rank_from_the_file_name(name, rank):
    assert rank_from_name(name) == rank


def test_rank_from_distributed_info_then_file_name_then_default(tmp_path):
    ev = [X("cpu_op", "a", 1, 1)]
    assert convert(write_trace(tmp_path / "x_rank7.json", ev, {"distributedInfo": {"rank": 2}}))[1].rank == 2
    c = convert(write_trace(tmp_path / "x_rank7.json", ev, {"distributedInfo": {"backend": "nccl"}}))[1]
    assert (c.rank, c.rank_source) == (7, "file name")
    c = convert(write_trace(tmp_path / "plain.json", ev), default_rank=9)[1]
    assert (c.rank, c.rank_source) == (9, "default")


def test_a_trace_without_events(tmp_path):
    t, conv = convert(write_trace(tmp_path / "e.json", [], {"schemaVersion": 1}))
    assert t.num_rows == 0 and conv.problems == []
    p = tmp_path / "nothing.json"
    p.write_text('{"schemaVersion": 1}')
    t, conv = convert(p)
    assert t.num_rows == 0 and "no traceEvents" in conv.problems[0]


@needs_shared_traces
@pytest.mark.parametrize("path", shared_traces(), ids=lambda p: p.name)
def test_every_real_trace_converts(path):
    t, conv = convert(path)
    assert conv.problems == []
    assert t.num_rows > 0
    assert pylist(t)[-1]["category"] == "window"            # the window ends the spans
    starts = pc.cast(t["start"], pa.int64())
    assert pc.min(starts).as_py() > 1_600_000_000 * 10 ** 9     # epoch ns (2020 or later)
    assert pc.all(pc.greater_equal(pc.cast(t["end"], pa.int64()), starts)).as_py()
    gpu = t.filter(pc.is_in(t["category"].cast(pa.string()),
                            value_set=pa.array(["kernel", "memcpy", "memset", "sync"])))
    assert gpu["kernel_class"].null_count == 0 and gpu["stream"].null_count == 0
    assert conv.gpu_spans == gpu.num_rows


@needs_shared_traces
def test_real_rocm_trace_names():
    t, _ = convert(shared("mi250_rocm62_minitoy.json.gz"))
    runtime = {r["name"] for r in rows(t, category="runtime")}
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyWithStream"} <= runtime
    memcpy = rows(t, category="memcpy")
    assert memcpy and all(r["kernel_class"] == "memory" and r["device"] == 2 for r in memcpy)
    # each GPU span's launch is in the trace (hip* runtime calls carry the correlation)
    corr = {r["correlation"] for r in rows(t, category="runtime")}
    assert all(r["correlation"] in corr for r in rows(t, category="kernel"))


@needs_shared_traces
def test_real_nccl_kernels_carry_their_collective():
    t, _ = convert(shared("a100_nccl_rank0of2.json.gz"))
    comm = rows(t, kernel_class="communication")
    assert len(comm) == 21
    assert {(r["collective"], r["group_size"]) for r in comm} == {("allreduce", 2), ("broadcast", 2)}
    assert all(r["bytes"] and r["bytes"] > 0 for r in comm)


@needs_shared_traces
def test_real_gloo_collectives_on_the_cpu_are_tagged():
    t, conv = convert(shared("cpu_only_gloo_rank34.json.gz"))
    gloo = rows(t, category="collective")
    assert len(gloo) == 10 and {r["collective"] for r in gloo} == {"all_reduce"}
    assert {r["bytes"] for r in gloo} == {321271 * 4, 2082411 * 4}
    assert conv.rank == 34 and conv.gpu_spans == 0


def test_dataloader_waits_are_input_spans_and_a_timed_process_keeps_none_of_its_marks(tmp_path):
    evs = [X("user_annotation", "ProfilerStep#3", 100, 500),
           X("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 100, 80),
           X("cpu_op", "aten::mm", 200, 50),
           {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
            "ts": 90, "dur": 600}]
    path = write_trace(tmp_path / "t.pt.trace.json", evs, {"baseTimeNanoseconds": BASE})
    t, _ = convert(path)
    cats = dict(zip(t["name"].to_pylist(), t["category"].cast(pa.string()).to_pylist()))
    assert cats["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"] == "input"
    assert cats["ProfilerStep#3"] == "step"
    # the driver timed this process's steps and waits itself: the trace's own are left out
    t, conv = convert(path, drop_marks=True)
    assert t["name"].to_pylist() == ["aten::mm", "t.pt.trace.json"]
    assert conv.info["spans"] == 2


@pytest.mark.parametrize("after", [(), ("baseTimeNanoseconds", "distributedInfo")],
                         ids=["meta first", "meta after the events"])
def test_scanning_ahead_in_a_thread_converts_as_scanning_in_line(tmp_path, after):
    """scan_ahead (what `counterprof import` uses): the same spans, rank, info and problems as
    the scanner in line, also where metadata follows the events (each batch is converted with
    the metadata seen when it was scanned, not what the thread has read by then)."""
    p = small_trace(tmp_path)
    doc = json.loads(p.read_text())
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    p = write_trace(tmp_path / "late.json", doc["traceEvents"], meta, after=after)
    inline, a = convert(p, spill_dir=tmp_path, batch_rows=2)
    ahead, b = convert(p, spill_dir=tmp_path, batch_rows=2, scan_ahead=True)
    assert ahead.equals(inline)
    assert (b.rank, b.rank_source, b.info, b.problems) == (a.rank, a.rank_source, a.info, a.problems)
    assert b.spans == a.spans and b.scanner.events == a.scanner.events


def test_scanning_ahead_stops_with_its_reader(tmp_path):
    """A reader that stops early (a full disk while writing) leaves no scanning thread."""
    import threading
    p = small_trace(tmp_path)
    conv = TraceConversion(p, batch_rows=1, scan_ahead=True)
    it = iter(conv)
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name in ("counterprof-scan", "counterprof-inflate")]


def test_scanning_ahead_raises_a_damaged_trace_in_line(tmp_path):
    """The scanner's error reaches the reader after the batches before it, as in line."""
    from counterprof.collectors.torch_trace.scan import TraceFileError
    p = tmp_path / "bad.json"
    p.write_text("not a trace")
    for scan_ahead in (False, True):
        with pytest.raises(TraceFileError):
            list(TraceConversion(p, scan_ahead=scan_ahead))
