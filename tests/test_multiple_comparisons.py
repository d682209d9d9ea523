"""Holm's adjusted p-values on hand-computed examples, and the paired bootstrap p-value that
feeds them (issue 49.5)."""

from __future__ import annotations

import numpy as np
import pytest

from fid.evaluation.bootstrap import paired_bootstrap_interval, paired_bootstrap_p_value
from fid.evaluation.multiple_comparisons import holm_adjusted


def test_holm_on_a_hand_computed_family():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to
    # the 0.06 before it: the step-down never adjusts a larger p below a smaller one's)
    adjusted = holm_adjusted([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])
    # at alpha 0.05 Holm rejects two (0.005, 0.01); Bonferroni (x4) rejects only 0.005
    assert (adjusted <= 0.05).sum() == 2


def test_holm_caps_at_one_keeps_ties_and_takes_a_single_p_as_it_is():
    # sorted 0.2 (x3 = 0.6), 0.2 (x2 = 0.4, raised to 0.6), 0.5 (x1, raised to 0.6)
    np.testing.assert_allclose(holm_adjusted([0.5, 0.2, 0.2]), [0.6, 0.6, 0.6])
    np.testing.assert_allclose(holm_adjusted([0.6, 0.4]), [0.8, 0.8])
    np.testing.assert_allclose(holm_adjusted([0.9, 0.7]), [1.0, 1.0])  # capped
    np.testing.assert_allclose(holm_adjusted([0.03]), [0.03])
    assert holm_adjusted([]).shape == (0,)


@pytest.mark.parametrize("bad", [[0.1, 1.5], [-0.1], [float("nan")]])
def test_holm_refuses_what_is_no_p_value(bad):
    with pytest.raises(ValueError, match="p-values in \\[0, 1\\]"):
        holm_adjusted(bad)


def test_bootstrap_p_value_agrees_with_the_interval():
    ours = np.array([1.0] * 30 + [0.0] * 20)  # 60%
    clear = np.array([1.0] * 10 + [0.0] * 40)  # 20%: every resample favours ours
    assert paired_bootstrap_p_value(ours, clear) == pytest.approx(2 / 10_001)
    assert paired_bootstrap_interval(ours, clear)[0] > 0
    close = np.array([1.0] * 28 + [0.0] * 22)  # 56%: the interval holds 0
    low, high = paired_bootstrap_interval(ours, close)
    assert low <= 0 <= high and paired_bootstrap_p_value(ours, close) > 0.05
    assert paired_bootstrap_p_value(ours, ours) == 1.0
    assert paired_bootstrap_p_value(ours[:0], ours[:0]) == 1.0
