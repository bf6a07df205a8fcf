"""Hostile traces for `counterprof import` (issue 12, item 12): numbers no time or rank can be,
strings of tens of MB. Each is imported as far as it is a trace, and what was left out is counted
and named; memory stays near the file's size."""
from __future__ import annotations

import json
import resource
import subprocess

import pytest

from helpers import COUNTERPROF
from kineto_traces import X


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
