"""The unprivileged path: every capability dropped in a subprocess (setpriv), system
settings untouched. With perf_event_paranoid 2 the kernel then allows user-space
counting of one's own processes only, as for any ordinary user."""
import json
import shutil
import subprocess

import pytest

from helpers import COUNTERPROF, PYTHON, REPO
from counterprof.ground.errors import perf_event_paranoid

SETPRIV = shutil.which("setpriv")
pytestmark = [
    pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) is not installed"),
    pytest.mark.skipif((perf_event_paranoid() or 0) < 2,
                       reason="perf_event_paranoid < 2: an unprivileged user may count the kernel too"),
]


def unprivileged(*args, **kw):
    return subprocess.run([SETPRIV, "--bounding-set=-all", "--inh-caps=-all", "--", *COUNTERPROF, *args],
                          capture_output=True, text=True, timeout=120, **kw)


def test_falls_back_to_user_space_counting_like_perf(tmp_path):
    proc = unprivileged("run", "-e", "task-clock,page-faults", "-o", str(tmp_path / "r"), "--",
                        PYTHON, str(REPO / "examples" / "busy.py"), "0.2")
    assert proc.returncode == 0, proc.stderr
    assert "counting user space only" in proc.stderr
    events = json.loads((tmp_path / "r" / "meta.json").read_text())["collectors"]["perf"]["events"]
    assert events["task-clock"]["status"] == "counted"
    assert events["task-clock"]["modifiers"] == "u"
    assert "perf_event_paranoid" in events["task-clock"]["reason"]


def test_explicit_kernel_counting_is_refused_with_the_fix(tmp_path):
    proc = unprivileged("run", "-e", "task-clock:k", "-o", str(tmp_path / "r"), "--", "true")
    assert proc.returncode == 0, "the workload still runs; only the perf collector fails"
    assert "kernel.perf_event_paranoid is 2" in proc.stderr
    assert "sysctl kernel.perf_event_paranoid=1" in proc.stderr
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["collectors"]["perf"]["status"] == "failed"
    assert meta["collectors"]["host"]["status"] == "ok"


def test_system_wide_refused_but_the_run_goes_on(tmp_path):
    proc = unprivileged("run", "-q", "-a", "--duration", "0.3", "-o", str(tmp_path / "r"))
    assert proc.returncode == 0
    assert "system-wide (-a) counting is not permitted" in proc.stderr
    assert "Traceback" not in proc.stderr
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["collectors"]["perf"]["status"] == "failed"
    assert "perf_event_paranoid" in meta["collectors"]["perf"]["reason"]


def test_list_says_user_space_only(tmp_path):
    proc = unprivileged("list", "--json")
    assert proc.returncode == 0, proc.stderr
    perf = next(c for c in json.loads(proc.stdout)["collectors"] if c["name"] == "perf")
    assert perf["available"]
    rows = {r[0]: r for r in perf["tables"][0]["rows"]}
    assert rows["task-clock"][2] == "user only"
