"""Runs reduced to figures and compared: what `counterprof compare` and `history add` read.

analysis/compare.py holds the statistics (figures in, a Comparison out); this module opens
that to runs: one streaming pass per run (analysis/run_figures.py; a big run's blocks of ranks
read by every CPU, analysis/workers.py) with its MFU per step added,
one window length for every run, and the runs' own problems (unreadable files, rows left out)
carried into the comparison's notes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compare import Comparison
    from .roofline import Roofline
    from .run_figures import Grid, PartsOf, RanksPart, RunFigures
    from ..store.reader import Run

SAMPLE_COLUMNS = ["time", "duration_ns", "metric", "value"]
# a run's ranks x seconds from which its samples are read by every CPU (worker processes): below,
# a worker's start (~0.4 s: numpy and pyarrow) is not worth it
PARALLEL_MIN_RANK_SECONDS = 3600.0
MAX_CELLS_BYTES = 512 << 20   # the blocks' cells (5 arrays of 8 bytes per metric and cell) held at once


def parse_threshold(text: str) -> float:
    """A --threshold percentage (3 or 3%) as a fraction; ValueError says what is wrong."""
    try:
        pct = float(text.strip().rstrip("%"))
    except ValueError:
        raise ValueError(f"--threshold takes a percentage (3 or 3%), not {text!r}") from None
    if not 0 <= pct < 1000:
        raise ValueError("--threshold must be between 0 and 1000 percent")
    return pct / 100


def figures(run: Run, warn: Callable[[str], None], window_ns: int | None = None,
            bounds: tuple[int, int] | None = None) -> RunFigures:
    """A run reduced by analysis.run_figures (one streaming pass over its samples)."""
    from .run_figures import run_figures
    from .roofline_run import roofline_if_ops
    spans = run.spans_by_rank()    # (not table(): its one sort held the spans twice)
    roof = roofline_if_ops(run, spans, warn)       # the verdicts' compute vs memory, and the MFU
    # the samples' files listed once for every rank, not once per rank (quadratic in the ranks)
    start, end = bounds if bounds is not None else bounds_of(run)
    big = (end - start) / 1e9 * len(run.ranks()) >= PARALLEL_MIN_RANK_SECONDS
    f = run_figures(str(run.path), run.meta, run.catalog, run.ranks(),
                    run.rank_batches("samples", SAMPLE_COLUMNS),
                    spans, window_ns=window_ns, bounds=(start, end), roofline=roof,
                    parts_of=_parts_in_workers(run) if big else None)
    if roof is not None:
        add_mfu(f, roof)
    del spans, roof
    from ..store.limits import release_freed
    release_freed()          # the next run's figures are not made on top of this one's leftovers
    return f


def _parts_in_workers(run: Run) -> PartsOf:
    """run_figures' parts_of: the blocks of ranks read in worker processes, one group of blocks
    each (analysis/workers.py), what they left out noted on run as its own reads note it."""
    from functools import partial

    from .workers import MAX_WORKERS, cpus, spread

    def parts_of(blocks: list[list[int]], grid: Grid) -> Iterable[RanksPart]:
        n = max(1, min(cpus(), MAX_WORKERS, len(blocks)))
        if n == 1 or len(blocks) * max(1, len(run.catalog)) * grid.ncells * 40 > MAX_CELLS_BYTES:
            # one CPU, or the workers would give back more blocks' cells at once than fit: each
            # block read here in turn, merged as it comes
            from .run_figures import ranks_part
            of_rank = run.rank_batches("samples", SAMPLE_COLUMNS)
            return (ranks_part(of_rank, block, run.catalog, grid) for block in blocks)
        cuts = [len(blocks) * i // n for i in range(n + 1)]
        groups = [(blocks[a:b], grid) for a, b in zip(cuts, cuts[1:])]
        out: list[RanksPart] = []
        for parts, skipped, left_out in spread(partial(_ranks_parts, str(run.path), run.skip_unreadable,
                                                       run.catalog), groups):
            out += parts
            run.skipped += [w for w in skipped if w not in run.skipped]
            run.left_out += [w for w in left_out if w not in run.left_out]
        return out
    return parts_of


def _ranks_parts(path: str, skip_unreadable: bool, catalog: dict[str, dict[str, Any]],
                 group: tuple[list[list[int]], Grid]) -> tuple[list[RanksPart], list[str], list[str]]:
    """A worker's share: its blocks of ranks reduced, by the run's damage policy, and what its
    reads left out (Run.skipped, Run.left_out)."""
    from .run_figures import ranks_part
    from ..store.reader import Run
    blocks, grid = group
    run = Run(path, skip_unreadable=skip_unreadable)
    of_rank = run.rank_batches("samples", SAMPLE_COLUMNS)
    parts = [ranks_part(of_rank, block, catalog, grid) for block in blocks]
    return parts, run.skipped, run.left_out


def add_mfu(f: RunFigures, r: Roofline) -> None:
    """The MFU of each traced step of the Roofline r (roofline.mfu*: percent of the measured and
    the datasheet peak; roofline.flops_per_s) as metrics of the run: compared like every metric,
    one value per step, and kept by history as their medians."""
    from .roofline import mfu_series
    values, units = mfu_series(r, default_rank=(f.ranks or [0])[0])
    for name, by_rank in values.items():
        f.metrics[name] = by_rank
        f.units[name] = units[name]
        f.kinds[name] = "gauge"


def bounds_of(run: Run) -> tuple[int, int]:
    from .run_figures import time_bounds
    return time_bounds(run.meta, lambda: run.batches("samples", ["time"]))


def command_of(run: Run) -> str:
    from ..ground.redact import command_line
    from ..store.meta import RunMeta
    return command_line(RunMeta.of(run.meta).command) or "(no command)"


def check_commands(base_runs: list[Run], cand_runs: list[Run], force: bool) -> set[str]:
    """The runs' commands; runs of different commands do not compare (UsageError) unless force."""
    commands = {command_of(r) for r in base_runs + cand_runs}
    if len(commands) > 1 and not force:
        from ..ground.errors import UsageError
        lines = [f"  {side} {r.path}: {command_of(r)}" for side, runs in (("baseline ", base_runs),
                                                                            ("candidate", cand_runs)) for r in runs]
        raise UsageError("these runs ran different commands, so their figures do not compare:\n"
                         + "\n".join(lines) + "\n(--force compares them anyway)")
    return commands


def compare_runs(base_runs: list[Run], cand_runs: list[Run], warn: Callable[[str], None], *, force: bool = False,
                 window_s: float | None = None, **stats: Any) -> Comparison:
    """The Comparison of two sides of runs (store.reader.Run); stats go to analysis.compare.compare
    (threshold, resamples, confidence, seed, min_time_change_s, strict). What the runs could not
    give (unreadable files, rows left out) is said through warn and noted in the comparison."""
    from .compare import compare
    from .run_figures import default_window_ns
    commands = check_commands(base_runs, cand_runs, force)
    runs = base_runs + cand_runs
    bounds = {id(r): bounds_of(r) for r in runs}
    if window_s:
        window_ns = int(window_s * 1e9)
    else:   # one window length for every run: rates averaged over the same time
        window_ns = max(default_window_ns(r.meta, *bounds[id(r)]) for r in runs)
    base = [figures(r, warn, window_ns, bounds[id(r)]) for r in base_runs]
    cand = [figures(r, warn, window_ns, bounds[id(r)]) for r in cand_runs]
    cmp = compare(base, cand, **stats)
    for r in runs:
        for why in r.skipped:
            warn(f"skipped an unreadable file: {why}")
            cmp.notes.append(f"left out, unreadable: {why}")
        for why in r.left_out:
            warn(why)
            cmp.notes.append(why)
    if len(commands) > 1:
        cmp.notes.insert(0, "--force: the runs ran different commands (" + " | ".join(sorted(commands)) + ")")
    return cmp


def gate_notes(cmp: Comparison, strict: bool) -> list[str]:
    """What --fail-on-regression says about the changes it does not fail on, and (when
    cmp.failed) why it fails, last."""
    notes = []
    explained = [r for r in cmp.regressions if r.explained]
    wide = [r for r in cmp.inconclusive if r.direction == "lower"]    # times that could regress
    if wide:
        notes.append(f"{len(wide)} time(s) inconclusive (intervals too wide to call): not failing; more "
                     "runs a side (--baseline/--candidate) narrow them")
    if explained and not strict:
        notes.append(f"{len(explained)} regression(s) that contention on the machine explains: not "
                     "failing (--strict fails on them)")
    if cmp.failed:
        why = [f"{len(cmp.failing)} regression(s) flagged"] if cmp.failing else []
        why += [f"{len(cmp.problems)} run problem(s)"] if cmp.problems else []
        notes.append(" and ".join(why) + (" (--fail-on-regression --strict)" if strict else " (--fail-on-regression)"))
    return notes
