"""A run directory is a trust boundary: symbolic links planted in one (a run copied from someone
else, a tarball, a shared filesystem) are never followed. Every command over a run with each
kind of planted link leaves the link's target untouched, exits cleanly (no traceback), and a
reader names the link it skipped; `--force` refuses to replace a run holding one."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from counterprof.store import rundir
from counterprof.store.journal import JournalWriter
from helpers import PYTHON, journal_dir, rank_files, run_cli, table_dir, table_files, traces_dir
from kineto_traces import X, write_trace

pytestmark = pytest.mark.slow

WORK = ("import time, counterprof\n"
        "for _ in range(3):\n"
        "    with counterprof.region('step'):\n"
        "        t = time.perf_counter()\n"
        "        while time.perf_counter() - t < 0.05: pass\n")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """One real finished run (counterprof run of a Python workload with regions)."""
    root = tmp_path_factory.mktemp("base")
    run = root / "run"
    run_cli("run", "-q", "--collectors", "host,perf", "-o", str(run), "--", PYTHON, "-c", WORK,
            check=True)
    return run


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _killed(run: Path) -> None:
    """Make the run look like one whose profiler was SIGKILLed (readers recover it)."""
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "running"
    meta.setdefault("profiler", {})["pid"] = _dead_pid()
    rundir.write_json(run / "meta.json", meta)


def _segment_in(folder: Path, writer: str) -> None:
    """A real journal segment (one samples batch) of a dead writer, in folder/journal/."""
    from counterprof.ground.schema import TABLES
    schema = TABLES["samples"]
    row = {f.name: [None] for f in schema}
    row.update(time=[1], metric=["victim-metric"], source=["host"], entity=["x"], value=[7.0],
               duration_ns=[1])
    batch = pa.RecordBatch.from_pydict(row, schema=schema)
    w = JournalWriter(folder, writer)
    w.write("samples", batch)
    w.close()


def _victims(tmp: Path, base: Path) -> dict[str, Path]:
    """What the planted links point at: a folder holding files someone else owns (one of them a
    readable samples file, so a reader that follows the link would count its rows), a journal
    folder with a real segment, and a copy of /etc/passwd (never the real one: we run as root)."""
    v = tmp / "victim"
    v.mkdir()
    (v / "precious.txt").write_text("not counterprof's\n")
    shutil.copy(table_files(base, "samples")[0], v / "samples-v.parquet")
    vj = tmp / "victim-journal-owner"
    vj.mkdir()
    _segment_in(vj, f"{_dead_pid()}-victim")
    passwd = tmp / "passwd"
    passwd.write_text(Path("/etc/passwd").read_text())
    dataset = tmp / "victim-dataset"           # someone's samples dataset
    shutil.copytree(base / "samples", dataset)
    return {"dir": v, "journal": vj / rundir.JOURNAL, "passwd": passwd, "dataset": dataset}


def _snapshot(paths) -> dict[str, tuple]:
    out = {}
    for root in paths:
        root = Path(root)
        for p in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            st = p.lstat()
            out[str(p)] = (st.st_mode, st.st_mtime_ns, st.st_size,
                           p.read_bytes() if p.is_file() else None)
    return out


TRACE = "h_4242.1.pt.trace.json"


def _plant(kind: str, run: Path, victims: dict[str, Path]) -> Path:
    """Plant one kind of link; returns the link."""
    if kind == "table folder":
        shutil.rmtree(run / "samples")
        link = run / "samples"
        link.symlink_to(victims["dataset"])
    elif kind == "partition":
        link = run / "samples" / "rank=7"
        link.symlink_to(victims["dir"])
    elif kind == "rank folder":
        link = run / rundir.RANKS / "rank=7"
        link.symlink_to(victims["dir"])
    elif kind == "older-layout rank":
        link = run / "rank=7"
        link.symlink_to(victims["dir"])
    elif kind == "journal":
        _killed(run)
        link = journal_dir(run)
        assert not link.exists()
        link.symlink_to(victims["journal"])
    elif kind == "trace claim":
        _killed(run)
        traces_dir(run).mkdir(parents=True, exist_ok=True)
        write_trace(traces_dir(run) / TRACE, [X("cpu_op", "aten::mm", 1000, 50, pid=4242, tid=4242)],
                    {"schemaVersion": 1})
        link = traces_dir(run) / f".{TRACE}.claim"
        link.symlink_to(victims["dir"] / "precious.txt")
    elif kind == "steps claim":
        _killed(run)
        traces_dir(run).mkdir(parents=True, exist_ok=True)
        (traces_dir(run) / "h_4242.steps").write_text("counterprof-steps\n")
        link = traces_dir(run) / ".h_4242.steps.claim"
        link.symlink_to(victims["dir"] / "precious.txt")
    elif kind == "parquet file":
        link = table_dir(run, "samples", 0) / "samples-evil.parquet"
        link.symlink_to(victims["passwd"])
        (table_dir(run, "samples", 0) / "samples-v.parquet").symlink_to(victims["dir"] / "samples-v.parquet")
    elif kind == "catalog":
        (run / "catalog.json").rename(run / "catalog.real")
        link = run / "catalog.json"
        link.symlink_to(victims["dir"] / "precious.txt")
    else:
        raise AssertionError(kind)
    return link


KINDS = ["table folder", "partition", "rank folder", "older-layout rank", "journal", "trace claim", "steps claim",
         "parquet file", "catalog"]


def _clean(proc: subprocess.CompletedProcess, what: str, codes=(0,)) -> None:
    assert "Traceback" not in proc.stderr, f"{what}:\n{proc.stderr}"
    assert proc.returncode in codes, f"{what} -> {proc.returncode}:\n{proc.stderr}"


def _rows(report_json: str) -> dict:
    return {(r.get("source"), r.get("metric") or r.get("name")): r.get("value")
            for r in json.loads(report_json)["summary"]["rows"]}


@pytest.mark.parametrize("kind", KINDS)
def test_every_command_over_a_run_with_a_planted_link(tmp_path, base_run, kind):
    victims = _victims(tmp_path, base_run)
    run = tmp_path / "run"
    shutil.copytree(base_run, run, symlinks=True)
    clean = tmp_path / "clean"
    shutil.copytree(base_run, clean, symlinks=True)
    link = _plant(kind, run, victims)
    before = _snapshot(victims.values())
    linked_parquet = kind in ("partition", "rank folder", "older-layout rank", "parquet file")

    # without its samples folder (a link, skipped) a run may have nothing left to judge: exit 1
    # with one line saying so is clean too
    judged = (0, 1) if kind == "table folder" else (0,)
    rep = run_cli("report", "--json", str(run))
    _clean(rep, "report --json", codes=judged)
    assert str(link) in rep.stderr and "symbolic link" in rep.stderr, rep.stderr
    if linked_parquet:     # the victim's rows are not the run's
        assert _rows(rep.stdout) == _rows(run_cli("report", "--json", str(clean), check=True).stdout)
    _clean(run_cli("report", str(run), "--html", str(tmp_path / "r.html")), "report --html", codes=judged)
    _clean(run_cli("export", str(run), "--perfetto", str(tmp_path / "t.json")), "export")
    _clean(run_cli("compare", str(clean), str(run)), "compare", codes=(0, 2) if kind == "table folder" else (0,))
    _clean(run_cli("history", "add", str(run), "--db", str(tmp_path / "h.duckdb")), "history add")
    _clean(run_cli("recover", str(run)), "recover")
    _clean(run_cli("breakdown", str(run)), "breakdown", codes=(0, 1))
    merged = tmp_path / "merged"
    _clean(run_cli("merge", str(run), "-o", str(merged)), "merge")
    for p in merged.rglob("*"):
        assert not p.is_symlink(), p
        if p.is_file():
            assert p.read_bytes() != victims["passwd"].read_bytes(), p
            assert p.read_bytes() != (victims["dir"] / "samples-v.parquet").read_bytes() or \
                p.name != "samples-v.parquet", p
    assert not (merged / "samples" / "rank=7").exists() and not (merged / rundir.RANKS / "rank=7").exists()

    # --force replaces only what is counterprof's: a run holding a link is refused, whole
    for force in (["run", "-q", "--force", "-o", str(run), "--", "true"],
                  ["import", "--force", "-o", str(run), str(tmp_path / "none.json")]):
        if force[0] == "import":
            write_trace(tmp_path / "none.json", [X("cpu_op", "aten::mm", 1000, 50)], {"schemaVersion": 1})
        proc = run_cli(*force)
        _clean(proc, force[0] + " --force", codes=(1,))
        assert "symbolic link" in proc.stderr and "nothing was replaced" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
        assert link.is_symlink()
    assert _snapshot(victims.values()) == before, "a link's target was changed"


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path, base_run):
    """The names counterprof writes before a rename (meta.json.<pid>.tmp, a compaction's
    .<file>.tmp, a claim) are created exclusively: a link there is never opened for writing."""
    from counterprof.store import safepath
    from counterprof.store.compact import compact_rank
    victim = tmp_path / "victim.txt"
    victim.write_text("x")
    run = tmp_path / "run"
    shutil.copytree(base_run, run, symlinks=True)
    tmp = run / f"meta.json.{os.getpid()}.tmp"
    tmp.symlink_to(victim)
    rundir.write_json(run / "meta.json", json.loads((run / "meta.json").read_text()))
    assert not tmp.exists() and not tmp.is_symlink()
    _segment_in(rank_files(run, 0), f"{_dead_pid()}-w")
    writer = next(p.name.split("~")[1] for p in journal_dir(run).iterdir())
    staging = table_dir(run, "samples", 0) / f".samples-{writer}.parquet.tmp"
    staging.symlink_to(victim)
    compact_rank(rank_files(run, 0))
    assert (table_dir(run, "samples", 0) / f"samples-{writer}.parquet").is_file()
    planted = run / "planted"
    planted.symlink_to(victim)
    with pytest.raises(safepath.LinkInRun):
        safepath.create_new(planted)
    assert victim.read_text() == "x"


def test_a_run_whose_meta_json_is_a_link_is_not_read(tmp_path, base_run):
    run = tmp_path / "run"
    shutil.copytree(base_run, run, symlinks=True)
    (run / "meta.json").rename(tmp_path / "elsewhere.json")
    (run / "meta.json").symlink_to(tmp_path / "elsewhere.json")
    proc = run_cli("report", str(run))
    _clean(proc, "report", codes=(1,))
    assert "meta.json is a symbolic link" in proc.stderr
