"""The perf sampler's spill, end to end: from -I 100 every tick (host's and the threads walk's rows
included) is on disk as it is taken, the drain wakes every 10 s, and a SIGKILLed profiler's run
is recovered to its last tick, with the rows the drain had taken identical to the spill's."""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import time

import pyarrow.compute as pc

import counterprof
from counterprof.collectors.perf import spill
from helpers import COUNTERPROF, EXAMPLES, PYTHON, run_cli


def _keyed(table):
    return collections.Counter(zip(table["source"].cast("string").to_pylist(),
                                   table["metric"].cast("string").to_pylist(),
                                   table["entity"].cast("string").to_pylist(),
                                   pc.cast(table["time"], "int64").to_pylist()))


def _spill_dir(run_dir):
    return run_dir / "_ranks" / "rank=0" / spill.SPILL_DIR


def test_a_clean_run_drains_every_10_s_and_leaves_no_spill(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_cli("run", "-q", "-o", str(run_dir), "--", PYTHON, str(EXAMPLES / "busy.py"), "1.5")
    assert proc.returncode == 0, proc.stderr
    perf = json.loads((run_dir / "meta.json").read_text())["collectors"]["perf"]
    assert perf["drain_every_s"] == 10.0
    assert perf["spill"]["records"] >= 3 * 10 and "error" not in perf["spill"]   # perf, host, walks: 10/s
    assert not _spill_dir(run_dir).exists(), "a clean stop removes the spill"
    t = counterprof.load(run_dir).samples()
    assert max(_keyed(t).values()) == 1
    assert {"perf", "host", "threads"} <= set(t["source"].cast("string").to_pylist())


def test_finer_intervals_and_a_live_consumer_keep_the_drain_every_second(tmp_path):
    proc = run_cli("run", "-q", "-I", "50", "-o", str(tmp_path / "a"), "--", "sleep", "0.3")
    assert proc.returncode == 0, proc.stderr
    perf = json.loads((tmp_path / "a" / "meta.json").read_text())["collectors"]["perf"]
    assert "spill" not in perf and "drain_every_s" not in perf
    proc = run_cli("run", "-q", "--live", "-o", str(tmp_path / "b"), "--", "sleep", "0.3")
    assert proc.returncode == 0, proc.stderr
    perf = json.loads((tmp_path / "b" / "meta.json").read_text())["collectors"]["perf"]
    assert "spill" not in perf, "the live view shows the last seconds: rows every second"


def test_killed_profiler_recovers_to_its_last_tick_with_the_drains_rows_unchanged(tmp_path):
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-q", "-o", str(run_dir), "--", PYTHON,
                             str(EXAMPLES / "busy.py"), "18"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not any(_spill_dir(run_dir).glob("*.spill")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(12.3)         # one drain (at 10 s) behind it, 2.3 s of ticks only in the spill
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    names = sorted(p.name for p in _spill_dir(run_dir).iterdir())
    assert len(names) == 3 and names[-1].endswith(".json"), names
    kept = tmp_path / "spill-copy"
    shutil.copytree(_spill_dir(run_dir), kept)
    labels = json.loads((kept / names[-1]).read_text())
    from_spill = spill.spill_rows(spill.spill_records(kept, names[-1][:-len(".json")]), labels)

    rec = run_cli("recover", str(run_dir))
    assert rec.returncode == 0, rec.stderr
    assert "from the sampler's spill" in rec.stderr
    assert not _spill_dir(run_dir).exists()
    t = counterprof.load(run_dir).samples()
    keys = _keyed(t)
    assert max(keys.values()) == 1, "no row twice: those the drain had taken are left out"
    for source in ("perf", "host", "threads"):
        times = pc.cast(t.filter(pc.equal(t["source"].cast("string"), source))["time"], "int64")
        assert killed_at - pc.max(times).as_py() / 1e9 < 0.45, f"{source}: a tick and the kill's latency"
    # the file the drain at 10 s took is still whole (emptied at the next rotation): its rows are
    # the journal's, value for value
    stored = {k: v for k, v in zip(zip(t["source"].cast("string").to_pylist(), t["metric"].cast("string").to_pylist(),
                                       t["entity"].cast("string").to_pylist(),
                                       pc.cast(t["time"], "int64").to_pylist()), t["value"].to_pylist())}
    spilled = list(zip(zip(from_spill["source"].cast("string").to_pylist(),
                           from_spill["metric"].cast("string").to_pylist(),
                           from_spill["entity"].cast("string").to_pylist(),
                           pc.cast(from_spill["time"], "int64").to_pylist()), from_spill["value"].to_pylist()))
    assert len(spilled) > 200
    missing = [k for k, _v in spilled if k not in stored]
    assert not missing, missing[:5]
    differ = [(k, v, stored[k]) for k, v in spilled if v != stored[k]]
    assert not differ, differ[:5]

    # an interrupted recovery (its Parquet file written, the spill not yet removed) adds nothing
    shutil.copytree(kept, _spill_dir(run_dir))
    rows = t.num_rows
    assert spill.recover(run_dir) == []
    assert counterprof.load(run_dir).samples().num_rows == rows
    assert not _spill_dir(run_dir).exists()


def test_a_link_planted_where_the_spill_goes_is_not_written_through(tmp_path):
    from counterprof.store.safepath import LinkInRun
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("keep me")
    run_dir = tmp_path / "r"
    (run_dir / "_ranks" / "rank=0").mkdir(parents=True)
    os.symlink(elsewhere, _spill_dir(run_dir))          # the folder: refused
    try:
        spill.Spill.open(run_dir, 0, [("task-clock", "process")], None)
    except LinkInRun:
        pass
    else:
        raise AssertionError("a linked spill folder must be refused")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]
    os.unlink(_spill_dir(run_dir))
    _spill_dir(run_dir).mkdir()
    name = f"perf{os.getpid()}-{spill._opened + 1}"
    os.symlink(elsewhere / "keep", _spill_dir(run_dir) / f"{name}.0.spill")   # a file: removed, not followed
    sp = spill.Spill.open(run_dir, 0, [("task-clock", "process")], None)
    try:
        assert (elsewhere / "keep").read_text() == "keep me"
        assert not (_spill_dir(run_dir) / f"{name}.0.spill").is_symlink()
    finally:
        sp.close()
    assert not _spill_dir(run_dir).exists()
