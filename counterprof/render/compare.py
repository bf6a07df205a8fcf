"""`counterprof compare` as text (terminal) and markdown (pull-request comments). Formats a
Comparison; computes nothing (JSON is Comparison.to_json())."""
from __future__ import annotations

import shlex
from collections.abc import Callable

from ..analysis.compare import WALL, Comparison, Row, Side
from ..analysis.run_figures import STEP
from .console import inert
from ..ground import units

STATUS_WORD = {"regression": "REGRESSION", "improvement": "improvement", "changed": "changed",
               "context": "moved (machine)", "inconclusive": "inconclusive"}
EXPLAINED_WORD = {"regression": "slower (machine)", "improvement": "faster (machine)"}
# the readings compare's machine line rests on: shown by default when they moved
MFU_PREFIX = "metric:roofline.mfu"      # the MFU rows (analysis/roofline.MFU_SERIES) are shown like steps
CONTENTION_KEYS = ("metric:proc.run_delay", "metric:thread.main.runnable", "metric:system.cpu_util")
def _share(x: float | None) -> str:
    return units.share(x, none="?")      # a wait share the machine line lacks


def status_word(row: Row, strict: bool) -> str:
    """A regression contention explains reads "slower (machine)" (the gate lets it pass), unless
    the gate is strict."""
    if row.explained and not strict:
        return EXPLAINED_WORD.get(row.status, row.status)
    return STATUS_WORD.get(row.status, row.status)


def contention_text(row: Row) -> str:
    """What the machine's contention says about a flagged time ("" when nothing)."""
    if not row.contention or row.wait is None:
        return ""
    wb, wc = row.wait
    slower, more, less = ("candidate", wc, wb) if row.status == "regression" else ("baseline", wb, wc)
    waited = f"the {slower} waited for a CPU {_share(more)} of the time vs {_share(less)}"
    without = f"{units.change(row.adjusted_change)} with the wait taken out"
    if row.contention == "explains":
        return f"{waited}: contention explains this ({without})"
    if row.contention == "partly":
        return f"{waited}: contention explains only part of this ({without})"
    return f"{waited}, but the workload's own CPU use rose with it: its own threads may be the competition"


def label(row: Row) -> str:
    if row.key == "step_time":
        return "step time"
    if row.key == WALL:
        return "wall time"
    if row.key.startswith("region:"):
        return "region " + inert(row.key[7:])
    return inert(row.key[7:])


def rank_text(row: Row, multi: bool) -> str:
    if row.rank is None:
        return "all" if multi else ""
    return str(row.rank)


def _multi(cmp: Comparison) -> bool:
    return any(r.rank is not None for r in cmp.rows)


def shown(cmp: Comparison, all_rows: bool = False) -> list[Row]:
    """Steps, regions and MFU over all ranks, every flagged row, and what one side lacks."""
    if all_rows:
        return list(cmp.rows)
    moved = cmp.machine is not None and cmp.machine.moved
    return [r for r in cmp.rows if r.flagged or r.status.startswith("only in")
            or ((not r.key.startswith("metric:") or r.key.startswith(MFU_PREFIX)) and r.rank is None)
            or (moved and r.status == "context" and r.key in CONTENTION_KEYS)]


def _last_column(row: Row) -> str:
    """The verdict (change), why a row is not flagged when it has a reason, and what the
    machine's contention says about it."""
    return "; ".join(x for x in (_verdict_text(row), row.note, contention_text(row)) if x)


def _verdict_text(row: Row) -> str:
    if not row.verdict:
        return ""
    a, b = row.verdict
    return f"{a} → {b}" if a != b else a


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _headline(cmp: Comparison) -> str:
    """Regressions that fail the gate (all of them when strict), then the rest."""
    def count(status: str) -> int:
        return sum(1 for r in cmp.rows if r.status == status and not r.explained)

    strict = cmp.settings.get("strict", False)
    regressions = len(cmp.failing)
    explained = [r for r in cmp.rows if r.explained]
    text = (f"{_plural(regressions, 'regression')}, {_plural(count('improvement'), 'improvement')}, "
            f"{count('changed')} changed, {len(cmp.inconclusive)} inconclusive (of {len(cmp.rows)} compared)")
    if explained:
        slower = sum(1 for r in explained if r.status == "regression")
        text += (f"; {len(explained)} {'slower' if slower == len(explained) else 'moved'} with the machine: "
                 f"contention explains {'them' if len(explained) > 1 else 'it'}"
                 + (" (--strict: counted as regressions)" if strict and slower else ""))
    if cmp.problems:
        text += f"; {len(cmp.problems)} PROBLEM{'S' if len(cmp.problems) != 1 else ''}"
    return text


def machine_line(cmp: Comparison) -> str:
    """The machine's contention, per side, and what it explains ("" when it did not move and
    explains nothing)."""
    m = cmp.machine
    touched = [r for r in cmp.rows if r.contention]
    if m is None or not (m.moved or touched):
        return ""
    b, c = m.baseline, m.candidate
    parts = []
    scope = m.scope
    if scope:
        of = "of its steps' time" if scope == STEP else "of the time"
        parts.append(f"the candidate's main thread waited for a CPU {_share(c.waits[scope])} {of} "
                     f"vs the baseline's {_share(b.waits[scope])} ({c.wait_source or b.wait_source})")
    if b.other_share is not None and c.other_share is not None:
        parts.append(f"other processes used {_share(c.other_share)} of the machine's {c.cpus or b.cpus} CPUs "
                     f"vs {_share(b.other_share)}")
    text = "machine: " + ("; ".join(parts) or "moved")
    if m.busier:
        text += f": the machine was busier for the {m.busier}"
    explained = [r for r in touched if r.explained]
    if explained:
        names = ", ".join(_scope_name(r) for r in explained)
        text += (f"; contention explains {names}"
                 + ("" if cmp.settings.get("strict") else
                    f" (--fail-on-regression does not fail on {'them' if len(explained) > 1 else 'it'}; "
                    "--strict does)"))
    partly = [r for r in touched if r.contention == "partly"]
    if partly:
        text += "; it explains only part of " + ", ".join(_scope_name(r) for r in partly)
    own = [r for r in touched if r.contention == "own"]
    if own:
        text += ("; the workload's own CPU use rose with the wait, so its own threads may be what it "
                 "waited for: not explained (" + ", ".join(_scope_name(r) for r in own) + ")")
    return text


def _scope_name(r: Row) -> str:
    return label(r) + (f" (rank {r.rank})" if r.rank is not None else "")


def _side_text(side: Side) -> str:
    ranks = sorted({len(r) for r in side.ranks})
    runs = f"{len(side.ids)} run{'s' if len(side.ids) != 1 else ''}"
    return (f"{', '.join(side.ids[:4])}{' …' if len(side.ids) > 4 else ''}  ({runs}, "
            f"{'/'.join(map(str, ranks))} rank{'s' if ranks != [1] else ''})")


def _method(cmp: Comparison) -> str:
    from ..ground.thresholds import value
    s = cmp.settings
    t = f"{100 * s['threshold']:g}%"
    return (f"median change per quantity; {100 * s['confidence']:g}% percentile bootstrap interval "
            f"({s['resamples']} resamples, seed {s['seed']}); flagged when the interval excludes 0 "
            f"and |change| ≥ {t} (regions: and ≥ {1e3 * s['min_time_change_s']:g} ms; "
            f"counters: the whole interval beyond {t}); unchanged when the whole interval lies within "
            f"±{t}; inconclusive otherwise; metrics per {s['window_s']:g} s "
            "window; times: up is a regression; counters: changed; system.*: context, never flagged; "
            "contention explains a time when the slower side's main thread waited for a CPU at least "
            f"{100 * value('contention_wait_points'):g} points longer and, with that wait taken out, "
            f"under ±{t} (or {value('contention_unexplained_share'):g} of the change the wait implies) is left")


def _verdict_line(cmp: Comparison) -> str:
    a, b = cmp.baseline.verdict, cmp.candidate.verdict
    line = f"verdict: {a} → {b}" if a != b else f"verdict: {a} (unchanged)"
    if len(set(cmp.baseline.verdicts)) > 1 or len(set(cmp.candidate.verdicts)) > 1:
        line += (f"   [baseline runs: {', '.join(cmp.baseline.verdicts)}; "
                 f"candidate runs: {', '.join(cmp.candidate.verdicts)}]")
    return line


def _cells(r: Row, multi: bool) -> tuple[str, ...]:
    """A row's cells in both tables: quantity, rank, baseline, candidate, change, interval,
    and the last column (the status goes before that, worded per table)."""
    return (label(r), rank_text(r, multi), units.value(r.base_median, r.unit),
            units.value(r.cand_median, r.unit), units.change(r.change), units.interval(r.ci),
            _last_column(r))


def compare_text(cmp: Comparison, all_rows: bool = False) -> str:
    multi = _multi(cmp)
    strict = cmp.settings.get("strict", False)
    rows = shown(cmp, all_rows)
    table: list[tuple[str, ...]] = [("quantity", "rank", "baseline", "candidate", "change",
                                     f"{100 * cmp.settings['confidence']:g}% CI", "status", "verdict")]
    for r in rows:
        *cells, last = _cells(r, multi)
        table.append((*cells, status_word(r, strict), last))
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    lines = [f"counterprof compare: {_headline(cmp)}",
             f"baseline   {_side_text(cmp.baseline)}",
             f"candidate  {_side_text(cmp.candidate)}",
             f"command    {inert(shlex.join(cmp.baseline.command)) or '(none)'}",
             _verdict_line(cmp)]
    if machine_line(cmp):
        lines.append(machine_line(cmp))
    lines.append("")
    for t in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
    hidden = len(cmp.rows) - len(rows)
    if hidden:
        wide = sum(1 for r in cmp.rows if r.status == "inconclusive" and r not in rows)
        lines.append(f"{hidden} more rows (per rank and metrics) not flagged"
                     + (f" ({wide} of them inconclusive)" if wide else "") + ": --all shows them, --json has them")
    lines += _closing(cmp, ("PROBLEM: ", "note: ", "method: "))
    return "\n".join(lines) + "\n"


def _closing(cmp: Comparison, heads: tuple[str, str, str],
             esc: Callable[[str], str] = lambda text: text) -> list[str]:
    """The problems, the notes, then the method: a line each, headed (and escaped) per format."""
    problem, note, method = heads
    return ([problem + esc(n) for n in cmp.problems] + [note + esc(n) for n in cmp.notes]
            + [method + esc(_method(cmp))])


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _md_table(rows: list[Row], multi: bool, confidence: float, strict: bool) -> list[str]:
    out = [f"| | quantity | rank | baseline | candidate | change | {100 * confidence:g}% CI | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.explained and not strict:
            status = "🟠 " + status_word(r, strict)
        else:
            status = {"regression": "🔴 **regression**", "improvement": "🟢 improvement",
                      "changed": "🟡 changed", "inconclusive": "⚪ inconclusive"}.get(
                r.status, STATUS_WORD.get(r.status, r.status))
        quantity, *rest = _cells(r, multi)
        out.append("| " + " | ".join(_md(x) for x in (status, f"`{quantity}`", *rest)) + " |")
    return out


def compare_markdown(cmp: Comparison) -> str:
    multi = _multi(cmp)
    rows = shown(cmp)
    conf = cmp.settings["confidence"]
    strict = cmp.settings.get("strict", False)
    lines = [f"### counterprof compare: {_headline(cmp)}", "",
             f"**baseline** {_md(_side_text(cmp.baseline))} · **candidate** {_md(_side_text(cmp.candidate))}  ",
             f"command: `{inert(shlex.join(cmp.baseline.command)) or '(none)'}`  ",
             f"**{_md(_verdict_line(cmp))}**" + ("  " if machine_line(cmp) else "")]
    if machine_line(cmp):
        lines.append(f"⚠️ {_md(machine_line(cmp))}")
    lines.append("")
    lines += _md_table(rows, multi, conf, strict)
    if len(rows) < len(cmp.rows):
        lines += ["", f"<details><summary>all {len(cmp.rows)} rows</summary>", ""]
        lines += _md_table(cmp.rows, multi, conf, strict)
        lines += ["", "</details>"]
    lines.append("")
    lines += _closing(cmp, ("- ⛔ **problem**: ", "- note: ", "- method: "), _md)
    return "\n".join(lines) + "\n"
