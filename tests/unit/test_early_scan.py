"""`counterprof import` starts scanning its first trace before pyarrow loads
(scan.start_early): the batches parsed then are held unfinished until the conversion adopts the
scanner. What it converts must be what a conversion that scans from the start converts, on
whole, big, cut and damaged files; a file it cannot adopt is scanned anew."""
from __future__ import annotations

import gzip
import os
import shutil
import sys
import time

import pyarrow as pa
import pytest

from counterprof.collectors.torch_trace import scan
from counterprof.collectors.torch_trace.convert import TraceConversion
from helpers import run_cli
from kineto_traces import X, needs_shared_traces, shared, write_trace


@pytest.fixture(autouse=True)
def no_early_left():
    yield
    for ahead in scan._early.values():      # a test that failed before adopting
        ahead.close()
    scan._early.clear()
    scan._restore_switch_interval()


def convert(path, tmp_path) -> tuple[pa.Table, TraceConversion]:
    conv = TraceConversion(path, spill_dir=tmp_path, scan_ahead=True)
    batches = list(conv)
    return pa.Table.from_batches(batches) if batches else pa.table({}), conv


def early_then_convert(path, tmp_path, held: int) -> tuple[pa.Table, TraceConversion]:
    """start_early, wait until `held` batches are parsed and held (the libraries' load), then
    the conversion, which must adopt that scanner."""
    scan.start_early(path)
    assert len(scan._early) == 1
    ahead = next(iter(scan._early.values()))
    deadline = time.monotonic() + 30
    while len(ahead.scanner._held) < held and ahead.thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert len(ahead.scanner._held) >= held, "the early scan held fewer batches than it parsed"
    table, conv = convert(path, tmp_path)
    assert conv.scanner is ahead.scanner and not scan._early
    return table, conv


def same(a: tuple[pa.Table, TraceConversion], b: tuple[pa.Table, TraceConversion]) -> None:
    assert a[0].equals(b[0])
    assert a[1].problems == b[1].problems
    assert (a[1].scanner.events, a[1].scanner.skipped) == (b[1].scanner.events, b[1].scanner.skipped)
    assert (a[1].rank, a[1].spans) == (b[1].rank, b[1].spans)


@needs_shared_traces
def test_a_trace_of_more_batches_than_are_held(tmp_path):
    """75k events: 5 batches, EARLY_BATCHES (4) of them held, then the wait for the libraries."""
    path = shared("a100_rank3of8.json.gz")
    early = early_then_convert(path, tmp_path, held=scan.EARLY_BATCHES)
    assert early[1].scanner.events > scan.EARLY_BATCHES * scan.BATCH_ROWS
    same(early, convert(path, tmp_path))


@needs_shared_traces
@pytest.mark.parametrize("cut", [0.3, 0.7])
def test_a_cut_off_trace(tmp_path, cut):
    """A trace cut while it was written: what came before the cut, and the same problem said."""
    data = gzip.decompress(shared("a100_rank3of8.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(data[:int(len(data) * cut)])
    early = early_then_convert(path, tmp_path, held=1)
    plain = convert(path, tmp_path)
    same(early, plain)
    assert plain[1].problems and plain[0].num_rows > 0


@needs_shared_traces
def test_a_damaged_trace(tmp_path):
    data = bytearray(gzip.decompress(shared("a100_nccl_rank0of2.json.gz").read_bytes()))
    at = data.index(b'"ts"', len(data) // 2)
    data[at:at + 4] = b'"t}s'                    # a flipped byte inside an event
    path = tmp_path / "damaged.json"
    path.write_bytes(bytes(data))
    early = early_then_convert(path, tmp_path, held=1)
    plain = convert(path, tmp_path)
    same(early, plain)
    assert any("damaged" in p for p in plain[1].problems), plain[1].problems


def test_a_small_trace_is_held_whole_then_finished(tmp_path):
    path = tmp_path / "small.json"
    write_trace(path, [X("cpu_op", f"aten::op{i}", 10 + i, 1) for i in range(50)])
    same(early_then_convert(path, tmp_path, held=1), convert(path, tmp_path))


def test_a_file_replaced_before_the_conversion_is_read_anew(tmp_path):
    path, other = tmp_path / "t.json", tmp_path / "other.json"
    write_trace(path, [X("cpu_op", "aten::first", 10, 1)])
    write_trace(other, [X("cpu_op", "aten::second", 10, 1), X("cpu_op", "aten::third", 20, 1)])
    scan.start_early(path)
    os.replace(other, path)
    table, conv = convert(path, tmp_path)
    ops = sorted(n for n in table.column("name").to_pylist() if n.startswith("aten::"))
    assert ops == ["aten::second", "aten::third"]
    assert len(scan._early) == 1             # never adopted: left to the process's exit


def test_a_trace_named_through_a_symlink_is_adopted(tmp_path):
    """The command starts on the name given; the importer converts the resolved path."""
    real = tmp_path / "real.json"
    write_trace(real, [X("cpu_op", f"aten::op{i}", 10 + i, 1) for i in range(20)])
    link = tmp_path / "link.json"
    link.symlink_to(real)
    scan.start_early(link)
    ahead = next(iter(scan._early.values()))
    table, conv = convert(real.resolve(), tmp_path)
    assert conv.scanner is ahead.scanner and not scan._early
    same((table, conv), convert(real, tmp_path))


def test_the_switch_interval_is_short_only_until_adopt(tmp_path):
    """The scan thread gets the GIL sooner while the libraries load; the conversion runs with
    the interpreter's interval."""
    path = tmp_path / "t.json"
    write_trace(path, [X("cpu_op", f"aten::op{i}", 10 + i, 1) for i in range(20)])
    before = sys.getswitchinterval()
    scan.start_early(path)
    assert sys.getswitchinterval() == pytest.approx(scan.EARLY_SWITCH_INTERVAL)
    table, conv = convert(path, tmp_path)
    assert sys.getswitchinterval() == before and conv.spans == 20


def test_only_regular_files_start_early(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (tmp_path, tmp_path / "missing.json", fifo, "bad\0name"):
        scan.start_early(path)               # a FIFO is not opened (that would block, or eat it)
    assert scan._early == {}


@needs_shared_traces
def test_the_cli_gives_what_the_conversion_gives(tmp_path):
    """The command, which scans early, against an in-process conversion that does not."""
    path = shared("a100_rank3of8.json.gz")
    run = tmp_path / "run"
    proc = run_cli("import", str(path), "-o", str(run), "-q")
    assert proc.returncode == 0, proc.stderr
    files = list((run / "spans").glob("rank=*/*.parquet"))
    assert len(files) == 1
    import pyarrow.parquet as pq
    written = pq.read_table(files[0])
    table, _ = convert(path, tmp_path)
    assert written.num_rows == table.num_rows
    assert written.column("name").to_pylist() == table.column("name").to_pylist()
    assert written.column("start").equals(table.column("start"))


@needs_shared_traces
def test_a_refused_import_does_not_wait_for_its_early_scan(tmp_path):
    """The run directory holds a run and no --force: refused at once, the early scan dropped."""
    path = shared("a100_rank3of8.json.gz")
    run = tmp_path / "run"
    assert run_cli("import", str(path), "-o", str(run), "-q").returncode == 0
    t0 = time.monotonic()
    proc = run_cli("import", str(path), "-o", str(run), "-q", timeout=60)
    assert proc.returncode != 0 and "--force" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 30
    shutil.rmtree(run)
