"""Page size and time to render of the HTML pages (report --html, roofline --html, history show
--html), as this checkout writes them and as a git revision wrote them (--rev, default HEAD):

    python benchmarks/html_pages.py RUN [--rev HEAD] [--repeats 7]

RUN: a run directory (`counterprof run --torch -o RUN -- python examples/matmul_add.py`); the
history page is of a synthetic 24-run database. Each page is rendered to a file, then loaded by
headless chromium (offline, --virtual-time-budget so the scripts run), --repeats times in
alternation with an empty page: time to render is the median of (page - empty page) wall time
of the chromium process; for pages that draw with charts.js, also the page's own
performance.now() when its charts were drawn (#cp-layout's "drawn_ms")."""
from __future__ import annotations

import argparse
import html
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
MODULES = ("roofline", "report_html", "history_html")     # each after those it imports


def old_modules(rev: str, where: Path) -> dict[str, ModuleType]:
    """The renderers as of `rev`, loaded inside counterprof.render (their relative imports
    resolve against this checkout's package)."""
    out = {}
    for name in MODULES:
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:counterprof/render/{name}.py"],
                             capture_output=True, text=True, check=True).stdout
        for other in MODULES:                           # the old pages' imports of each other, kept old
            src = src.replace(f"from .{other} import", f"from ._old_{other} import")
        path = where / f"old_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"counterprof.render._old_{name}", path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        out[name] = mod
    return out


def pages(run: str, mods: dict[str, ModuleType], out: Path, tag: str) -> dict[str, Path]:
    from counterprof.analysis.report import ReportInputs, bucket_ns, build_report, regroup
    from counterprof.analysis.roofline_run import roofline_if_ops, run_roofline
    from counterprof.analysis.changepoints import change_points
    from counterprof.store.history import RunRecord, add, connect, trends
    from counterprof.store.query import RunQuery
    from counterprof.store.reader import Run

    r = Run(run)
    q = RunQuery(r.path)
    totals, devices, _ = regroup(q.groups())
    spans = q.spans()
    bn = bucket_ns(r.meta)
    inputs = ReportInputs(q.buckets(bn), totals, devices, spans, r.catalog, r.meta, ranks=1,
                          roofline=roofline_if_ops(r, spans, lambda m: None))
    q.close()
    report = build_report(inputs, 1.0)
    files = {}
    rh = mods["report_html"].report_html
    files["report"] = out / f"report-{tag}.html"
    if tag == "before":
        files["report"].write_text(rh(report, roofline=inputs.roofline))
    else:
        files["report"].write_text(rh(report, roofline=inputs.roofline, buckets=inputs.buckets,
                                      catalog=r.catalog, bucket_ns=bn))
    roof = inputs.roofline if inputs.roofline is not None else run_roofline(r, spans)
    if roof is not None:
        files["roofline"] = out / f"roofline-{tag}.html"
        files["roofline"].write_text(mods["roofline"].roofline_html(roof, "roofline"))
    db = out / f"h-{tag}.duckdb"
    con = connect(str(db))
    for i in range(24):
        step = 0.1 * (1.3 if i >= 14 else 1.0) * (1 + 0.01 * ((i * 7) % 5 - 2))
        add(con, RunRecord(f"n{i}", f"/runs/{i}", 1_700_000_000_000_000_000 + i * 86_400 * 10**9,
                           f"2024-05-{i + 1:02d}T02:00:00+0000", '["python", "train.py"]', "ci", f"{i:040x}", 2,
                           600.0, "compute", "0.1.0", [("step_time", step, "s", 500, "compute"),
                                                       ("region:forward", 0.04, "s", 500, "compute")]))
    ts = trends(con)
    con.close()
    files["history"] = out / f"history-{tag}.html"
    files["history"].write_text(mods["history_html"].history_html(
        str(db), ts, [change_points(t.values) for t in ts], 0.05))
    return files


def chromium_ms(page: Path, profile: Path) -> tuple[float, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed"
    t = time.perf_counter()
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                          "--allow-file-access-from-files", "--host-resolver-rules=MAP * ~NOTFOUND",
                          "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    return (time.perf_counter() - t) * 1e3, dom


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    import counterprof.render.history_html as h
    import counterprof.render.report_html as rh
    import counterprof.render.roofline as rf
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        before = pages(a.run, old_modules(a.rev, out), out, "before")
        after = pages(a.run, {"report_html": rh, "history_html": h, "roofline": rf}, out, "after")
        empty = out / "empty.html"
        empty.write_text("<!doctype html><html><body></body></html>")
        profile = out / "profile"
        chromium_ms(empty, profile)                     # the profile's first start, not timed
        rows = []
        for name in before:
            times: dict[str, list[float]] = {"before": [], "after": []}
            drawn = []
            for _ in range(a.repeats):
                for tag, f in (("before", before[name]), ("after", after[name])):
                    base, _ = chromium_ms(empty, profile)
                    ms, dom = chromium_ms(f, profile)
                    times[tag].append(ms - base)
                    m = re.search(r'<pre id="cp-layout"[^>]*>(.*?)</pre>', dom, re.S)
                    if tag == "after" and m:
                        drawn.append(json.loads(html.unescape(m.group(1)))["drawn_ms"])
            rows.append((name, before[name].stat().st_size, after[name].stat().st_size,
                         statistics.median(times["before"]), statistics.median(times["after"]),
                         statistics.median(drawn) if drawn else None))
    print("| page | bytes before | bytes after | load+render before (ms) | after (ms) | charts drawn at (ms) |")
    print("|---|---|---|---|---|---|")
    for name, b0, b1, t0, t1, d in rows:
        print(f"| {name} | {b0:,} | {b1:,} | {t0:.0f} | {t1:.0f} | {'-' if d is None else f'{d:.0f}'} |")


if __name__ == "__main__":
    main()
