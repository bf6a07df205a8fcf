"""`counterprof run -r N` with real processes: N runs as one set, means ± sd in the summary,
the set taken by `compare` and `history add` as the runs of one side."""
from __future__ import annotations

import json
import re
import statistics

import pytest

from helpers import PYTHON, REPO, run_cli

WORKLOADS = str(REPO / "tests" / "workloads.py")
# a fixed amount of CPU per run: task-clock's mean is known, whatever the machine's noise
# (plus the interpreter's start-up, which a loaded machine can stretch to a tenth of a second
# or more: the burn is long enough that the start-up cannot be mistaken for it)
BURN_S = 0.5
BURN = [PYTHON, WORKLOADS, "burn", str(BURN_S)]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repeat")
    out = {}
    for name in ("base", "cand"):
        proc = run_cli("run", "-r", "3", "-e", "task-clock", "-I", "20", "-o", str(tmp / name),
                       "--", *BURN, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out[name] = (tmp / name, proc)
    return out


def test_three_runs_one_set_and_the_means_with_their_spread(sets):
    path, proc = sets["base"]
    data = json.loads((path / "runset.json").read_text())
    assert data["runs"] == ["run-1", "run-2", "run-3"] and data["exit_statuses"] == [0, 0, 0]
    assert data["command"] == BURN and data["repeat"] == 3
    for i in (1, 2, 3):
        assert (path / f"run-{i}" / "meta.json").is_file()
    assert proc.stdout == ""                        # the summary stays on stderr
    assert "Performance counter stats for '" in proc.stderr and "(3 runs):" in proc.stderr
    assert proc.stderr.count("Performance counter stats") == 1     # one summary, the set's
    # the summary's task-clock is the mean of the three runs' own, with their sample sd
    rows = {r["metric"]: r for r in data["summary"]["rows"]}
    tc = rows["task-clock"]
    from counterprof import Run
    vals = [Run(path / f"run-{i}").summary().value("task-clock") for i in (1, 2, 3)]
    assert tc["value"] == pytest.approx(statistics.fmean(vals))
    assert tc["stddev"] == pytest.approx(statistics.stdev(vals))
    # the workload's own CPU: its burn (thread time, so at least that) plus its start-up
    assert BURN_S * 0.98 <= tc["value"] / 1e9 <= BURN_S + 0.4
    # the table's row (the -I interval rows before it start with their time)
    line = next(ln for ln in proc.stderr.splitlines() if "task-clock" in ln and "msec" in ln
                and not re.match(r"\s*\d+\.\d{9}\s", ln))
    assert re.search(r"\( \+- [0-9.]+% \)", line), line
    assert re.search(r"[0-9.]+ \+- [0-9.]+ seconds time elapsed  \( \+- [0-9.]+% \)", proc.stderr)
    assert proc.stderr.rstrip().endswith(f"run set: {path} (3 runs, {path}/run-1 to run-3)")


def test_compare_takes_each_set_as_the_runs_of_one_side(sets):
    base, cand = sets["base"][0], sets["cand"][0]
    proc = run_cli("compare", str(base), str(cand), "--json", check=True, timeout=300)
    cmp = json.loads(proc.stdout)
    assert cmp["baseline"]["paths"] == [str(base / f"run-{i}") for i in (1, 2, 3)]
    assert cmp["candidate"]["paths"] == [str(cand / f"run-{i}") for i in (1, 2, 3)]
    # globs pick sets too
    proc = run_cli("compare", "--baseline", str(base.parent / "ba*"), "--candidate", str(cand),
                   "--json", check=True, timeout=300)
    assert len(json.loads(proc.stdout)["baseline"]["paths"]) == 3


def test_history_adds_a_sets_runs_in_order(sets, tmp_path):
    base = sets["base"][0]
    db = tmp_path / "h.duckdb"
    proc = run_cli("history", "add", str(base), "--db", str(db), check=True, timeout=300)
    added = [ln for ln in proc.stderr.splitlines() if "added as run" in ln]
    assert len(added) == 3
    assert all(ln.startswith(f"counterprof: {base}/run-{i}: added") for i, ln in zip((1, 2, 3), added)), added
    show = json.loads(run_cli("history", "show", "--db", str(db), "--json", check=True).stdout)
    wall = next(s for s in show["series"] if s["series"] == "wall_time")
    assert len(wall["points"]) == 3


def test_a_failing_workload_is_repeated_and_its_status_kept(tmp_path):
    out = tmp_path / "fail"
    proc = run_cli("run", "-q", "-r", "2", "-e", "task-clock", "-o", str(out), "--",
                   PYTHON, "-c", "import sys; sys.exit(3)", timeout=300)
    assert proc.returncode == 3
    data = json.loads((out / "runset.json").read_text())
    assert data["exit_statuses"] == [3, 3]
    assert "Performance counter stats" not in proc.stderr      # -q


def test_a_set_is_replaced_only_with_force_and_report_says_what_to_give(sets, tmp_path):
    base = sets["base"][0]
    again = run_cli("run", "-r", "2", "-o", str(base), "--", PYTHON, "-c", "pass")
    assert again.returncode == 1 and "already holds a run set" in again.stderr
    assert "--force" in again.stderr
    rep = run_cli("report", str(base))
    assert rep.returncode == 2 and "is a set of 3 runs" in rep.stderr and "run-1" in rep.stderr
    bad = run_cli("run", "-r", "0", "--", PYTHON, "-c", "pass")
    assert bad.returncode == 2 and "-r/--repeat" in bad.stderr
    for args, code in ((["-e", "no-such-event", "--", PYTHON, "-c", "pass"], 2),
                       (["--", str(tmp_path / "missing")], 127)):
        failed = run_cli("run", "-r", "2", "-o", str(tmp_path / "none"), *args)
        assert failed.returncode == code, failed.stderr
        assert not (tmp_path / "none").exists()          # no empty set left behind
    nocmd = run_cli("run", "-r", "2", "--pid", "1")
    assert nocmd.returncode == 2 and "-r repeats a command" in nocmd.stderr


def test_a_terminated_profiler_stops_repeating_and_keeps_the_runs_done(tmp_path):
    import signal
    import subprocess
    import time

    from helpers import COUNTERPROF
    out = tmp_path / "set"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-q", "-r", "5", "-e", "task-clock", "-o", str(out),
                             "--", PYTHON, "-c", "import time; time.sleep(60)"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "run-1" / "meta.json").exists():   # the first workload is running
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)        # forwarded to the workload, which dies of it
        _, errs = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, errs
    data = json.loads((out / "runset.json").read_text())
    assert data["runs"] == ["run-1"] and data["stopped_after"] == 1
    assert "not repeating further" in errs
    assert not (out / "run-2").exists()
