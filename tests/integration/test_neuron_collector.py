"""The neuron collector end to end: `counterprof run` of a stand-in Neuron application
(tests/neuron_workload.py) with the fake neuron-monitor and neuron-ls of tests/fake_neuron
first on PATH and a fake sysfs tree (COUNTERPROF_NEURON_SYSFS); the variants real releases
print, a cut line, a monitor that exits, ranks, `list`, and the report."""
from __future__ import annotations

import json
import os
import subprocess

import pyarrow.compute as pc
import pytest

import counterprof
from fake_neuron import BIN, make_sysfs, path_with_fakes
from helpers import COUNTERPROF, PYTHON, REPO, run_cli

WORKLOAD = str(REPO / "tests" / "neuron_workload.py")
FLOPS = 1_000_000


def neuron_env(tmp_path, sysfs=True, fakes=True, **extra):
    env = path_with_fakes() if fakes else dict(os.environ)
    if sysfs:
        env["COUNTERPROF_NEURON_SYSFS"] = str(make_sysfs(tmp_path / "neuron_device", devices=1, cores=4))
    else:
        env["COUNTERPROF_NEURON_SYSFS"] = str(tmp_path / "no-such-tree")
    env["FAKE_NEURON_RECORD"] = str(tmp_path / "monitor.json")
    env.update(extra)
    return env


def profile(tmp_path, env, seconds=3.5, args=(), workload_args=(), name="run"):
    """counterprof run of the workload as a user runs it; (process, run, the workload's FLOPs)."""
    out = tmp_path / name
    root = env["COUNTERPROF_NEURON_SYSFS"] if os.path.isdir(env["COUNTERPROF_NEURON_SYSFS"]) else "-"
    cmd = [*COUNTERPROF, "run", "-o", str(out), *args, "--", PYTHON, WORKLOAD, str(seconds), root,
           str(FLOPS), *workload_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    added = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc, counterprof.load(out), added


def neuron_rows(run, rank=None):
    t = run.samples(rank=rank)
    t = t.filter(pc.equal(t["source"].cast("string"), "neuron"))
    return [dict(zip(("metric", "entity", "value", "duration_ns"), r)) for r in zip(
        t["metric"].cast("string").to_pylist(), t["entity"].cast("string").to_pylist(),
        t["value"].to_pylist(), t["duration_ns"].to_pylist())]


def values(rows, metric, entity=None):
    return [r["value"] for r in rows if r["metric"] == metric and (entity is None or r["entity"] == entity)]


def test_run_records_the_workload_cores_from_monitor_and_sysfs(tmp_path):
    env = neuron_env(tmp_path, FAKE_NEURON_FOREIGN="1", FAKE_NEURON_UTIL="80")
    proc, run, added = profile(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    meta = run.meta
    st = meta["collectors"]["neuron"]
    assert st["status"] == "ok", st
    rows = neuron_rows(run)
    # neuron-monitor: the workload's NeuronCores 0 and 1 on device 0, every second
    util = values(rows, "neuron.core_util", "neuron:0/core:0")
    assert len(util) >= 2 and set(util) == {80.0}
    assert values(rows, "neuron.phys_core_util", "neuron:0/core:1/phys:3") and values(rows, "neuron.flops_rate")
    assert all(r["duration_ns"] and 0.9e9 < r["duration_ns"] < 1.1e9
               for r in rows if r["metric"] == "neuron.core_util")
    assert values(rows, "neuron.exec_completed") and values(rows, "neuron.latency_p99")
    assert values(rows, "neuron.device_mem_used", "neuron:0/core:1")
    # pid 1's runtime (cores 4-5) is another application's: none of its rows
    assert not any("core:4" in r["entity"] or "pid:1" == r["entity"].rpartition("/")[2] for r in rows)
    assert len(st["runtimes"]) == 1 and st["runtimes"][0]["pid"] != 1
    # sysfs: every FLOP the workload added to its cores' flop_count, as deltas
    flops = {e: sum(values(rows, "neuron.flop_count", e)) for e in ("neuron:0/core:0", "neuron:0/core:1")}
    assert flops == {"neuron:0/core:0": added["0"], "neuron:0/core:1": added["1"]}
    assert sum(values(rows, "neuron.flop_count", "neuron:0/core:2")) == 0    # not the workload's
    assert sum(values(rows, "neuron.nc_time_in_use", "neuron:0/core:0")) == pytest.approx(
        added["0"] / FLOPS * 0.01)
    # the catalog names every metric with its unit, kind and source
    cat = run.catalog
    assert cat["neuron.core_util"]["unit"] == "percent" and cat["neuron.core_util"]["source"] == "neuron"
    assert cat["neuron.flop_count"]["kind"] == "delta" and cat["neuron.latency_p99"]["kind"] == "gauge"
    assert {r["metric"] for r in rows} <= set(cat)
    # the monitor: the config at the run's interval, a child of the profiler, not of the workload
    rec = json.loads((tmp_path / "monitor.json").read_text())
    assert rec["config"]["period"] == "1s"
    assert rec["config"]["system_metrics"] == [{"type": "neuron_hw_counters"}]
    assert rec["ppid"] == meta["profiler"]["pid"]
    assert st["monitor_pid"] == rec["pid"] and st["monitor_exit"] is not None
    assert meta["neuron"]["hardware"]["neuron_device_type"] == "trainium2"


def test_report_has_the_neuron_section_and_verdict(tmp_path):
    env = neuron_env(tmp_path, FAKE_NEURON_UTIL="30", FAKE_NEURON_VARIANT="errors")
    proc, run, _ = profile(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    text = run_cli("report", str(run.path), check=True, env={**env, "COLUMNS": "200"}).stdout
    assert "(compute device: neuron)" in text
    assert "NeuronCores busy 30% of the time (neuron-monitor)" in text
    assert "execution errors reported by the Neuron runtime" in text
    assert "uncorrected ECC events on the Neuron devices" in text
    assert "Neuron devices" in text and "neuron:0/core:0" in text
    r = json.loads(run_cli("report", str(run.path), "--json", check=True, env=env).stdout)
    o = r["overall"]
    assert o["device"] == "neuron" and o["verdict"] == "host"      # idle NeuronCore time is the host's
    assert o["shares"]["host"] == pytest.approx(0.7, abs=0.01)
    assert {e["metric"] for e in o["secondary"]} >= {"neuron_exec_errors", "neuron_ecc_uncorrected"}
    devs = {d["entity"]: d["metrics"] for d in r["devices"]}
    assert devs["neuron:0/core:0"]["neuron.core_util"]["mean"] == pytest.approx(30.0)
    assert {round(p["neuron_util"], 2) for p in r["plot"] if "neuron_util" in p} == {0.3}
    html = tmp_path / "r.html"
    run_cli("report", str(run.path), "--html", str(html), check=True, env=env)
    assert 'data-signal="neuron_util"' in html.read_text()


def test_variants_newer_and_older_releases_print(tmp_path):
    env = neuron_env(tmp_path, sysfs=False, FAKE_NEURON_VARIANT="effective_flops,device,null_latency,group_error")
    proc, run, _ = profile(tmp_path, env, seconds=2.5)
    assert proc.returncode == 0, proc.stderr
    rows = neuron_rows(run)
    assert values(rows, "neuron.flops_rate", "neuron:0/core:0")         # from effective_flops
    assert not values(rows, "neuron.latency_p50")                       # null: no model ran
    assert values(rows, "neuron.exec_completed")
    st = run.meta["collectors"]["neuron"]
    assert st["status"] == "ok"                # an error string in a group is said, not a failure
    assert any(k.endswith("execution_stats") and "Connection refused" in v for k, v in st["errors"].items())
    assert "Connection refused" in proc.stderr

    old = neuron_env(tmp_path / "old", sysfs=False, FAKE_NEURON_VARIANT="old")
    proc, run, _ = profile(tmp_path / "old", old, seconds=2.5)
    assert proc.returncode == 0, proc.stderr
    rows = neuron_rows(run)
    assert set(values(rows, "neuron.core_util", "neuron:0/core:1")) == {42.01}
    assert values(rows, "neuron.exec_completed") and values(rows, "neuron.ecc_mem_uncorrected", "neuron:0")
    assert run.meta["collectors"]["neuron"]["status"] == "ok"


def test_a_cut_line_fails_the_collector_and_keeps_the_rest(tmp_path):
    env = neuron_env(tmp_path, sysfs=False, FAKE_NEURON_VARIANT="cut", FAKE_NEURON_AFTER="2")
    proc, run, _ = profile(tmp_path, env, seconds=4.0)
    assert proc.returncode == 0, proc.stderr
    st = run.meta["collectors"]["neuron"]
    assert st["status"] == "failed"
    assert "neuron-monitor printed a line that is not its report (line 2): not JSON" in st["reason"]
    assert st["bad_lines"] == 1 and st["lines"] >= 3
    # the lines before and after the cut one are in the run
    assert len(values(neuron_rows(run), "neuron.core_util", "neuron:0/core:0")) >= 2
    assert run.meta["status"] == "complete"


def test_a_monitor_that_exits_fails_the_collector_and_the_run_goes_on(tmp_path):
    env = neuron_env(tmp_path, FAKE_NEURON_VARIANT="exit", FAKE_NEURON_AFTER="1")
    proc, run, added = profile(tmp_path, env, seconds=3.5)
    assert proc.returncode == 0, proc.stderr
    st = run.meta["collectors"]["neuron"]
    assert st["status"] == "failed"
    assert ("neuron-monitor exited with status 3 after 1 line(s): neuron-monitor: lost connection to "
            "the Neuron driver; sysfs counters go on") in st["reason"]
    rows = neuron_rows(run)
    assert len(values(rows, "neuron.core_util", "neuron:0/core:0")) == 1      # the line it gave
    assert sum(values(rows, "neuron.flop_count", "neuron:0/core:0")) == added["0"]   # sysfs went on
    assert "neuron collector failed" in proc.stderr


def test_sysfs_only_samples_at_the_finer_interval(tmp_path):
    env = neuron_env(tmp_path, fakes=False)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(BIN))
    proc, run, added = profile(tmp_path, env, seconds=2.0, args=("--neuron-interval-ms", "100"))
    assert proc.returncode == 0, proc.stderr
    st = run.meta["collectors"]["neuron"]
    assert st["status"] == "ok" and st["monitor"] is None
    rows = neuron_rows(run)
    deltas = [r for r in rows if r["metric"] == "neuron.flop_count" and r["entity"] == "neuron:0/core:0"]
    assert len(deltas) >= 12                                  # ~10 a second, not once a second
    assert sum(r["value"] for r in deltas) == added["0"]
    # no monitor and no NEURON_RT_VISIBLE_CORES: every core's counters (the device's)
    assert values(rows, "neuron.sysfs_device_mem_used", "neuron:0/core:3")
    assert set(values(rows, "neuron.power_util", "neuron:0")) == {32.5}


def test_neuron_cores_go_to_the_rank_that_owns_them(tmp_path):
    env = neuron_env(tmp_path)
    proc, run, added = profile(tmp_path, env, seconds=3.5, args=("--per-rank",),
                               workload_args=("--ranks", "2"))
    assert proc.returncode == 0, proc.stderr
    assert run.ranks() == [0, 1]
    r0, r1 = neuron_rows(run, 0), neuron_rows(run, 1)
    assert values(r0, "neuron.core_util", "neuron:0/core:0") and not values(r0, "neuron.core_util", "neuron:0/core:2")
    assert values(r1, "neuron.core_util", "neuron:0/core:3") and not values(r1, "neuron.core_util", "neuron:0/core:1")
    assert sum(values(r1, "neuron.flop_count", "neuron:0/core:2")) == added["2"]
    pids = {rt["rank"]: rt["pid"] for rt in run.meta["collectors"]["neuron"]["runtimes"]}
    assert set(pids) == {0, 1}
    assert values(r1, "neuron.exec_completed", f"neuron:0/pid:{pids[1]}")
    assert not values(r0, "neuron.exec_completed", f"neuron:0/pid:{pids[1]}")


def test_list_shows_the_devices_or_why_not(tmp_path):
    env = neuron_env(tmp_path)
    out = run_cli("list", "--json", check=True, env=env).stdout
    entry = next(c for c in json.loads(out)["collectors"] if c["name"] == "neuron")
    assert entry["available"] is True
    table = entry["tables"][0]
    assert table["title"] == "Neuron devices" and table["rows"][0][:3] == ["neuron:0", "cc:00.0", "8"]
    assert "neuron-ls -j" in table["note"]
    text = run_cli("list", check=True, env={**env, "COLUMNS": "200"}).stdout
    assert "neuron:0  cc:00.0" in text
    # no neuron-ls: the sysfs tree's devices
    bare = neuron_env(tmp_path / "b", fakes=False)
    entry = next(c for c in json.loads(run_cli("list", "--json", check=True, env=bare).stdout)["collectors"]
                 if c["name"] == "neuron")
    assert entry["tables"][0]["rows"] == [["neuron:0", "Trainium2", "4"]]
    # neither: unavailable, and why
    none = neuron_env(tmp_path / "n", sysfs=False, fakes=False)
    entry = next(c for c in json.loads(run_cli("list", "--json", check=True, env=none).stdout)["collectors"]
                 if c["name"] == "neuron")
    assert entry["available"] is False
    assert "neuron-monitor is not on PATH" in entry["reason"] and "no-such-tree" in entry["reason"]


def test_compare_and_history_take_the_neuron_metrics(tmp_path):
    runs = []
    env = neuron_env(tmp_path)
    for util in ("40", "80"):          # the same command, on NeuronCores twice as busy
        proc, run, _ = profile(tmp_path, {**env, "FAKE_NEURON_UTIL": util}, seconds=3.0, name=f"run{util}")
        assert proc.returncode == 0, proc.stderr
        runs.append(str(run.path))
    cmp = json.loads(run_cli("compare", *runs, "--json", check=True).stdout)
    row = next(r for r in cmp["rows"] if r["key"] == "metric:neuron.core_util")
    assert (row["base_median"], row["cand_median"], row["unit"]) == (40.0, 80.0, "percent")
    assert any(r["key"] == "metric:neuron.flop_count" for r in cmp["rows"])
    db = str(tmp_path / "history.duckdb")
    for r in runs:
        run_cli("history", "add", r, "--db", db, check=True)
    shown = json.loads(run_cli("history", "show", "--db", db, "--metric", "metric:neuron.core_util",
                               "--json", check=True).stdout)
    assert [p["value"] for p in shown["series"][0]["points"]] == [40.0, 80.0]


def test_runtimes_outside_the_tree_are_matched_by_neuron_process_tag(tmp_path):
    env = neuron_env(tmp_path, sysfs=False, NEURON_PROCESS_TAG="train-7", FAKE_NEURON_FOREIGN="1")
    proc, run, _ = profile(tmp_path, env, seconds=3.5, workload_args=("--detached",))
    assert proc.returncode == 0, proc.stderr
    detached = int(next(ln for ln in proc.stderr.splitlines() if ln.startswith("detached ")).split()[1])
    st = run.meta["collectors"]["neuron"]
    # the config asks for the workload's tag only: the foreign app (tag other-app) is not reported
    assert st["monitor_config"]["neuron_runtimes"][0]["tag_filter"] == r"^train\-7$"
    assert {rt["pid"] for rt in st["runtimes"]} >= {detached}
    assert all(rt["tag"] == "train-7" for rt in st["runtimes"])
    rows = neuron_rows(run)
    assert values(rows, "neuron.core_util", "neuron:0/core:2")          # the detached one's cores
    assert values(rows, "neuron.core_util", "neuron:0/core:0")          # the workload's own
    assert not any("core:4" in r["entity"] for r in rows)


def test_in_process_profile_records_the_process_own_runtime(tmp_path):
    """counterprof.profile() in a Neuron application: the monitor is this process's child and
    is not taken for part of the workload's tree."""
    env = neuron_env(tmp_path, sysfs=False, FAKE_NEURON_RUNTIME="1")
    script = (
        "import time, counterprof\n"
        f"with counterprof.profile(path={str(tmp_path / 'run')!r}, collectors=['neuron']) as run:\n"
        "    time.sleep(3.0)\n")
    proc = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(tmp_path / "run")
    st = run.meta["collectors"]["neuron"]
    assert st["status"] == "ok", st
    rec = json.loads((tmp_path / "monitor.json").read_text())
    assert [rt["pid"] for rt in st["runtimes"]] == [rec["ppid"]]        # this process, not the monitor
    assert values(neuron_rows(run), "neuron.core_util", "neuron:0/core:0")
