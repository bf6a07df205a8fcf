"""HTA 0.5.0's numbers for every trace in /work/shared/traces, as a JSON fixture.

Run once, in a virtual environment that has HTA (it is not a counterprof dependency):

    python3 -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis==0.5.0
    /tmp/hta/bin/python tests/tools/hta_reference.py /work/shared/traces tests/data/hta_reference.json

The agreement test (tests/unit/test_breakdown_vs_hta.py) compares counterprof's breakdowns to
this file, so the test itself needs no HTA. Each trace is analysed twice: with HTA's default
rounding of nanosecond-resolution timestamps (start rounded up, end rounded down to whole µs)
and with HTA_DISABLE_NS_ROUNDING=1 (exact times, what counterprof keeps). A figure HTA cannot
compute (it raises) is recorded as {"error": "..."}.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path


def _safe(fn):
    try:
        return fn()
    except Exception as exc:   # HTA raises on traces without GPU kernels, and so on
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def analyse(path: Path) -> dict:
    from hta.trace_analysis import TraceAnalysis
    analyzer = TraceAnalysis(trace_files={0: str(path)}, trace_dir=str(path.parent))
    out: dict = {}

    def temporal():
        df = analyzer.get_temporal_breakdown(visualize=False)
        r = df.iloc[0]
        return {k: float(r[f"{k}(us)"]) for k in ("idle_time", "compute_time", "non_compute_time", "kernel_time")}
    out["temporal"] = _safe(temporal)

    def kernel_types(include_memory):
        def run():
            type_df, _ = analyzer.get_gpu_kernel_breakdown(
                visualize=False, include_memory_kernels=include_memory)
            return {str(r["kernel_type"]): float(r["sum"]) for _, r in type_df.iterrows()}
        return run
    out["kernel_types"] = _safe(kernel_types(False))
    out["kernel_types_with_memory"] = _safe(kernel_types(True))

    def overlap():
        df = analyzer.get_comm_comp_overlap(visualize=False)
        return {"pct": float(df.iloc[0]["comp_comm_overlap_pctg"])}
    out["comm_comp_overlap"] = _safe(overlap)

    def idle():
        df, _ = analyzer.get_idle_time_breakdown(ranks=[0], visualize=False)
        rows: dict = {}
        for _, r in df.iterrows():
            rows.setdefault(str(int(r["stream"])), {})[str(r["idle_category"])] = float(r["idle_time"])
        return rows
    out["idle_time"] = _safe(idle)

    def launches():
        df = analyzer.get_cuda_kernel_launch_stats(ranks=[0], visualize=False)[0]
        return {"count": int(len(df)), "cpu_duration_sum": float(df["cpu_duration"].sum()),
                "gpu_duration_sum": float(df["gpu_duration"].sum()),
                "launch_delay_sum": float(df["launch_delay"].sum())}
    out["launch_stats"] = _safe(launches)
    return out


def main(argv: list[str]) -> int:
    traces, target = Path(argv[0]), Path(argv[1])
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    import hta
    result = {"hta_version": getattr(hta, "__version__", "0.5.0"), "traces": {}}
    for path in sorted(traces.glob("*.json*")):
        entry = {}
        for mode, flag in (("exact", "1"), ("hta_default", "0")):
            os.environ["HTA_DISABLE_NS_ROUNDING"] = flag
            entry[mode] = _safe(lambda path=path: analyse(path))
        result["traces"][path.name] = entry
        print(path.name, json.dumps(entry["exact"])[:300], file=sys.stderr)
    target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
