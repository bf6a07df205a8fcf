"""What counterprof writes is its owner's, and what it shows holds no secret and no live escape:
every file of a run is 0600 and every folder 0700 (while live, after a SIGKILL, after recovery),
the outputs a user names (--html, --perfetto) follow the user's umask, secret-looking arguments are redacted in every
derived output (meta.json alone keeps the command as run), and names with terminal escapes
print inert. Through the real CLI, under a umask that would let anyone read."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import (COUNTERPROF, PYTHON, end_processes, journal_dir, kill_profiler, run_cli,
                     wait_for_samples)
from kineto_traces import X, write_trace

pytestmark = pytest.mark.slow


def _open_umask():
    os.umask(0)          # the workload's and the profiler's files would be 0666/0777


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return run_cli(*args, preexec_fn=_open_umask, **kw)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*")}


def _assert_private(root: Path) -> None:
    bad = {p: oct(m) for p, m in _modes(root).items()
           if m != (0o700 if (root / p).is_dir() else 0o600)}
    assert not bad, f"not owner-only in {root}: {bad}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


SPIN = ("import sys, time\n"
        "t = time.perf_counter()\n"
        "while time.perf_counter() - t < float(sys.argv[1]): pass\n")


def test_a_run_is_owner_only_while_live_after_a_kill_and_after_recovery(tmp_path):
    run = tmp_path / "run"
    prof = subprocess.Popen([*COUNTERPROF, "run", "-q", "--collectors", "host,perf", "-o", str(run),
                             "--", PYTHON, "-c", SPIN, "30"], preexec_fn=_open_umask,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    workload = []
    try:
        wait_for_samples(run)
        # the journal's segments, or (from -I 100, before the first drain at 10 s) the spill's files
        segs = list(journal_dir(run).parent.glob("journal/*")) + list(journal_dir(run).parent.glob("spill/*"))
        assert segs
        _assert_private(run)                      # live: the journal's segments and the spill are 0600
        workload = kill_profiler(prof)
        _assert_private(run)                      # what a SIGKILL left
    finally:
        end_processes(workload)
        if prof.poll() is None:
            prof.kill()
        prof.wait()
        prof.stderr.close()
    rec = cli("recover", str(run))
    assert rec.returncode == 0, rec.stderr
    assert list(run.glob("samples/rank=*/*.parquet"))
    _assert_private(run)                          # Parquet, the recovered meta.json


def test_runs_are_owner_only_and_named_outputs_follow_the_umask(tmp_path):
    run = tmp_path / "run"
    cli("run", "-q", "--collectors", "host,perf", "-o", str(run), "--", PYTHON, "-c", SPIN, "0.3",
        check=True)
    _assert_private(run)
    outputs = {"report.html": ["report", str(run), "--html"],
               "trace.json.gz": ["export", str(run), "--perfetto"],
               "h.duckdb": ["history", "add", str(run), "--db"]}
    for name, args in outputs.items():
        cli(*args, str(tmp_path / name), check=True)
    cli("history", "show", "--db", str(tmp_path / "h.duckdb"), "--html", str(tmp_path / "h.html"), check=True)
    imported = tmp_path / "imported"
    write_trace(tmp_path / "t.json", [X("cpu_op", "aten::mm", 1000, 50)], {"schemaVersion": 1})
    cli("import", "-o", str(imported), str(tmp_path / "t.json"), check=True)
    _assert_private(imported)
    # the outputs the user named follow the user's umask (0 here), as cp's and perf -o's;
    # the history database, a store of runs' summaries, stays the owner's
    for name in ("report.html", "trace.json.gz", "h.html"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666, name
    assert stat.S_IMODE((tmp_path / "h.duckdb").stat().st_mode) == 0o600
    # a file the user made keeps the mode its owner gave it
    mine = tmp_path / "mine.html"
    mine.write_text("")
    os.chmod(mine, 0o644)
    cli("report", str(run), "--html", str(mine), check=True)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o644 and mine.stat().st_size > 0


SECRETS = ["hunter2", "tok-123456", "hf_abcdef", "s3cr3t-pw", "AKIAEXAMPLE", "bearer-xyz"]
SECRET_ARGS = ["--password=hunter2", "--token", "tok-123456", "HF_TOKEN=hf_abcdef",
               "https://alice:s3cr3t-pw@example.com/repo", "--aws-access-key", "AKIAEXAMPLE",
               "Authorization: Bearer bearer-xyz"]


def test_secret_looking_arguments_are_redacted_in_every_derived_output(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        proc = cli("run", "--collectors", "host,perf", "-o", str(run), "--", PYTHON, "-c", SPIN, "0.3",
                   *SECRET_ARGS, check=True)
        assert not any(s in proc.stderr for s in SECRETS), proc.stderr     # the run's summary
    meta = json.loads((runs[0] / "meta.json").read_text())
    assert meta["command"][-len(SECRET_ARGS):] == SECRET_ARGS           # the record keeps it (0600)
    db, html, hhtml, trace = (tmp_path / n for n in ("h.duckdb", "r.html", "h.html", "t.json"))
    shown = [cli("report", str(runs[0])), cli("report", "--json", str(runs[0])),
             cli("report", str(runs[0]), "--html", str(html)),
             cli("compare", str(runs[0]), str(runs[1])),
             cli("compare", "--markdown", str(runs[0]), str(runs[1])),
             cli("export", str(runs[0]), "--perfetto", str(trace)),
             cli("history", "add", str(runs[0]), str(runs[1]), "--db", str(db)),
             cli("history", "show", "--db", str(db)),
             cli("history", "show", "--json", "--db", str(db)),
             cli("history", "show", "--db", str(db), "--html", str(hhtml))]
    for proc in shown:
        assert proc.returncode == 0, (proc.args, proc.stderr)
    texts = [p.stdout + p.stderr for p in shown] + [f.read_text(errors="replace") for f in (html, hhtml, trace)]
    texts.append(db.read_bytes().decode("latin-1"))
    for text in texts:
        leaked = [s for s in SECRETS if s in text]
        assert not leaked, (leaked, text[:2000])
    report = shown[1].stdout
    assert "--password=***" in report and "HF_TOKEN=***" in report and "alice:***@example.com" in report


ESCAPE = "\x1b[2J\x1b]0;PWNED\x07"
REGION_WORK = ("import sys, time, counterprof\n"
               "for _ in range(3):\n"
               "    with counterprof.region('evil' + sys.argv[1]):\n"
               "        t = time.perf_counter()\n"
               "        while time.perf_counter() - t < 0.05: pass\n")


def test_terminal_escapes_in_names_and_commands_print_inert(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        cli("run", "-q", "--collectors", "host,perf", "-o", str(run), "--", PYTHON, "-c", REGION_WORK,
            ESCAPE, check=True)
    db = tmp_path / "h.duckdb"
    shown = [cli("report", str(runs[0])), cli("compare", str(runs[0]), str(runs[1])),
             cli("compare", "--markdown", str(runs[0]), str(runs[1])), cli("breakdown", str(runs[0])),
             cli("history", "add", str(runs[0]), "--db", str(db)), cli("history", "show", "--db", str(db)),
             cli("recover", str(runs[0])), cli("merge", str(runs[0]), "-o", str(tmp_path / "m"))]
    for proc in shown:
        assert "Traceback" not in proc.stderr, proc.stderr
        text = proc.stdout + proc.stderr
        assert "\x07" not in text and "\x1b]" not in text and "\x1b[2J" not in text, (proc.args, text)
    for proc in shown[:2]:                  # shown, as visible escapes (the lines may wrap)
        assert "evil\\x1b[2J" in proc.stdout and "PWNED\\x07" in proc.stdout, proc.stdout
