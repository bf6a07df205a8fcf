"""RunMeta: meta.json read once into typed fields; a wrong shape or a status counterprof never
writes is one RunDirectoryError naming the file and the field."""
import json
from pathlib import Path

import pytest

from counterprof.ground.errors import RunDirectoryError
from counterprof.store.meta import CollectorStatus, RunMeta, read_meta, read_run_meta

DATA = Path(__file__).resolve().parents[1] / "data"
GOOD = {"id": "r1", "status": "complete", "command": ["python", "x.py"], "start_ns": 10, "end_ns": 30,
        "host": {"hostname": "vm", "cpus": 2},
        "workload": {"status": "exited", "elapsed_s": 1.5, "exit_status": 0, "started_ns": 11},
        "collectors": {"perf": {"status": "ok", "reason": "", "config": {"interval_ms": 10},
                                "events": {"cycles": {"status": "not supported", "reason": "no PMU"},
                                           "task-clock": {}}},
                       "nvml": {"status": "unavailable", "reason": "no driver"},
                       "threads": {"status": "ok", "main": [1], "contenders": []}}}


def test_fields_are_typed_and_raw_is_the_document():
    m = RunMeta.of(GOOD)
    assert m.raw is GOOD
    assert (m.id, m.status, m.command, m.start_ns, m.end_ns) == ("r1", "complete", ["python", "x.py"], 10, 30)
    assert m.host.hostname == "vm" and m.host.cpus == 2 and m.host.kernel is None
    assert m.workload.elapsed_s == 1.5 and m.workload.started_ns == 11 and m.workload.ended_ns is None
    perf, nvml = m.collectors["perf"], m.collectors["nvml"]
    assert isinstance(perf, CollectorStatus) and perf.ok and perf.interval_ms == 10.0
    assert not nvml.ok and not nvml.ran and nvml.reason == "no driver" and nvml.interval_ms is None
    assert list(perf.events) == ["cycles", "task-clock"]          # the order they were asked for
    assert perf.events["cycles"].status == "not supported" and perf.events["task-clock"].status == "counted"
    assert m.collector("threads").detail("main") == [1] and m.collector("neuron") is None
    assert RunMeta.of(m) is m


def test_an_older_meta_reads_with_what_it_lacks_empty():
    m = RunMeta.of({"counterprof_version": "0.1", "status": "complete"})
    assert m.collectors == {} and m.ranks == {} and m.env == {} and m.warnings == []
    assert m.workload.elapsed_s is None and m.host.cpus is None and m.path == ""
    assert RunMeta.of({"collectors": {"host": {"config": {"interval_ms": 100}}}}).collectors["host"].ran
    assert not m.records_git_revision and RunMeta.of({"git_revision": None}).records_git_revision
    assert [RunMeta.of({"status": s}).status for s in ("running", "recovered", "merged")] == \
        ["running", "recovered", "merged"]


def test_the_recorded_run_in_tests_data_reads():
    m = read_run_meta(DATA / "live-phases" / "meta.json")
    assert m.status == "complete" and m.collectors["perf"].ok and m.workload.status == "exited"


@pytest.mark.parametrize("doc,why", [
    ([], "it holds an array, not an object"),
    ({"status": 3}, "status is a number"),
    ({"start_ns": "yesterday"}, "start_ns is a string"),
    ({"host": {"cpus": "two"}}, "host.cpus is a string"),
    ({"collectors": {"perf": "ok"}}, "collectors.perf is a string"),
    ({"collectors": {"perf": {"status": 1}}}, "collectors.perf.status is a number"),
    ({"collectors": {"perf": {"status": "ok", "events": []}}}, "collectors.perf.events is an array"),
    ({"collectors": {"perf": {"status": "ok", "events": {"cycles": "counted"}}}},
     "collectors.perf.events.cycles is a string"),
])
def test_wrong_types_are_one_clear_error(doc, why):
    with pytest.raises(RunDirectoryError, match="is not a counterprof run's metadata") as exc:
        RunMeta.of(doc)
    assert why in str(exc.value) and "restore it from a copy" in str(exc.value)


@pytest.mark.parametrize("doc,why", [
    ({"status": "finished"}, "status is 'finished', not one of running, complete, recovered, merged"),
    ({"collectors": {"nvml": {"status": "broken"}}}, "collectors.nvml.status is 'broken', not one of ok"),
    ({"collectors": {"perf": {"status": "ok", "events": {"cycles": {"status": "maybe"}}}}},
     "collectors.perf.events.cycles.status is 'maybe'"),
])
def test_an_unknown_status_is_named(doc, why):
    with pytest.raises(RunDirectoryError, match="is not a counterprof run's metadata") as exc:
        RunMeta.of(doc)
    assert why in str(exc.value)


def test_read_run_meta_names_the_file_and_read_meta_is_unchanged(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"status": "finished"}))
    with pytest.raises(RunDirectoryError,
                       match=r"meta.json: meta.json is not a counterprof run's metadata \(status is 'finished'"):
        read_run_meta(path)
    assert read_meta(path) == {"status": "finished"}       # the dict reader checks shapes only
    path.write_text("[]")
    with pytest.raises(RunDirectoryError, match=r"\(it holds an array"):
        read_run_meta(path)
    with pytest.raises(RunDirectoryError, match="is not a counterprof run"):
        read_run_meta(tmp_path / "nowhere" / "meta.json")
