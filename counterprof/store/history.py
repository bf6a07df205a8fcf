"""The history file: a DuckDB database of runs' summaries (`counterprof history`).

    runs     one row per added run: when, what command, which host and git revision, its verdict
    figures  one row per series per run (the series names below), with the scope's verdict

Series names:
    wall_time                       the run's wall time (s); verdict: the run's
    step_time                       median step duration (s); verdict: the steps'
    region:NAME                     median duration of the region's occurrences (s); its verdict
    metric:NAME                     median of the metric's per-window value over all ranks
                                    (rates per second for counters, means for gauges)
    signal:NAME                     a classifier signal over the whole run (cpu_busy, gpu_util, ...)
    signal:NAME@step_time, signal:NAME@region:NAME   the same over the steps / a region
    correlate:SOURCE:FIGURE         a `correlate --json` output's figures (history add --correlation):
                                    mape, coverage, within (%), geomean_ratio (x), spearman; and
    correlate:SOURCE:GROUP:FIGURE   mape and geomean_ratio per op group (GEMM, attention...)

duckdb is imported when a history file is opened (store/query.py uses it for the report too).

Several processes may add at once (nightly jobs adding to one perf.duckdb): a new file is built
under a part-file name of the process's own and published with link(2), which fails when the
name exists, so exactly one creator's file becomes the history file and the others add to it;
DuckDB lets one process write at a time, and a writer (or a reader, while another writes) waits
for the file up to WAIT_S before it says so. No process ever removes a history file, only its own
part-file (add_records).
"""
from __future__ import annotations

import datetime as _dt
import errno
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ground.errors import CounterprofError, UsageError
from . import limits

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS runs (
        seq INTEGER PRIMARY KEY, run_id VARCHAR, path VARCHAR, start_ns BIGINT, start_time VARCHAR,
        added_at TIMESTAMP, command VARCHAR, host VARCHAR, git_rev VARCHAR, ranks INTEGER,
        duration_s DOUBLE, verdict VARCHAR, counterprof_version VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS figures (
        seq INTEGER, series VARCHAR, value DOUBLE, unit VARCHAR, n BIGINT, verdict VARCHAR)""",
]


class HistoryError(CounterprofError):
    """The history file cannot be opened or written."""


DUCKDB_MAGIC = b"DUCK"      # DuckDB database files carry it at byte 8 (after an 8-byte checksum)


def check_file(path: str, read_only: bool = False) -> None:
    """Refuse, with the reason, a --db path DuckDB cannot use as a history file: a directory, a
    missing file (to read) or a missing directory (to create it in), and an existing file that
    is not a DuckDB database (DuckDB would open a .json/.csv/.parquet file as an in-memory
    database over it and keep nothing, or fail with a message about another writer). An
    existing file is never overwritten."""
    if path.startswith((":memory:", "md:", "motherduck:")):     # DuckDB keeps no file for these
        raise HistoryError(f"{path}: DuckDB opens no file for that name (an in-memory database): give a file path")
    p = Path(path)
    if p.is_dir():
        raise HistoryError(f"{path} is a directory, not a history file: give a file path "
                           "(--db perf.duckdb)")
    if not p.exists():
        if read_only:
            raise HistoryError(f"{path} does not exist: `counterprof history add RUN --db {path}` creates it")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise HistoryError(f"cannot create the history file {path}: the directory {parent} does not exist")
        return
    try:
        with open(p, "rb") as f:
            head = f.read(12)
    except OSError as exc:
        raise HistoryError(f"cannot read the history file {path}: {exc.strerror or exc}") from None
    if not head:
        raise HistoryError(f"{path} is an empty file, not a DuckDB database: remove it (`counterprof "
                           "history add` creates the file) or give another path")
    if head[8:12] != DUCKDB_MAGIC:
        raise HistoryError(f"{path} is not a DuckDB database file (it lacks DuckDB's header; is it "
                           "another kind of file?): give a new path or a history file")


WAIT_S = 120.0         # how long a command waits for another process's hold on the file
_POLL_S = 0.1          # DuckDB's lock is taken without waiting: it is tried again this often


def _say(message: str) -> None:
    print(f"counterprof: {message}", file=sys.stderr, flush=True)


def connect(path: str, read_only: bool = False, wait_s: float = WAIT_S,
            waiting: Callable[[str], None] | None = _say) -> Any:      # a duckdb connection (no stubs)
    """The history file, open (its tables made when writing). Another process holding it (a
    writer; or, to write, any process) is waited for, up to wait_s seconds (said once through
    waiting), then a HistoryError: DuckDB lets one process write a file at a time."""
    try:
        import duckdb
    except ImportError:
        raise UsageError("counterprof history needs duckdb (a dependency of counterprof): reinstall counterprof "
                         "(or pip install duckdb)") from None
    check_file(path, read_only)
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            con = duckdb.connect(path, read_only=read_only, config=dict(limits.duckdb_config()))
            break
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise HistoryError(f"cannot open the history file {path}: {exc}") from None
            if time.monotonic() >= deadline:
                waited = f" for {wait_s:.0f} s" if wait_s > 0 else ""
                raise HistoryError(f"cannot open the history file {path}: another process has had it open "
                                   f"for writing{waited} (DuckDB allows one writer at a time): try again "
                                   "when it is done") from None
            if not said and waiting is not None:
                waiting(f"{path}: another process has it open; waiting for it (up to {wait_s:.0f} s)")
                said = True
            time.sleep(_POLL_S * random.uniform(0.5, 1.5))
        except duckdb.OutOfMemoryException:
            raise              # the CLI's one out-of-memory line (cli/common.guarded), not "unusable file"
        except duckdb.Error as exc:
            raise HistoryError(f"{path} is not a usable DuckDB file: {exc}") from None
    stored = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    if not stored or not stored[0]:      # ':memory:' and the like: nothing would be kept
        con.close()
        raise HistoryError(f"{path}: DuckDB opened no file there (an in-memory database): give a file path")
    if not read_only:
        for stmt in SCHEMA:
            con.execute(stmt)
    else:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if not {"runs", "figures"} <= names:
            con.close()
            raise HistoryError(f"{path} holds no counterprof history (no runs/figures tables); "
                               "`counterprof history add RUN --db FILE` creates one")
    return con


@dataclass
class RunRecord:
    run_id: str
    path: str
    start_ns: int | None
    start_time: str | None
    command: str
    host: str | None
    git_rev: str | None
    ranks: int
    duration_s: float | None
    verdict: str
    counterprof_version: str | None
    figures: list[tuple[str, float, str, int, str | None]] = field(default_factory=list)
    appended: int = 0      # add(): series put beside a run already in the file (correlate:*)


def add(con: Any, rec: RunRecord) -> tuple[int, bool]:
    """Append a run; (its seq, True), or (the existing seq, False) when it is already there
    (same run id, start and host): then only its correlate:* series the file lacks are put
    beside it (a run correlated after it was added; rec.appended says how many)."""
    row = con.execute("SELECT seq FROM runs WHERE run_id = ? AND start_ns IS NOT DISTINCT FROM ? "
                      "AND host IS NOT DISTINCT FROM ?", [rec.run_id, rec.start_ns, rec.host]).fetchone()
    if row:
        seq = int(row[0])
        have = {r[0] for r in con.execute("SELECT series FROM figures WHERE seq = ?", [seq]).fetchall()}
        new = [f for f in rec.figures if f[0].startswith("correlate:") and f[0] not in have]
        if new:
            con.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?)",
                            [[seq, sr, v, u, n, vd] for sr, v, u, n, vd in new])
        rec.appended = len(new)
        return seq, False
    seq = int(con.execute("SELECT coalesce(max(seq), 0) + 1 FROM runs").fetchone()[0])
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            seq, rec.run_id, rec.path, rec.start_ns, rec.start_time,
            _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None), rec.command, rec.host, rec.git_rev,
            rec.ranks, rec.duration_s, rec.verdict, rec.counterprof_version])
        if rec.figures:
            con.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?)",
                            [[seq, s, v, u, n, vd] for s, v, u, n, vd in rec.figures])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return seq, True


@dataclass
class Trend:
    command: str
    series: str
    unit: str
    seqs: list[int]
    values: list[float]
    verdicts: list[str | None]
    runs: list[dict[str, Any]]         # per point: seq, run_id, start_time, git_rev, host

    def known(self) -> list[float]:
        """The values of the runs that have the series (the others are NaN)."""
        return [v for v in self.values if math.isfinite(v)]

    def median(self) -> float | None:
        """Over the runs that have the series; of an even count, the middle two's mean."""
        known = self.known()
        return statistics.median(known) if known else None


def trends(con: Any, pattern: str | None = None) -> list[Trend]:
    """Every series (or those whose name matches the glob `pattern`), per command, in the order
    the runs started (then the order they were added)."""
    where, params = "", []
    if pattern:
        where = "WHERE f.series GLOB ?"
        params = [pattern]
    rows = con.execute(f"""
        SELECT r.command, f.series, f.unit, r.seq, f.value, f.verdict, r.run_id, r.start_time, r.git_rev,
               r.host
        FROM figures f JOIN runs r USING (seq) {where}
        ORDER BY r.command, f.series, r.start_ns NULLS LAST, r.seq""", params).fetchall()
    out: dict[tuple[str, str], Trend] = {}
    for command, series, unit, seq, v, verdict, run_id, start_time, rev, host in rows:
        t = out.get((command, series))
        if t is None:
            t = out[(command, series)] = Trend(command, series, unit or "", [], [], [], [])
        t.seqs.append(seq)
        t.values.append(v if v is not None else float("nan"))
        t.verdicts.append(verdict)
        t.runs.append({"seq": seq, "run_id": run_id, "start_time": start_time, "git_rev": rev, "host": host})
    return list(out.values())


def series_names(con: Any) -> list[str]:
    return [r[0] for r in con.execute("SELECT DISTINCT series FROM figures ORDER BY series").fetchall()]


def series_keys(con: Any) -> list[tuple[str, str]]:
    """Every (command, series) the file holds."""
    return [(r[0], r[1]) for r in con.execute(
        "SELECT DISTINCT r.command, f.series FROM figures f JOIN runs r USING (seq) ORDER BY 1, 2").fetchall()]


def run_count(con: Any) -> int:
    return int(con.execute("SELECT count(*) FROM runs").fetchone()[0])


def command_text(command: list[str] | None) -> str:
    """The command as the history file keeps it: redacted (the file is a derived output)."""
    from ..ground.redact import redact_argv
    return json.dumps(redact_argv(command))


def command_display(text: str) -> str:
    """The stored command (a JSON list) as a shell line, redacted again (a history file written
    before redaction holds commands as they were run)."""
    from ..ground.redact import command_line, redact_text
    try:
        return command_line(json.loads(text)) or "(no command)"
    except (ValueError, TypeError):
        return redact_text(str(text))


def add_records(db: str, records: list[tuple[str, RunRecord]],
                said: Callable[[str, RunRecord, int, bool], None],
                waiting: Callable[[str], None] | None = _say) -> None:
    """Append each (path, record) to the history file db, calling said(path, rec, seq, added)
    for each once they are in it for good (closed: its checkpoint written).

    A new file is built under a name of this process's own beside it and published with link(2),
    which fails if the name exists: of processes creating one file at once, one publishes its
    file and the others add to it (waiting their turn, see connect); no process ever deletes a
    history file, only its own part-file. Nothing half-written is ever under the name. A full
    disk is one DiskFull saying what was kept."""
    if not Path(db).exists():
        made = _create(db, records)
        if made is not None:
            for (path, rec), (seq, added) in zip(records, made):
                said(path, rec, seq, added)
            return
    con = connect(db, waiting=waiting)          # an existing file: ours to add to, never to remove
    done: list[tuple[int, bool]] = []
    try:
        for _path, rec in records:
            done.append(add(con, rec))          # each run is its own transaction
        con.close()           # its checkpoint writes too
    except Exception as exc:
        con.close()
        for (path, rec), (seq, added) in zip(records, done):     # those committed are in it
            said(path, rec, seq, added)
        _raise_disk_full(exc, db, "the history file keeps what it had before"
                         + (f" and the {len(done)} run(s) said above" if done else ""))
        raise
    for (path, rec), (seq, added) in zip(records, done):
        said(path, rec, seq, added)


def _create(db: str, records: list[tuple[str, RunRecord]]) -> list[tuple[int, bool]] | None:
    """A new history file at db holding records: (seq, added) per record, or None when another
    process published one there first (then nothing of ours is left behind)."""
    p = Path(db)
    folder = p.parent if str(p.parent) else Path(".")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HistoryError(f"cannot create the history file {db}: permission denied (you cannot write "
                           f"in {folder})")
    part = folder / f".{p.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    try:
        try:
            con = connect(str(part), wait_s=0)
        except HistoryError as exc:             # said of the file being made, not of its part-file
            raise HistoryError(str(exc).replace(str(part), db)) from None
        try:
            done = [add(con, rec) for _path, rec in records]
        finally:
            con.close()
        published = _publish(part, p)
    except BaseException as exc:               # Ctrl-C too: no part-file is left behind
        _remove_part(part)
        _raise_disk_full(exc, db, "no history file was created")
        raise
    _remove_part(part)
    return done if published else None


def _publish(part: Path, db: Path) -> bool:
    """Give the finished part-file the name db unless that name exists (False then)."""
    try:
        os.link(part, db)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS):
            raise
    # a file system without hard links: claim the name with an empty file of our own (O_EXCL),
    # then rename the part-file over it, the only file we may replace
    try:
        fd = os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    try:
        os.replace(part, db)
    except OSError:
        try:                      # still our empty claim: take it back
            if db.stat().st_size == 0:
                db.unlink()
        except OSError:
            pass
        raise
    return True


def _remove_part(part: Path) -> None:
    """This process's own part-file and its write-ahead log (never a published file)."""
    for q in (part, Path(f"{part}.wal")):
        try:
            q.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            pass


def _raise_disk_full(exc: BaseException, db: str, kept: str) -> None:
    if "No space left" in str(exc) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
        from ..ground.errors import DiskFull
        raise DiskFull(f"{Path(db).parent or '.'}: no space left on the device (adding to {db}); "
                       f"{kept}; free some space and add again") from None


def select_trends(con: Any, db: str, patterns: list[str] | None,
                  default: tuple[str, ...]) -> tuple[list[Trend], list[tuple[str, str]]]:
    """The trends `history show` prints: those matching patterns (a bare name also tried as
    metric:, signal: and region:; one that matches nothing is a UsageError naming what db has),
    else those matching default without the per-scope signals (NAME@scope), each (command,
    series) once; and, for the default, the (command, series) it leaves out."""
    names = series_names(con)
    found: list[Trend] = []
    shown: set[tuple[str, str]] = set()
    for pat in patterns or default:
        got = [t for t in trends(con, pat) if patterns or "@" not in t.series]
        if not got and patterns:
            alt = [f"metric:{pat}", f"signal:{pat}", f"region:{pat}"]
            got = [t for a in alt for t in trends(con, a)]
        if not got and patterns:
            raise UsageError(f"no series {pat!r} in {db}; it has: {', '.join(names[:40])}"
                             + (" ..." if len(names) > 40 else ""))
        for t in got:
            if (t.command, t.series) not in shown:
                shown.add((t.command, t.series))
                found.append(t)
    hidden = [] if patterns else [k for k in series_keys(con) if k not in shown]
    return found, hidden
