"""`counterprof merge` refuses an output inside, equal to or containing one of its inputs, before
it writes anything: a copy into its own input never ends (each copied rank directory holds the
copy being made), and --force on an input would delete it. The runs are real: two single-rank
`counterprof.profile()` runs stand in for two hosts of one job (as in test_multirank)."""
import json
import os
import subprocess

import pytest

import counterprof
from helpers import PYTHON, run_cli, rank_files


def _snapshot(root):
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    base = tmp_path_factory.mktemp("merge")
    parts = []
    for rank in (0, 1):
        run_dir = base / "job" / f"host{rank}"
        script = (f"import counterprof, time\n"
                  f"with counterprof.profile(events='task-clock', interval_ms=10, path={str(run_dir)!r}):\n"
                  f"    end = time.time() + 0.2\n"
                  f"    while time.time() < end: pass\n")
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", COUNTERPROF_JOB=f"node{rank}")
        p = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        parts.append(run_dir)
    return base, parts


@pytest.mark.parametrize("where, what", [
    ("{a}/rank=0/x", "is inside the input run"),      # the reviewer's case: endless recursion
    ("{b}/sub", "is inside the input run"),
    ("{a}", "is the input run"),
    ("{job}", "contains the input run"),
])
@pytest.mark.parametrize("force", [False, True])
def test_an_output_inside_an_input_is_refused_before_anything_is_written(hosts, where, what, force):
    base, (a, b) = hosts
    out = where.format(a=a, b=b, job=base / "job")
    before = _snapshot(base)
    proc = run_cli("merge", str(a), str(b), "-o", out, *(["--force"] if force else []), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert what in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("counterprof:") == 1
    assert _snapshot(base) == before                    # nothing copied, nothing replaced
    for run in (a, b):
        assert counterprof.load(run).meta["status"] == "complete"


def test_an_output_through_a_symlink_into_an_input_is_refused(hosts, tmp_path):
    base, (a, b) = hosts
    (tmp_path / "link").symlink_to(a)
    before = _snapshot(base)
    proc = run_cli("merge", str(a), str(b), "-o", str(tmp_path / "link" / "merged"), timeout=60)
    assert proc.returncode == 2 and "is inside the input run" in proc.stderr, proc.stderr
    assert _snapshot(base) == before


def test_an_output_beside_the_inputs_is_merged(hosts, tmp_path):
    _, (a, b) = hosts
    out = tmp_path / "merged"
    proc = run_cli("merge", str(a), str(b), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    run = counterprof.load(out)
    assert run.ranks() == [0, 1]
    assert json.loads((rank_files(out, 1) / "meta.json").read_text())["merged_from"] == str(b)


def test_the_merged_run_starts_with_its_earliest_input_whatever_the_order(hosts, tmp_path):
    _, (a, b) = hosts                      # host0's run started before host1's
    out = tmp_path / "later-first"
    proc = run_cli("merge", str(b), str(a), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    metas = [json.loads((x / "meta.json").read_text()) for x in (a, b)]
    merged = json.loads((out / "meta.json").read_text())
    assert merged["start_ns"] == min(m["start_ns"] for m in metas) < max(m["start_ns"] for m in metas)
    assert merged["end_ns"] == max(m["end_ns"] for m in metas)
    assert merged["duration_ns"] == merged["end_ns"] - merged["start_ns"]
    times = counterprof.load(out).samples()["time"].cast("int64").to_numpy()
    assert times.min() >= merged["start_ns"]          # nothing before time 0: no negative times
