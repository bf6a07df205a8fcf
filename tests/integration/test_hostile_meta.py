"""meta.json / catalog.json of the wrong shape (issue 12, item 10): one reader checks them
(counterprof/store/meta.py), so every command says the same one line, exits 1 (compare: 2,
never the gate's 1), and shows no traceback."""
from __future__ import annotations

import json

import pytest

from hostile.cases import Pristine, finished_run, meta_cases, run_case
from counterprof.ground.errors import RunDirectoryError
from counterprof.store.meta import catalog_problem, meta_problem, read_meta


@pytest.mark.parametrize("doc,why", [
    ([], "an array"), ([1, 2, 3], "an array"), ("hello", "a string"), (None, "null"), (7, "a number"),
    ({"status": 3}, "status is a number"), ({"collectors": [1]}, "collectors is an array"),
    ({"collectors": {"perf": "ok"}}, "collectors.perf is a string"),
    ({"start_ns": "yesterday"}, "start_ns is a string"), ({"start_ns": True}, "start_ns is a boolean"),
    ({"profiler": {"pid": "x"}}, "profiler.pid is a string"), ({"command": ["a", 1]}, "command holds"),
    ({"workload": {"exit_code": 1.5}}, "workload.exit_code is a number"),
])
def test_each_wrong_shape_is_named(doc, why):
    assert why in meta_problem(doc)


def test_a_counterprof_meta_passes_and_wrong_catalogs_are_named(tmp_path):
    ok = {"status": "complete", "start_ns": 1, "end_ns": None, "collectors": {"perf": {"status": "ok", "reason": ""}},
          "workload": {"exit_code": 0, "elapsed_s": 1.5, "signal": None}, "command": ["sh"]}
    assert meta_problem(ok) == ""
    assert catalog_problem([{"name": "task-clock", "unit": "ms"}]) == ""
    assert "not an array" in catalog_problem({})
    assert "entry 0 has no name" in catalog_problem([{"unit": "s"}])
    (tmp_path / "meta.json").write_text("[]")
    with pytest.raises(RunDirectoryError,
                       match=r"meta.json: meta.json is not a counterprof run's metadata \(it holds an array"):
        read_meta(tmp_path / "meta.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Pristine:
    root = tmp_path_factory.mktemp("pristine")
    return Pristine(finished_run(root / "finished"), root / "none")


TOP_LEVEL = ("array", "numbers", "string", "null", "number", "status-int")


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in meta_cases(Pristine(None, None))
                                  if c.klass == "meta" and c.name.split("-")[0] in TOP_LEVEL
                                  and c.name.rsplit("-", 1)[-1] != "json"],
                         ids=lambda c: c.name)
def test_every_command_says_one_line_for_a_meta_of_the_wrong_shape(runs, tmp_path, case):
    case.setup = _rebound(case, runs)
    res = run_case(case, tmp_path)
    assert res.ok, f"{case.name}: {res.problems}\n{res.stderr[-1500:]}"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["object", "numbers", "string", "name-int"])
def test_a_catalog_of_the_wrong_shape_is_named_and_the_run_still_reads(runs, tmp_path, shape):
    from hostile.cases import CATALOG_SHAPES, _copy
    from helpers import run_cli
    run = _copy(runs.finished, tmp_path)
    (run / "catalog.json").write_text(json.dumps(CATALOG_SHAPES[shape]))
    rep = run_cli("report", str(run))
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stderr
    assert "is not a counterprof metric catalog" in rep.stderr


def _rebound(case, runs):
    """meta_cases were built for no run (for the ids): the same case over this module's run."""
    name = case.name
    return next(c for c in meta_cases(runs) if c.name == name).setup
