"""The public statistics helpers on inputs at the edges of the float range and on non-finite
input: an answer that scales as the data do, or a ValueError naming what is wrong, never an
OverflowError, a ZeroDivisionError or a silent answer (issue 34, item 5)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analysis
from prereg.ranks import signed_rank

values = st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), min_size=3, max_size=12)


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from([1e-200, 1e160, 1e200, 1e300]))
def test_an_interval_scales_with_the_data_up_to_the_float_range(d, k):
    """``paired_interval(k b, k c) = k paired_interval(b, c)`` to rounding, for k up to 1e300
    (the squares of 1e200 overflow a float: the helper scales them)."""
    base = [0.0] * len(d)
    if max(d) - min(d) == 0:
        return
    small = analysis.paired_interval(base, d, 0.95)
    big = analysis.paired_interval(base, [k * x for x in d], 0.95)
    for a, b in ((small.estimate, big.estimate), (small.low, big.low), (small.high, big.high)):
        assert math.isclose(a * k, b, rel_tol=1e-9, abs_tol=1e-9 * k * max(map(abs, d)))
    assert math.isclose(small.standard_error * k, big.standard_error, rel_tol=1e-9)


def test_an_interval_in_the_ordinary_range_keeps_its_bits():
    """The plain formulas still run where nothing overflows: the scaled path changes no figure."""
    got = analysis.paired_interval([1.0, 2.0, 3.5], [1.1, 2.3, 3.2], 0.99)
    d = [0.1 + 0.0, 0.2999999999999998, -0.2999999999999998]
    m = math.fsum([1.1 - 1.0, 2.3 - 2.0, 3.2 - 3.5]) / 3
    assert got.estimate == m and d[0] != 0
    se = math.sqrt(math.fsum((x - m) ** 2 for x in [1.1 - 1.0, 2.3 - 2.0, 3.2 - 3.5]) / 2 / 3)
    assert got.standard_error == se


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_signed_rank_test_refuses_a_non_finite_difference(bad):
    with pytest.raises(ValueError, match=r"needs finite differences; d\[2\]"):
        signed_rank([0.5, -0.25, bad, 1.5], 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_an_interval_refuses_a_non_finite_value(bad):
    with pytest.raises(ValueError, match="is not finite"):
        analysis.paired_interval([1.0, 2.0, 3.0], [1.0, bad, 3.0])


def test_a_p_value_that_underflows_reads_the_same_whatever_the_library_rounds_it_to():
    """An incomplete beta near the float floor gives a subnormal in one library and 0 in another
    (scipy): the decision text is a bound, the same for both, so the audit reports no mismatch."""
    from prereg.decisions import p_text

    texts = {p_text(p) for p in (0.0, 5e-324, 2.2e-308, 1e-310, 9.9e-301)}
    assert texts == {"p < 1e-300"}
    assert p_text(0.0123) == "p = 0.0123" and p_text(1e-300) == "p = 1e-300"
