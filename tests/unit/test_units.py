"""ground/units.py (numbers into words) and render/svg.py (the pages' plotting)."""
from __future__ import annotations

import math

import pytest

from counterprof.ground import units
from counterprof.render import svg


@pytest.mark.parametrize("call, text", [
    (lambda: units.share(0.456), "46%"), (lambda: units.share(0.456, 1), "45.6%"),
    (lambda: units.share(None), "-"), (lambda: units.share(None, none="?"), "?"),
    (lambda: units.points(45.66), "45.7%"), (lambda: units.change(0.05), "+5.0%"),
    (lambda: units.change(None, none="from 0"), "from 0"),
    (lambda: units.interval((-0.01, 0.09)), "[-1.0%, +9.0%]"),
    (lambda: units.value(0.0123, "s"), "12.30 ms"), (lambda: units.value(3 << 20, "bytes/s"), "3.00 MiB/s"),
    (lambda: units.value(2.5e6, "FLOP/s"), "2.5e+03k FLOP/s"), (lambda: units.value(None, "s"), "—"),
    (lambda: units.si(3.12e14, "FLOP/s"), "312 TFLOP/s"), (lambda: units.duration(1.5e6), "1.50 ms"),
    (lambda: units.rate(2e6, 1.0), "2.000 M/sec"), (lambda: units.stat_number(2e6, "ns"), ("2.00", "msec")),
    (lambda: units.spread(2.0, 0.1), "( +- 5.00% )"), (lambda: units.spread(0.0, 0.5), "( +- 0.5 )"),
    (lambda: units.number(12345.6), "12,346"), (lambda: units.ms(0.0123), "12.3 ms"),
])
def test_rules(call, text):
    assert call() == text


def test_sparkline_two_scales():
    # from zero to a top (the live view), and from the smallest to the largest (history)
    assert units.sparkline([0, 4, 8], 8) == "▁▄█"
    assert units.sparkline([10, 14, 18], lo=None) == "▁▄█"
    assert units.sparkline([1.0, math.nan, 2.0, 3.0], lo=None, marks={2}) == "▁ |▄█"
    assert units.sparkline([None, 5.0], lo=None) == " ▁"


def test_svg_elements_and_scales():
    assert svg.line(1, 2.25, 3, 4, cls="cp", stroke_width=1.5) == \
        '<line class="cp" x1="1" y1="2.2" x2="3" y2="4" stroke-width="1.5"/>'
    assert svg.text(2, 14, "a<b") == '<text x="2" y="14" font-size="10">a&lt;b</text>'
    y = svg.scale(0.0, 10.0, 8, 108, flip=True, clamp=True)
    assert (y(0), y(10), y(20)) == (108.0, 8.0, 8.0)
    x = svg.scale(1, 1000, 0, 300, log=True)
    assert x(10) == pytest.approx(100)
