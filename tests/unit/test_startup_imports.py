"""What `counterprof --help` (and `import counterprof`) import: the interpreter's own modules,
the standard library and counterprof's light modules, nothing else. Start-up time is what a
user waits for on every command; pyarrow, numpy, pandas, duckdb, rich and torch cost tens to
hundreds of ms each, so they load only in a command that needs them. Not a timing test: the
modules imported are the same on any machine."""
import json
import subprocess
import sys

import pytest

from helpers import PYTHON

HEAVY = {"pyarrow", "numpy", "pandas", "duckdb", "rich", "torch", "psutil", "cffi", "polars",
         "prometheus_client", "pynvml", "isal"}


def imported(args: list[str]) -> set[str]:
    """Modules `python -X importtime ARGS` imported (importtime's report, on stderr)."""
    p = subprocess.run([PYTHON, "-X", "importtime", *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    names = set()
    for line in p.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name)
    return names


@pytest.fixture(scope="module")
def interpreter_own() -> set[str]:
    return imported(["-c", "pass"])     # site, .pth hooks (an editable install's finder)


@pytest.mark.parametrize("args", [["-m", "counterprof", "--help"],
                                  ["-m", "counterprof", "--version"],
                                  ["-m", "counterprof", "run", "--help"],
                                  ["-m", "counterprof", "import", "--help"],
                                  ["-c", "import counterprof"]],
                         ids=["--help", "--version", "run --help", "import --help", "import counterprof"])
def test_only_light_modules_at_start_up(args, interpreter_own):
    extra = imported(args) - interpreter_own
    tops = {name.split(".")[0] for name in extra}
    assert not tops & HEAVY, f"{' '.join(args)} imports {sorted(tops & HEAVY)}"
    # org: copy.py's probe for Jython (`from org.python.core import ...`, which fails)
    allowed = set(sys.stdlib_module_names) | {"counterprof", "org"}
    assert tops <= allowed, f"{' '.join(args)} imports modules outside the allow-list: {sorted(tops - allowed)}"


def test_the_api_loads_on_first_use():
    """The lazy attributes are the real ones (counterprof.profile is the context manager)."""
    code = ("import sys, counterprof; assert 'pyarrow' not in sys.modules; "
            "from counterprof.api import profile; from counterprof.regions import region; "
            "from counterprof.store.reader import Run, load; "
            "assert counterprof.profile is profile and counterprof.region is region; "
            "assert counterprof.Run is Run and counterprof.load is load; "
            "assert set(counterprof.__all__) <= set(dir(counterprof)); print('ok')")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "ok", p.stderr[-2000:]
    p = subprocess.run([PYTHON, "-c", "import counterprof; counterprof.nope"], capture_output=True,
                       text=True, timeout=60)
    assert "has no attribute 'nope'" in p.stderr


def test_a_run_keeps_pandas_and_heavy_extras_out_of_its_process(tmp_path):
    """`counterprof run -q -- true` imports pyarrow and numpy (it writes Arrow and Parquet) but
    not pandas (pyarrow's first array conversion would: 0.3-0.6 s), pyarrow.compute (~50 ms),
    rich (nothing is drawn under -q), duckdb or torch."""
    # sys.modules at the end (importtime also lists imports that failed, as pandas's must)
    code = ("import json, sys\nfrom counterprof.cli import main\n"
            f"rc = main(['run', '-q', '-e', 'task-clock', '-o', {str(tmp_path / 'r')!r}, '--', 'true'])\n"
            "print(json.dumps([rc, sorted(sys.modules)]))")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, names = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0
    tops = {name.split(".")[0] for name in names}
    assert {"pyarrow", "numpy"} <= tops
    assert not tops & {"pandas", "rich", "duckdb", "torch", "polars"}, sorted(tops & HEAVY)
    assert "pyarrow.compute" not in names
    assert (tmp_path / "r" / "meta.json").exists()


def test_an_import_loads_only_what_it_uses(tmp_path):
    """`counterprof import TRACE -o RUN` needs pyarrow, numpy and the native scanner, and no
    more: not pandas (pyarrow's first pa.array would import it: 0.3-0.6 s), pyarrow.compute
    (~20 ms of wrappers: the conversion calls Arrow's functions through pyarrow._compute),
    pyarrow.parquet with pyarrow.fs and ssl (~12 ms: the spans are written through
    pyarrow._parquet's writer), importlib.metadata (~9 ms), the other collectors, or the readers
    (duckdb, pyarrow.dataset). Start-up is most of what a user waits for on an import."""
    from kineto_traces import X, launch, write_trace
    trace = write_trace(tmp_path / "rank0.json.gz", [
        X("cpu_op", "ProfilerStep#1", 0, 100),
        X("cpu_op", "aten::mm", 10, 20, **{"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}),
        *launch("gemm", 12, 3, 1, 40, 10),
        X("cpu_op", "record_param_comms", 50, 5, **{"Collective name": "allreduce", "dtype": "Float",
                                                   "In msg nelems": 8, "Out msg nelems": 8, "Group size": 2}),
    ], {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000}, gz=True)
    code = ("import json, sys\nfrom counterprof.cli import main\n"
            f"rc = main(['import', {str(trace)!r}, '-o', {str(tmp_path / 'r')!r}, '-q'])\n"
            "print(json.dumps([rc, sorted(sys.modules)]))")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, names = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0
    assert {"pyarrow", "numpy", "counterprof._native"} <= set(names)
    tops = {name.split(".")[0] for name in names}
    assert not tops & {"pandas", "rich", "duckdb", "torch", "polars", "psutil"}, sorted(tops & HEAVY)
    unwanted = {"pyarrow.compute", "pyarrow.parquet", "pyarrow.fs", "pyarrow.dataset", "ssl",
                "importlib.metadata", "counterprof.collectors.host", "counterprof.collectors.perf",
                # the torch collector's machinery: the package loads it on first use
                "counterprof.collector", "counterprof.collectors.torch_trace.collector",
                "counterprof.collectors.torch_trace.steps", "counterprof.store.journal"}
    assert not unwanted & set(names), sorted(unwanted & set(names))
    assert list((tmp_path / "r" / "spans").glob("rank=0/*.parquet"))
