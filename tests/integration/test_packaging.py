"""What `pip install .` ships: the compiled core, collectors as counterprof.collectors,
the entry points, and native/ in the source distribution."""
import subprocess
import sys
import tarfile
import zipfile

import pytest

from helpers import PYTHON, REPO

pytestmark = pytest.mark.slow


def test_wheel_contents(tmp_path):
    subprocess.run([PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=600)
    wheel = next(tmp_path.glob("counterprof-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("counterprof/_native") and n.endswith(".so") for n in names)
    for module in ("counterprof/collectors/__init__.py", "counterprof/collectors/host.py",
                   "counterprof/collectors/threads.py",
                   "counterprof/collectors/perf/events.py", "counterprof/collectors/nvml/library.py",
                   "counterprof/cli/run.py",
                   "counterprof/store/journal.py",
                   "counterprof/collectors/torch_trace/bootstrap/sitecustomize.py",
                   "counterprof/collectors/torch_trace/bootstrap/_counterprof_torch_driver.py",
                   "counterprof/collectors/jax_trace/convert.py",
                   "counterprof/collectors/jax_trace/bootstrap/_counterprof_jax_driver.py"):
        assert module in names
    assert not any(n.startswith("collectors/") for n in names), "never a top-level 'collectors'"
    ep = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[counterprof.collectors]" in ep
    assert "perf = counterprof.collectors.perf:PerfCollector" in ep
    assert "nvml = counterprof.collectors.nvml:NvmlCollector" in ep
    assert "threads = counterprof.collectors.threads:ThreadsCollector" in ep
    assert "torch = counterprof.collectors.torch_trace:TorchCollector" in ep
    assert "jax = counterprof.collectors.jax_trace.collector:JaxCollector" in ep
    assert "counterprof = counterprof.cli:console_main" in ep


def test_sdist_ships_native(tmp_path):
    code = ("import setuptools.build_meta as b, sys; "
            f"print(b.build_sdist({str(tmp_path)!r}))")
    out = subprocess.run([PYTHON, "-c", code], cwd=REPO, check=True, capture_output=True,
                         text=True, timeout=300)
    name = out.stdout.strip().splitlines()[-1]
    members = tarfile.open(tmp_path / name).getnames()
    for f in ("native/counterprof_native.c", "native/procstat.c", "native/kineto.c",
              "native/counterprof_native.h",
              "native/build_native.py", "setup.py", "pyproject.toml", "README.md"):
        assert any(m.endswith("/" + f) for m in members), f


def test_collectors_refuse_to_be_imported_top_level():
    out = subprocess.run([sys.executable, "-c", "import collectors"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "only importable as counterprof.collectors" in out.stderr


def test_vendor_libraries_are_not_imported_at_package_import():
    code = "import sys, counterprof; print(sorted(m for m in ('torch', 'pynvml') if m in sys.modules))"
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
