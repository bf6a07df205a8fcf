"""The live view's one formatting module: a figure carries numbers (detail_parts), and its
words come from ground/units.py (its live view section), with the value column's and the detail column's roundings."""
from counterprof.live.figures import Figure
from counterprof.ground.units import (live_detail as fmt_detail, live_si as si, live_si_short as si_short,
                                     live_value as fmt_value)


def test_value_and_detail_columns_round_si_prefixes_apart():
    assert (si(4e5), si_short(4e5)) == ("400.0K", "400K")
    assert (si(2.5e6), si_short(2.5e6)) == ("2.50M", "2.5M")
    assert (si(12.0), si_short(12.0)) == ("12.0", "12")


def test_a_detail_is_words_and_numbers_with_units():
    assert fmt_detail(("of refs", " · ", (4e5, "short/s"))) == "of refs · 400K/s"
    assert fmt_detail(("of ", (80.0 * 2**30, "bytes"))) == "of 80.0 GiB"
    assert fmt_detail(("of ", (700.0, "W"))) == "of 700 W"           # as fmt_value writes W
    assert fmt_detail(((1.0, "processes"),)) == "1 process"
    assert fmt_detail(((3.0, "processes"),)) == "3 processes"
    assert fmt_detail(("ran ", (49.6, "whole percent"), " of time")) == "ran 50% of time"
    assert fmt_detail(()) == ""


def test_a_figure_keeps_numbers_and_reads_as_words():
    f = Figure("host.cpu", "CPU (tree)", "CPU", 120.0, "percent", detail_parts=("sys ", (20.0, "percent")))
    assert f.detail == "sys 20.0%" and fmt_value(f.value, f.unit) == "120.0%"
