"""`counterprof trace`: a job running under `counterprof run --torch` traces its next steps when
asked, on every rank, from the same step number, and the spans land in the run on its clock.

Jobs written here, each running until the test drops a stop file: a 2-rank gloo DDP job under
torchrun (asked twice), a launcher of two independent ranks one of which exits before the ask,
a loop of raw ops that marks no steps (a time window), and a non-Python workload (refused)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import counterprof                                   # noqa: E402
from helpers import COUNTERPROF, run_cli             # noqa: E402

DDP = """
import json, os, sys, threading, time
import torch, torch.distributed as dist
import counterprof
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 256)
stop, out = sys.argv[1], sys.argv[2]
threads_before, i = None, 0
while i < 6000:
    flag = torch.tensor([float(os.path.exists(stop))])
    dist.all_reduce(flag)                       # every rank stops at the same step
    if flag.item():
        break
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    counterprof.step()
    if i == 5:
        threads_before = sorted(t.name for t in threading.enumerate())
    i += 1
    time.sleep(0.01)
threads_after = sorted(t.name for t in threading.enumerate())
# The cleanup DDP scripts end with (tests/thread_workloads.py has the counts): without the barrier
# and the del, the reducer keeps the process group alive into interpreter teardown, where torch
# 2.13's gloo can abort a rank ("terminate called without an active exception").
dist.barrier()
del model, opt
dist.destroy_process_group()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "steps": i, "threads_before": threads_before,
               "threads_after": threads_after, "cwd": sorted(os.listdir("."))}, f)
"""

WORKER = """
import os, sys, time, torch, counterprof
stop, life = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60
a = torch.randn(128, 128)
t = time.time()
while not os.path.exists(stop) and time.time() - t < life:
    a @ a
    counterprof.step()
    time.sleep(0.01)
"""

LAUNCHER = """
import os, subprocess, sys
worker, stop = sys.argv[1], sys.argv[2]
procs = [subprocess.Popen([sys.executable, worker, stop, life], env={**os.environ, "RANK": str(r)})
         for r, life in ((0, "60"), (1, "2"))]
sys.exit(max(p.wait() for p in procs))
"""

RAW = """
import os, sys, time, torch
a = torch.randn(256, 256)
t = time.time()
while not os.path.exists(sys.argv[1]) and time.time() - t < 60:
    a @ a
"""


def script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


class Job:
    """`counterprof run --torch -o RUN -- ARGV...` in the background until stop() (the stop file)."""

    def __init__(self, tmp_path: Path, *argv: str):
        self.run, self.stop_file = tmp_path / "run", tmp_path / "stop"
        self.proc = subprocess.Popen([*COUNTERPROF, "run", "--torch", "-q", "-o", str(self.run), "--", *argv,
                                      str(self.stop_file), *([str(tmp_path)] if "ddp" in argv[-1] else [])],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)

    def wait_for(self, drivers: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        folder = self.run / "_control" / "drivers"
        while time.monotonic() < deadline:
            steps = list((self.run / "_ranks").glob("rank=*/traces/*.steps")) if (self.run / "_ranks").exists() else []
            if folder.is_dir() and len(list(folder.glob("*.json"))) >= drivers and steps:
                return
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.2)
        raise AssertionError(f"{drivers} drivers not registered in {timeout} s")

    def stop(self) -> subprocess.CompletedProcess:
        self.stop_file.touch()
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0 and "Traceback" not in err, err
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def trace(run: Path, *args: str) -> tuple[dict, float]:
    t = time.monotonic()
    proc = run_cli("trace", str(run), *args, "--json", timeout=90)
    took = time.monotonic() - t
    assert "Traceback" not in proc.stderr, proc.stderr
    return {**json.loads(proc.stdout), "rc": proc.returncode, "stderr": proc.stderr}, took


def windows(run: Path, ask_id: str) -> dict[int, tuple[int, int, list[str], int]]:
    """Per rank: the asked window's (start, end), the step spans mostly inside it, the ops in it."""
    r = counterprof.load(run)
    out = {}
    for rank in r.ranks():
        t = r.table("spans", rank=rank).to_pandas()
        w = t[(t.category == "window") & t.name.str.contains(f"ask-{ask_id}", regex=False)]
        if w.empty:
            continue
        s, e = w.start.iloc[0].value, w.end.iloc[0].value
        st = t[t.category == "step"]
        inside = [n for n, a, b in zip(st.name, st.start, st.end)
                  if min(e, b.value) - max(s, a.value) >= 0.9 * (b.value - a.value)]
        ops = t[(t.category == "cpu_op") & (t.start.astype("int64") >= s) & (t.end.astype("int64") <= e)]
        out[rank] = (s, e, inside, len(ops))
    return out


def test_a_ddp_job_traces_the_same_steps_on_both_ranks_when_asked_twice(tmp_path):
    job = Job(tmp_path, "torchrun", "--nproc_per_node", "2", str(script(tmp_path, "ddp.py", DDP)))
    job.wait_for(2)
    time.sleep(2)
    first, took = trace(job.run, "--steps", "3")
    assert first["rc"] == 0, first
    answers = {a["rank"]: a for a in first["answers"]}
    assert sorted(answers) == [0, 1] and all(a["status"] == "traced" for a in answers.values()), answers
    a0 = first["start_step"]
    assert answers[0]["steps"] == answers[1]["steps"] == [a0, a0 + 2], answers
    assert took < 10, took
    time.sleep(1)
    second, _ = trace(job.run, "--steps", "3")
    b0 = second["start_step"]
    assert b0 > a0 + 2 and {a["rank"]: a["steps"] for a in second["answers"]} == {0: [b0, b0 + 2], 1: [b0, b0 + 2]}
    job.stop()
    for ask, s0 in ((first, a0), (second, b0)):
        w = windows(job.run, ask["id"])
        assert sorted(w) == [0, 1], w
        for rank, (_s, _e, steps, ops) in w.items():
            assert steps == [f"ProfilerStep#{n}" for n in range(s0, s0 + 3)], (rank, steps)
            assert ops > 10, (rank, ops)
        (s0_, e0, _, _), (s1_, e1, _, _) = w[0], w[1]
        assert min(e0, e1) - max(s0_, s1_) > 0.5 * min(e0 - s0_, e1 - s1_)      # the same steps, at once
    rep = run_cli("report", str(job.run), timeout=120)
    assert rep.returncode == 0 and "windows asked for (counterprof trace)" in rep.stdout, rep.stderr
    said = " ".join(rep.stdout.split())                    # (the console wraps long lines)
    assert f"for 3 steps from step {a0} (ask {first['id']}): rank 0 steps {a0}-{a0 + 2}; rank 1" in said
    # nothing of the asks is left in the processes: the same threads as before them, no file
    # beside the job's own
    for rank in (0, 1):
        doc = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert doc["threads_after"] == doc["threads_before"], doc
        assert set(doc["cwd"]) <= {"ddp.py", "run", "stop", "rank0.json", "rank1.json"}, doc["cwd"]


def test_a_rank_that_exited_is_named_and_the_other_traced(tmp_path):
    worker = script(tmp_path, "worker.py", WORKER)
    job = Job(tmp_path, sys.executable, str(script(tmp_path, "launch.py", LAUNCHER)), str(worker))
    job.wait_for(2)
    time.sleep(3)                                  # rank 1 lives 2 s
    got, _ = trace(job.run, "--steps", "2")
    by_rank = {a["rank"]: a for a in got["answers"]}
    assert by_rank[0]["status"] == "traced" and by_rank[0]["steps"][1] - by_rank[0]["steps"][0] == 1, by_rank
    assert by_rank[1]["status"] == "not reached" and "exited" in by_rank[1]["why"], by_rank
    text = run_cli("trace", str(job.run), "--steps", "1", timeout=60)
    assert "rank 1 (pid" in text.stdout and "not reached: exited before the ask" in text.stdout, text.stdout
    # the lines as README.md shows them
    assert re.search(r"^  rank 0 \(pid \d+\): traced steps (\d+)-\1, [\d.]+ [kM]?B: \S+\.ask-\S+\.pt\.trace\.json$",
                     text.stdout, re.M), text.stdout
    assert re.match(r"counterprof trace: asked 1 process\(es\) \(1 more had exited\) for 1 step\(s\) from step \d+ "
                    r"\(ask \S+\)", text.stderr), text.stderr
    # the live view's t asks the same (what `run --live` shows while the job runs)
    from counterprof.live.view import ASK_STEPS, LiveView
    from counterprof.store import control
    view = LiveView(None, title="t", run_path=str(job.run), catalog=dict, statuses=dict)
    view._key("t")
    assert view.warnings and view.warnings[-1].startswith(f"t: asked every process for {ASK_STEPS} steps")
    ask_id = control.asks(job.run)[-1]["id"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(a["rank"] == 0 for a in control.answers(job.run, ask_id)):
        time.sleep(0.2)
    (answer,) = [a for a in control.answers(job.run, ask_id) if a["rank"] == 0]
    assert answer["status"] == "traced" and answer["steps"][1] - answer["steps"][0] == ASK_STEPS - 1, answer
    assert (answer["seen_ns"] - control.asks(job.run)[-1]["asked_ns"]) / 1e9 < 2.0     # reached within 2 s
    job.stop()


def test_the_runs_of_one_job_on_two_hosts_trace_from_one_step(tmp_path):
    """Two runs (as COUNTERPROF_JOB gives each host its own), asked together: one step number."""
    worker = script(tmp_path, "worker.py", WORKER)
    jobs = []
    for name in ("host-a", "host-b"):
        (tmp_path / name).mkdir()
        jobs.append(Job(tmp_path / name, sys.executable, str(worker)))
        time.sleep(1.5)                            # the second starts later: fewer steps so far
    for job in jobs:
        job.wait_for(1)
    time.sleep(1)
    proc = run_cli("trace", str(jobs[0].run), str(jobs[1].run), "--steps", "2", "--json", timeout=60)
    got = json.loads(proc.stdout)
    assert proc.returncode == 0 and len(got["answers"]) == 2, proc.stderr
    first = got["start_step"]
    assert [a["steps"] for a in got["answers"]] == [[first, first + 1]] * 2, got["answers"]
    assert {a["run"] for a in got["answers"]} == {str(j.run) for j in jobs}
    for job in jobs:
        job.stop()


def test_a_loop_without_steps_gets_a_time_window(tmp_path):
    job = Job(tmp_path, sys.executable, str(script(tmp_path, "raw.py", RAW)))
    job.wait_for(1)
    got, took = trace(job.run, "--ms", "300")
    (a,) = got["answers"]
    assert a["status"] == "traced" and 250 <= a["ms"] <= 2000 and a["file"].endswith(".time.pt.trace.json"), a
    assert took < 10
    job.stop()
    w = windows(job.run, got["id"])
    assert w and w[0][3] > 10 and 0.25e9 <= w[0][1] - w[0][0] <= 2.5e9, w


def test_what_cannot_be_asked_is_refused(tmp_path):
    run = tmp_path / "run"
    job = subprocess.Popen([*COUNTERPROF, "run", "--torch", "-q", "-o", str(run), "--", "sleep", "20"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not (run / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc = run_cli("trace", str(run), "--steps", "3")
        assert proc.returncode == 2 and "no process of the job has counterprof's torch or jax driver" in proc.stderr
        assert "Python" in proc.stderr, proc.stderr
    finally:
        job.kill()
        job.wait()
    done = tmp_path / "done"
    assert run_cli("run", "-q", "-o", str(done), "--", "true").returncode == 0
    proc = run_cli("trace", str(done), "--ms", "10")
    assert proc.returncode == 2 and "its profiler is not running" in proc.stderr
    for args, words in ((["--steps", "0"], "--steps must be a positive"), ([], "one of the arguments --steps --ms"),
                        (["--steps", "1", "--ms", "3"], "not allowed with")):
        proc = run_cli("trace", str(done), *args)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    proc = run_cli("trace", str(tmp_path / "nope"), "--ms", "10")
    assert proc.returncode == 2 and "not a counterprof run" in proc.stderr


OPT = """
import os, sys, time, torch
m = torch.nn.Linear(128, 128)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(16, 128)
t = time.time()
while not os.path.exists(sys.argv[1]) and time.time() - t < 60:
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()
    time.sleep(0.005)
"""
KINETO_LAUNCHER = """
import subprocess, sys
procs = [subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]]) for _ in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def _daemon_name_free() -> bool:
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind(b"\0dynolog\0")
        return True
    except OSError:
        return False
    finally:
        s.close()


def plain_job(tmp_path: Path, argv: list[str], daemon: bool) -> subprocess.Popen:
    env = {**os.environ, **({"KINETO_USE_DAEMON": "1"} if daemon else {})}
    env.pop("KINETO_IPC_SOCKET_DIR", None)
    return subprocess.Popen([sys.executable, *argv], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.skipif(not _daemon_name_free(), reason="a Kineto daemon (dynolog) serves this host already")
def test_a_job_not_under_counterprof_is_traced_through_kinetos_daemon_mode(tmp_path):
    """Started with KINETO_USE_DAEMON=1 and no counterprof: `trace --pid` answers as the daemon;
    a launcher's pid reaches its two workers, each a rank of the run; a job without the daemon
    mode is named, with what to start it with."""
    stop = tmp_path / "stop"
    raw = plain_job(tmp_path, [str(script(tmp_path, "raw.py", RAW)), str(stop)], daemon=True)
    try:
        time.sleep(3)
        proc = run_cli("trace", "--pid", str(raw.pid), "--ms", "300", "-o", str(tmp_path / "one"), timeout=90)
        assert proc.returncode == 0 and f"pid {raw.pid}: traced 300 ms" in proc.stdout, (proc.stdout, proc.stderr)
        t = counterprof.load(tmp_path / "one").table("spans").to_pandas()
        w = t[t.category == "window"]
        assert len(w) == 1 and (t.category == "cpu_op").sum() > 10 and set(t.pid) == {raw.pid}
        assert 0.25e9 <= w.end.iloc[0].value - w.start.iloc[0].value <= 3e9
    finally:
        stop.touch()
        raw.wait(timeout=60)
    stop.unlink()
    launcher = plain_job(tmp_path, [str(script(tmp_path, "launch.py", KINETO_LAUNCHER)),
                                    str(script(tmp_path, "opt.py", OPT)), str(stop)], daemon=True)
    try:
        time.sleep(3)
        proc = run_cli("trace", "--pid", str(launcher.pid), "--steps", "2", "-o", str(tmp_path / "two"), timeout=90)
        assert proc.returncode == 0 and proc.stdout.count("traced 2 step(s)") == 2, (proc.stdout, proc.stderr)
        run = counterprof.load(tmp_path / "two")
        assert run.ranks() == [0, 1]
        pids = {k: set(run.table("spans", rank=k).to_pandas().pid) for k in (0, 1)}
        assert len(pids[0] | pids[1]) == 2 and launcher.pid not in pids[0] | pids[1], pids
    finally:
        stop.touch()
        launcher.wait(timeout=60)
    stop.unlink()
    os.environ["SLURM_JOB_ID"] = "4242"                # a Slurm job's processes, by its id
    try:
        slurm = plain_job(tmp_path, [str(script(tmp_path, "raw.py", RAW)), str(stop)], daemon=True)
    finally:
        del os.environ["SLURM_JOB_ID"]
    try:
        time.sleep(3)
        proc = run_cli("trace", "--job", "4242", "--ms", "200", "-o", str(tmp_path / "job"), timeout=90)
        assert proc.returncode == 0 and f"pid {slurm.pid}: traced 200 ms" in proc.stdout, (proc.stdout, proc.stderr)
    finally:
        stop.touch()
        slurm.wait(timeout=60)
    stop.unlink()
    plain = plain_job(tmp_path, [str(script(tmp_path, "raw.py", RAW)), str(stop)], daemon=False)
    try:
        proc = run_cli("trace", "--pid", str(plain.pid), "--ms", "100", "-o", str(tmp_path / "none"),
                       "--timeout", "7", timeout=60)
        assert proc.returncode == 1 and "never asked Kineto's daemon (start it with KINETO_USE_DAEMON=1" \
            in proc.stdout, proc.stdout
        assert not (tmp_path / "none").exists()
    finally:
        stop.touch()
        plain.wait(timeout=60)
    for args, words in ((["--pid", "1", "--ms", "5"], "need -o RUN"), (["--pid", "999999999", "--ms", "5", "-o",
                                                                          str(tmp_path / "x")], "no such process")):
        proc = run_cli("trace", *args)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr


JAX_LOOP = """
import os, sys, time
import jax, jax.numpy as jnp
f = jax.jit(lambda a: a @ a)
a = jnp.ones((128, 128))
i, t = 0, time.time()
while not os.path.exists(sys.argv[1]) and time.time() - t < 90:
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        f(a).block_until_ready()
    i += 1
    time.sleep(0.01)
"""


def test_a_jax_job_traces_its_next_steps_when_asked(tmp_path):
    pytest.importorskip("jax")
    job = JaxJob(tmp_path)
    job.wait_for(1)
    time.sleep(1)
    got, took = trace(job.run, "--steps", "2")
    (a,) = got["answers"]
    first = got["start_step"]
    assert a["status"] == "traced" and a["steps"] == [first, first + 1] and ".ask-" in a["file"], got
    assert took < 15
    job.stop()
    w = windows(job.run, got["id"])
    assert w, "no asked window in the run"
    r = counterprof.load(job.run)
    t = r.table("spans").to_pandas()
    (s, e) = next((v[0], v[1]) for v in w.values())
    xla = t[(t.category == "xla_op") & (t.start.astype("int64") >= s) & (t.end.astype("int64") <= e)]
    assert len(xla) > 0


class JaxJob(Job):
    def __init__(self, tmp_path: Path):
        self.run, self.stop_file = tmp_path / "run", tmp_path / "stop"
        loop = script(tmp_path, "loop.py", JAX_LOOP)
        self.proc = subprocess.Popen([*COUNTERPROF, "run", "--jax", "-q", "-o", str(self.run), "--", sys.executable,
                                      str(loop), str(self.stop_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=tmp_path,
                                     env={**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"})
