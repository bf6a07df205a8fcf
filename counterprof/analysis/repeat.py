"""The summary of N repetitions of one command, like `perf stat -r N`: per row the mean over the
runs with the sample standard deviation. Pure: Summaries in, a Summary out.

A row is counted in the combined summary only when every run counted it (a mean over the runs
that happened to count it would mix populations); otherwise it keeps the first run's status.
Derived notes (CPUs utilized, rates) are per run and not averaged, so they are left out; the
standard deviation takes their place (perf stat -r shows its spread there too).
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from .summary import Summary


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) if len(values) > 1 else None)


def _combine_field(summaries: list[Summary], name: str) -> tuple[float | None, float | None]:
    vals = [getattr(s, name) for s in summaries]
    if not vals or any(v is None for v in vals):
        return None, None
    return mean_sd([float(v) for v in vals])


def combine(summaries: list[Summary]) -> Summary:
    """One Summary over runs of the same command: means, with `stddev` on every row and
    the wall/user/sys times' standard deviations in `spread`."""
    if not summaries:
        raise ValueError("combine() needs at least one summary")
    first = summaries[0]
    keys = list(dict.fromkeys((r.source, r.metric, r.aggregate) for s in summaries for r in s.rows))
    by_run = [{(r.source, r.metric, r.aggregate): r for r in s.rows} for s in summaries]
    rows = []
    for key in keys:
        found = [d.get(key) for d in by_run]
        template = next(r for r in found if r is not None)
        values = [r.value for r in found if r is not None and r.value is not None]
        if len(values) == len(found):          # every run counted it
            present = [r for r in found if r is not None]
            m, sd = mean_sd([float(v) for v in values])
            cov = [r.coverage for r in present]
            covered = [c for c in cov if c is not None]
            rows.append(replace(template, value=m, stddev=sd, note="",
                                coverage=min(covered) if len(covered) == len(cov) else None,
                                unknown_intervals=sum(r.unknown_intervals for r in present)))
        else:
            missing = next((r for r in found if r is None or r.value is None), None)
            rows.append(replace(missing or template, value=None, stddev=None, note="",
                                status=(missing.status if missing is not None else "not counted")))
    elapsed, elapsed_sd = _combine_field(summaries, "elapsed_s")
    user, user_sd = _combine_field(summaries, "user_s")
    system, system_sd = _combine_field(summaries, "system_s")
    statuses = [s.exit_status for s in summaries]
    return Summary(command=first.command, elapsed_s=elapsed, user_s=user, system_s=system,
                   exit_status=next((x for x in statuses if x), statuses[0]), rows=rows,
                   collectors=first.collectors, path=first.path, ranks=first.ranks,
                   runs=len(summaries),
                   spread={"elapsed_s": elapsed_sd, "user_s": user_sd, "system_s": system_sd})
