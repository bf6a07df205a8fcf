"""`counterprof correlate` end to end: a CPU torch job (matmuls in a region, 16 MB adds, steps)
recorded twice under `run --torch` against ceilings `calibrate` measured; the roofline as the
predictor, the job's second run as the first's prediction, a user's file with a deliberately
skewed row, the gate, history; and the shared GPU traces against the datasheet and against
TraceLens's own per-op kernel times (a second tool's measurement of the same trace)."""
from __future__ import annotations

import ast
import csv
import json
import sys

import pytest

pytest.importorskip("torch")

from helpers import REPO, calibrated, run_cli
from kineto_traces import SHARED as TRACES, needs_shared_traces

EXAMPLE = REPO / "examples" / "matmul_add.py"         # README's example, with its predictions file
PREDICTIONS = REPO / "examples" / "predictions.csv"
MM = [[384, 384], [384, 384]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(env with this machine's ceilings, two runs of the README's example)."""
    home = tmp_path_factory.mktemp("xdg")
    env, _ = calibrated(home)
    out = []
    for name in ("a", "b"):
        d = tmp_path_factory.mktemp(name)
        proc = run_cli("run", "--torch", "--torch-window", "4/10", "-q", "-o", str(d / "run"), "--",
                       sys.executable, str(EXAMPLE), timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        out.append(d / "run")
    return env, out


def correlate(env, *args: str, rc: int = 0) -> dict:
    proc = run_cli("correlate", *args, "--json", timeout=120, env=env)
    assert proc.returncode == rc and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def items(doc: dict) -> dict[str, dict]:
    return {i["name"]: i for i in doc["items"]}


def test_the_roofline_predicts_each_op_at_its_roof(runs):
    """The roofline predicts each op at its roof: its mean time over the prediction is 1 / the
    roof fraction `roofline` reports (the ratio is of the median)."""
    env, (a, _) = runs
    doc = correlate(env, str(a), "--model", "roofline")
    roof = json.loads(run_cli("roofline", str(a), "--json", env=env).stdout)
    fraction = {o["name"]: o["roof_fraction"] for o in roof["ops"]}
    got = items(doc)
    assert {"aten::mm", "aten::add"} <= set(got), list(got)
    assert doc["source"].startswith("roofline (measured") and doc["coverage"] > 0.8, doc
    for name in ("aten::mm", "aten::add"):
        i = got[name]
        print(f"\n{name}: measured {i['measured_us']:.0f} µs, roofline {i['predicted_us']:.0f} µs, "
              f"ratio {i['ratio']:.2f}, 1 / roof fraction {1 / fraction[name]:.2f}")
        mean_ratio = i["measured_total_us"] / i["calls"] / i["predicted_us"]
        assert mean_ratio * fraction[name] == pytest.approx(1, rel=0.01), (i, fraction[name])
        assert i["ratio"] == pytest.approx(i["measured_us"] / i["predicted_us"], rel=0.01)
    assert got["aten::mm"]["shapes"] == MM and got["aten::mm"]["group"] == "GEMM"
    assert got["aten::add"]["group"] == "elementwise"
    assert doc["mape"] is not None and 0 <= doc["mape"] < 1
    assert (doc["spearman"] is None) == (len(doc["items"]) < 3)        # a correlation needs 3 points


def test_a_run_predicts_itself_exactly_and_its_twin_within_noise(runs):
    env, (a, b) = runs
    same = correlate(env, str(a), "--predictions", str(a))
    assert same["mape"] == 0 and same["geomean_ratio"] == 1 and same["coverage"] == 1
    kinds = {i["kind"] for i in same["items"]}
    assert kinds == {"op", "region", "step"}, kinds
    twin = correlate(env, str(a), "--predictions", str(b))
    assert twin["source"] == f"run {b.name}"
    got = items(twin)
    print(f"\nrun a against run b: geo-mean {twin['geomean_ratio']:.2f}, MAPE {twin['mape']:.0%}; "
          + ", ".join(f"{k} {v['ratio']:.2f}" for k, v in got.items() if k in ("aten::mm", "aten::add", "matmul")))
    assert 0.6 < twin["geomean_ratio"] < 1.6
    for name in ("aten::mm", "aten::add", "matmul"):
        assert 0.5 < got[name]["ratio"] < 2, got[name]


def test_the_readme_example(runs):
    """README's "Predicted vs measured": examples/predictions.csv against a run of its job."""
    env, (a, _) = runs
    proc = run_cli("correlate", str(a), "--predictions", str(PREDICTIONS), env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("sim-v3: coverage 100%") and "unmatched line 6: kernel:*gemm*" in proc.stdout
    doc = correlate(env, str(a), "--predictions", str(PREDICTIONS))
    assert {i["key"].split(" ")[0] for i in doc["items"]} == {"op:aten::mm", "op:aten::add", "region:matmul",
                                                              "step:ProfilerStep"}
    add = items(doc)["aten::add"]
    assert add["predicted_us"] == pytest.approx(3 * 4 * 4 * 1024 * 1024 / 20e9 * 1e6, rel=1e-3)   # bytes / rate


def test_a_users_file_finds_the_skewed_row_first_and_lists_what_matched_nothing(runs, tmp_path):
    env, (a, _) = runs
    truth = items(correlate(env, str(a), "--predictions", str(a)))
    f = tmp_path / "sim-v3.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "name", "shapes", "predicted_us", "predicted_total_us", "tolerance", "block"])
        w.writerow(["op", "aten::mm", json.dumps(MM), truth["aten::mm"]["measured_us"] / 10, "", "", "tensor"])
        w.writerow(["op", "aten::add", "", truth["aten::add"]["measured_us"], "", "30%", "vector"])
        w.writerow(["region", "matmul", "", "", truth["matmul"]["measured_total_us"], "", ""])
        w.writerow(["op", "aten::mm", json.dumps([[8, 8], [8, 8]]), 1, "", "", ""])
        w.writerow(["kernel", "*gemm*", "", 3, "", "", ""])
    doc = correlate(env, str(a), "--predictions", str(f))
    top = doc["items"][0]
    assert (top["name"], top["within"], top["line"], top["extra"]) == ("aten::mm", False, 2, {"block": "tensor"})
    assert 9 < top["ratio"] < 11
    got = items(doc)
    assert got["aten::add"]["within"] and got["aten::add"]["tolerance"] == 0.3 and got["aten::add"]["ratio"] == 1
    assert got["matmul"]["ratio"] == 1
    why = {u["line"]: u["why"] for u in doc["sources"][0]["unmatched"]}
    assert set(why) == {5, 6} and "other shapes" in why[5] and "no kernel items" in why[6]
    # the text names the same, and the gate fails on the skewed row's MAPE
    proc = run_cli("correlate", str(a), "--predictions", str(f), "--fail-above", "15", env=env)
    assert proc.returncode == 1 and "above --fail-above 15%" in proc.stderr, proc.stderr
    assert "unmatched line 5" in proc.stdout and "aten::mm" in proc.stdout.split("\n", 3)[3]
    ok = run_cli("correlate", str(a), "--predictions", str(a), "--fail-above", "1", env=env)
    assert ok.returncode == 0, ok.stderr
    nothing = tmp_path / "kernels.csv"                   # no row can be compared: no pass
    nothing.write_text("kind,name,predicted_us\nkernel,*,1\n")
    proc = run_cli("correlate", str(a), "--predictions", str(nothing), "--fail-above", "50", env=env)
    assert proc.returncode == 1 and "no row of kernels could be compared" in proc.stderr, proc.stderr


def test_outputs_csv_html_and_bad_input(runs, tmp_path):
    env, (a, b) = runs
    page, table = tmp_path / "c.html", tmp_path / "c.csv"
    proc = run_cli("correlate", str(a), "--predictions", str(b), "--html", str(page), "--csv", str(table), env=env)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    rows = list(csv.DictReader(table.open()))
    assert html.count("<circle class=\"row") == len(rows) > 3 and "measured = predicted" in html
    assert "<script" not in html and {r["name"] for r in rows} >= {"aten::mm", "matmul"}
    assert {r["kind"] for r in rows} == {"op", "region", "step"}
    for args, words in ((["--model", "datasheet"], "no datasheet entry for the device 'cpu'"),
                        ([], "nothing to hold the run against"),
                        (["--predictions", str(tmp_path / "none.csv")], "no such file"),
                        (["--model", "roofline", "--rank", "7"], "--rank 7"),
                        (["--model", "roofline", "--tolerance", "lots"], "--tolerance takes a percentage"),
                        (["--model", "roofline", "--top", "0"], "--top must be 1 or more"),
                        (["--model", "roofline", "--html", str(a / "meta.json")], "a file inside the run"),
                        (["--predictions", str(PREDICTIONS), "--csv", str(PREDICTIONS)], "would overwrite the input")):
        proc = run_cli("correlate", str(a), *args, env=env)
        assert proc.returncode in (1, 2) and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_history_tracks_the_correlation(runs, tmp_path):
    env, (a, b) = runs
    db = tmp_path / "perf.duckdb"
    files = []
    for run in (a, b):
        f = tmp_path / f"{run.parent.name}.json"
        f.write_text(run_cli("correlate", str(run), "--model", "roofline", "--json", env=env).stdout)
        files.append(f)
    proc = run_cli("history", "add", str(a), "--db", str(db), env=env)    # first without, then with
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("history", "add", str(a), str(b), "--db", str(db), "--correlation", str(files[0]),
                   "--correlation", str(files[1]), env=env)
    assert proc.returncode == 0 and "correlate series added to it" in proc.stderr, proc.stderr
    shown = json.loads(run_cli("history", "show", "--db", str(db), "--json", "--metric", "correlate:*:mape",
                               env=env).stdout)
    series = {t["series"]: t for t in shown["series"]}
    key = next(k for k in series if k.startswith("correlate:roofline") and k.endswith(":mape") and k.count(":") == 2)
    assert [p["value"] is not None for p in series[key]["points"]] == [True, True], series[key]
    assert series[key]["unit"] == "%"
    bad = run_cli("history", "add", str(a), "--db", str(db), "--correlation", str(tmp_path / "x.json"), env=env)
    assert bad.returncode != 0 and "not readable JSON" in bad.stderr
    shaped = tmp_path / "shaped.json"
    shaped.write_text(json.dumps({"run_id": "x", "sources": [{"source": "s", "by_group": [1, 2]}]}))
    bad = run_cli("history", "add", str(a), "--db", str(db), "--correlation", str(shaped), env=env)
    assert bad.returncode == 2 and "not a `counterprof correlate --json` output" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


@needs_shared_traces
@pytest.mark.parametrize("trace", ["h100_vit_nsfw.json.gz", "h100_timesformer.json.gz"])
def test_shared_gpu_traces_against_the_datasheet_and_tracelens(tmp_path, trace):
    """Our measured op time (its kernels) against TraceLens's kernel time per op name + shapes +
    types, given as a user's predictions file: the same trace measured by two tools agrees. Ours
    is at most theirs: TraceLens counts every kernel under an op, we count a child op with a cost
    model of its own (a convolution's bias add) in its own row."""
    run = tmp_path / "run"
    assert run_cli("import", str(TRACES / "tracelens" / trace), "-o", str(run), "-q").returncode == 0
    sheet = correlate(None, str(run), "--model", "datasheet")
    assert sheet["source"] == "datasheet (H100 SXM)" and sheet["coverage"] > 0.8
    assert all(i["ratio"] > 0.9 for i in sheet["items"]), [i for i in sheet["items"] if i["ratio"] <= 0.9]
    ref = json.loads((TRACES / "tracelens" / "tracelens_reference.json").read_text())["traces"][trace]
    f = tmp_path / "tracelens.jsonl"
    with f.open("w") as fh:
        for op in ref["ops"]:
            dims = [list(d) for d in ast.literal_eval(op["input_dims"])]
            types = list(ast.literal_eval(op["input_types"]))
            fh.write(json.dumps({"name": op["name"], "shapes": dims, "types": types,
                                 "predicted_total_us": op["kernel_time_us_sum"], "source": "tracelens"}) + "\n")
    doc = correlate(None, str(run), "--predictions", str(f))
    matched = {(i["name"], json.dumps(i["shapes"])): i for i in doc["items"]}
    print(f"\n{trace}: {len(matched)} of {len(ref['ops'])} TraceLens ops matched; ratios "
          + ", ".join(f"{i['ratio']:.3f}" for i in matched.values()))
    assert len(matched) >= len(ref["ops"]) - len(doc["sources"][0]["unmatched"]) and len(matched) >= 3
    assert all(0.9 < i["ratio"] < 1.001 for i in matched.values()), matched
    # a kernel pattern gets every GEMM kernel of the trace, summed by their total
    f = tmp_path / "kernels.csv"
    f.write_text("kind,name,predicted_total_us\nkernel,*gemm*,1000\nkernel,re:^nope$,1\n")
    k = correlate(None, str(run), "--predictions", str(f))
    gemm = k["items"][0]
    assert gemm["kind"] == "kernel" and gemm["items"] > 1 and gemm["group"] == "GEMM", gemm
    assert gemm["ratio"] == pytest.approx(gemm["measured_total_us"] / 1000, rel=1e-3)
    assert [u["line"] for u in k["sources"][0]["unmatched"]] == [3]
    assert sum(abs(i["ratio"] - 1) < 0.005 for i in matched.values()) >= 0.8 * len(matched)
