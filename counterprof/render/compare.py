"""`counterprof compare` as text (terminal) and markdown (pull-request comments). Formats a
Comparison; computes nothing (JSON is Comparison.to_json())."""
from __future__ import annotations

import shlex

from ..analysis.compare import FLAGGED, WALL, Comparison, Row
from .console import inert

STATUS_WORD = {"regression": "REGRESSION", "improvement": "improvement", "changed": "changed",
               "context": "moved (machine)"}
UNITS_SI = (("G", 1e9), ("M", 1e6), ("k", 1e3))


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        a = abs(v)
        if a >= 1:
            return f"{v:.3f} s"
        if a >= 1e-3:
            return f"{v * 1e3:.2f} ms"
        return f"{v * 1e6:.1f} µs"
    if unit.startswith("bytes"):
        rest = unit[5:]
        for name, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(v) >= div:
                return f"{v / div:.2f} {name}{rest}"
        return f"{v:.0f} B{rest}"
    if unit == "percent":
        return f"{v:.1f}%"
    for prefix, div in UNITS_SI:
        if abs(v) >= div * 10:
            return f"{v / div:.3g}{prefix} {unit}".rstrip()
    return f"{v:.4g} {unit}".rstrip()


def fmt_change(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def fmt_ci(ci) -> str:
    return "—" if ci is None else f"[{100 * ci[0]:+.1f}%, {100 * ci[1]:+.1f}%]"


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
    """Steps and regions over all ranks, every flagged row, and what one side lacks."""
    if all_rows:
        return list(cmp.rows)
    return [r for r in cmp.rows if r.flagged or r.status.startswith("only in")
            or (not r.key.startswith("metric:") and r.rank is None)]


def _last_column(row: Row) -> str:
    """The verdict (change) and, when a row has one, why it is not flagged."""
    v = _verdict_text(row)
    return f"{v}; {row.note}" if v and row.note else v or row.note


def _verdict_text(row: Row) -> str:
    if not row.verdict:
        return ""
    a, b = row.verdict
    return f"{a} → {b}" if a != b else a


def _headline(cmp: Comparison) -> str:
    counts = {s: sum(1 for r in cmp.rows if r.status == s) for s in FLAGGED}
    return (f"{counts['regression']} regression{'s' if counts['regression'] != 1 else ''}, "
            f"{counts['improvement']} improvement{'s' if counts['improvement'] != 1 else ''}, "
            f"{counts['changed']} changed (of {len(cmp.rows)} compared)"
            + (f"; {len(cmp.problems)} PROBLEM{'S' if len(cmp.problems) != 1 else ''}" if cmp.problems else ""))


def _side_text(side) -> str:
    ranks = sorted({len(r) for r in side.ranks})
    runs = f"{len(side.ids)} run{'s' if len(side.ids) != 1 else ''}"
    return (f"{', '.join(side.ids[:4])}{' …' if len(side.ids) > 4 else ''}  ({runs}, "
            f"{'/'.join(map(str, ranks))} rank{'s' if ranks != [1] else ''})")


def _method(cmp: Comparison) -> str:
    s = cmp.settings
    return (f"median change per quantity; {100 * s['confidence']:g}% percentile bootstrap interval "
            f"({s['resamples']} resamples, seed {s['seed']}); flagged when the interval excludes 0 "
            f"and |change| ≥ {100 * s['threshold']:g}% (regions: and ≥ {1e3 * s['min_time_change_s']:g} ms; "
            f"counters: the whole interval beyond {100 * s['threshold']:g}%); metrics per {s['window_s']:g} s "
            "window; times: up is a regression; counters: changed; system.*: context, never flagged")


def _verdict_line(cmp: Comparison) -> str:
    a, b = cmp.baseline.verdict, cmp.candidate.verdict
    line = f"verdict: {a} → {b}" if a != b else f"verdict: {a} (unchanged)"
    if len(set(cmp.baseline.verdicts)) > 1 or len(set(cmp.candidate.verdicts)) > 1:
        line += (f"   [baseline runs: {', '.join(cmp.baseline.verdicts)}; "
                 f"candidate runs: {', '.join(cmp.candidate.verdicts)}]")
    return line


def compare_text(cmp: Comparison, all_rows: bool = False) -> str:
    multi = _multi(cmp)
    rows = shown(cmp, all_rows)
    table = [("quantity", "rank", "baseline", "candidate", "change", f"{100 * cmp.settings['confidence']:g}% CI",
              "status", "verdict")]
    for r in rows:
        table.append((label(r), rank_text(r, multi), fmt_value(r.base_median, r.unit),
                      fmt_value(r.cand_median, r.unit), fmt_change(r.change), fmt_ci(r.ci),
                      STATUS_WORD.get(r.status, r.status), _last_column(r)))
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    lines = [f"counterprof compare: {_headline(cmp)}",
             f"baseline   {_side_text(cmp.baseline)}",
             f"candidate  {_side_text(cmp.candidate)}",
             f"command    {inert(shlex.join(cmp.baseline.command)) or '(none)'}",
             _verdict_line(cmp), ""]
    for t in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
    hidden = len(cmp.rows) - len(rows)
    if hidden:
        lines.append(f"{hidden} more rows (per rank and metrics) not flagged: --all shows them, --json has them")
    for n in cmp.problems:
        lines.append(f"PROBLEM: {n}")
    for n in cmp.notes:
        lines.append(f"note: {n}")
    lines.append(f"method: {_method(cmp)}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _md_table(rows: list[Row], multi: bool, confidence: float) -> list[str]:
    out = [f"| | quantity | rank | baseline | candidate | change | {100 * confidence:g}% CI | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = {"regression": "🔴 **regression**", "improvement": "🟢 improvement",
                  "changed": "🟡 changed"}.get(r.status, STATUS_WORD.get(r.status, r.status))
        out.append("| " + " | ".join(_md(x) for x in (
            status, f"`{label(r)}`", rank_text(r, multi), fmt_value(r.base_median, r.unit),
            fmt_value(r.cand_median, r.unit), fmt_change(r.change), fmt_ci(r.ci),
            _last_column(r))) + " |")
    return out


def compare_markdown(cmp: Comparison) -> str:
    multi = _multi(cmp)
    rows = shown(cmp)
    conf = cmp.settings["confidence"]
    lines = [f"### counterprof compare: {_headline(cmp)}", "",
             f"**baseline** {_md(_side_text(cmp.baseline))} · **candidate** {_md(_side_text(cmp.candidate))}  ",
             f"command: `{inert(shlex.join(cmp.baseline.command)) or '(none)'}`  ",
             f"**{_md(_verdict_line(cmp))}**", ""]
    lines += _md_table(rows, multi, conf)
    if len(rows) < len(cmp.rows):
        lines += ["", f"<details><summary>all {len(cmp.rows)} rows</summary>", ""]
        lines += _md_table(cmp.rows, multi, conf)
        lines += ["", "</details>"]
    lines.append("")
    for n in cmp.problems:
        lines.append(f"- ⛔ **problem**: {_md(n)}")
    for n in cmp.notes:
        lines.append(f"- note: {_md(n)}")
    lines.append(f"- method: {_md(_method(cmp))}")
    return "\n".join(lines) + "\n"
