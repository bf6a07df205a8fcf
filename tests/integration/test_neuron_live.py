"""The live view of a run on a Neuron device (the fakes of tests/fake_neuron): a panel per
Neuron device with its NeuronCores' figures, in a real terminal (tmux)."""
from __future__ import annotations

import re
import shlex

from fake_neuron import BIN, make_sysfs
from helpers import COUNTERPROF, PYTHON, REPO
from integration.test_live import Tmux, has, pytestmark, shell  # noqa: F401  (tmux, marks)

import pytest

WORKLOAD = str(REPO / "tests" / "neuron_workload.py")


@pytest.fixture
def term():
    t = Tmux(width=160, height=60)
    yield t
    t.kill()


def test_a_panel_per_neuron_device(term, tmp_path):
    root = make_sysfs(tmp_path / "neuron_device", devices=1, cores=4)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in {
        "PATH": f"{BIN}:/usr/bin:/bin", "COUNTERPROF_NEURON_SYSFS": str(root),
        "FAKE_NEURON_UTIL": "80"}.items())
    term.start(shell([*COUNTERPROF, "run", "--live", "-o", str(tmp_path / "run"), "--",
                      PYTHON, WORKLOAD, "8", str(root), "1000000000"], tmp_path, env))
    def shown(label: str, value: str):       # a row of the panel with its current value
        return lambda s: any(label in ln and value in ln.split(label, 1)[1] for ln in s)

    lines = term.wait_for(lambda s: has("╭─ neuron:0")(s) and shown("nc1 util", "%")(s)
                          and shown("nc0 FLOPs", "G FLOP")(s) and shown("vCPU user", "%")(s),
                          timeout=40, what="the neuron:0 panel")
    util = next(ln for ln in lines if "nc0 util" in ln)
    assert "80.0%" in util or "80%" in util, util
    flops = next(ln for ln in lines if "nc0 FLOPs" in ln)
    assert re.search(r"\d(\.\d)?G FLOP", flops), flops      # ~1e9 FLOPs per 50 ms: a delta as its rate
    assert any(" vCPU user" in ln and "42.0%" in ln for ln in lines)     # the runtime's rows
    mem = next(ln for ln in lines if "nc0 mem" in ln)
    assert "of 96.0 GiB" in mem, mem                       # the device's size beside a core's use
    # the memory breakdown and Trn2's physical cores stay out of the panel
    assert not any("phys:" in ln or "device_mem_tensors" in ln for ln in lines)
    # no errors: the error counters are not shown
    assert not any("exec_errors" in ln for ln in lines)
    term.wait_for(has("EXIT=0"), timeout=60, what="the run to finish")
