"""The neuron collector's pure parts under hostile input (fixed seeds): neuron-monitor lines
cut at every byte, bytes flipped, a wrong type or a wild value in every field, core indexes
that are not numbers; NEURON_RT_VISIBLE_CORES out of range; sysfs files that are empty, not
numbers, NaN, going backwards, vanishing, a FIFO or a symlink loop. Nothing may raise, hang,
or give a row that is not a finite, non-negative reading with a sane interval."""
from __future__ import annotations

import copy
import json
import math
import os
import random
import threading

import pytest

from counterprof.collectors.neuron import child, monitor, sysfs, topology
from counterprof.collectors.neuron.monitor import Parser
from fake_neuron import DATA, bump, make_sysfs

GUIDE = json.loads((DATA / "monitor-guide.json").read_text())
OLD = json.loads((DATA / "monitor-old-guide.json").read_text())
GUIDE_LINE = (DATA / "monitor-guide.json").read_bytes().strip()

WILD = ["x", "-1", "1e9", "abc", "²", [], [1], {}, {"a": 1}, None, True, False, -1, -1e9,
        float("nan"), float("inf"), float("-inf"), 1e308, 10**400, 2**63, 0, 0.0]


def _paths(o, p=()):
    yield p
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, p + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _paths(v, p + (i,))


def _set(o, path, v):
    for k in path[:-1]:
        o = o[k]
    o[path[-1]] = v


def _check(rows):
    for r in rows:
        assert isinstance(r.value, float) and math.isfinite(r.value) and r.value >= 0, r
        assert r.duration_ns is None or 0 < r.duration_ns < 2**63, r
        assert len(r.entity) < 100, r


def _parse(obj):
    rows, errors = Parser().rows(obj, lambda pid, tag: True)
    _check(rows)
    json.dumps(errors, allow_nan=False)
    return rows


@pytest.mark.parametrize("base", [GUIDE, OLD], ids=["guide", "old-guide"])
def test_a_wild_value_in_every_field_never_raises_nor_gives_a_bad_row(base):
    for path in list(_paths(base))[1:]:
        for wild in WILD:
            obj = copy.deepcopy(base)
            _set(obj, path, wild)
            _parse(obj)


def test_wild_values_give_no_row_where_a_reading_was():
    for wild in (float("nan"), float("inf"), -1, 10**400, "42"):
        obj = copy.deepcopy(GUIDE)
        obj["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"]["0"][
            "neuroncore_utilization"] = wild
        rows = _parse(obj)
        assert not [r for r in rows if r.metric == "neuron.core_util" and r.entity.endswith("core:0")]
        assert [r for r in rows if r.metric == "neuron.core_util" and r.entity.endswith("core:1")]


@pytest.mark.parametrize("period", [1e308, float("inf"), 10**20, 2**63, 1e12, -5])
def test_a_wild_group_period_falls_back_to_the_interval(period):
    obj = copy.deepcopy(GUIDE)
    for g in obj["neuron_runtime_data"][0]["report"].values():
        g["period"] = period
    rows = _parse(obj)
    assert {r.duration_ns for r in rows if r.duration_ns is not None and r.pid is not None} == {1_000_000_000}


@pytest.mark.parametrize("key", ["-1", "1e9", "abc", "²", "٣", " 3", "9" * 5000,
                                 "99999999999999999999", "4096", ""])
def test_core_keys_that_are_not_core_numbers_are_skipped(key):
    obj = copy.deepcopy(GUIDE)
    rep = obj["neuron_runtime_data"][0]["report"]
    rep["neuroncore_counters"]["neuroncores_in_use"][key] = rep["neuroncore_counters"]["neuroncores_in_use"]["0"]
    ncm = rep["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"]
    ncm[key] = ncm["0"]
    rows = _parse(obj)
    assert {r.core for r in rows if r.core is not None} == {0, 1}


def test_a_line_cut_at_every_byte_offset():
    parser = Parser()
    for cut in range(len(GUIDE_LINE)):
        try:
            obj = monitor.decode(GUIDE_LINE[:cut])
        except ValueError:
            continue
        _check(parser.rows(obj, lambda pid, tag: True)[0])


def test_flipped_bytes_never_raise_anything_but_value_error():
    rng = random.Random(15)
    parser = Parser()
    for _ in range(3000):
        line = bytearray(GUIDE_LINE)
        for _ in range(rng.randint(1, 4)):
            line[rng.randrange(len(line))] = rng.randrange(256)
        try:
            obj = monitor.decode(bytes(line))
        except ValueError:
            continue
        _check(parser.rows(obj, lambda pid, tag: True)[0])


def test_random_structures_in_the_report():
    rng = random.Random(1515)

    def wild(depth=0):
        kinds = ["num", "str", "list", "dict", "none"] if depth < 4 else ["num", "str", "none"]
        k = rng.choice(kinds)
        if k == "num":
            return rng.choice([rng.randint(-2**70, 2**70), rng.uniform(-1e300, 1e300), float("nan"), 0])
        if k == "str":
            return rng.choice(["0", "1", "nc_v3.2", "x" * 300, "-1"])
        if k == "list":
            return [wild(depth + 1) for _ in range(rng.randint(0, 3))]
        if k == "dict":
            return {rng.choice(["0", "1", "period", "error", "flops", "v3d", "host", "p50"]): wild(depth + 1)
                    for _ in range(rng.randint(0, 4))}
        return None

    paths = list(_paths(GUIDE))[1:]
    for _ in range(2000):
        obj = copy.deepcopy(GUIDE)
        for _ in range(rng.randint(1, 5)):
            try:
                _set(obj, rng.choice(paths), wild())
            except (KeyError, IndexError, TypeError):
                pass               # an earlier change replaced the path's parent
        _parse(obj)


def test_deep_nesting_is_a_bad_line_not_a_crash():
    with pytest.raises(ValueError, match="nested too deep"):
        monitor.decode(b"[" * 200_000)
    with pytest.raises(ValueError):
        monitor.decode(b'{"a": ' * 200_000)


def test_hardware_info_with_wild_values_keeps_the_layout_and_meta_json_sane():
    topo = topology.Topology()
    topo.update(GUIDE["neuron_hardware_info"])
    assert topo.cores_per_device == 4
    for key in ("neuroncore_per_device_count", "neuron_device_count", "neuron_device_memory_size"):
        for wild in (True, float("nan"), 1e308, 10**400, -4, "4", 4.5):
            info = dict(GUIDE["neuron_hardware_info"], **{key: wild}, neuron_device_type="x" * 10_000)
            t = topology.Topology()
            t.update(info)
            json.dumps(t.facts, allow_nan=False)
            assert len(json.dumps(t.facts)) < 4000
            assert t.cores_per_device in (None, 4)
            assert t.device_memory in (None, 103079215104)


def _within(seconds, fn, *args):
    """fn(*args) on a thread; its result, failing the test (not hanging it) past `seconds`."""
    out = []
    th = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"{fn.__name__}{args!r} still running after {seconds} s"
    return out[0]


@pytest.mark.parametrize("text,cores", [
    ("0-3", [0, 1, 2, 3]), ("4,5", [4, 5]), ("0-1,6", [0, 1, 6]), (" 2 - 3 ", [2, 3]), ("1,1,0-1", [1, 0]),
    ("0-999999999", None), ("0-4096", None), ("²", None), ("-1", None), ("1e9", None), ("abc", None),
    ("3-1", None), ("0-", None), (",", None), ("9" * 5000, None),
])
def test_visible_cores_wild(text, cores):
    assert _within(2.0, topology.parse_core_list, text) == cores


def test_visible_cores_widest_allowed_range_is_quick():
    assert _within(2.0, topology.parse_core_list, "0-4095,0-4095") == list(range(4096))


# -- sysfs ---------------------------------------------------------------------------------

def _flop_rows(rows, core):
    return [r.value for r in rows if r.metric == "neuron.flop_count" and r.core == core]


def _write(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@pytest.mark.parametrize("bad", ["", "\n", "abc\n", "nan\n", "inf\n", "-5\n", "1e400\n", "\x00\x00", "12abc\n"])
def test_a_counter_that_is_not_a_reading_gives_no_row_and_counting_resumes(tmp_path, bad):
    root = make_sysfs(tmp_path / "nd")
    flop = root / "neuron0" / "neuron_core0" / "stats" / "other_info" / "flop_count"
    s = sysfs.SysfsSampler(str(root))
    s.tick(1_000, None)
    _write(flop, bad)
    rows = s.tick(2_000, None)
    _check(rows)
    assert _flop_rows(rows, 0) == []
    _write(flop, "100\n")
    s.tick(3_000, None)
    _write(flop, "350\n")
    assert _flop_rows(s.tick(4_000, None), 0) == [250.0]


def test_a_counter_that_goes_back_was_reset(tmp_path):
    root = make_sysfs(tmp_path / "nd")
    s = sysfs.SysfsSampler(str(root))
    bump(root, 0, 0, flops=1000)
    s.tick(1_000, None)
    _write(root / "neuron0" / "neuron_core0" / "stats" / "other_info" / "flop_count", "10\n")
    assert _flop_rows(s.tick(2_000, None), 0) == []        # no negative delta
    bump(root, 0, 0, flops=5)
    assert _flop_rows(s.tick(3_000, None), 0) == [5.0]


def test_files_vanishing_mid_run(tmp_path):
    import shutil
    root = make_sysfs(tmp_path / "nd", cores=2)
    s = sysfs.SysfsSampler(str(root))
    s.tick(1_000, None)
    shutil.rmtree(root / "neuron0" / "neuron_core0")
    os.remove(root / "neuron0" / "stats" / "power" / "utilization")
    bump(root, 0, 1, flops=7)
    rows = s.tick(2_000_000_000, None)
    assert _flop_rows(rows, 0) == [] and _flop_rows(rows, 1) == [7.0]
    shutil.rmtree(root)
    assert s.tick(3_000_000_000, None) == []


def test_a_fifo_a_symlink_loop_and_dev_zero_in_the_tree_do_not_hang(tmp_path):
    root = make_sysfs(tmp_path / "nd", cores=3)
    other = root / "neuron0" / "neuron_core{}" / "stats" / "other_info" / "flop_count"
    os.remove(str(other).format(0))
    os.mkfifo(str(other).format(0))                             # open() of a FIFO blocks for a writer
    os.remove(str(other).format(1))
    os.symlink(str(other).format(1), str(other).format(1))      # ELOOP
    os.remove(str(other).format(2))
    os.symlink("/dev/zero", str(other).format(2))                # endless
    mem = root / "neuron0" / "neuron_core0" / "stats" / "memory_usage" / "device_mem"
    os.symlink(str(mem), mem / "loop")                           # a directory pointing at itself
    power = root / "neuron0" / "stats" / "power" / "utilization"
    os.remove(power)
    os.mkfifo(power)
    s = sysfs.SysfsSampler(str(root))
    rows = _within(5.0, s.tick, 1_000, None)
    _check(rows)
    rows = _within(5.0, s.tick, 2_000_000_000, None)
    assert [r for r in rows if r.metric == "neuron.flop_count"] == []
    assert [r for r in rows if r.metric == "neuron.sysfs_device_mem_used"]


@pytest.mark.parametrize("count", ["nan", "inf", "1e400", "-1", "0", "abc", "99999999"])
def test_a_wild_core_count_and_odd_directory_names(tmp_path, count):
    root = make_sysfs(tmp_path / "nd", devices=2, cores=2)
    _write(root / "neuron1" / "core_count", count + "\n")
    for odd in ("neuron²", "neuron_core٣", "neuron" + "9" * 5000)[:2]:
        (root / odd).mkdir()
    (root / "neuron0" / "neuron_core²").mkdir()
    assert sysfs.present(str(root))
    s = sysfs.SysfsSampler(str(root))
    assert sorted(c for _d, c, _p in s.layout) == [0, 1, 2, 3]
    _check(s.tick(1_000, None))
    sysfs.inventory_rows(str(root))


# -- the child's line reader ---------------------------------------------------------------

def test_line_reader_bounds_a_line_and_keeps_the_stderr_tail(tmp_path):
    script = tmp_path / "emit.py"
    script.write_text(
        "import sys\n"
        "o = sys.stdout.buffer\n"
        "o.write(b'one\\n' + b'x' * 3_000_000 + b'\\ntwo\\nthree')\n"
        "sys.stderr.write('noise\\n' * 100_000 + 'the last word\\n')\n")
    import sys
    mon = child.MonitorProcess([sys.executable, str(script)], max_line=1 << 20)
    mon.spawn()
    lines, longs = [], []
    mon.pump(lines.append, longs.append, lambda: None, lambda: False)
    assert lines == [b"one", b"two"] and longs == [3_000_000]
    assert mon.partial_at_end == len(b"three")
    assert mon.stderr_tail() == "the last word"
    assert len(mon._stderr) <= child.STDERR_KEEP
    mon.kill(2.0)
    mon.close()


def test_old_runtime_memory_nested_in_current_as_the_beta_guide_text_says():
    obj = copy.deepcopy(OLD)
    mem = obj["runtime_data"][0]["report"]["memory_used"]
    mem["runtime_memory"] = {"current": mem["runtime_memory"]}
    rows = _parse(obj)
    assert [r.value for r in rows if r.metric == "neuron.host_mem_used"] == [1000000.0]
    assert [r.value for r in rows if r.metric == "neuron.device_mem_used"] == [2000000.0]


def test_neuron_ls_devices_with_wild_fields_still_list():
    base = json.loads((DATA / "neuron-ls.json").read_text())[0]
    for key in base:
        for wild in WILD + [[None, {}], [{"pid": [1]}]]:
            rows = topology.device_rows([dict(base, **{key: wild})])
            assert len(rows) == 1 and all(isinstance(c, str) for c in rows[0])
    assert topology.device_rows([base])[0][4] == "96.0 GiB"
