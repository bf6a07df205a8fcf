"""`counterprof history`: real runs added to a DuckDB file (git revision from the run's working
directory, host from meta.json), trends with change points on a synthetic nightly series, and
the HTML page in a real headless browser."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from browser import CHROMIUM, SKIP_REASON, check_layout, layout, render
from helpers import PYTHON, REPO, run_cli

duckdb = pytest.importorskip("duckdb")

WORKLOAD = str(REPO / "tests" / "step_workloads.py")


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_add_and_show_real_runs_with_their_git_revision(tmp_path):
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "README").write_text("x\n")
    git(repo, "add", "README")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init")
    head = git(repo, "rev-parse", "HEAD")
    db = tmp_path / "perf.duckdb"
    for name, extra in (("night1", "0"), ("night2", "20")):
        env = dict(os.environ, COUNTERPROF_TEST_EXTRA_MS=extra)
        proc = run_cli("run", "-q", "-I", "10", "-o", str(tmp_path / name), "--", PYTHON, WORKLOAD,
                       "steps", "20", "5", "20", cwd=repo, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    # the checkout moves on before the runs are added: night1 keeps the revision it recorded
    # when it started; night2 stands for a run from before counterprof recorded one
    (repo / "README").write_text("y\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "next")
    head2 = git(repo, "rev-parse", "HEAD")
    assert head2 != head
    for name, edit in (("night1", lambda m: m.update(git_revision=head)),
                       ("night2", lambda m: m.pop("git_revision", None))):
        meta_path = tmp_path / name / "meta.json"
        meta = json.loads(meta_path.read_text())
        edit(meta)
        meta_path.write_text(json.dumps(meta))
    add = run_cli("history", "add", str(tmp_path / "night1"), str(tmp_path / "night2"), "--db", str(db))
    assert add.returncode == 0, add.stderr
    assert "added as run 1" in add.stderr and "added as run 2" in add.stderr
    assert f"git {head[:12]}" in add.stderr and f"git {head2[:12]}" in add.stderr
    (note,) = [x for x in add.stderr.splitlines() if "no git revision recorded" in x]
    assert "night2" in note and f"using the checkout's HEAD now, {head2}" in note
    again = run_cli("history", "add", str(tmp_path / "night1"), "--db", str(db))
    assert again.returncode == 0 and "already in" in again.stderr

    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT seq, run_id, git_rev, host, command, ranks, verdict FROM runs ORDER BY seq").fetchall()
    meta = json.loads((tmp_path / "night1" / "meta.json").read_text())
    assert [r[1] for r in runs] == ["night1", "night2"]
    assert [r[2] for r in runs] == [head, head2] and {r[3] for r in runs} == {meta["host"]["hostname"]}
    assert json.loads(runs[0][4]) == meta["command"] and runs[0][5] == 1 and runs[0][6]
    series = {r[0] for r in con.execute("SELECT series FROM figures").fetchall()}
    assert {"wall_time", "step_time", "region:compute", "region:io", "metric:task-clock",
            "signal:cpu_busy", "signal:cpu_busy@step_time"} <= series
    steps = con.execute("SELECT value, n, verdict FROM figures WHERE series = 'step_time' ORDER BY seq").fetchall()
    con.close()
    assert 0.024 < steps[0][0] < 0.060 and steps[0][1] == 20 and steps[0][2]    # 5 ms spin + 20 ms sleep
    assert steps[1][0] > steps[0][0] + 0.015                                     # + 20 ms

    show = run_cli("history", "show", "--db", str(db), "--metric", "step_time", "--json")
    assert show.returncode == 0, show.stderr
    (s,) = json.loads(show.stdout)["series"]
    assert [p["run_id"] for p in s["points"]] == ["night1", "night2"] and s["points"][0]["git_rev"] == head
    assert s["change_points"] == []                 # two runs: too few to call a change
    text = run_cli("history", "show", "--db", str(db))
    assert text.returncode == 0 and "step_time" in text.stdout and "region:io" in text.stdout
    assert "metric:task-clock" not in text.stdout   # metrics on request: --metric 'metric:*'
    hidden = sorted(x for x in series if x.startswith("metric:") or "@" in x)
    metrics = sum(x.startswith("metric:") for x in hidden)
    last = text.stdout.splitlines()[-1]             # the default says what it leaves out
    assert last == (f"{len(hidden)} more series not shown ({metrics} metric:*, {len(hidden) - metrics} per step "
                    f"or region, NAME@SCOPE): --metric '*' shows them")
    listed = json.loads(run_cli("history", "show", "--db", str(db), "--json").stdout)["not_shown"]
    assert sorted(x["series"] for x in listed) == hidden
    page = tmp_path / "trends.html"
    assert run_cli("history", "show", "--db", str(db), "--html", str(page)).returncode == 0
    assert f"<p class='dim hidden-series'>{last}</p>".replace("'*'", "&#x27;*&#x27;") in page.read_text()
    every = run_cli("history", "show", "--db", str(db), "--metric", "*")
    assert "metric:task-clock" in every.stdout and "signal:cpu_busy@step_time" in every.stdout
    assert "more series not shown" not in every.stdout
    assert "metric:task-clock" in run_cli("history", "show", "--db", str(db), "--metric", "metric:*").stdout


@pytest.fixture(scope="module")
def a_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    proc = run_cli("run", "-q", "-I", "10", "-o", str(out), "--", PYTHON, WORKLOAD, "steps", "5", "2", "2",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_history_file_that_is_not_a_duckdb_database_is_refused(tmp_path, a_run):
    real = tmp_path / "real.duckdb"                  # what the installed duckdb writes
    duckdb.connect(str(real)).close()
    assert real.read_bytes()[8:12] == b"DUCK"
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "t.parquet")
    (tmp_path / "t.json").write_text('{"a": 1}\n')
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    (tmp_path / "t.txt").write_text("notes\n")
    for name in ("t.json", "t.csv", "t.parquet", "t.txt"):
        f = tmp_path / name
        before = f.read_bytes()
        proc = run_cli("history", "add", str(a_run), "--db", str(f))
        assert proc.returncode == 1, (name, proc.stderr)
        assert proc.stderr.strip().splitlines() == [
            f"counterprof: {f} is not a DuckDB database file (it lacks DuckDB's header; is it another kind "
            "of file?): give a new path or a history file"], name
        assert f.read_bytes() == before
        show = run_cli("history", "show", "--db", str(f))
        assert show.returncode == 1 and "is not a DuckDB database file" in show.stderr, (name, show.stderr)
        assert "another process" not in show.stderr
    (tmp_path / "empty.duckdb").touch()
    proc = run_cli("history", "add", str(a_run), "--db", str(tmp_path / "empty.duckdb"))
    assert proc.returncode == 1 and "is an empty file, not a DuckDB database" in proc.stderr
    for action in (["add", str(a_run)], ["show"]):
        proc = run_cli("history", *action, "--db", str(tmp_path) + "/")
        assert proc.returncode == 1 and "is a directory, not a history file" in proc.stderr, proc.stderr
        assert "another process" not in proc.stderr
    proc = run_cli("history", "add", str(a_run), "--db", str(tmp_path / "no" / "perf.duckdb"))
    assert proc.returncode == 1 and f"the directory {tmp_path / 'no'} does not exist" in proc.stderr
    proc = run_cli("history", "add", str(a_run), "--db", ":memory:")
    assert proc.returncode == 1 and "an in-memory database" in proc.stderr
    proc = run_cli("history", "add", str(a_run), "--db", str(real))     # a DuckDB file is fine
    assert proc.returncode == 0 and "added as run 1" in proc.stderr
    con = duckdb.connect(str(real), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    con.close()


def nightly_db(path, n=24, change_at=14, seed=3):
    """A history of n nightly runs whose step time rises 30% at run change_at (added in the
    order they ran) through the same store API `history add` uses."""
    from counterprof.store.history import RunRecord, add, connect
    rng = np.random.default_rng(seed)
    con = connect(str(path))
    for i in range(n):
        slow = i >= change_at
        step = 0.100 * (1.3 if slow else 1.0) * (1 + rng.normal(0, 0.01))
        add(con, RunRecord(f"nightly-{i}", f"/runs/{i}", 1_700_000_000_000_000_000 + i * 86_400 * 10**9,
                           f"2024-05-{i + 1:02d}T02:00:00+0000", '["python", "train.py"]', "ci-1",
                           f"{i:040x}", 2, 600.0, "host" if slow else "compute", "0.1.0",
                           [("step_time", step, "s", 500, "host" if slow else "compute"),
                            ("region:forward", 0.04 * (1 + rng.normal(0, 0.01)), "s", 500, "compute"),
                            ("signal:cpu_busy", 0.9 + rng.normal(0, 0.005), "", 1, None)]))
    con.close()


def test_show_flags_the_step_change_of_a_nightly_series(tmp_path):
    db = tmp_path / "nightly.duckdb"
    nightly_db(db)
    proc = run_cli("history", "show", "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    by = {s["series"]: s for s in json.loads(proc.stdout)["series"]}
    (cp,) = by["step_time"]["change_points"]
    assert cp["index"] == 14 and cp["run"]["run_id"] == "nightly-14" and cp["change"] == pytest.approx(0.3, abs=0.03)
    assert cp["run"]["git_rev"] == f"{14:040x}"
    assert by["region:forward"]["change_points"] == [] and by["signal:cpu_busy"]["change_points"] == []
    text = run_cli("history", "show", "--db", str(db), "--metric", "step_time")
    assert text.returncode == 0
    line = next(x for x in text.stdout.splitlines() if x.strip().startswith("step_time"))
    assert "run 15 (2024-05-15, rev 00000000): +" in line and "|" in line and "compute → host" in line
    assert 27 < float(line.split("rev 00000000): +")[1].split("%")[0]) < 33


def test_show_errors_exit_with_a_message(tmp_path):
    proc = run_cli("history", "show", "--db", str(tmp_path / "none.duckdb"))
    assert proc.returncode == 2 and "no such history file" in proc.stderr
    db = tmp_path / "n.duckdb"
    nightly_db(db, n=6)
    proc = run_cli("history", "show", "--db", str(db), "--metric", "nope")
    assert proc.returncode == 2 and "no series 'nope'" in proc.stderr and "step_time" in proc.stderr
    assert run_cli("history", "show", "--db", str(db), "--metric", "cpu_busy").returncode == 0   # signal:cpu_busy
    proc = run_cli("history", "add", str(tmp_path / "not-a-run"), "--db", str(db))
    assert proc.returncode == 1 and "no such run directory" in proc.stderr
    proc = run_cli("history")
    assert proc.returncode == 2
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    proc = run_cli("history", "show", "--db", str(other))
    assert proc.returncode == 1 and "holds no counterprof history" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_show_usage_errors_print_the_usage_of_show(tmp_path):
    db = tmp_path / "n.duckdb"
    nightly_db(db, n=6)
    proc = run_cli("history", "show", "--db", str(db), "--threshold", "x")
    assert proc.returncode == 2 and proc.stderr.startswith("usage: counterprof history show")
    assert "--threshold takes a percentage" in proc.stderr
    proc = run_cli("history", "show", "--db", str(tmp_path / "none.duckdb"))
    assert proc.returncode == 2 and proc.stderr.startswith("usage: counterprof history show")


def test_an_unwritable_html_path_is_one_line_before_any_output(tmp_path):
    db = tmp_path / "n.duckdb"
    nightly_db(db, n=6)
    missing = tmp_path / "nonexistent" / "x.html"
    for html, why in ((missing, f"the directory {missing.parent} does not exist"),
                      (tmp_path, "is a directory; give a file name")):
        proc = run_cli("history", "show", "--db", str(db), "--html", str(html))
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout      # checked before printing
        assert proc.stderr.splitlines() == [f"counterprof: --html {html}: {why}"]


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two(tmp_path):
    from counterprof.store.history import RunRecord, add, connect
    db = tmp_path / "two.duckdb"
    con = connect(str(db))
    for i, v in enumerate((2.285, 1.877)):
        add(con, RunRecord(f"r{i}", f"/runs/{i}", i, None, '["python", "t.py"]', "h", None, 1, 3.0, "compute",
                           "0.1.0", [("step_time", v, "s", 10, "compute")]))
    con.close()
    proc = run_cli("history", "show", "--db", str(db), "--metric", "step_time")
    assert proc.returncode == 0, proc.stderr
    head, row = [x.split() for x in proc.stdout.splitlines() if x.strip().startswith(("series", "step_time"))]
    assert row[:9] == ["step_time", "2", "2.285", "s", "1.877", "s", "2.081", "s", "█▁"], row
    assert head[:5] == ["series", "runs", "first", "latest", "median"]


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_html_trends_render_in_a_browser(tmp_path):
    db = tmp_path / "nightly.duckdb"
    nightly_db(db)
    html = tmp_path / "trends.html"
    proc = run_cli("history", "show", "--db", str(db), "--metric", "*", "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    dom = render(html, tmp_path, height=900)
    found = layout(dom)
    check_layout(found)
    trends = {c["id"]: c for c in found["charts"]}
    assert dom.count('class="trend"') == 3 and len(trends) == 3
    assert [c["points"] for c in trends.values()] == [24, 24, 24]
    labels = [lb for c in trends.values() for lb in c["labels"]]
    assert len(labels) == 1 and 27 < float(labels[0]["text"].strip("+%")) < 33      # the one change point
    assert "change point before run 15" in labels[0]["title"]
    for c in trends.values():                     # honest axes: every y axis starts at zero
        assert c["y_ticks"][0].startswith("0"), c["y_ticks"]
        assert all(t.startswith("run ") for t in c["x_ticks"]), c["x_ticks"]
    step = next(c for c in trends.values() if any(t.endswith(" ms") for t in c["y_ticks"]))
    assert step["y_ticks"][0] == "0 s" and all(t.endswith((" s", " ms")) for t in step["y_ticks"])


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_a_drift_looks_its_size_and_a_flat_series_is_one_value(tmp_path):
    """A 14% drift on a y axis from zero spans 14% of the axis's range, not all of it; a flat
    series draws distinct tick labels (its value once, not min and max both)."""
    from counterprof.store.history import RunRecord, add, connect
    db = tmp_path / "drift.duckdb"
    con = connect(str(db))
    for i in range(8):
        add(con, RunRecord(f"r{i}", f"/runs/{i}", 1_700_000_000_000_000_000 + i * 10**9, None,
                           '["python", "t.py"]', "h", None, 1, 3.0, "compute", "0.1.0",
                           [("step_time", 2.0 * (1 + 0.02 * i), "s", 10, "compute"),
                            ("region:flat", 0.5, "s", 10, "compute")]))
    con.close()
    html = tmp_path / "drift.html"
    proc = run_cli("history", "show", "--db", str(db), "--metric", "*", "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    found = layout(render(html, tmp_path, height=700))
    check_layout(found)
    ticks = {c["id"]: c["y_ticks"] for c in found["charts"]}
    assert len(ticks) == 2

    def secs(t):
        num, unit = t.split()
        return float(num) * {"s": 1, "ms": 1e-3, "µs": 1e-6}[unit]
    tops = {}
    for k, y in ticks.items():
        assert y[0] == "0 s", y
        tops[k] = max(secs(t) for t in y)
    drift, flat = sorted(ticks, key=tops.get, reverse=True)
    assert 2.0 <= tops[drift] < 2.6, ticks[drift]     # from zero to just above the data (2.0 to 2.28 s)
    assert 0.3 <= tops[flat] < 0.6 and len(set(ticks[flat])) == len(ticks[flat]) >= 2, ticks[flat]
