"""Hostile traces for `counterprof import` (issue 12, item 12): numbers no time or rank can be,
strings of tens of MB. Each is imported as far as it is a trace, and what was left out is counted
and named; memory stays near the file's size."""
from __future__ import annotations

import json
import resource
import subprocess

import pytest

from helpers import COUNTERPROF
from kineto_traces import X, launch


def _import(tmp_path, doc, name="t.json", limit_mb: int | None = None):
    path = tmp_path / name
    path.write_text(json.dumps(doc, allow_nan=True))

    def limit():
        if limit_mb:
            resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    p = subprocess.run([*COUNTERPROF, "import", str(path), "-o", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return p


def _spans(tmp_path) -> list[str]:
    import counterprof
    t = counterprof.load(tmp_path / "run").table("spans").to_pylist()
    return [r["name"] for r in t if r["category"] != "window"]     # not the trace's own window


def test_a_base_time_no_clock_can_have_is_named_and_the_events_kept(tmp_path):
    p = _import(tmp_path, {"baseTimeNanoseconds": 1e40, "traceEvents": [X("cpu_op", "aten::mm", 1000, 5)]})
    assert p.returncode == 0 and "baseTimeNanoseconds '1e+40' is not a time" in p.stderr
    assert _spans(tmp_path) == ["aten::mm"]


@pytest.mark.parametrize("rank", [10**30, -5, "7" * 45])
def test_a_rank_no_job_can_have_is_left_out_and_named(tmp_path, rank):
    p = _import(tmp_path, {"distributedInfo": {"rank": rank}, "traceEvents": [X("cpu_op", "a", 1, 1)]})
    assert p.returncode == 0 and "is not a rank" in p.stderr, p.stderr
    assert [d.name for d in (tmp_path / "run" / "spans").iterdir()] == ["rank=0"]


def test_events_whose_times_are_not_numbers_are_counted_and_named(tmp_path):
    evs = [X("cpu_op", "s", "abc", 1), X("cpu_op", "n", float("nan"), 1), X("cpu_op", "big", 1e300, 1),
           X("cpu_op", "d", 10, "x"), X("cpu_op", "ok", 3000, 5)]
    p = _import(tmp_path, {"traceEvents": evs})
    assert p.returncode == 0
    assert "4 complete event(s) (ph X) left out: their ts or dur is not a number" in p.stderr
    assert _spans(tmp_path) == ["ok"]


@pytest.mark.slow
def test_a_50_mb_event_name_is_left_out_and_the_next_event_kept(tmp_path):
    p = _import(tmp_path, {"traceEvents": [X("cpu_op", "n" * 50_000_000, 1, 1), X("cpu_op", "next", 2000, 1)]})
    assert p.returncode == 0 and "1 event(s) left out: a name or category longer than" in p.stderr
    assert "damaged" not in p.stderr
    assert _spans(tmp_path) == ["next"]


@pytest.mark.slow
def test_a_50_mb_device_properties_is_left_out_within_a_memory_limit(tmp_path):
    # before: 614 MB peak; now the text is stepped over, never decoded into objects
    p = _import(tmp_path, {"deviceProperties": [{"name": "x" * 50_000_000}],
                           "traceEvents": [X("cpu_op", "a", 1, 1)]}, limit_mb=1500)
    assert p.returncode == 0, p.stderr
    assert "'deviceProperties' is 47.7 MB: left out" in p.stderr


def test_a_pipe_is_refused_before_anything_is_opened(tmp_path):
    """A FIFO given as the trace (no writer: an open would block for ever; with one: the reader
    cannot seek back) is named as a pipe, and no run directory is made."""
    import os
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    p = subprocess.run([*COUNTERPROF, "import", str(fifo), "-o", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert f"{fifo}: not a regular file (a pipe)" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists()


def test_sigterm_mid_import_removes_the_part_files_and_the_run(tmp_path):
    """SIGTERM (timeout, a batch system) while a trace converts ends the import as Ctrl-C does:
    exit 143, one line, the part-file and the new run directory removed (the default action
    left a directory that was no run but refused the next import without --force)."""
    import signal
    import time
    events = [X("cpu_op", f"aten::op{i % 50}", 10 * i, 5, tid=1 + i % 4) for i in range(300_000)]
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "run"
    p = subprocess.Popen([*COUNTERPROF, "import", str(trace), "-o", str(out)],
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob(".import-*.parquet.tmp")):     # converting: spans being written
            assert p.poll() is None and time.monotonic() < deadline, "the import ended before it was caught"
            time.sleep(0.005)
        p.send_signal(signal.SIGTERM)
        _, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, stderr
    assert "counterprof: terminated (SIGTERM)" in stderr and "Traceback" not in stderr
    assert not out.exists()


def test_a_cut_trace_is_imported_as_far_as_it_goes_and_the_report_says_so(tmp_path):
    """A trace cut off mid-file keeps what came before the cut (exit 0), and `counterprof
    report` shows the import's warning above its verdict (and in --json), not only meta.json."""
    import gzip
    events = [e for i in range(10_000) for e in launch("gemm", 100 * i, 3, i, 100 * i + 5, 60)]
    whole = gzip.compress(json.dumps({"traceEvents": events}).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 3])
    p = subprocess.run([*COUNTERPROF, "import", str(cut), "-o", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "cut off" in p.stderr, p.stderr
    assert 0 < len(_spans(tmp_path)) < 20_000        # the runtime calls and kernels before the cut
    import os
    r = subprocess.run([*COUNTERPROF, "report", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    head = r.stdout.split("verdict:")[0]
    assert f"! {cut}: the gzip stream is cut off" in head, r.stdout[:800]
    j = subprocess.run([*COUNTERPROF, "report", "--json", str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=120)
    assert any("cut off" in w for w in json.loads(j.stdout)["run"]["warnings"])


def test_what_a_killed_import_left_is_named_as_such(tmp_path):
    """A SIGKILLed import leaves its claimed directory without meta.json: a second import says
    a killed process left it (not that it holds a run) and --force replaces it; a claim whose
    process still lives keeps the plain refusal."""
    import socket
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": launch("gemm", 10, 3, 1, 15, 60)}))
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = tmp_path / "run"
    out.mkdir(mode=0o700)
    (out / ".counterprof").write_text(json.dumps({"format": "counterprof-run/1", "created_by": {
        "pid": gone.pid, "host": socket.gethostname()}}))
    (out / f".import-{gone.pid}-0.parquet.tmp").write_bytes(b"PAR1 half")
    p = subprocess.run([*COUNTERPROF, "import", str(trace), "-o", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert f"killed before writing its meta.json (pid {gone.pid} is gone): pass --force" in p.stderr
    p = subprocess.run([*COUNTERPROF, "import", str(trace), "-o", str(out), "--force"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (out / "meta.json").exists() and not list(out.glob(".import-*"))
    import os
    alive = tmp_path / "alive"
    alive.mkdir(mode=0o700)
    (alive / ".counterprof").write_text(json.dumps({"format": "counterprof-run/1", "created_by": {
        "pid": os.getpid(), "host": socket.gethostname()}}))
    p = subprocess.run([*COUNTERPROF, "import", str(trace), "-o", str(alive)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "already holds a run" in p.stderr, p.stderr


def test_the_reports_warnings_leave_out_what_its_collectors_section_says(tmp_path):
    """A collector asked for by name and unavailable here is warned of when the run is recorded
    (meta.json) and shown in the report's collectors section: not again above the verdict."""
    from counterprof.collectors.nvml.library import no_driver_here
    if not no_driver_here():
        pytest.skip("an NVIDIA driver is here: nvml is available")
    out = tmp_path / "run"
    p = subprocess.run([*COUNTERPROF, "run", "-q", "--collectors", "perf,nvml", "-e", "task-clock", "-o",
                        str(out), "--", "python3", "-c", "sum(range(3_000_000))"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert any(w.startswith("nvml collector unavailable")
               for w in json.loads((out / "meta.json").read_text())["warnings"])
    j = subprocess.run([*COUNTERPROF, "report", "--json", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert j.returncode == 0, j.stderr
    report = json.loads(j.stdout)
    assert not any("collector unavailable" in w for w in report["run"]["warnings"])
    assert report["collectors"]["nvml"]["status"] == "unavailable"


def test_an_empty_path_is_refused_not_read_as_the_current_directory(tmp_path):
    # `counterprof import "$TRACE" -o run` with TRACE unset: "" would import every trace below "."
    (tmp_path / "stray.json").write_text(json.dumps({"traceEvents": [X("cpu_op", "op", 1, 2)]}))
    for args in (["", "-o", "run"], ["stray.json", "-o", ""]):
        p = subprocess.run([*COUNTERPROF, "import", *args], cwd=tmp_path, capture_output=True, text=True)
        assert p.returncode == 2, p.stderr
        assert "an empty path was given" in p.stderr
        assert not (tmp_path / "run").exists() and not (tmp_path / "meta.json").exists()
