"""Who owns a run directory: counterprof's marker, created exclusively when a run is claimed.
Two `counterprof run -o same` at once: exactly one wins and the other is told so; `--force`
replaces only a finished run of counterprof's own (never a directory holding a meta.json
counterprof did not write, never a run still being written); runs from before the marker are
still read and replaced."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess

import pytest

from counterprof.ground.errors import RunDirectoryError
from counterprof.store import rundir
from helpers import COUNTERPROF, PYTHON, run_cli, table_files, wait_for_samples

SPIN = ("import time\n"
        "t = time.perf_counter()\n"
        "while time.perf_counter() - t < 0.3: pass\n")


def _claimer(path: str, barrier, results) -> None:
    barrier.wait()
    try:
        rundir.claim(path, on_create=lambda p: rundir.write_json(p / rundir.META, {"pid": os.getpid()}))
        results.put(("won", os.getpid()))
    except RunDirectoryError as exc:
        results.put(("refused", str(exc)))


def test_processes_claiming_one_directory_at_once_agree_on_one_winner(tmp_path):
    """Real processes released together by a barrier, 30 times: one claim succeeds, the others
    are refused with the usual words, and the meta.json is the winner's."""
    ctx = multiprocessing.get_context("fork")
    for trial in range(30):
        path = tmp_path / f"run{trial}"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_claimer, args=(str(path), barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        won = [pid for kind, pid in outcomes if kind == "won"]
        assert len(won) == 1, (trial, outcomes)
        assert all("already holds a run; choose another -o" in why for kind, why in outcomes if kind == "refused")
        assert json.loads((path / rundir.META).read_text())["pid"] == won[0]


@pytest.mark.slow
def test_two_counterprof_runs_into_one_directory_at_once(tmp_path):
    """The CLI, as a user starts it twice: exactly one run, its own samples only."""
    for trial in range(8):
        out = tmp_path / f"same{trial}"
        cmd = [*COUNTERPROF, "run", "-q", "--collectors", "host,perf", "-o", str(out), "--", PYTHON, "-c", SPIN]
        procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        errs = [p.communicate(timeout=120)[1] for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 1], (trial, codes, errs)
        loser = errs[[p.returncode for p in procs].index(1)]
        assert "already holds a run; choose another -o, or pass --force" in loser, loser
        assert "Traceback" not in loser
        writers = {f.name for f in table_files(out, "samples")}
        assert len(writers) == 1, writers         # one run's samples under its meta.json


def test_force_never_clears_a_directory_counterprof_did_not_make(tmp_path):
    """A model directory: a meta.json of its own, an upload in progress, weights in rank=0/."""
    model = tmp_path / "model"
    (model / "rank=0").mkdir(parents=True)
    (model / "meta.json").write_text(json.dumps({"architecture": "gpt2"}))
    (model / "upload.tmp").write_text("partial")
    (model / "rank=0" / "weights.bin").write_bytes(b"\x00" * 1024)
    before = sorted(str(p.relative_to(model)) for p in model.rglob("*"))
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000, "dur": 5}]}))
    for args in (["run", "-q", "--force", "-o", str(model), "--", "true"],
                 ["import", "--force", "-o", str(model), str(trace)]):
        proc = run_cli(*args)
        assert proc.returncode == 1, proc.stderr
        assert "holds a meta.json that counterprof did not write" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert sorted(str(p.relative_to(model)) for p in model.rglob("*")) == before
    assert (model / "rank=0" / "weights.bin").stat().st_size == 1024


def test_a_run_from_before_the_marker_is_read_and_replaced(tmp_path):
    run = tmp_path / "run"
    run_cli("run", "-q", "--collectors", "host,perf", "-o", str(run), "--", PYTHON, "-c", SPIN, check=True)
    (run / rundir.MARKER).unlink()                  # what every run written before it looks like
    assert run_cli("report", str(run)).returncode == 0
    proc = run_cli("run", "-q", "-o", str(run), "--", "true")
    assert proc.returncode == 1 and "already holds a run" in proc.stderr
    run_cli("run", "-q", "--force", "--collectors", "host", "-o", str(run), "--", "true", check=True)
    assert (run / rundir.MARKER).is_file()
    assert json.loads((run / "meta.json").read_text())["command"] == ["true"]


@pytest.mark.slow
def test_force_does_not_replace_a_run_still_being_written(tmp_path):
    run = tmp_path / "run"
    live = subprocess.Popen([*COUNTERPROF, "run", "-q", "--collectors", "host,perf", "-o", str(run), "--",
                             PYTHON, "-c", "import time; time.sleep(30)"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_samples(run)
        proc = run_cli("run", "-q", "--force", "-o", str(run), "--", "true")
        assert proc.returncode == 1, proc.stderr
        assert "still writing" in proc.stderr, proc.stderr
        assert json.loads((run / "meta.json").read_text())["profiler"]["pid"] == live.pid
    finally:
        live.terminate()
        live.wait(60)


def test_replacing_a_run_set_deletes_only_its_own_runs(tmp_path):
    """`run -r N --force` replaces a set's member runs, through no link and never a member that
    is not counterprof's."""
    runs = tmp_path / "set"
    args = ["run", "-q", "-r", "2", "--collectors", "host", "-o", str(runs), "--", PYTHON, "-c", SPIN]
    run_cli(*args, check=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "meta.json").write_text(json.dumps({"counterprof_version": "0.1", "status": "complete"}))
    (victim / "weights.bin").write_bytes(b"w")
    (runs / "run-3").symlink_to(victim)
    proc = run_cli(*args[:1], "--force", *args[1:])
    assert proc.returncode == 1 and "run-3 is a symbolic link" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(victim)) == ["meta.json", "weights.bin"]
    assert (runs / "run-1" / "meta.json").is_file()          # nothing was replaced
    (runs / "run-3").unlink()
    run_cli(*args[:1], "--force", *args[1:], check=True)
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith("run-")) == ["run-1", "run-2"]
