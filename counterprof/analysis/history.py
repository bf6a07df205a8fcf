"""What `counterprof history` keeps of a run and shows of the file: a run reduced to its
summary series (store/history.py's RunRecord), and the trends ordered with their change points."""
from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..store.meta import RunMeta

if TYPE_CHECKING:
    from .changepoints import ChangePoint
    from ..store.history import RunRecord, Trend
    from ..store.reader import Run

# the order series are shown in, per command: by the first prefix each starts with
SERIES_ORDER = ("wall_time", "step_time", "region:", "metric:roofline.mfu", "correlate:", "signal:", "metric:")


def run_record(run: Run, path: str, warn: Callable[[str], None]) -> RunRecord:
    """The RunRecord of a finished run (store.reader.Run, opened from path); a run whose
    profiler still writes it is a UsageError (its figures would be partial, and the finished run
    refused later). What the run could not give is said through warn."""
    from .. import __version__
    from .compare_runs import figures
    from .run_figures import summary_series
    from ..store.history import RunRecord, command_text
    from ..store.liveness import profiler_alive
    meta = RunMeta.of(run.meta)
    if profiler_alive(meta.raw):
        from ..ground.errors import UsageError
        raise UsageError(f"{run.path} is still being written (counterprof pid {meta.profiler.pid} on "
                         f"{meta.profiler.host}): add it once that run has finished")
    f = figures(run, warn)
    for why in run.skipped:
        warn(f"skipped an unreadable file (its rows are not in the summary): {why}")
    for why in run.left_out:
        warn(why)
    if f.verdict is None and not f.times:
        warn(f"{run.path}: no samples or spans: only its wall time and command are recorded")
    series = summary_series(f)
    return RunRecord(
        run_id=str(meta.id or run.path.name), path=str(run.path.resolve()), start_ns=meta.start_ns,
        start_time=meta.start_time, command=command_text(meta.command), host=meta.host.hostname,
        git_rev=run_git_revision(meta, path, warn), ranks=len(run.ranks()),
        duration_s=(f.end_ns - f.start_ns) / 1e9, verdict=series[0][4] or "none",
        counterprof_version=meta.counterprof_version or __version__, figures=series)


def run_git_revision(meta: RunMeta | dict[str, Any], path: str, warn: Callable[[str], None]) -> str | None:
    """The git revision the run was made from: meta.json's git_revision, recorded at the run's
    start (None: its working directory was not a checkout). Runs from before counterprof
    recorded it lack the key: for them, the HEAD of their working directory's checkout now,
    and warn says so (it is the run's revision only if nothing was committed since)."""
    m = RunMeta.of(meta)
    if m.records_git_revision:
        rev = m.git_revision
        return rev if isinstance(rev, str) and rev else None
    cwd = m.cwd
    if not cwd or not Path(cwd).is_dir():
        return None
    from ..ground.gitrev import git_revision
    rev = git_revision(cwd)
    if rev:
        warn(f"{path}: no git revision recorded at run time; using the checkout's HEAD now, {rev}")
    return rev


def order_trends(found: list[Trend], threshold: float) -> tuple[list[Trend], list[list[ChangePoint]]]:
    """The trends sorted as shown (per command, SERIES_ORDER, name), and each one's change
    points (analysis/changepoints.py) in that order."""
    from .changepoints import change_points
    found = sorted(found, key=lambda t: (t.command, _order(t.series), t.series))
    return found, [change_points(t.values, threshold=threshold) for t in found]


def _order(series: str) -> int:
    for i, prefix in enumerate(SERIES_ORDER):
        if series.startswith(prefix):
            return i
    return 9


def correlation_series(path: str) -> tuple[str, list[tuple[str, float, str, int, str | None]]]:
    """(the run id, its history series) of a `counterprof correlate --json` output: per source
    mape, coverage, within (%), geomean_ratio (x), spearman; per source and group mape and
    geomean_ratio. A file that is not one is a UsageError saying what to give."""
    import json
    import math
    from ..ground.errors import UsageError
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--correlation {path}: not readable JSON ({exc}): give the output of "
                         "`counterprof correlate RUN ... --json`") from None
    def bad(why: str) -> UsageError:
        return UsageError(f"--correlation {path}: not a `counterprof correlate --json` output ({why})")
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list) or not doc.get("run_id"):
        raise bad("no run_id and sources")
    for s in doc["sources"]:
        if not isinstance(s, dict) or not isinstance(s.get("by_group") or {}, dict):
            raise bad("a source is not an object with figures and by_group")
    out: list[tuple[str, float, str, int, str | None]] = []
    pct = {"mape": "%", "coverage": "%", "within": "%", "geomean_ratio": "x", "spearman": ""}

    def put(prefix: str, figs: dict[str, object], names: tuple[str, ...]) -> None:
        if not isinstance(figs, dict):
            raise bad(f"the figures of {prefix} are not an object")
        for k in names:
            v = figs.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((f"{prefix}:{k}", float(v) * (100 if pct[k] == "%" else 1), pct[k],
                            int(figs.get("rows") or 0), None))       # type: ignore[call-overload]
    for s in doc["sources"]:
        name = str(s.get("source") or "predictions").replace(":", " ")
        put(f"correlate:{name}", s, ("mape", "coverage", "within", "geomean_ratio", "spearman"))
        for g, figs in (s.get("by_group") or {}).items():
            put(f"correlate:{name}:{g}", figs, ("mape", "geomean_ratio"))
    return str(doc["run_id"]), out
