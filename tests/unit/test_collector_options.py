"""Collectors declare their own flags on `counterprof run` (counterprof.collector.CollectorOptions):
run's parser asks every registered collector for its group, and its configuration for it, and
names none. A third-party collector registered through the entry points adds an option that
`counterprof run --help` shows and whose value reaches its configuration; one that fails to load
never breaks `run --help`; and the parser loads the collectors' light options modules only,
never the collectors (pyarrow must not load before a run has parsed its command line)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import re
from pathlib import Path

import pytest

from helpers import PYTHON
from counterprof.cli.common import UsageFailure

BUILT_IN = ("perf", "host", "threads", "nvml", "neuron", "neuron_profile", "torch", "jax")

PLUGIN = '''
from counterprof.collector import Collector, CollectorOptions
from counterprof.ground.errors import UsageError


class FakeOptions(CollectorOptions):
    title = "fake collector (a third party's)"
    finds_ranks = True

    @classmethod
    def add_arguments(cls, group):
        group.add_argument("--fake", action="store_true", help="turn the fake collector on")
        group.add_argument("--fake-rate", type=float, default=3.0, metavar="HZ",
                           help="how often the fake collector looks (default 3)")

    @classmethod
    def config_from_args(cls, args):
        if args.fake_rate <= 0:
            raise UsageError("--fake-rate must be above 0")
        return {"rate": args.fake_rate, "interval_ms": args.interval_ms}

    @classmethod
    def turned_on(cls, args):
        return args.fake


class FakeCollector(Collector):
    name = "fake"
    default_on = False
    options = FakeOptions
    DEFAULTS = {"rate": 1.0}

    def start(self, ctx):
        pass
'''


def ident(tmp_path: Path) -> str:
    """A module name of this test's own (its tmp directory's)."""
    return re.sub(r"\W", "_", tmp_path.name)


def install_plugin(base: Path, module: str, collectors: str, options: str | None = None,
                   source: str = PLUGIN) -> Path:
    """A third-party distribution on `base`: its module, and its entry_points.txt registering
    `collectors` (and `options`) lines, as pip would install them."""
    base.mkdir(parents=True, exist_ok=True)
    (base / f"{module}.py").write_text(source)
    info = base / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    text = f"[counterprof.collectors]\n{collectors}\n"
    if options is not None:
        text += f"\n[counterprof.collector_options]\n{options}\n"
    (info / "entry_points.txt").write_text(text)
    return base


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A fake collector registered with its options, on sys.path for this test (a module name
    of its own: no other test's module is found in sys.modules)."""
    module = f"fake_plugin_{ident(tmp_path)}"
    base = install_plugin(tmp_path / "site", module, f"fake = {module}:FakeCollector",
                          f"fake = {module}:FakeOptions")
    monkeypatch.syspath_prepend(str(base))
    yield module
    sys.modules.pop(module, None)


def parse(argv: list[str]):
    from counterprof.cli.run import build_parser
    return build_parser().parse_args(argv)


def config_of(argv: list[str]):
    from counterprof.cli.run import _collector_config
    return _collector_config(parse(argv))[:2]      # (config, collectors): the third is what is said


# --- the hook, in process -----------------------------------------------------------------------

def test_a_third_party_option_is_in_the_help_and_reaches_its_config(plugin):
    from counterprof.cli.run import build_parser
    text = build_parser().format_help()
    assert "fake collector (a third party's):" in text
    assert "--fake-rate HZ" in text and "how often the fake collector looks (default 3)" in text
    config, collectors = config_of(["-I", "20", "--fake-rate", "7", "--", "true"])
    assert config["fake"] == {"rate": 7.0, "interval_ms": 20.0}
    assert collectors is None                  # not turned on: the default collectors
    assert config["perf"]["interval_ms"] == 20.0        # the built-in ones as before


def test_a_third_party_flag_turns_its_collector_on(plugin):
    from counterprof.collector import resolve
    _, collectors = config_of(["--fake", "--", "true"])
    assert collectors == [*resolve(None), "fake"]
    _, collectors = config_of(["--fake", "--collectors", "perf", "--", "true"])
    assert collectors == ["perf", "fake"]
    _, collectors = config_of(["--fake", "--collectors", "fake,perf", "--", "true"])
    assert collectors == ["fake", "perf"]


def test_a_collector_that_finds_ranks_makes_per_rank_auto(plugin):
    from counterprof.cli.run import _per_rank_mode
    assert _per_rank_mode(parse(["--", "python", "t.py"]), ["python", "t.py"]) is False
    assert _per_rank_mode(parse(["--fake", "--", "python", "t.py"]), ["python", "t.py"]) == "auto"


def test_a_third_party_usage_error_is_said_with_runs_usage(plugin):
    with pytest.raises(UsageFailure) as failure:
        config_of(["--fake-rate", "0", "--", "true"])
    assert str(failure.value) == "--fake-rate must be above 0"
    assert failure.value.usage.startswith("usage: counterprof run")


def test_options_come_from_the_class_when_not_registered_apart(tmp_path, monkeypatch):
    """A collector that registers its class only: run loads the class for its `options`."""
    module = f"fake_class_only_{ident(tmp_path)}"
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", module,
                                                   f"fake = {module}:FakeCollector")))
    try:
        from counterprof.collector import options_registry
        assert options_registry()["fake"].__name__ == "FakeOptions"
        config, _ = config_of(["--fake-rate", "5", "--", "true"])
        assert config["fake"]["rate"] == 5.0
    finally:
        sys.modules.pop(module, None)


def test_a_collector_that_fails_to_load_leaves_the_parser_whole(tmp_path, monkeypatch):
    module = f"fake_broken_{ident(tmp_path)}"
    monkeypatch.syspath_prepend(str(install_plugin(
        tmp_path / "site", module, f"broken = {module}:Nope\nfake = {module}:FakeCollector",
        f"broken = {module}:Nope", source=PLUGIN + "\nraise ImportError('half installed')\n")))
    try:
        from counterprof.collector import options_registry
        found = options_registry()
        assert isinstance(found["broken"], ImportError) and isinstance(found["fake"], ImportError)
        from counterprof.cli.run import build_parser
        text = build_parser().format_help()
        assert "--events EVENTS" in text and "--fake" not in text
        config, _ = config_of(["--", "true"])
        assert "broken" not in config and set(BUILT_IN) - {"torch", "jax", "neuron_profile"} <= set(config)
    finally:
        sys.modules.pop(module, None)


def test_options_whose_flag_another_has_are_left_out_and_said(tmp_path, monkeypatch, capsys):
    module = f"fake_clash_{ident(tmp_path)}"
    source = PLUGIN.replace('"--fake-rate"', '"--gpus"')
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", module,
                                                   f"fake = {module}:FakeCollector",
                                                   f"fake = {module}:FakeOptions", source=source)))
    try:
        args = parse(["--gpus", "0", "--", "true"])
        assert "fake" not in args.collector_options and "nvml" in args.collector_options
        assert "the fake collector's options are left out: argument --gpus" in capsys.readouterr().err
        from counterprof.cli.run import _collector_config
        config, *_ = _collector_config(args)
        assert "fake" not in config and config["nvml"]["gpus"] == "0"
    finally:
        sys.modules.pop(module, None)


def test_the_built_in_collectors_declare_their_options_beside_them():
    """Every built-in collector's `options` is what its light entry names; run's own module
    declares none of their flags."""
    from counterprof.collector import CollectorOptions, options_registry, registry
    options, classes = options_registry(), registry()
    for name in BUILT_IN:
        assert options[name] is classes[name].options, name
        assert issubclass(options[name], CollectorOptions) and options[name] is not CollectorOptions
        assert options[name].__module__.startswith("counterprof.collectors."), name
    source = (Path(__file__).resolve().parents[2] / "counterprof" / "cli" / "run.py").read_text()
    for flag in ("--events", "--sampling", "--no-aggr", "--per-thread", "--torch", "--torch-window",
                 "--torch-time-window", "--jax", "--jax-window", "--host-interval-ms",
                 "--host-system-interval-ms", "--threads-interval-ms", "--gpus",
                 "--nvml-interval-ms", "--gpm-interval-ms", "--neuron-interval-ms"):
        assert f'"{flag}"' not in source, flag


def test_the_entry_points_read_once_are_read_again_after_an_install(tmp_path, monkeypatch):
    """The entry_points.txt files are read once for the parser, the configuration and the
    collectors, and again once a directory on sys.path gains or loses a distribution."""
    from counterprof import collector
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = collector._fast_entry_points(collector.OPTIONS_ENTRY_POINT_GROUP)
    assert before is not None and "fake" not in [e.name for e in before]
    assert collector._entry_point_texts() is collector._entry_point_texts()      # kept
    module = f"fake_late_{ident(tmp_path)}"
    install_plugin(site, module, f"fake = {module}:FakeCollector", f"fake = {module}:FakeOptions")
    try:
        after = collector._fast_entry_points(collector.OPTIONS_ENTRY_POINT_GROUP)
        assert [e.value for e in after if e.name == "fake"] == [f"{module}:FakeOptions"]
    finally:
        sys.modules.pop(module, None)


# --- the built-in collectors' configuration, as run built it before ----------------------------

def test_the_built_in_configuration():
    config, collectors = config_of(["-I", "5", "-e", "cycles", "-e", "instructions,branches", "-A",
                                    "--per-thread", "--gpus", "0,1", "--nvml-interval-ms", "50",
                                    "--gpm-interval-ms", "200", "--host-interval-ms", "7",
                                    "--host-system-interval-ms", "0", "--neuron-interval-ms", "2000",
                                    "--", "true"])
    assert collectors is None
    assert config == {
        "perf": {"interval_ms": 5.0, "per_thread": True, "per_cpu": True, "sampling": "tick",
                 "events": "cycles,instructions,branches"},
        "host": {"interval_ms": 7.0, "system_interval_ms": 0.0},
        "threads": {"interval_ms": 10.0},
        "nvml": {"interval_ms": 50.0, "gpm_interval_ms": 200.0, "gpus": "0,1"},
        "neuron": {"interval_ms": 2000.0},
    }


@pytest.mark.parametrize("argv, ms", [([], 100.0), (["-I", "1"], 10.0), (["-I", "500"], 500.0),
                                      (["--sampling", "kernel", "-I", "10"], 100.0),
                                      (["-I", "1", "--threads-interval-ms", "2"], 2.0)])
def test_the_threads_interval_follows_I_and_perfs_sampling(argv, ms):
    config, _ = config_of([*argv, "--", "true"])
    assert config["threads"] == {"interval_ms": ms}


def test_torch_and_jax_windows():
    config, collectors = config_of(["--torch", "--torch-window", "3/9", "--torch-time-window",
                                    "1.5/10", "--collectors", "perf", "--", "true"])
    assert config["torch"] == {"active": 3, "every": 9, "window_s": 1.5, "window_every_s": 10.0}
    assert collectors == ["perf", "torch"] and "jax" not in config
    config, collectors = config_of(["--jax", "--jax-window", "2/4", "--collectors", "host", "--",
                                    "true"])
    assert config["jax"] == {"active": 2, "every": 4} and collectors == ["host", "jax"]
    config, _ = config_of(["--torch-window", "3/9", "--", "true"])      # without --torch: unread
    assert "torch" not in config


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "0", "--collectors", "perf,host", "--", "true"],
     "--gpus selects GPUs for the nvml collector, which --collectors leaves out"),
    (["--torch", "--torch-window", "x/9", "--", "true"], "--torch-window 'x/9': give ACTIVE/EVERY, e.g. 5/50"),
    (["--torch", "--torch-time-window", "a/b", "--", "true"],
     "--torch-time-window 'a/b': give SECONDS/EVERY, e.g. 2/20"),
    (["--jax-window", "2/4", "--", "true"], "--jax-window applies with --jax"),
    (["--jax", "--jax-window", "2-4", "--", "true"], "--jax-window '2-4': give ACTIVE/EVERY, e.g. 5/50"),
    (["--jax", "--pid", "1"], "--jax profiles a command counterprof launches (`counterprof run --jax "
                              "-- CMD`), not a running process"),
])
def test_the_built_in_usage_errors(argv, message):
    with pytest.raises(UsageFailure) as failure:
        config_of(argv)
    assert str(failure.value) == message


# --- in a fresh interpreter, as a user runs it --------------------------------------------------

HEAVY = {"pyarrow", "numpy", "pandas", "torch", "jax", "duckdb", "rich", "pynvml", "psutil", "cffi"}

_HELP_MODULES = """import contextlib, io, json, sys
from counterprof.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        main(["run", "--help"])
except SystemExit:
    pass
print(json.dumps([out.getvalue(), sorted(sys.modules)]))
"""


def fresh(code: str, pythonpath: Path | None = None) -> tuple[str, list[str]]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_run_help_loads_the_options_modules_and_no_collector():
    """-X importtime does not see modules that importlib.import_module loads (the entry points'):
    sys.modules at the end does."""
    text, names = fresh(_HELP_MODULES)
    assert "perf collector (CPU counters):" in text and "--torch-window ACTIVE/EVERY" in text
    assert not {n.split(".")[0] for n in names} & HEAVY, sorted({n.split(".")[0] for n in names} & HEAVY)
    assert {"counterprof.collectors.perf.options", "counterprof.collectors.host_options",
            "counterprof.collectors.torch_trace.options"} <= set(names)
    collectors = {"counterprof.collectors.perf.collector", "counterprof.collectors.host",
                  "counterprof.collectors.threads", "counterprof.collectors.nvml.collector",
                  "counterprof.collectors.neuron.collector",
                  "counterprof.collectors.torch_trace.collector",
                  "counterprof.collectors.jax_trace.collector", "counterprof.ground.schema"}
    assert not collectors & set(names), sorted(collectors & set(names))


def test_run_help_shows_a_plugins_option_and_survives_a_broken_one(tmp_path):
    site = install_plugin(tmp_path / "site", "fake_cli_plugin", "fake = fake_cli_plugin:FakeCollector",
                          "fake = fake_cli_plugin:FakeOptions")
    broken = site / "broken_plugin-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken_plugin\nVersion: 1.0\n")
    (broken / "entry_points.txt").write_text("[counterprof.collectors]\nbroken = no_such_module:X\n\n"
                                             "[counterprof.collector_options]\nbroken = no_such_module:Y\n")
    text, names = fresh(_HELP_MODULES, site)
    assert "fake collector (a third party's):" in text and "--fake-rate HZ" in text
    assert "--events EVENTS" in text
    # counterprof's own collectors' groups first (a third party's clashing flag is the one left out)
    assert text.index("fake collector (a third") > max(text.index(f"\n{n} collector") for n in BUILT_IN)
    assert "fake_cli_plugin" in names


def test_a_plugins_option_reaches_the_runs_meta(tmp_path):
    """`counterprof run --fake --fake-rate 7 -- true`: the flag turns the collector on, and its
    value is in the configuration the run records."""
    site = install_plugin(tmp_path / "site", "fake_run_plugin", "fake = fake_run_plugin:FakeCollector",
                          "fake = fake_run_plugin:FakeOptions")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    run = tmp_path / "r"
    p = subprocess.run([PYTHON, "-m", "counterprof", "run", "-q", "--collectors", "host", "--fake",
                        "--fake-rate", "7", "-o", str(run), "--", "true"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    meta = json.loads((run / "meta.json").read_text())
    assert meta["collectors"]["fake"]["config"] == {"rate": 7.0, "interval_ms": 100.0}
    assert set(meta["collectors"]) == {"host", "fake"}
    p = subprocess.run([PYTHON, "-m", "counterprof", "run", "--fake-rate", "-1", "--", "true"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and p.stderr.startswith("usage: counterprof run")
    assert "counterprof: --fake-rate must be above 0" in p.stderr


def test_each_collector_has_its_group_in_the_help():
    """A heading per collector (its options' title), after run's own options."""
    text, _ = fresh(_HELP_MODULES)
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings[:2] == ["positional arguments", "options"]
    assert sorted(h.split()[0] for h in headings[2:] if " collector" in h) == sorted(BUILT_IN)
