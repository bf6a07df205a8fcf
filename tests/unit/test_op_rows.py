"""The roofline's walk over a run's ops in slices of time (store/op_rows.py): the same answer
however the trace is cut, from a spans table or from the run's files, on real GPU traces."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from helpers import run_cli

import counterprof.store.op_rows as op_rows
from counterprof.analysis.roofline import busy_split, roofline
from counterprof.calibrate import datasheet
from counterprof.collectors.torch_trace.convert import TraceConversion
from counterprof.store.query import RunQuery

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")

A100 = datasheet.lookup("NVIDIA A100-SXM4-40GB")


def _table(name: str) -> pa.Table:
    return pa.Table.from_batches(list(TraceConversion(TRACES / name, default_rank=3))).unify_dictionaries()


@pytest.mark.parametrize("name", ["a100_rank3of8.json.gz", "tracelens/h100_timesformer.json.gz"])
def test_slices_of_any_size_give_the_same_roofline(name, monkeypatch):
    spans = _table(name)
    whole = roofline(spans, A100, datasheet=A100)
    monkeypatch.setattr(op_rows, "CHUNK_ROWS", 100)        # dozens of slices, ops open across them
    src = op_rows.OpRows.of(spans)
    assert src.counts()[0] > 20 * 100
    src.close()
    sliced = roofline(spans, A100, datasheet=A100)
    assert json.dumps(sliced.to_json(), sort_keys=True) == json.dumps(whole.to_json(), sort_keys=True)
    assert whole.ops and whole.mfu and whole.total_time_ns > 0
    # busy_split over a window cuts the same atoms
    lo, hi = int(pa.compute.min(spans.column("start").cast(pa.int64())).as_py()), \
        int(pa.compute.max(spans.column("end").cast(pa.int64())).as_py())
    mid = (lo, lo + (hi - lo) // 2)
    assert busy_split(sliced, None, mid)[0] == busy_split(whole, None, mid)[0]


def test_the_runs_files_and_its_table_agree(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("import", str(TRACES / "a100_rank3of8.json.gz"), "-o", str(run), "-q", timeout=120)
    assert proc.returncode == 0, proc.stderr
    q = RunQuery(run)
    from_files = roofline(q, A100, datasheet=A100, keep_atoms=False)
    from_table = roofline(q.spans(), A100, datasheet=A100, keep_atoms=False)
    q.close()
    assert json.dumps(from_files.to_json(), sort_keys=True) == json.dumps(from_table.to_json(), sort_keys=True)
    assert from_files.ops[0].calls > 0 and from_files.unmodelled["time_ns"] > 0
