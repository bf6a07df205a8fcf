"""Faults of the machine (issue 12, items 11 and 13): a run the user may not read, a disk that
fills. Each is one line that names the file or directory and what was kept; the workload's exit
status always comes back and is recorded; no temporary is left to block a rerun."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import COUNTERPROF, PYTHON, run_cli
from hostile.cases import BURN, Pristine, fill_disk, finished_run, run_case, unreadable_cases

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Pristine:
    root = tmp_path_factory.mktemp("pristine")
    return Pristine(finished_run(root / "finished"), root / "none")


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs root and setpriv to read a run as nobody")
@pytest.mark.parametrize("name", ["report", "export", "history", "breakdown", "recover", "compare"])
def test_a_run_the_user_cannot_read_is_one_line_and_compare_exits_2(runs, tmp_path, name):
    tmp_path.chmod(0o755)
    for parent in tmp_path.parents:         # nobody must reach the case's folder
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    case = next(c for c in unreadable_cases(runs) if c.name == f"dir-{name}")
    res = run_case(case, tmp_path)
    assert res.ok, f"{case.name}: {res.problems}\n{res.stderr[-1500:]}"


def test_os_errors_become_one_line_naming_the_file():
    from counterprof.ground.errors import DiskFull, os_error
    e = os_error(PermissionError(errno.EACCES, "Permission denied"), "/r/meta.json", "read")
    assert str(e).startswith("/r/meta.json: permission denied (read")
    full = os_error(OSError(errno.ENOSPC, "No space left on device"), "/r/samples/x.parquet",
                    "compacting", kept="every segment")
    assert isinstance(full, DiskFull) and "/r/samples: no space left" in str(full)
    assert "kept every segment" in str(full)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs, where this test may mount one (root, not in a user namespace that forbids it)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount permission)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_disk_that_fills_during_a_run_keeps_the_workloads_exit_status(small_disk):
    run = small_disk / "r"
    # 600 KB left: a 6 s run at -I 1 journals more than that (about 1.3 MB), however few
    # collectors sample as finely as the counters
    st = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - 600 * 1024))
    proc = subprocess.run([*COUNTERPROF, "run", "-o", str(run), "-I", "1", "--", "sh", "-c",
                           f"{PYTHON} -c '{BURN.format(s=6)}'; exit 5"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert meta["workload"]["exit_code"] == 5
    assert "no space left on the device" in proc.stderr
    full = [ln for ln in proc.stderr.splitlines() if "no space left" in ln]
    assert all(str(run) in ln or " r:" in ln or ln.startswith("counterprof: r") for ln in full), full
    rep = run_cli("report", str(run))
    assert "Traceback" not in rep.stderr and rep.returncode in (0, 1), rep.stderr
    if meta.get("journal_failed"):
        rec = json.loads((run / "meta.json").read_text())
        said = " ".join(rec.get("warnings", []))
        assert "at most the last second" not in said or rec["status"] == "complete"


def test_import_export_report_history_on_a_full_disk_leave_no_temporaries(runs, small_disk):
    from kineto_traces import X, write_trace
    trace = write_trace(small_disk.parent / "t.json",
                        [X("cpu_op", f"aten::op{i}", 1000 + i * 10, 5) for i in range(3000)],
                        {"distributedInfo": {"rank": 0}})
    shutil.copytree(runs.finished, small_disk / "ok")
    fill_disk(small_disk)
    for argv in (["import", str(trace), "-o", str(small_disk / "imp")],
                 ["export", str(small_disk / "ok"), "--perfetto", str(small_disk / "x.json")],
                 ["report", str(small_disk / "ok"), "--html", str(small_disk / "x.html")],
                 ["history", "add", "--db", str(small_disk / "h.duckdb"), str(small_disk / "ok")]):
        p = run_cli(*argv)
        assert "Traceback" not in p.stderr, (argv, p.stderr[-2000:])
        left = sorted(f.name for f in small_disk.rglob("*") if f.name.endswith(".tmp")
                      or (f.name in ("x.json", "x.html", "h.duckdb") and f.stat().st_size == 0))
        assert not left, (argv, left)
        if p.returncode != 0:
            assert "no space left" in p.stderr.lower() or "space" in p.stderr, (argv, p.stderr)
    (small_disk / "filler").unlink()
    again = run_cli("import", str(trace), "-o", str(small_disk / "imp"))
    assert again.returncode == 0, again.stderr


def test_recover_and_report_of_a_killed_run_on_a_full_disk(tmp_path, small_disk):
    from hostile.cases import killed_run
    src = killed_run(tmp_path / "killed")
    run = small_disk / "k"
    shutil.copytree(src, run)
    fill_disk(small_disk)
    rec = run_cli("recover", str(run))
    assert rec.returncode == 1 and "Traceback" not in rec.stderr, rec.stderr
    assert "no space left on the device" in rec.stderr and "kept every journal segment" in rec.stderr
    assert not [f for f in run.rglob("*.tmp")]
    rep = run_cli("report", str(run))
    assert rep.returncode == 0, rep.stderr
    assert "read without recovering it" in rep.stderr
    (small_disk / "filler").unlink()
    rec = run_cli("recover", str(run))
    assert rec.returncode == 0, rec.stderr
    assert json.loads((run / "meta.json").read_text())["status"] == "recovered"
