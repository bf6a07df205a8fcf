"""Scaling for multiplexing, in the C code the sampler uses (fake reads, no kernel)."""
import math

import pytest

from counterprof._native import ffi, lib


def scale(value, enabled, running):
    out = ffi.new("double *")
    known = lib.cp_scale_delta(value, enabled, running, out)
    return bool(known), out[0]


def aggregate(rows):
    n = len(rows)
    v = ffi.new("uint64_t[]", [r[0] for r in rows])
    e = ffi.new("uint64_t[]", [r[1] for r in rows])
    r = ffi.new("uint64_t[]", [r[2] for r in rows])
    value, quality = ffi.new("double *"), ffi.new("float *")
    known = lib.cp_aggregate(n, v, e, r, value, quality)
    return bool(known), value[0], quality[0]


def test_exact_when_running_equals_enabled():
    assert scale(1000, 50, 50) == (True, 1000.0)


def test_multiplexed_interval_is_scaled_up_by_enabled_over_running():
    known, v = scale(1000, 100, 25)     # counted a quarter of the time
    assert known and v == pytest.approx(4000.0)


def test_enabled_but_never_running_is_unknown_not_zero():
    known, v = scale(0, 100, 0)
    assert not known and math.isnan(v)


def test_not_enabled_in_interval_is_a_known_unchanged_count():
    # a task counter whose task slept the whole interval: nothing happened, and that is known
    assert scale(0, 0, 0) == (True, 0.0)


def test_running_above_enabled_is_not_scaled_down():
    assert scale(500, 10, 12) == (True, 500.0)


def test_aggregate_sums_each_member_scaled_by_its_own_ratio():
    known, v, q = aggregate([(100, 10, 10), (300, 20, 10)])
    assert known
    assert v == pytest.approx(100 + 600)
    assert q == pytest.approx(20 / 30)


def test_aggregate_is_unknown_if_any_member_never_ran_while_enabled():
    known, v, q = aggregate([(100, 10, 10), (0, 10, 0)])
    assert not known and math.isnan(v)
    assert q == pytest.approx(0.5)


def test_aggregate_of_idle_members_is_zero_with_full_quality():
    assert aggregate([(0, 0, 0), (0, 0, 0)]) == (True, 0.0, 1.0)
