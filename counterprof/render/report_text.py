"""`counterprof report` in the terminal. Formats a Report; computes nothing."""
from __future__ import annotations

import shlex
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.classify import Verdict, describe
from ..analysis.report import Report, asked_words
from ..ground import units
from .console import inert
from .summary import summary_renderable

COLORS = {"compute": "green", "memory": "magenta", "collectives": "cyan", "host": "yellow",
          "unknown": "white", "compute|memory": "blue"}
LETTER = {"compute": "C", "memory": "M", "collectives": "X", "host": "H", "unknown": "?"}


def shares_bar(v: Verdict, width: int = 40) -> Text:
    text = Text()
    for cls, share in sorted(v.shares.items(), key=lambda kv: kv[1], reverse=True):
        n = round(share * width)
        if n:
            text.append("█" * n, style=COLORS.get(cls, "white"))
    text.append("  ")
    parts = [f"{cls} {units.share(s)}" + (_host_parts(v) if cls == "host" else "")
             for cls, s in sorted(v.shares.items(), key=lambda kv: kv[1], reverse=True) if s >= 0.005]
    text.append("  ".join(parts))
    return text


def _host_parts(v: Verdict) -> str:
    """The host share's parts (input pipeline, CPU contention, blocked), where known."""
    parts = [f"{name} {units.share(x)}" for name, x in sorted(v.host_parts.items(), key=lambda kv: -kv[1])
             if x >= 0.005]
    return f" ({', '.join(parts)})" if len(parts) > 1 or (parts and len(v.host_parts) > 1) else ""


def roofline_line(rl: dict[str, Any]) -> Text:
    """MFU and how much of the op time has a cost model (details: `counterprof roofline RUN`)."""
    from .roofline import above_peak, caveats
    mfu = rl.get("mfu") or {}
    text = Text("roofline: ", style="bold")
    if mfu.get("mfu_measured") is not None or mfu.get("mfu_datasheet") is not None:
        parts = []
        if mfu.get("mfu_measured") is not None:
            parts.append(f"MFU {units.share(mfu['mfu_measured'], 1)} of the measured {mfu.get('dtype')} peak"
                         + above_peak(mfu["mfu_measured"]))
        if mfu.get("mfu_datasheet") is not None:
            parts.append(f"{units.share(mfu['mfu_datasheet'], 1)} of the datasheet's"
                         + above_peak(mfu["mfu_datasheet"]))
        text.append(", ".join(parts) + f" (median of {len(mfu.get('steps') or [])} traced steps)")
    elif rl.get("missing"):
        text.append("; ".join(rl["missing"]))
    if rl.get("modelled_share") is not None:
        text.append(f"; ops with a cost model: {units.share(rl['modelled_share'])} of op time", style="dim")
    text.append("  [counterprof roofline RUN]", style="dim")
    for n in caveats(rl.get("notes") or []):      # the ceilings do not fit, or are not the run's own
        text.append(f"\n  ! {inert(n)}", style="yellow")
    return text


def evidence_lines(v: Verdict, indent: str = "  ") -> list[Text]:
    out = []
    for e in v.evidence:
        line = Text(f"{indent}• {inert(e.text)}")
        if e.threshold is not None:
            line.append(f"  [threshold {e.threshold:g}; {e.source}]", style="dim")
        elif e.source:
            line.append(f"  [{e.source}]", style="dim")
        out.append(line)
    for e in v.secondary:
        out.append(Text(f"{indent}◦ also: {inert(e.text)}", style="dim"))
    if v.missing and v.verdict == "unknown":
        out.append(Text(f"{indent}→ would decide it: " + inert("; ".join(v.missing)), style="italic"))
    return out


def timeline(r: Report, width: int = 100) -> Text:
    text = Text()
    wins = r.windows
    if not wins:
        return text
    stride = max(1, -(-len(wins) // width))   # ceil: one character per `stride` windows
    for i in range(0, len(wins), stride):
        group = wins[i:i + stride]
        verdicts = [w.verdict for w in group]
        top = max(set(verdicts), key=verdicts.count)
        text.append(LETTER.get(top, "?"), style=COLORS.get(top, "white"))
    return text


def device_tables(devices: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """The report's device figures in one table per kind: GPUs, then Neuron devices (their
    cores and runtimes, entities neuron:D/...)."""
    neuron = [d for d in devices if str(d["entity"]).startswith("neuron:")]
    gpus = [d for d in devices if d not in neuron]
    return [t for t in (("GPUs", "gpu", gpus),
                        ("Neuron devices (cores, runtimes: neuron:D/core:C, neuron:D/pid:P)", "neuron", neuron))
            if t[2]]


WARNINGS_SHOWN = 5


def warning_lines(warnings: list[str]) -> list[Text]:
    """What the recording warned of its data (a trace cut off, an event not supported), above
    the verdict that rests on that data; the rest are in meta.json."""
    out = [Text(f"  ! {inert(w)}", style="yellow") for w in warnings[:WARNINGS_SHOWN]]
    if len(warnings) > WARNINGS_SHOWN:
        out.append(Text(f"  ! … {len(warnings) - WARNINGS_SHOWN} more in meta.json", style="yellow"))
    return out


def steps_words(r: Report) -> str:
    """What the headline was judged over: "30 steps, 7.67 s"."""
    steps = next((rv for rv in r.regions if rv.kind == "step"), None)
    return f"{steps.count} steps, {units.secs(steps.total_s)}" if steps else "the steps"


def phase_words(p: Verdict) -> str:
    what = {"start-up": "before the first step", "tear-down": "after the last step"}.get(p.scope, "")
    length = units.secs((p.end_ns - p.start_ns) / 1e9) if p.start_ns is not None and p.end_ns is not None else ""
    return f"{length} {what}".strip()


def report_renderable(r: Report) -> Group:
    parts: list[RenderableType] = []
    cmd = inert(shlex.join(r.run.get("command") or [])) or "(no command)"
    parts.append(Text(f"counterprof report: {inert(r.run.get('id'))}  '{cmd}'", style="bold"))
    parts.extend(warning_lines(r.run.get("warnings") or []))
    o = r.overall
    head = Text("\nverdict: ", style="bold")
    head.append(describe(o), style=f"bold {COLORS.get(o.verdict, 'white')}")
    if o.verdict != "unknown":
        head.append(f"   confidence {o.confidence:.2f}", style="dim")
    head.append(f"   (compute device: {o.device})", style="dim")
    parts.append(head)
    if o.scope == "steps":
        parts.append(Text(f"  judged over its steps ({steps_words(r)}); the time before and after them apart",
                          style="dim"))
    if o.shares:
        parts.append(Text("time: ") + shares_bar(o))
    parts.extend(evidence_lines(o))
    for p in r.phases:
        line = Text(f"{p.scope} ({phase_words(p)}): ", style="dim")
        line.append(describe(p), style=COLORS.get(p.verdict, "white"))
        parts.append(line)
    if r.roofline:
        parts.append(roofline_line(r.roofline))

    if r.windows:
        parts.append(Text(f"\ntimeline ({r.window_s:g} s windows, {len(r.windows)} of them): ", style="bold"))
        parts.append(timeline(r))
        parts.append(Text("  C compute  M memory  X collectives  H host  ? unknown", style="dim"))

    if r.regions:
        t = Table(title="regions", title_justify="left", box=None, pad_edge=False)
        for col in ("region", "kind", "count", "time", "verdict", "evidence"):
            t.add_column(col, overflow="fold")
        for rv in r.regions:
            first = inert(rv.verdict.evidence[0].text) if rv.verdict.evidence else ""
            t.add_row(inert(rv.name), rv.kind, str(rv.count), units.secs(rv.total_s),
                      Text(describe(rv.verdict), style=COLORS.get(rv.verdict.verdict, "white")), first)
        parts.extend([Text(""), t])

    if r.rank_verdicts or r.rank_analysis:
        parts.extend([Text(""), ranks_table(r)])
        if r.rank_analysis:
            for note in r.rank_analysis.get("notes", []):
                parts.append(Text(f"  {inert(note)}", style="dim"))
        for note in r.rank_notes:
            parts.append(Text(f"  {inert(note)}", style="dim"))

    if r.asked_windows:
        parts.append(Text(""))
        parts.append(Text("windows asked for (counterprof trace)", style="bold"))
        for a in r.asked_windows:
            parts.append(Text(f"  {inert(asked_words(a))}"))

    t = Table(title="collectors", title_justify="left", box=None, pad_edge=False)
    t.add_column("collector")
    t.add_column("status")
    t.add_column("why")
    for name, c in r.collectors.items():
        style = "green" if c.get("status") == "ok" else "yellow"
        t.add_row(inert(name), Text(str(c.get("status")), style=style), inert(c.get("reason", "")))
    parts.extend([Text(""), t])

    if r.summary is not None and r.summary.rows:
        parts.append(summary_renderable(r.summary))

    for title, col, devices in device_tables(r.devices):
        t = Table(title=title, title_justify="left", box=None, pad_edge=False)
        for column in (col, "metric", "mean", "peak", "unit"):
            t.add_column(column)
        for d in devices:
            for metric, m in d["metrics"].items():
                t.add_row(inert(d["entity"]), inert(metric), units.number(m["mean"]), units.number(m["peak"]),
                          m["unit"])
        parts.extend([Text(""), t])

    if r.gpu_breakdown:
        b = r.gpu_breakdown
        tm = b["temporal"]
        t = Table(title="GPU time (HTA-style breakdown, summed over ranks; `counterprof breakdown` for more)",
                  title_justify="left", box=None, pad_edge=False)
        for col in ("", "share"):
            t.add_column(col)
        t.add_row("idle", units.points(tm['idle_pct']))
        t.add_row("compute", units.points(tm['compute_pct']))
        t.add_row("non-compute", units.points(tm['non_compute_pct']))
        for k in b["kernel_types"][:6]:
            t.add_row(f"  kernels: {k['kernel_type']}", units.points(k['pct']))
        if b["comm_comp_overlap"].get("pct") is not None:
            t.add_row("communication overlapped by compute", units.points(b['comm_comp_overlap']['pct']))
        parts.extend([Text(""), t])

    if r.top_kernels:
        t = Table(title="top kernels", title_justify="left", box=None, pad_edge=False)
        for col in ("kernel", "class", "count", "total", "share"):
            t.add_column(col, overflow="fold")
        for k in r.top_kernels:
            t.add_row(inert(k["name"][:80]), k["kernel_class"] or "", str(k["count"]),
                      units.ns_as_ms(k['total_ns']), units.points(k['share_pct']))
        parts.extend([Text(""), t])

    if r.next_steps:
        parts.append(Text("\nwhat to look at next:", style="bold"))
        parts.extend(Text(f"  → {inert(s)}") for s in r.next_steps)
    return Group(*parts)


def _short(v: Verdict) -> str:
    if v.verdict == "unknown":
        return "unknown (" + "|".join(v.undecided) + ")" if v.undecided else "unknown"
    return f"{v.verdict} {units.share(v.shares.get(v.verdict))}"


def ranks_table(r: Report) -> Table:
    figs = {f["rank"]: f for f in (r.rank_analysis or {}).get("ranks", [])}
    verdicts = {int(v.scope.split()[-1]): v for v in r.rank_verdicts}
    straggler = (r.rank_analysis or {}).get("straggler")
    t = Table(title="ranks (per step: mean step time, time in collectives, wait for the straggler)",
              title_justify="left", box=None, pad_edge=False)
    late = {b["rank"]: b for b in (r.collective_calls or {}).get("by_rank", [])}
    for col in ("rank", "verdict", "step", "straggler in", "in collectives", "waited", "last at calls", "skew"):
        t.add_column(col, overflow="fold")
    for rank in sorted(set(figs) | set(verdicts)):
        f, v = figs.get(rank, {}), verdicts.get(rank)
        b = late.get(rank)
        t.add_row(str(rank) + (" ◀" if rank == straggler else ""),
                  Text(_short(v), style=COLORS.get(v.verdict, "white")) if v else "-",
                  units.ms(f.get("step_mean_s")), str(f.get("slowest_in", "-")) if f else "-",
                  units.ms(f.get("collective_s_per_step")), units.ms(f.get("waited_s_per_step")),
                  f"{b['last']} of {b['calls']}" if b else "-",
                  "-" if f.get("skew_ms") is None else f"{f['skew_ms']:+.2f} ms")
    return t

