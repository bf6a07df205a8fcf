"""JAX profiles into spans and runs (collectors/jax_trace: convert.py, importer.py, and
`counterprof import`), held to what the recording jobs measured themselves.

Three jobs run once, side by side, each in its own interpreter with real jax on the CPU:
- matmul: a jitted matmul + tanh, 5 steps under StepTraceAnnotation, each step's wall-clock
  bounds taken with time.time_ns() around it; the compiled module's entry instructions and
  XLA's cost analysis (compile().cost_analysis()) saved as the truth to hold the profile to.
- psum: shard_map over 2 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=2), a
  psum per step (an all-reduce of a known size), with process_index=1 in the profile's metadata.
- mixed: a torch.profiler (Kineto) trace of a few ops, then a JAX profile, in one process.
Damaged and cut files are made from the matmul profile's own bytes.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("google.protobuf")

import pyarrow.compute as pc

from helpers import run_cli
from kineto_traces import SHARED

STEPS = 5
PSUM_STEPS = 3
ROWS, K, N = 128, 256, 64

MATMUL_JOB = r"""
import json, os, sys, time
import jax, jax.numpy as jnp
out, (rows, k, n, steps) = sys.argv[1], map(int, sys.argv[2:])
def layer(a, b):
    return jnp.tanh(a @ b)
f = jax.jit(layer)
a = jnp.ones((rows, k), jnp.float32)
b = jnp.ones((k, n), jnp.float32)
f(a, b).block_until_ready()                 # compiled before the profile starts
compiled = f.lower(a, b).compile()
cost = compiled.cost_analysis()
cost = cost[0] if isinstance(cost, list) else cost
marks = []
jax.profiler.start_trace(out, create_perfetto_trace=True)
for i in range(steps):
    t0 = time.time_ns()
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        y = f(a, b)
        host = jax.device_get(y)
    marks.append([t0, time.time_ns()])
jax.profiler.stop_trace()
print(json.dumps({"marks": marks, "pid": os.getpid(), "flops": cost.get("flops"),
                  "bytes": cost.get("bytes accessed"), "hlo": compiled.as_text()}))
"""

PSUM_JOB = r"""
import json, os, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map
out, steps = sys.argv[1], int(sys.argv[2])
devices = jax.devices()
mesh = Mesh(np.array(devices), ("x",))
f = jax.jit(shard_map(lambda a: jax.lax.psum(a @ a.T, "x"), mesh=mesh, in_specs=P("x"),
                      out_specs=P()))
a = jnp.ones((2 * 64, 32), jnp.float32)
f(a).block_until_ready()
marks = []
jax.profiler.start_trace(out)
try:                                # the profile's own metadata (jax's private helper)
    from jax._src.lib import _profiler
    from jax._src.profiler import set_metadata
    ranked = hasattr(_profiler, "set_metadata")
    set_metadata("process_index", "1")
except ImportError:
    ranked = False
for i in range(steps):
    t0 = time.time_ns()
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        f(a).block_until_ready()
    marks.append([t0, time.time_ns()])
jax.profiler.stop_trace()
print(json.dumps({"marks": marks, "pid": os.getpid(), "devices": len(devices), "ranked": ranked,
                  "shard_rows": a.shape[0] // len(devices), "itemsize": 4}))
"""

MIXED_JOB = r"""
import json, os, sys, time
out = sys.argv[1]
import torch
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    x = torch.ones(64, 64)
    for _ in range(3):
        x = torch.tanh(x @ x)
prof.export_chrome_trace(os.path.join(out, "torch_job.json"))
import jax, jax.numpy as jnp
f = jax.jit(lambda v: jnp.sin(v) * 2)
v = jnp.ones(1024)
f(v).block_until_ready()
with jax.profiler.trace(os.path.join(out, "jaxlog")):
    for i in range(2):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            f(v).block_until_ready()
print(json.dumps({"pid": os.getpid()}))
"""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    """Run the three jobs at once (each its own process); their outputs and what they said."""
    root = tmp_path_factory.mktemp("jax_jobs")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    two_devices = {**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    specs = {"matmul": (MATMUL_JOB, [ROWS, K, N, STEPS], env), "psum": (PSUM_JOB, [PSUM_STEPS], two_devices),
             "mixed": (MIXED_JOB, [], env)}
    procs = {}
    for name, (code, args, job_env) in specs.items():
        out = root / name
        out.mkdir()
        procs[name] = (out, subprocess.Popen([sys.executable, "-c", code, str(out), *map(str, args)],
                                             env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True))
    done = {}
    for name, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        if name == "mixed" and proc.returncode != 0 and "No module named 'torch'" in stderr:
            done[name] = None
            continue
        assert proc.returncode == 0, f"{name} job failed:\n{stderr[-3000:]}"
        done[name] = {"dir": out, **json.loads(stdout.strip().splitlines()[-1])}
    return done


def _session(logdir: Path) -> Path:
    (session,) = (logdir / "plugins" / "profile").iterdir()
    return session


def _xplane(logdir: Path) -> Path:
    (xplane,) = _session(logdir).glob("*.xplane.pb")
    return xplane


def _cat(table, category: str):
    return table.filter(pc.equal(table["category"].cast("string"), category))


def _ns(table, col: str) -> list[int]:
    return table[col].cast("int64").to_pylist()


def _entry_ops(hlo_text: str) -> set[str]:
    """The instructions of the compiled module's entry computation that run as ops."""
    entry = hlo_text[hlo_text.index("\nENTRY"):]
    entry = entry[:entry.index("\n}")]
    ops = set()
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S+\s+([\w\-]+)\(", line)
        if m and m.group(2) not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
            ops.add(m.group(1))
    return ops


def _copy_session(logdir: Path, dest: Path, keep_json: bool) -> Path:
    """A copy of a profile's session folder (plugins/profile/<time>/), with or without the
    Chrome traces jax wrote beside the XSpace."""
    session = _session(logdir)
    target = dest / "plugins" / "profile" / session.name
    target.mkdir(parents=True)
    for f in session.iterdir():
        if keep_json or f.name.endswith(".xplane.pb"):
            shutil.copy(f, target / f.name)
    return target


# ---- the converter -------------------------------------------------------------------------

def test_steps_fall_inside_the_jobs_own_step_times(jobs):
    from counterprof.collectors.jax_trace.convert import convert_profile
    job = jobs["matmul"]
    table = convert_profile(job["dir"])
    steps = _cat(table, "step")
    assert steps.num_rows == STEPS
    assert steps["name"].to_pylist() == [f"ProfilerStep#{i}" for i in range(STEPS)]
    assert [json.loads(a)["step_num"] for a in steps["attrs"].to_pylist()] == list(range(STEPS))
    for (t0, t1), s, e in zip(job["marks"], _ns(steps, "start"), _ns(steps, "end")):
        assert t0 <= s <= e <= t1, f"step [{s}, {e}] outside the job's [{t0}, {t1}]"
    assert set(steps["pid"].to_pylist()) == {job["pid"]}


def test_xla_ops_are_the_compiled_modules_instructions(jobs):
    from counterprof.collectors.jax_trace.convert import convert_profile
    job = jobs["matmul"]
    table = convert_profile(job["dir"])
    ops = _cat(table, "xla_op")
    attrs = [json.loads(a) for a in ops["attrs"].to_pylist()]
    mine = {a["hlo_op"] for a in attrs if a["hlo_module"] == "jit_layer"}
    assert mine == _entry_ops(job["hlo"])
    # one execution of the module per step, each op inside its step
    per_op = {name: sum(1 for a in attrs if a["hlo_op"] == name and a["hlo_module"] == "jit_layer")
              for name in mine}
    assert set(per_op.values()) == {STEPS}
    step_times = list(zip(_ns(_cat(table, "step"), "start"), _ns(_cat(table, "step"), "end")))
    for s, e, a in zip(_ns(ops, "start"), _ns(ops, "end"), attrs):
        if a["hlo_module"] == "jit_layer":
            assert any(lo <= s and e <= hi for lo, hi in step_times)
    # the dot's fusion is named for the dot it holds (from the module's HLO in the profile)
    assert any(a["category"] == "dot fusion" for a in attrs if a["hlo_module"] == "jit_layer")
    # the host side: one outermost dispatch per call, the device_get as a transfer to the host
    dispatch = _cat(table, "dispatch")
    assert dispatch["name"].to_pylist().count("PjitFunction(layer)") == STEPS
    to_host = [json.loads(a)["direction"] for a in _cat(table, "transfer")["attrs"].to_pylist()]
    assert to_host.count("d2h") >= STEPS


def test_module_costs_are_xlas_own(jobs):
    from counterprof.collectors.jax_trace.convert import module_costs
    job = jobs["matmul"]
    costs = module_costs(job["dir"])
    (mine,) = [c for c in costs.values() if c["module"] == "jit_layer"]
    assert mine["flops"] == pytest.approx(job["flops"])
    assert mine["bytes_accessed"] == pytest.approx(job["bytes"])
    dots = [o for o in mine["ops"].values() if o["category"] == "dot fusion"]
    assert [o["flops"] for o in dots] == [2 * ROWS * K * N]      # 2·M·N·K: XLA's count of a matmul
    assert sum(o.get("flops", 0) for o in mine["ops"].values()) == pytest.approx(mine["flops"])


def test_psum_across_two_devices_is_an_all_reduce(jobs):
    from counterprof.collectors.jax_trace.convert import read_profiles
    job = jobs["psum"]
    (done,) = read_profiles(job["dir"])
    assert done.problems == []
    coll = _cat(done.table, "collective")
    assert set(coll["collective"].to_pylist()) == {"all-reduce"}
    assert set(coll["group_size"].to_pylist()) == {job["devices"]}
    assert set(coll["bytes"].to_pylist()) == {job["shard_rows"] ** 2 * job["itemsize"]}
    # every step ran it once on each device
    devices = [json.loads(a)["device_ordinal"] for a in coll["attrs"].to_pylist()]
    for (t0, t1) in job["marks"]:
        inside = [d for d, s, e in zip(devices, _ns(coll, "start"), _ns(coll, "end")) if t0 <= s and e <= t1]
        assert sorted(inside) == list(range(job["devices"]))
    if job["ranked"]:
        assert (done.rank, done.rank_source) == (1, "profile metadata process_index")


def test_the_chrome_trace_beside_it_gives_the_same_steps(jobs, tmp_path):
    """The .trace.json.gz alone: anchored by the XSpace beside it, the same steps to the ns;
    with no XSpace, placed by the session folder's name (the second jax wrote it in) to about
    a second, and said so."""
    from counterprof.collectors.jax_trace.convert import convert_file, convert_profile
    job = jobs["matmul"]
    session = _session(job["dir"])
    (chrome,) = session.glob("*.trace.json.gz")
    xs_steps = _cat(convert_profile(job["dir"]), "step")
    done = convert_file(chrome)
    assert done.fmt == "chrome-json" and done.problems == []
    steps = _cat(done.table, "step")
    assert _ns(steps, "start") == _ns(xs_steps, "start") and _ns(steps, "end") == _ns(xs_steps, "end")
    alone = _copy_session(job["dir"], tmp_path, keep_json=True)
    (alone / _xplane(job["dir"]).name).unlink()
    done = convert_file(alone / "perfetto_trace.json.gz")
    assert any("session folder's name" in p for p in done.problems)
    steps = _cat(done.table, "step")
    assert steps.num_rows == STEPS
    for (t0, t1), s in zip(job["marks"], _ns(steps, "start")):
        assert t0 - 2_500_000_000 <= s <= t1 + 2_500_000_000


# ---- counterprof import ----------------------------------------------------------------------

def test_import_then_report_breakdown_export(jobs, tmp_path):
    job = jobs["psum"]
    run = tmp_path / "run"
    p = run_cli("import", str(job["dir"]), "-o", str(run))
    assert p.returncode == 0, p.stderr
    rank = 1 if job["ranked"] else 0
    assert f"rank {rank} (" in p.stderr and "spans" in p.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert meta["collectors"]["jax"]["status"] == "ok"
    assert meta["traces"][0]["source"] == "jax" and meta["traces"][0]["anchor"] == "profile_start_time"
    import pyarrow.dataset as ds
    spans = ds.dataset(run / "spans", partitioning="hive").to_table()
    assert set(spans["rank"].to_pylist()) == {rank}
    window = _cat(spans, "window")
    assert window.num_rows == 1
    (w0,), (w1,) = _ns(window, "start"), _ns(window, "end")
    assert w0 <= job["marks"][0][1] and w1 >= job["marks"][-1][0]
    report = run_cli("report", str(run), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["collectors"]["jax"]["status"] == "ok"
    breakdown = run_cli("breakdown", str(run))
    assert breakdown.returncode == 0 and "no gpu activity" in (breakdown.stdout + breakdown.stderr).lower()
    out = tmp_path / "t.json.gz"
    export = run_cli("export", str(run), "--perfetto", str(out))
    assert export.returncode == 0, export.stderr
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    assert {"collective", "xla_op", "step"} <= {e.get("cat") for e in events}


def test_import_beside_a_kineto_trace(jobs, tmp_path):
    job = jobs["mixed"]
    if job is None:
        pytest.skip("torch is not installed: no Kineto trace to import beside the JAX profile")
    run = tmp_path / "run"
    p = run_cli("import", str(job["dir"]), "-o", str(run))
    assert p.returncode == 0, p.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert {"torch", "jax"} <= set(meta["collectors"])
    assert sorted(Path(t["file"]).name for t in meta["traces"]) == \
        sorted(["torch_job.json", _xplane(job["dir"] / "jaxlog").name])
    import pyarrow.dataset as ds
    cats = set(ds.dataset(run / "spans", partitioning="hive").to_table()["category"].cast("string").to_pylist())
    assert {"cpu_op", "xla_op", "step"} <= cats


def test_rankless_profiles_of_two_processes_get_ranks_in_their_order(jobs, tmp_path):
    from counterprof.import_trace import import_traces
    mixed = jobs["mixed"]
    second = _xplane(mixed["dir"] / "jaxlog") if mixed else None
    if second is None:
        pytest.skip("the mixed job needs torch")
    traces = import_traces([jobs["matmul"]["dir"], second], tmp_path / "run")
    by_pid = {t.host_pid: t for t in traces}
    assert sorted(by_pid) == sorted([jobs["matmul"]["pid"], mixed["pid"]])
    order = sorted(by_pid)
    assert [by_pid[pid].rank for pid in order] == [0, 1]
    assert all(t.rank_source.startswith("order of the processes") for t in traces)


# ---- cut and damaged files -----------------------------------------------------------------

def test_a_profile_cut_before_its_start_time_keeps_its_events(jobs, tmp_path):
    """Cut inside the Task Environment plane (written last): every event is kept, placed by
    the session folder's name, and the import says both."""
    job = jobs["matmul"]
    session = _copy_session(job["dir"], tmp_path / "cut", keep_json=False)
    (xplane,) = session.glob("*.xplane.pb")
    data = xplane.read_bytes()
    xplane.write_bytes(data[:data.rindex(b"Task Environment") - 1])
    run = tmp_path / "run"
    p = run_cli("import", str(tmp_path / "cut"), "-o", str(run))
    assert p.returncode == 0, p.stderr
    assert "cut off" in p.stderr and "session folder's name" in p.stderr
    assert "Traceback" not in p.stderr
    import pyarrow.dataset as ds
    steps = _cat(ds.dataset(run / "spans", partitioning="hive").to_table(), "step")
    assert steps.num_rows == STEPS
    for (t0, t1), s in zip(job["marks"], sorted(_ns(steps, "start"))):
        assert t0 - 2_500_000_000 <= s <= t1 + 2_500_000_000


def test_a_profile_cut_inside_its_events(jobs, tmp_path):
    """Cut in the middle of the host plane: its events' names come after them, so nothing of it
    can be read: exit 1 with the reason, no traceback; with jax's Chrome trace beside it, that is
    read instead and the import succeeds, saying so."""
    job = jobs["matmul"]
    for keep_json in (False, True):
        root = tmp_path / f"cut-{keep_json}"
        session = _copy_session(job["dir"], root, keep_json=keep_json)
        (xplane,) = session.glob("*.xplane.pb")
        data = xplane.read_bytes()
        xplane.write_bytes(data[:len(data) // 2])
        p = run_cli("import", str(root), "-o", str(tmp_path / f"run-{keep_json}"))
        assert "Traceback" not in p.stderr
        assert "cut off" in p.stderr
        if keep_json:
            assert p.returncode == 0, p.stderr
            assert ".trace.json.gz instead" in p.stderr
        else:
            assert p.returncode == 1
            assert "none of its events can be read" in p.stderr and "nothing could be imported" in p.stderr


def test_a_damaged_profile_keeps_the_threads_that_decode(jobs, tmp_path):
    job = jobs["matmul"]
    session = _copy_session(job["dir"], tmp_path / "bad", keep_json=False)
    (xplane,) = session.glob("*.xplane.pb")
    data = bytearray(xplane.read_bytes())
    at = data.index(b"tf_XLA") + 40            # inside an XLA thread's line, past its name
    data[at:at + 32] = b"\xff" * 32
    xplane.write_bytes(bytes(data))
    junk = tmp_path / "junk" / "host.xplane.pb"
    junk.parent.mkdir()
    junk.write_bytes(b"this is not a profile at all\n" * 10)
    p = run_cli("import", str(tmp_path / "bad"), str(junk), "-o", str(tmp_path / "run"))
    assert "Traceback" not in p.stderr
    assert p.returncode == 1                       # one of the two could not be imported
    assert "damaged and left out" in p.stderr
    assert "is not an XSpace profile" in p.stderr
    import pyarrow.dataset as ds
    spans = ds.dataset(tmp_path / "run" / "spans", partitioning="hive").to_table()
    assert _cat(spans, "step").num_rows == STEPS  # the Python thread's line decoded


# ---- a real GPU profile ---------------------------------------------------------------------

GPU_PROFILE = SHARED / "jax" / "mi300x_jax_conv.xplane.pb" if SHARED else None


@pytest.mark.skipif(GPU_PROFILE is None or not GPU_PROFILE.is_file(),
                    reason="the shared JAX GPU profiles (shared/traces/jax) are not on this machine")
def test_a_gpu_profile_gives_kernels_linked_to_their_launches(tmp_path):
    """jax on 8 MI300X (TraceLens's test data): 5 calls of a jitted 3-D convolution."""
    from counterprof.collectors.jax_trace.convert import convert_profile
    table = convert_profile(GPU_PROFILE)
    assert _cat(table, "dispatch")["name"].to_pylist().count("PjitFunction(forward_3d_conv)") == 5
    kernels, launches = _cat(table, "kernel"), _cat(table, "runtime")
    assert set(kernels["device"].to_pylist()) == set(range(8))
    assert set(kernels["correlation"].to_pylist()) <= set(launches["correlation"].to_pylist())
    run = tmp_path / "run"
    assert run_cli("import", str(GPU_PROFILE), "-o", str(run)).returncode == 0
    b = run_cli("breakdown", str(run), "--json")
    assert b.returncode == 0, b.stderr
    (rank,) = json.loads(b.stdout)["ranks"]
    assert rank["gpu_spans"] == kernels.num_rows
