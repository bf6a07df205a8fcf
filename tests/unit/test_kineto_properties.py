"""Property tests of the Kineto scanner on generated event streams.

Each example is a trace written token by token with random whitespace, key order, string
escaping, number spelling (ints, fractions, exponents, values past int64), metadata before and
after traceEvents, elements that are not complete events, plain or gzip. The native scanner and
the reference (raw_decode) scanner, each at a random chunk size, must both give exactly the rows
an independent oracle computes from the generated objects.
"""
from __future__ import annotations

import decimal
import gzip
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from counterprof.collectors.torch_trace.scan import ARG_INTS, KinetoScanner

I64 = 2 ** 63


class Num:
    """A JSON number literal, kept as text."""

    def __init__(self, text: str):
        self.text = text

    def ns(self) -> int | None:
        """The oracle: the literal (µs) in ns, rounded half away from zero; None off int64."""
        with decimal.localcontext(decimal.Context(prec=1000)):
            v = decimal.Decimal(self.text) * 1000
            ns = int(v.quantize(decimal.Decimal(1), rounding=decimal.ROUND_HALF_UP))
        return ns if -I64 < ns < I64 else None

    def int_value(self) -> int | None:
        if any(c in self.text for c in ".eE"):
            return None
        v = int(self.text)
        return v if -I64 < v < I64 else None


@st.composite
def numbers(draw, small=False):
    neg = draw(st.booleans()) if not small else False
    whole = draw(st.integers(0, 10 ** 6 if small else 10 ** 20))
    frac = draw(st.text("0123456789", min_size=1, max_size=9)) if draw(st.booleans()) else ""
    exp = draw(st.integers(-8, 8)) if draw(st.integers(0, 5)) == 0 else None
    text = ("-" if neg else "") + str(whole) + ("." + frac if frac else "")
    if exp is not None:
        text += (draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+", "-"]) if exp >= 0 else st.just("-"))
                 + str(abs(exp)))
    return Num(text)


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 20, 10 ** 20),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_values = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)
int_like = st.one_of(st.integers(-2 ** 40, 2 ** 40), st.integers(-10 ** 20, 10 ** 20),
                     numbers(small=True), st.text(max_size=4), st.none())


@st.composite
def events(draw):
    ev = {}
    if draw(st.integers(0, 9)):
        ev["ph"] = draw(st.sampled_from(["X", "X", "X", "i", "M", "s", "", "Xtra"])) \
            if draw(st.integers(0, 9)) else draw(json_values)
    if draw(st.integers(0, 9)):
        ev["cat"] = draw(st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy"])) \
            if draw(st.booleans()) else draw(st.one_of(st.text(max_size=12), json_values))
    if draw(st.integers(0, 9)):
        ev["name"] = draw(st.text(max_size=40)) if draw(st.integers(0, 9)) else draw(json_values)
    for key in ("pid", "tid"):
        if draw(st.booleans()):
            ev[key] = draw(int_like)
    for key in ("ts", "dur"):
        if draw(st.integers(0, 19)):
            ev[key] = draw(numbers()) if draw(st.integers(0, 19)) else draw(json_values)
    if draw(st.booleans()):
        args = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=3))
        for key in draw(st.lists(st.sampled_from(list(ARG_INTS)), max_size=5, unique=True)):
            args[key] = draw(int_like)
        ev["args"] = args if draw(st.integers(0, 9)) else draw(json_values)
    keys = list(ev)
    random.Random(draw(st.integers(0, 1000))).shuffle(keys)
    return {k: ev[k] for k in keys}


def as_num(v) -> Num | None:
    """A number in the JSON text, whichever way it was generated."""
    if isinstance(v, Num):
        return v
    if type(v) in (int, float):
        return Num(json.dumps(v))
    return None


def expected_row(ev) -> tuple | None:
    if not isinstance(ev, dict):
        return None
    ph = ev.get("ph")
    ts, dur = as_num(ev.get("ts")), as_num(ev.get("dur"))
    if not (isinstance(ph, str) and ph[:1] == "X" and isinstance(ts, Num) and isinstance(dur, Num)):
        return None
    ts_ns, dur_ns = ts.ns(), dur.ns()
    if ts_ns is None or dur_ns is None:
        return None

    def as_int(v):
        n = as_num(v)
        return n.int_value() if n is not None else None

    def as_text(v):
        if not isinstance(v, str):
            return None
        return v.encode("utf-16", "surrogatepass").decode("utf-16", "replace")

    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    return (as_text(ev.get("cat")), as_text(ev.get("name")), ts_ns, dur_ns, as_int(ev.get("pid")),
            as_int(ev.get("tid")), *(as_int(args.get(k)) for k in ARG_INTS))


def dump(value, rnd: random.Random) -> str:
    """JSON text with random whitespace and escaping."""
    ws = lambda: rnd.choice(["", "", " ", "\n", "\t ", "\r\n  "])  # noqa: E731
    if isinstance(value, Num):
        return value.text
    if isinstance(value, str):
        ascii_only = rnd.random() < 0.5 or any(0xD800 <= ord(c) <= 0xDFFF for c in value)
        return json.dumps(value, ensure_ascii=ascii_only)
    if isinstance(value, dict):
        items = [ws() + dump(k, rnd) + ws() + ":" + ws() + dump(v, rnd) for k, v in value.items()]
        return "{" + ",".join(items) + ws() + "}"
    if isinstance(value, list):
        return "[" + ",".join(ws() + dump(v, rnd) for v in value) + ws() + "]"
    return json.dumps(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(evs=st.lists(events(), max_size=25), extra=st.lists(st.one_of(st.integers(), json_values), max_size=3),
       meta=st.dictionaries(st.sampled_from(["schemaVersion", "distributedInfo", "baseTimeNanoseconds",
                                             "deviceProperties", "traceName"]), json_values, max_size=4),
       split=st.integers(0, 4), gz=st.booleans(), seed=st.integers(0, 10 ** 6),
       chunks=st.tuples(st.integers(1, 300), st.integers(1, 5000)))
def test_both_scanners_give_exactly_the_oracles_rows(tmp_path, evs, extra, meta, split, gz, seed, chunks):
    rnd = random.Random(seed)
    elements = evs + extra
    rnd.shuffle(elements)
    keys = list(meta)
    before = {k: meta[k] for k in keys[:split]}
    after = {k: meta[k] for k in keys[split:]}
    doc = {**before, "traceEvents": elements, **after}
    text = dump(doc, rnd)
    data = text.encode("utf-8")
    path = tmp_path / f"t{seed}.json"
    path.write_bytes(gzip.compress(data) if gz else data)

    expected = [r for r in map(expected_row, elements) if r is not None]
    # complete events (ph X) whose ts or dur is not a time: left out, and counted in one line
    bad = sum(1 for ev in elements if isinstance(ev, dict) and isinstance(ev.get("ph"), str)
              and ev["ph"][:1] == "X" and expected_row(ev) is None)
    for native, chunk in ((True, chunks[0]), (False, chunks[1])):
        scanner = KinetoScanner(path, native=native, chunk_bytes=chunk, batch_rows=7)
        batches = list(scanner)
        said = [f"{bad:,} complete event(s) (ph X) left out"] if bad else []
        assert [p[:len(said[0])] for p in scanner.problems] == said if bad else not scanner.problems, \
            (bad, scanner.problems)
        rows = []
        for b in batches:
            cols = [b.columns[c].to_pylist() for c in ("cat", "name", "ts_ns", "dur_ns", "pid", "tid",
                                                      *(ARG_INTS[k] for k in ARG_INTS))]
            rows += list(zip(*cols))
        assert rows == expected, f"native={native} chunk={chunk}"
        assert scanner.meta == json.loads(json.dumps({**before, **after}))
        assert scanner.skipped == len(elements) - len(expected)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(evs=st.lists(events(), min_size=1, max_size=30), cut=st.floats(0.05, 0.95), seed=st.integers(0, 1000))
def test_a_trace_cut_anywhere_gives_a_prefix_of_its_rows(tmp_path, evs, cut, seed):
    rnd = random.Random(seed)
    text = dump({"traceEvents": evs}, rnd).encode()
    path = tmp_path / f"cut{seed}.json"
    path.write_bytes(text[: max(1, int(len(text) * cut))])
    expected = [r for r in map(expected_row, evs) if r is not None]
    for native in (True, False):
        scanner = KinetoScanner(path, native=native, chunk_bytes=rnd.randint(1, 64))
        try:
            rows = [r for b in scanner for r in zip(*[b.columns[c].to_pylist() for c in ("cat", "name", "ts_ns")])]
        except Exception as exc:       # only "not a trace" for a cut inside the first token
            assert "not a JSON trace" in str(exc) or "is empty" in str(exc)
            continue
        assert rows == [r[:3] for r in expected[: len(rows)]]
        assert scanner.problems        # and it says so
