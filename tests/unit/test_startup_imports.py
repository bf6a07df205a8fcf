"""What `counterprof --help` (and `import counterprof`) import: the interpreter's own modules,
the standard library and counterprof's light modules, nothing else. Start-up time is what a
user waits for on every command; pyarrow, numpy, pandas, duckdb, rich and torch cost tens to
hundreds of ms each, so they load only in a command that needs them. Not a timing test: the
modules imported are the same on any machine."""
import json
import subprocess
import sys
from pathlib import Path

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
            "from counterprof.api import Run, load; "
            "assert counterprof.profile is profile and counterprof.region is region; "
            "assert counterprof.Run is Run and counterprof.load is load; "
            "assert set(counterprof.__all__) <= set(dir(counterprof)); print('ok')")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "ok", p.stderr[-2000:]
    p = subprocess.run([PYTHON, "-c", "import counterprof; counterprof.nope"], capture_output=True,
                       text=True, timeout=60)
    assert "has no attribute 'nope'" in p.stderr


def _run_in_process(tmp_path, args: list[str], tail: tuple[str, ...] = ("--", "true"),
                    prelude: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """`counterprof ARGS -o tmp/r TAIL` in a fresh interpreter: (the process, sys.modules at
    the end; importtime would also list imports that failed, as pandas's must). `prelude`
    runs first."""
    code = (prelude + "import json, sys\nfrom counterprof.cli import main\n"
            f"rc = main([*{args!r}, '-o', {str(tmp_path / 'r')!r}, *{list(tail)!r}])\n"
            "print(json.dumps([rc, sorted(sys.modules)]))")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, names = json.loads(next(line for line in reversed(p.stdout.splitlines())
                                if line.startswith("[")))
    assert rc == 0
    return p, names


def test_a_run_keeps_pandas_and_heavy_extras_out_of_its_process(tmp_path):
    """`counterprof run -q -- true` imports pyarrow and numpy (it writes Arrow and Parquet) but
    not pandas (pyarrow's first array conversion would: 0.3-0.6 s), pyarrow.compute (~50 ms),
    rich (nothing is drawn under -q), duckdb or torch."""
    p, names = _run_in_process(tmp_path, ['run', '-q', '-e', 'task-clock'])
    tops = {name.split(".")[0] for name in names}
    assert {"pyarrow", "numpy"} <= tops
    assert not tops & {"pandas", "rich", "duckdb", "torch", "polars"}, sorted(tops & HEAVY)
    assert "pyarrow.compute" not in names
    assert (tmp_path / "r" / "meta.json").exists()


def test_a_run_printing_its_summary_off_a_terminal_imports_no_rich_nor_pyarrow_compute(tmp_path):
    """`counterprof run -- true` with its summary table on stderr (a pipe here): the table is
    laid out without rich (~40 ms of import) and its sums are folded with numpy, not
    pyarrow.compute and its group_by (~45 ms with acero and dataset), nor pyarrow.parquet (~20
    ms with pyarrow.fs and ssl: the summary reads the run's meta and catalog, no Parquet); the
    table still prints."""
    p, names = _run_in_process(tmp_path, ['run', '-e', 'task-clock'])
    assert "Performance counter stats for 'true'" in p.stderr and "task-clock" in p.stderr
    heavy = {"rich", "pyarrow.compute", "pyarrow.acero", "pyarrow.dataset", "pyarrow.parquet", "ssl"}
    assert not heavy & set(names) and "rich" not in {n.split(".")[0] for n in names}, sorted(heavy & set(names))


def test_a_default_run_imports_no_module_it_does_not_use(tmp_path):
    """What a default `counterprof run -q -- true` leaves out: importlib.metadata (the
    collectors' entry points are read from the .dist-info files), pynvml where there is no
    NVIDIA driver (the dlopen nvmlInit would make says so), secrets/hashlib (a writer id is
    os.urandom's hex), calibration's measuring code (only its cache is read), the redaction
    used by the live view, the neuron-monitor child (subprocess) with no Neuron device,
    pyarrow.parquet with pyarrow.fs, its cloud filesystems and ssl (~20 ms: the journal is
    compacted through pyarrow._parquet's writer), dateutil (pyarrow loads it when a pa.array
    infers its type: the collectors' dictionaries are typed), shutil with bz2 and lzma (~2.5 ms:
    argparse's width and the PATH search are counterprof's own), difflib (only a misspelt
    event's suggestions) and the torch collector's steps files (no --torch)."""
    from counterprof.collectors.nvml.library import no_driver_here
    p, names = _run_in_process(tmp_path, ['run', '-q'])
    left_out = {"importlib.metadata", "secrets", "hashlib", "counterprof.calibrate.measure",
                "statistics", "counterprof.ground.redact", "counterprof.collectors.neuron.child",
                "pyarrow.parquet", "pyarrow.fs", "pyarrow._s3fs", "ssl", "dateutil",
                "shutil", "bz2", "lzma", "difflib", "counterprof.collectors.torch_trace.steps"}
    if no_driver_here():
        left_out.add("pynvml")
    assert not left_out & set(names), sorted(left_out & set(names))
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert {"perf", "host", "threads", "nvml", "neuron"} <= set(meta["collectors"])


def test_the_entry_points_read_from_the_files_are_importlib_metadatas():
    """The registry's reader of entry_points.txt finds what importlib.metadata finds, in its
    order, and loads the same classes."""
    from importlib import metadata

    from counterprof import collector
    fast = collector._fast_entry_points(collector.ENTRY_POINT_GROUP)
    assert fast is not None            # a plain sys.path: no fallback
    slow = metadata.entry_points(group=collector.ENTRY_POINT_GROUP)
    assert [(e.name, e.value) for e in fast] == [(e.name, e.value) for e in slow]
    assert [e.load() for e in fast] == [e.load() for e in slow]


def test_entry_points_txt_is_read_as_an_ini_file(tmp_path, monkeypatch):
    """Sections, comments, extras and the first distribution of a name on sys.path winning,
    as importlib.metadata reads them; a zip on sys.path falls back to importlib.metadata."""
    from counterprof import collector
    first, second = tmp_path / "a", tmp_path / "b"
    for base, value in ((first, "json:JSONDecoder [extra]"), (second, "json:JSONEncoder")):
        info = base / "Some_Plugin-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "entry_points.txt").write_text(
            "# a comment\n[console_scripts]\nx = y:z\n\n[counterprof.collectors]\n"
            f"plug = {value}\n; another\n[other]\nq = r:s\n")
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "missing"), str(second)])
    found = collector._fast_entry_points(collector.ENTRY_POINT_GROUP)
    import json as json_module
    assert [(e.name, e.load()) for e in found] == [("plug", json_module.JSONDecoder)]
    zipped = tmp_path / "some.zip"
    zipped.write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(first), str(zipped)])
    assert collector._fast_entry_points(collector.ENTRY_POINT_GROUP) is None


def test_the_fast_exit_joins_threads_runs_atexit_and_flushes(tmp_path):
    """exit_without_teardown ends as Python's exit would: non-daemon threads joined, atexit
    run, buffered stdout written, the status given."""
    code = ("import atexit, sys, threading, time\nfrom counterprof.cli import exit_without_teardown\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "sys.stdout.write('buffered ')\nexit_without_teardown(3)\nprint('not reached')")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert p.stdout.split() == ["buffered", "thread", "done", "atexit", "ran"]


def test_a_run_exits_with_the_workloads_status_through_the_fast_exit(tmp_path):
    """The console script's `run` ends through exit_without_teardown: the workload's status,
    the summary on stderr, the run written."""
    exe = str(Path(PYTHON).with_name("counterprof"))
    if not Path(exe).exists():
        pytest.skip("no counterprof console script beside this Python")
    p = subprocess.run([exe, "run", "-o", str(tmp_path / "r"), "--", "sh", "-c", "echo out; exit 3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stdout == "out\n"
    assert "task-clock" in p.stderr and f"run directory: {tmp_path / 'r'}" in p.stderr
    assert json.loads((tmp_path / "r" / "meta.json").read_text())["status"] == "complete"


# Logs every class that dataclasses gives generated methods (one exec per method: ~0.8 ms a
# class, ~1.5 ms a frozen one); counterprof.ground.record's classes ask it for none.
_LOG_DATACLASSES = """import dataclasses, atexit
_made = []
_process = dataclasses._process_class
def _logged(cls, init, repr, eq, *rest):
    if init or repr or eq:
        _made.append(cls.__module__ + "." + cls.__qualname__)
    return _process(cls, init, repr, eq, *rest)
dataclasses._process_class = _logged
atexit.register(lambda: print("DATACLASSES " + " ".join(_made)))
"""


@pytest.mark.skipif(not hasattr(__import__("dataclasses"), "_process_class"),
                    reason="this Python's dataclasses has no _process_class to watch")
@pytest.mark.parametrize("args, tail", [(["run", "-q"], ("--", "true")),
                                        (["run", "-e", "task-clock"], ("--", "true")),
                                        (["import", "TRACE"], ("-q",))])
def test_run_and_import_build_no_dataclass_methods(tmp_path, args, tail):
    """The classes a run or an import defines before it is done are counterprof.ground.record's:
    @dataclass would compile their methods one exec at a time, ~25 ms of a `run -- true`."""
    if "TRACE" in args:
        from kineto_traces import SHARED
        if SHARED is None:
            pytest.skip("../shared/traces is not beside the checkout")
        args = ["import", str(SHARED / "a100_rank3of8.json.gz")]
    p, _ = _run_in_process(tmp_path, args, tail, prelude=_LOG_DATACLASSES)
    made = next(line for line in p.stdout.splitlines() if line.startswith("DATACLASSES")).split()[1:]
    # OpCost stays a dataclass: an import makes one per costed op (10,194 in a100_rank3of8), and
    # a record's shared __init__ costs ~2 µs more per instance than the generated one
    ours = [name for name in made if name.startswith("counterprof")
            and name != "counterprof.ground.opcost.OpCost"]
    assert not ours, f"use counterprof.ground.record.record for these (no exec per method): {ours}"


def test_an_import_loads_only_what_it_uses(tmp_path):
    """`counterprof import TRACE -o RUN` needs pyarrow and the native scanner, and no more:
    not numpy (pyarrow loads without it, ~45 ms: the conversion is Arrow's compute functions),
    not pandas (pyarrow's first pa.array would import it: 0.3-0.6 s), pyarrow.compute
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
    _, names = _run_in_process(tmp_path, ["import", str(trace)], tail=("-q",))
    assert {"pyarrow", "counterprof._native"} <= set(names)
    tops = {name.split(".")[0] for name in names}
    assert not tops & {"numpy", "pandas", "rich", "duckdb", "torch", "polars", "psutil"}, sorted(tops & HEAVY)
    unwanted = {"pyarrow.compute", "pyarrow.parquet", "pyarrow.fs", "pyarrow.dataset", "ssl",
                "importlib.metadata", "counterprof.collectors.host", "counterprof.collectors.perf",
                # the torch collector's machinery: the package loads it on first use
                "counterprof.collector", "counterprof.collectors.torch_trace.collector",
                "counterprof.collectors.torch_trace.steps", "counterprof.store.journal",
                "dateutil"}         # pyarrow loads it when a pa.array or scalar infers its type
    assert not unwanted & set(names), sorted(unwanted & set(names))
    assert list((tmp_path / "r" / "spans").glob("rank=0/*.parquet"))


def test_ctrl_c_during_start_up_is_one_line(monkeypatch, capsys):
    """Ctrl-C while a subcommand's modules still import (before its own handler): one line and
    130, not a traceback."""
    import counterprof.cli as cli

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    monkeypatch.setattr("sys.argv", ["counterprof", "run", "--", "true"])
    with pytest.raises(SystemExit) as exit_:
        cli.console_main()
    assert exit_.value.code == 130
    assert capsys.readouterr().err == "counterprof: interrupted\n"


def test_pyarrow_loads_without_numpy_for_an_import_and_numpy_stays_importable():
    """numpy_left_out: pyarrow (and pyarrow._compute) load as where numpy is absent; numpy
    imports afterwards as usual (a later `import numpy` is not refused)."""
    code = ("import sys\nfrom counterprof.cli.process_setup import numpy_left_out\n"
            "with numpy_left_out():\n    import pyarrow, pyarrow._compute\n"
            "assert 'numpy' not in sys.modules, 'numpy loaded'\n"
            "import numpy\nassert numpy.ones(2).sum() == 2\nprint('ok')")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
