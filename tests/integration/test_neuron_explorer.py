"""Neuron Explorer profiles into runs (collectors/neuron/explorer.py, importer.py, and
`counterprof import`), held to the truth of profiles written as Explorer's schema reference
documents them (tests/neuron_profiles.py: an engine-bound kernel, a DMA-bound copy, a
collective, executions far apart), in two schema versions; damaged, cut, renamed and
unsupported ones refused with what to do; the device clock aligned to the host's through the
runtime's nrt_execute calls, as close as they allow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from helpers import run_cli, table_files
from kineto_traces import X, write_trace
from neuron_profiles import SHAPES, write_profile

VERSIONS = ("7.4.0", "12.0.1")


def _report(run: Path) -> dict:
    r = run_cli("report", str(run), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _spans(run: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in table_files(run, "spans")])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_kind_of_job_gets_its_verdict_from_engines_and_dma(tmp_path, shape, version):
    truth = write_profile(tmp_path / "profile", shape, version=version, system=True)
    run = tmp_path / "run"
    r = run_cli("import", str(tmp_path / "profile"), "-o", str(run))
    assert r.returncode == 0, r.stderr
    assert f"Neuron Explorer schema {version}" in r.stderr and "Traceback" not in r.stderr
    overall = _report(run)["overall"]
    assert overall["device"] == "neuron"
    assert overall["verdict"] == truth.verdict, (overall, truth.shares)
    shares = overall["shares"]
    assert sum(shares.values()) <= 1.0 + 1e-6
    for k, want in truth.shares.items():          # within a point of the constructed truth
        assert abs(shares.get(k, 0.0) - want) <= 0.01, (k, shares, truth.shares)
    text = " ".join(e["text"] for e in overall["evidence"])
    assert f"busiest: {truth.top_engine}" in text
    for engine, busy in truth.engine_busy.items():
        assert f"{engine} {round(busy * 100)}%" in text, (engine, busy, text)
    if shape == "memory":
        assert "semaphore wait" in text and "of the HBM peak" in text
    # Explorer's own roofline figures, against each other
    assert ("memory-bound by intensity" if shape == "memory" else "compute-bound by intensity") in text


def test_split_tables_missing_optional_tables_and_unknown_ones(tmp_path):
    truth = write_profile(tmp_path / "p", "compute", split=("Instruction", "DmaPacket"), drop=("ExecutionInfo",),
                          unknown=True)
    assert (tmp_path / "p" / "Instruction_1.parquet").exists() and not (tmp_path / "p" / "Instruction.parquet").exists()
    run = tmp_path / "run"
    r = run_cli("import", str(tmp_path / "p"), "-o", str(run))
    assert r.returncode == 0, r.stderr
    spans = _spans(run)
    cats = spans["category"].cast(pa.string())
    assert pc.sum(pc.equal(cats, "neuron_inst")).as_py() == truth.rows["Instruction"]
    assert pc.sum(pc.equal(cats, "neuron_dma")).as_py() == truth.rows["DmaPacket"]
    dma = spans.filter(pc.equal(cats, "neuron_dma"))
    assert pc.sum(dma["bytes"]).as_py() == truth.dma_bytes
    # every entity named as the issue asks: neuron:D/core:C/engine:E and .../dma:Q
    attrs = [json.loads(a) for a in spans.filter(pc.equal(cats, "neuron_inst"))["attrs"].to_pylist()]
    assert {a["entity"] for a in attrs} >= {"neuron:0/core:0/engine:Tensor", "neuron:0/core:0/engine:Vector"}
    assert all(json.loads(a)["entity"].startswith("neuron:0/core:0/dma:") for a in dma["attrs"].to_pylist())
    meta = json.loads((run / "meta.json").read_text())
    warnings = " ".join(meta["warnings"])
    assert "FutureTable" in warnings and "added_in_a_later_minor" in warnings
    assert _report(run)["overall"]["verdict"] == "compute"


def test_an_unsupported_major_is_refused_with_what_to_do(tmp_path):
    write_profile(tmp_path / "p", "compute", version="13.0.0")
    r = run_cli("import", str(tmp_path / "p"), "-o", str(tmp_path / "run"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "13.0.0" in r.stderr and "7.x" in r.stderr and "12.x" in r.stderr and "neuron-explorer" in r.stderr
    assert not (tmp_path / "run" / "meta.json").exists()


def test_a_renamed_field_in_a_known_major_is_named_not_misread(tmp_path):
    write_profile(tmp_path / "p", "compute", version="12.0.1")
    f = tmp_path / "p" / "Instruction.parquet"
    t = pq.read_table(f)
    pq.write_table(t.rename_columns(["start_timestamp" if n == "start_ts" else n for n in t.column_names]), f)
    r = run_cli("import", str(tmp_path / "p"), "-o", str(tmp_path / "run"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "'start_ts'" in r.stderr and "12.0.1" in r.stderr


def test_a_unit_the_profiles_own_schema_changed_is_refused(tmp_path):
    write_profile(tmp_path / "p", "compute", version="12.0.1")
    f = tmp_path / "p" / "SchemaFields.parquet"
    t = pq.read_table(f).to_pylist()
    for row in t:
        if row["table_name"] == "DmaPacket" and row["field_name"] == "transfer_bytes":
            row["field_unit"] = "kilobytes"
    pq.write_table(pa.Table.from_pylist(t), f)
    r = run_cli("import", str(tmp_path / "p"), "-o", str(tmp_path / "run"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "transfer_bytes" in r.stderr and "kilobytes" in r.stderr


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_damaged_parquet_is_named_and_nothing_is_left(tmp_path, damage):
    write_profile(tmp_path / "p", "memory")
    f = tmp_path / "p" / "DmaPacket.parquet"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "cut" else b"not parquet at all" * 10)
    r = run_cli("import", str(tmp_path / "p"), "-o", str(tmp_path / "run"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "DmaPacket.parquet" in r.stderr and "neuron-explorer" in r.stderr
    assert not (tmp_path / "run" / "meta.json").exists()


def test_the_device_clock_is_aligned_through_nrt_execute(tmp_path):
    """With a system profile: the device's executions land inside the runtime's nrt_execute
    calls, within the bound the import states (the calls start 20 µs before and end 15 µs
    after each execution by construction: the bound is 17.5 µs). Without one: Metadata's
    first_ts in whole seconds places it, and the import says how coarsely."""
    for system, most in ((True, 20_000), (False, 1_000_000_000)):
        out = tmp_path / f"s{system}"
        truth = write_profile(out / "p", "compute", system=system)
        r = run_cli("import", str(out / "p"), "-o", str(out / "run"))
        assert r.returncode == 0, r.stderr
        meta = json.loads((out / "run" / "meta.json").read_text())
        a = meta["traces"][0]["alignment"]
        assert a["method"] == ("nrt_execute" if system else "Metadata.first_ts")
        assert 0 < a["within_ns"] <= most
        spans = _spans(out / "run")
        ex = spans.filter(pc.equal(spans["category"].cast(pa.string()), "neuron_exec"))
        first = pc.min(ex["start"]).cast(pa.int64()).as_py()
        # the truth: where the first execution started on the Unix clock
        err = first - truth.device_unix_ns[0]
        assert abs(err) <= a["within_ns"], (err, a)
        if system:
            calls = spans.filter(pc.equal(spans["category"].cast(pa.string()), "neuron_runtime"))
            assert calls.num_rows == truth.executions and pc.all(pc.is_valid(calls["pid"])).as_py()
        else:
            assert "Metadata.first_ts alone" in " ".join(meta["warnings"])


def test_several_cores_are_ranks_and_beside_kineto_traces(tmp_path):
    write_profile(tmp_path / "c0", "compute", core=0)
    write_profile(tmp_path / "c1", "memory", core=1)
    kineto = tmp_path / "trace.json"
    write_trace(kineto, [X("cpu_op", "aten::mm", 1_000, 500), X("cpu_op", "aten::add", 1_600, 100)])
    run = tmp_path / "run"
    r = run_cli("import", str(tmp_path / "c0"), str(tmp_path / "c1"), str(kineto), "-o", str(run))
    assert r.returncode == 0, r.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert set(meta["collectors"]) >= {"torch", "neuron_explorer"}
    ranks = {t.get("neuroncore"): t["rank"] for t in meta["traces"] if t.get("source") == "neuron_explorer"}
    assert ranks == {"neuron:0/core:0": 0, "neuron:0/core:1": 1}
    verdicts = {r["scope"]: (r["device"], r["verdict"]) for r in _report(run)["rank_verdicts"]}
    assert verdicts["rank 0"] == ("neuron", "compute") and verdicts["rank 1"] == ("neuron", "memory")


def test_into_a_finished_run_adds_the_profile_once(tmp_path):
    """A real profiled run (counterprof run of a Python loop), then the device profile taken
    beside it imported --into it: its samples stay, the NeuronCore's spans join them on the
    same clock, and a second import is refused unless --force (then replaced, not doubled)."""
    run = tmp_path / "run"
    r = run_cli("run", "-o", str(run), "-q", "--", sys.executable, "-c",
                "import time\nt=time.time()\nwhile time.time()-t<1.0: sum(range(1000))")
    assert r.returncode == 0, r.stderr
    before = {f.name for f in table_files(run, "samples")}
    meta = json.loads((run / "meta.json").read_text())
    start = meta["start_ns"]
    truth = write_profile(tmp_path / "p", "memory", unix_start_ns=start + 200_000_000, system=True)
    assert truth.device_unix_ns[1] < meta["end_ns"]
    r = run_cli("import", str(tmp_path / "p"), "--into", str(run))
    assert r.returncode == 0, r.stderr
    assert before <= {f.name for f in table_files(run, "samples")}
    n = _spans(run).num_rows
    again = run_cli("import", str(tmp_path / "p"), "--into", str(run))
    assert again.returncode != 0 and "--force" in again.stderr and "Traceback" not in again.stderr
    forced = run_cli("import", str(tmp_path / "p"), "--into", str(run), "--force")
    assert forced.returncode == 0, forced.stderr
    assert _spans(run).num_rows == n
    meta = json.loads((run / "meta.json").read_text())
    assert "neuron_explorer" in meta["collectors"] and len(meta["collectors"]) > 1
    report = _report(run)
    assert report["overall"]["device"] == "neuron"
    not_a_run = run_cli("import", str(tmp_path / "p"), "--into", str(tmp_path / "p"))
    assert not_a_run.returncode != 0 and "not a run directory" in not_a_run.stderr


# the Neuron runtime's part, played by the workload (no Neuron hardware here): with
# NEURON_RT_INSPECT_ENABLE=1 it writes an .ntff (here JSON the fake neuron-explorer reads: the
# job's shape and when it ran) and the .neff it ran into NEURON_RT_INSPECT_OUTPUT_DIR
RUNTIME_JOB = r"""
import json, os, sys, time
t0 = time.time_ns()
time.sleep(0.5)
seen = {k: v for k, v in os.environ.items() if k.startswith("NEURON_RT_INSPECT")}
json.dump(seen, open(sys.argv[1], "w"))
if os.environ.get("NEURON_RT_INSPECT_ENABLE") == "1":
    out = os.environ["NEURON_RT_INSPECT_OUTPUT_DIR"]
    json.dump({"shape": "collectives", "unix_start_ns": t0 + 100_000_000, "core": 0},
              open(os.path.join(out, "i-0abc_pid%d_nc0.ntff" % os.getpid()), "w"))
    open(os.path.join(out, "graph.neff"), "wb").write(b"NEFF")
"""


def _explorer_only_path(tmp_path: Path) -> dict:
    """PATH with the fake neuron-explorer alone (not the fake neuron-monitor beside it)."""
    from fake_neuron import BIN
    d = tmp_path / "bin"
    d.mkdir()
    (d / "neuron-explorer").symlink_to(BIN / "neuron-explorer")
    return {**os.environ, "PATH": f"{d}{os.pathsep}{os.environ['PATH']}"}


def test_run_neuron_profile_captures_processes_and_judges(tmp_path):
    run, seen = tmp_path / "run", tmp_path / "env.json"
    env = _explorer_only_path(tmp_path)
    r = run_cli("run", "--neuron-profile", "-o", str(run), "-q", "--", sys.executable, "-c", RUNTIME_JOB,
                str(seen), env=env)
    assert r.returncode == 0, r.stderr
    inspect = json.loads(seen.read_text())
    assert inspect["NEURON_RT_INSPECT_ENABLE"] == "1" and inspect["NEURON_RT_INSPECT_DEVICE_PROFILE"] == "1"
    assert inspect["NEURON_RT_INSPECT_OUTPUT_DIR"] == str(run / "neuron_profile" / "raw")
    assert list((run / "neuron_profile" / "raw").glob("*.ntff"))           # the raw files kept
    meta = json.loads((run / "meta.json").read_text())
    col = meta["collectors"]["neuron_profile"]
    assert col["status"] == "ok", col
    overall = _report(run)["overall"]
    assert overall["device"] == "neuron" and overall["verdict"] == "collectives"


def test_run_neuron_profile_without_explorer_keeps_the_raw_files_and_says_the_command(tmp_path):
    run, seen = tmp_path / "run", tmp_path / "env.json"
    env = {**os.environ, "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                 if not (Path(p) / "neuron-explorer").exists())}
    r = run_cli("run", "--neuron-profile", "session", "-o", str(run), "--", sys.executable, "-c", RUNTIME_JOB,
                str(seen), env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(seen.read_text())["NEURON_RT_INSPECT_DEVICE_PROFILE"] == "session"
    want = f"neuron-explorer view -d {run / 'neuron_profile' / 'raw'} --output-file"
    assert want in r.stderr and f"--into {run}" in r.stderr and "Traceback" not in r.stderr
    # the command said, run by hand (with the fake on PATH), finishes the job
    cmd = r.stderr[r.stderr.index("neuron-explorer view"):].splitlines()[0]
    explorer_cmd, import_cmd = cmd.split(" && ")
    env = _explorer_only_path(tmp_path)
    assert subprocess.run(explorer_cmd.split(), env=env).returncode == 0
    done = run_cli("import", *import_cmd.split()[2:], env=env)
    assert done.returncode == 0, done.stderr
    assert _report(run)["overall"]["verdict"] == "collectives"


def test_run_neuron_profile_with_torch_is_refused_before_anything_runs(tmp_path):
    r = run_cli("run", "--neuron-profile", "--torch", "-o", str(tmp_path / "run"), "--", "true")
    assert r.returncode == 2 and "cannot be used together" in r.stderr
    assert not (tmp_path / "run").exists()


def test_the_readme_example_is_what_the_commands_print(tmp_path):
    """README's Neuron example, run as written from a copy of examples/: every line it shows
    is a line of the real output (lines left out are allowed, none made up)."""
    from helpers import REPO
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- neuron-example -->\n```\n", 1)[1].split("\n```", 1)[0].splitlines()
    command, shown = block[0].removeprefix("$ "), block[1:]
    assert command == "counterprof import examples/neuron_profile -o run && counterprof report run"
    (tmp_path / "examples").symlink_to(REPO / "examples")
    first, second = command.split(" && ")
    assert run_cli(*first.split()[1:], cwd=tmp_path).returncode == 0
    # (as a terminal wide enough for the lines shown: a pipe is 80 columns)
    out = run_cli(*second.split()[1:], cwd=tmp_path, env={**os.environ, "COLUMNS": "220"})
    assert out.returncode == 0, out.stderr
    real = [line.rstrip() for line in out.stdout.splitlines()]
    for line in shown:
        assert line.rstrip() in real, line


def test_host_gaps_say_where_the_host_was(tmp_path):
    """Executions far apart with the runtime's nrt_execute calls around them: the idle time
    is the host's, split between the runtime's calls and the rest, as the intervals give it."""
    truth = write_profile(tmp_path / "p", "host", system=True)
    run_cli("import", str(tmp_path / "p"), "-o", str(tmp_path / "run"), check=True)
    overall = _report(tmp_path / "run")["overall"]
    assert overall["verdict"] == "host"
    ev = {e["metric"]: e for e in overall["evidence"]}
    # by construction each call starts 20 µs before its execution and ends 15 µs after it:
    # the idle tail of each execution and 35 µs of each gap are inside a call
    assert abs(ev["neuron_idle_in_runtime"]["value"] - truth.idle_in_runtime) < 0.01, truth.idle_in_runtime
    assert 0.02 < truth.idle_in_runtime < 0.2


def test_breakdown_of_a_neuroncore(tmp_path):
    """`counterprof breakdown` of an imported profile: each engine's busy share and the DMA
    bytes as the generator wrote them, the collective named, in text and JSON."""
    truth = write_profile(tmp_path / "p", "collectives", system=True)
    run_cli("import", str(tmp_path / "p"), "-o", str(tmp_path / "run"), check=True)
    r = run_cli("breakdown", str(tmp_path / "run"), "--json")
    assert r.returncode == 0, r.stderr
    (b,) = json.loads(r.stdout)["neuron"]
    engines = {e["name"]: e["share"] for e in b["engines"]}
    for engine, busy in truth.engine_busy.items():
        assert abs(engines[engine] - busy) < 1e-3, (engine, engines, truth.engine_busy)
    assert sum(q["bytes"] for q in b["dma"]) == truth.dma_bytes
    assert [c["name"] for c in b["collectives"]] == ["AllReduce"]
    # the shape's AllReduce runs while the engines wait: all of it is exposed
    assert abs(b["collectives"][0]["share"] - truth.shares["collectives"]) < 1e-3
    text = run_cli("breakdown", str(tmp_path / "run"))
    assert text.returncode == 0 and "DMA by queue type" in text.stdout and "AllReduce" in text.stdout
