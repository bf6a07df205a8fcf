"""Issue 30, items 3-6 and the empty path, through real runs and real processes: a Parquet file
in the wrong table's folder is named and left out by every reader (export holds the run's own
spans only, merge does not copy it, history add and report exit 0); meta.json numbers no run
can hold (start_ns 10**400) are one line naming the field, and merge makes no output; `import`
names and leaves out negative durations; `profile(path="")` and `Session("")` are refused and
write nothing; under real `ulimit -v` limits the readers work at 1 and 2 GB, stop with one line
below what they need, and where memory runs out anyway say so in one line. The classes in full:
`python tests/hostile/run.py --only misplaced --only range --only import --only memory`."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import COUNTERPROF, PYTHON
from hostile.files_memory import SPANS_IN_RUN, export_spans, plant, regions_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """`counterprof run -q -o DIR -- python -c ...`: samples and 20 region spans."""
    run = regions_run(tmp_path_factory.mktemp("real") / "run")
    assert sorted((run / "spans" / "rank=0").glob("spans-*.parquet"))
    assert sorted((run / "samples" / "rank=0").glob("samples-*.parquet"))
    return run


def cli(*args: str, cwd: Path, limit_kb: int | None = None, env: dict | None = None):
    cmd = [*COUNTERPROF, *args]
    if limit_kb is not None:
        cmd = ["bash", "-c", f"ulimit -v {limit_kb}; exec {shlex.join(cmd)}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=cwd,
                          env={**os.environ, **(env or {})})


def copy(run: Path, dst: Path) -> Path:
    return Path(shutil.copytree(run, dst, symlinks=True))


def clean(p: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in p.stderr, p.stderr


# -- 4. a Parquet file in the wrong table's folder ---------------------------------------------

@pytest.mark.parametrize("what,says", [("samples-in-spans", "is not a spans file"),
                                       ("spans-in-samples", "is not a samples file")])
def test_misplaced_file_is_named_and_left_out_by_every_reader(real_run, tmp_path, what, says):
    run = copy(real_run, tmp_path / "run")
    planted = plant(run, what)

    out = tmp_path / "out.json"
    p = cli("export", str(run), "--perfetto", str(out), cwd=tmp_path)
    clean(p)
    assert p.returncode == 0, p.stderr
    assert str(planted) in p.stderr and says in p.stderr
    assert export_spans(out) == SPANS_IN_RUN         # no bogus spans (before: 660 of a samples file)

    p = cli("history", "add", "--db", str(tmp_path / "h.duckdb"), str(run), cwd=tmp_path)
    clean(p)
    assert p.returncode == 0, p.stderr
    assert str(planted) in p.stderr and "added as run 1" in p.stderr

    p = cli("report", "--json", str(run), cwd=tmp_path)
    clean(p)
    assert p.returncode == 0, p.stderr
    assert str(planted) in p.stderr
    assert "clock that jumped" not in p.stderr       # not blamed on damaged bytes or the clock
    json.loads(p.stdout)

    p = cli("merge", str(run), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    clean(p)
    assert p.returncode == 0, p.stderr
    assert str(planted) in p.stderr
    assert not list((tmp_path / "merged").rglob("*planted*"))
    # the merged run reads clean: the file was not carried along
    p = cli("export", str(tmp_path / "merged"), "--perfetto", str(tmp_path / "m.json"), cwd=tmp_path)
    assert p.returncode == 0 and "is not a" not in p.stderr, p.stderr
    assert export_spans(tmp_path / "m.json") == SPANS_IN_RUN

    assert planted.exists()                          # named and left out: never deleted


def test_a_file_with_a_wrong_column_type_is_named(real_run, tmp_path):
    """The table's columns, but one of another type (a start stored as text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    run = copy(real_run, tmp_path / "run")
    src = sorted((run / "spans" / "rank=0").glob("spans-*.parquet"))[0]
    t = pq.read_table(src)
    t = t.set_column(0, "start", pa.array([str(v) for v in t["start"].to_pylist()]))
    bad = src.with_name("spans-typed.parquet")
    pq.write_table(t, bad)
    p = cli("export", str(run), "--perfetto", str(tmp_path / "o.json"), cwd=tmp_path)
    clean(p)
    assert p.returncode == 0
    assert f"{bad} is not a spans file (its start column holds strings, not times)" in p.stderr
    assert export_spans(tmp_path / "o.json") == SPANS_IN_RUN


# -- 5. meta.json numbers out of range ---------------------------------------------------------

@pytest.mark.parametrize("verb", ["report", "export", "history", "merge", "compare", "recover"])
def test_start_ns_10e400_is_one_line_naming_the_field(real_run, tmp_path, verb):
    run = copy(real_run, tmp_path / "run")
    meta = json.loads((run / "meta.json").read_text())
    meta["start_ns"] = 10**400
    (run / "meta.json").write_text(json.dumps(meta))
    args = {"report": ["report", str(run)],
            "export": ["export", str(run), "--perfetto", str(tmp_path / "o.json")],
            "history": ["history", "add", "--db", str(tmp_path / "h.duckdb"), str(run)],
            "merge": ["merge", str(run), "-o", str(tmp_path / "merged")],
            "compare": ["compare", str(real_run), str(run)],
            "recover": ["recover", str(run)]}[verb]
    p = cli(*args, cwd=tmp_path)
    clean(p)
    assert p.returncode == (2 if verb == "compare" else 1), p.stderr
    line = [ln for ln in p.stderr.splitlines() if "meta.json" in ln]
    assert line and "start_ns is a number of 1329 bits, not a time" in line[0], p.stderr
    assert not (tmp_path / "merged").exists()        # merge refuses before it makes -o
    assert not (tmp_path / "o.json").exists()


# -- 6. negative durations in an imported trace ------------------------------------------------

def test_import_names_and_leaves_out_negative_durations(tmp_path):
    def ev(ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": [
        ev(1000, 5), ev(2000, -50), ev(3000, -1e9), ev(4000, 7)]}))
    p = cli("import", str(tmp_path / "t.json"), "-o", str(tmp_path / "imp"), cwd=tmp_path)
    clean(p)
    assert p.returncode == 0
    assert "2 complete event(s) (ph X) left out: their dur is negative" in p.stderr
    import pyarrow.dataset as ds
    t = ds.dataset(str(tmp_path / "imp" / "spans"), partitioning="hive").to_table()
    ops = [r for r in t.to_pylist() if r["name"] == "aten::mm"]
    assert len(ops) == 2
    assert all(r["end"] >= r["start"] for r in t.to_pylist())


# -- the empty path in the Python API -----------------------------------------------------------

def test_profile_and_session_refuse_an_empty_path(tmp_path):
    code = """
import counterprof
from counterprof.ground.errors import UsageError
from counterprof.session import Session
for make in (lambda: counterprof.profile(path="").__enter__(), lambda: Session(""),
             lambda: Session(b"")):
    try:
        make()
    except UsageError as exc:
        assert 'path "" was given' in str(exc), exc
    else:
        raise SystemExit("not refused")
print("refused")
"""
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and "refused" in p.stdout, p.stderr
    assert list(tmp_path.iterdir()) == []            # nothing written into the current directory


# -- 3. memory limits ---------------------------------------------------------------------------

READERS = {"report": lambda r, w: ["report", str(r)],
           "export": lambda r, w: ["export", str(r), "--perfetto", str(w / "o.json")],
           "history": lambda r, w: ["history", "add", "--db", str(w / "h.duckdb"), str(r)],
           "merge": lambda r, w: ["merge", str(r), "-o", str(w / "merged")]}


@pytest.mark.parametrize("limit_kb", [1_000_000, 2_000_000])
@pytest.mark.parametrize("verb", list(READERS))
def test_readers_work_under_a_batch_jobs_address_space_limit(real_run, tmp_path, verb, limit_kb):
    """Before: at 1 GB `report` raised MemoryError inside its error handler, at 1.5-2 GB DuckDB
    aborted (exit 127, `cannot allocate memory for thread-local data`)."""
    p = cli(*READERS[verb](real_run, tmp_path), cwd=tmp_path, limit_kb=limit_kb)
    clean(p)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("verb", list(READERS))
def test_a_limit_too_small_is_one_line_saying_what_to_do(real_run, tmp_path, verb):
    p = cli(*READERS[verb](real_run, tmp_path), cwd=tmp_path, limit_kb=200_000)
    clean(p)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "address-space limit of 195 MB (ulimit -v 200000)" in lines[0]
    assert "raise it to at least 600 MB (ulimit -v 614400)" in lines[0]
    assert not (tmp_path / "merged").exists() and not (tmp_path / "h.duckdb").exists()


@pytest.mark.parametrize("limit_kb", [150_000, 300_000])
@pytest.mark.parametrize("verb", list(READERS))
def test_memory_running_out_anyway_is_one_line(real_run, tmp_path, verb, limit_kb):
    """The start-up refusal lowered (COUNTERPROF_MIN_AS_MB): memory runs out inside numpy,
    pyarrow or DuckDB (a library that cannot be mapped, an allocation, a thread that cannot
    start): the line built at start-up, exit 1; never a file called damaged."""
    p = cli(*READERS[verb](real_run, tmp_path), cwd=tmp_path, limit_kb=limit_kb,
            env={"COUNTERPROF_MIN_AS_MB": "1"})
    clean(p)
    assert p.returncode in (0, 1), p.stderr
    assert "unreadable" not in p.stderr and "not a usable DuckDB file" not in p.stderr, p.stderr
    if p.returncode == 1:
        assert p.stderr.strip().splitlines() == [
            f"counterprof: out of memory under the address-space limit of {limit_kb // 1024} MB "
            f"(ulimit -v {limit_kb}): this run needs more: raise it (ulimit -v {2 * limit_kb} doubles "
            "it), or read the run where no such limit is set"], p.stderr


def test_run_under_60_MB_is_one_line(tmp_path):
    p = cli("run", "-q", "-o", str(tmp_path / "new"), "--", "true", cwd=tmp_path, limit_kb=60_000)
    clean(p)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "counterprof: out of memory under the address-space limit of 58 MB (ulimit -v 60000): "
        "raise it to at least 600 MB (ulimit -v 614400) for a small run, more for a large one"]
