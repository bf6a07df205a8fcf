"""The torch driver's calls into its own profilers keep torch's "Profiler clears events at the
end of each cycle" warning from the workload's stderr (on the H200, torch 2.11 gave it once per
process from a start or a stop, outside the filter the driver then had around step() only)."""
from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.profiler import profiler as torch_profiler  # noqa: E402

DRIVER = (Path(__file__).resolve().parents[2] / "collectors" / "torch_trace" / "bootstrap"
          / "_counterprof_torch_driver.py")
CLEARS = "Profiler clears events at the end of each cycle"


@pytest.fixture(scope="module")
def driver():
    spec = importlib.util.spec_from_file_location("_driver_under_test", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def used_profiler() -> torch_profiler.profile:
    """A profile whose next start warns, as torch does when its profiler object is reused."""
    prof = torch_profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    torch.ones(4).sum()
    prof.stop()
    return prof


def warned(call) -> list[str]:
    torch_profiler._WARNINGS_SHOWN.discard(next(
        (m for m in torch_profiler._WARNINGS_SHOWN if CLEARS in m), ""))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if CLEARS in str(w.message)]


def test_torch_warns_without_the_filter():
    """The control: this torch does warn on a reused profiler's start (else the test below
    could not fail)."""
    if not hasattr(torch_profiler, "_WARNINGS_SHOWN"):
        pytest.skip("this torch warns through another path (no _WARNINGS_SHOWN)")
    prof = used_profiler()
    try:
        assert warned(prof.start), "torch no longer warns here: the test below proves nothing"
    finally:
        prof.stop()


def test_calling_profiler_keeps_the_warning_out(driver):
    if not hasattr(torch_profiler, "_WARNINGS_SHOWN"):
        pytest.skip("this torch warns through another path (no _WARNINGS_SHOWN)")
    prof = used_profiler()

    def start_quietly():
        with driver._calling_profiler():
            prof.start()
    assert warned(start_quietly) == []
    with driver._calling_profiler():
        prof.stop()
    # the filter is gone afterwards: the workload's own warnings are its own
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("Warning: " + CLEARS + ". the workload's own", stacklevel=1)
    assert len(caught) == 1


def test_every_call_into_a_profiler_goes_through_the_filter():
    """Every prof.start(), prof.step() and prof.stop() in the driver sits inside a
    `with _calling_profiler():` block: a new call site without it brings the warning back."""
    tree = ast.parse(DRIVER.read_text())
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in ("start", "step", "stop")
             and "prof" in ast.unparse(n.func.value)]
    assert len(calls) >= 6, [ast.unparse(c) for c in calls]

    def guarded(node) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.With) and any(
                    "_calling_profiler" in ast.unparse(item.context_expr) for item in node.items):
                return True
        return False
    unguarded = [f"line {c.lineno}: {ast.unparse(c)}" for c in calls if not guarded(c)]
    assert unguarded == []
