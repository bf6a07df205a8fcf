"""`counterprof import` keeps each costed torch op's recorded shapes in its span's attrs (the
roofline's input). The native scanner writes that text from the args' own bytes; these tests
hold it to what the importer's rule gives from the trace JSON itself, decoded by Python."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

import counterprof
from counterprof.ground.opcost import FORMULAS
from helpers import run_cli
from kineto_traces import needs_shared_traces, shared_traces, SHARED

OP_CATS = ("cpu_op", "operator", "Operator")
NOT_OPS = ("c10d::", "gloo:", "record_param_comms", "ProfilerStep#", "enumerate(DataLoader)#")


def expected_attrs(name: str, args: dict | None) -> str | None:
    """The importer's rule: a costed op's Input Dims and Input type as json.dumps writes the
    decoded values, and Concrete Inputs when any of them has a value; other ops: none."""
    if name not in FORMULAS or args is None or "Input Dims" not in args:
        return None
    shapes = {"input_dims": args["Input Dims"], "input_types": args.get("Input type")}
    concrete = args.get("Concrete Inputs")
    if isinstance(concrete, list) and any(concrete):
        shapes["concrete_inputs"] = concrete
    return json.dumps(shapes, separators=(",", ":"))


def is_op(ev: dict) -> bool:
    return (ev.get("ph") == "X" and ev.get("cat") in OP_CATS and isinstance(ev.get("name"), str)
            and isinstance(ev.get("ts"), (int, float)) and isinstance(ev.get("dur"), (int, float))
            and not ev["name"].startswith(NOT_OPS))


def imported_ops(tmp_path: Path, trace: Path) -> Counter:
    run = tmp_path / "run"
    proc = run_cli("import", str(trace), "-o", str(run))
    assert proc.returncode == 0, proc.stderr
    spans = counterprof.load(run).table("spans").to_pydict()
    return Counter((n, a) for n, c, a in zip(spans["name"], spans["category"], spans["attrs"])
                   if c == "cpu_op" and not n.startswith(NOT_OPS))


@needs_shared_traces
@pytest.mark.parametrize("path", shared_traces() + (sorted((SHARED / "tracelens").glob("*.json.gz"))
                                                    if SHARED else []), ids=lambda p: p.name)
def test_every_ops_attrs_are_its_recorded_shapes(tmp_path, path):
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    expected = Counter((ev["name"], expected_attrs(ev["name"],
                                                   ev.get("args") if isinstance(ev.get("args"), dict) else None))
                       for ev in events if is_op(ev))
    assert imported_ops(tmp_path, path) == expected


# args texts the scanner must not copy as they stand: json.dumps writes them otherwise
TRICKY_ARGS = [
    '{"Input Dims": [ [2, 3] ,\n [ ] ], "Input type": [ "float" , "" ]}',
    '{"Input Dims": [[1]], "Input type": ["c10::Half\\u0020x", "a\\"b\\\\"]}',
    '{"Input Dims": [[1]], "Input type": ["\u00e9t\u00e9 \u4e2d"]}',
    '{"Input Dims": [[1], []], "Input type": ["float", "Scalar"], "Concrete Inputs": ["", 1.50, 1e-5]}',
    '{"Input Dims": {"b": 1, "a": 2, "b": 3}, "Input type": null}',
    '{"Input Dims": [[1]], "Input type": ["float"], "Input Dims": [[9, 9]]}',
    '{"Input Dims": [[1]], "Input type": ["float"], "note": "tab\there"}',
    '{"Input Dims": [[1]], "Input type": ["float"], "Concrete Inputs": ["", 0, false, null, []]}',
    '{"Input Dims": [[1]], "Input type": ["float"], "Concrete Inputs": [[], "0"]}',
    '{"Input Dims": [[4, 4]]}',
    '{"Input Dims": [[1]], "Concrete Inputs": "1"}',
    '{"Input Dims": [[-0, 12345678901234567890, -7]], "Input type": [true]}',
    '{"Input Dims": [[NaN]], "Input type": [Infinity, -Infinity]}',
    '{"Input\\u0020Dims": [[5]], "Input type": ["float"]}',
    '{"Input Dims": [[1]], "Input type": ["bad \xff\xfe bytes"]}',
    '{"Input Dims": [[1]], "Input type": ["\\ud800 lone"]}',
    '{"Concrete Inputs": ["1"]}',
    '{}',
]


def test_tricky_args_give_what_python_decodes(tmp_path):
    texts = [a.encode("utf-8", "surrogateescape") if "\xff" not in a else a.encode("latin-1")
             for a in TRICKY_ARGS]
    events = [b'{"ph": "X", "cat": "cpu_op", "name": "%s", "pid": 1, "tid": 1, "ts": %d, "dur": 1, "args": %s}'
              % (name.encode(), i, text)
              for i, text in enumerate(texts) for name in ("aten::mm", "aten::view")]
    trace = tmp_path / "t.json"
    trace.write_bytes(b'{"traceEvents": [\n' + b",\n".join(events) + b'\n], "baseTimeNanoseconds": 0}')
    expected = Counter()
    for text in texts:
        try:      # leniently, as the reference decoder: a raw tab inside a string is kept
            args = json.loads(text.decode("utf-8", "replace"), strict=False)
        except ValueError:
            args = None
        for name in ("aten::mm", "aten::view"):
            expected[(name, expected_attrs(name, args))] += 1
    got = imported_ops(tmp_path, trace)
    assert got == expected
    assert sum(n for (name, a), n in got.items() if a) >= 12     # the test holds real shapes


def test_the_reference_scanner_gives_the_same_shapes(tmp_path):
    """scan.py's Python decoder (native=False) against kineto.c, chunk boundaries anywhere; both
    read a raw tab inside a string leniently."""
    from counterprof.collectors.torch_trace.scan import KinetoScanner
    import pyarrow as pa
    texts = [a.encode("utf-8") if "\xff" not in a else a.encode("latin-1")
             for a in TRICKY_ARGS]
    events = [b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": %d, "dur": 1, '
              b'"args": %s}' % (i, text) for i, text in enumerate(texts)]
    trace = tmp_path / "t.json"
    trace.write_bytes(b'{"traceEvents": [' + b",".join(events) + b"]}")

    def every_row(cat, name):
        return pa.array([True] * len(name))

    def shapes(**kw):
        return sum((b.shapes.to_pylist() for b in KinetoScanner(trace, wants_shapes=every_row, **kw)), [])

    native = shapes(native=True)
    assert sum(s is not None for s in native) == len(texts) - 2     # two without Input Dims
    for chunk in (7, 64, 1 << 20):
        assert shapes(native=True, chunk_bytes=chunk) == native
        assert shapes(native=False, chunk_bytes=chunk) == native
