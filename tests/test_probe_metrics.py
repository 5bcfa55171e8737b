"""AUROC, Cohen's d and the bootstrap against sklearn and closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from valueprobe.errors import ValueprobeError
from valueprobe.probe.baselines import shuffle_within_group
from valueprobe.stats.metrics import auroc, bootstrap_ci, cohens_d

scores_labels = (
    st.integers(2, 60)
    .flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-5, 5).map(float), min_size=n, max_size=n),  # small ints: many ties
            st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n),
        )
    )
    .filter(lambda t: 0 < sum(t[1]) < len(t[1]))
)


@settings(max_examples=200, deadline=None)
@given(scores_labels)
def test_auroc_matches_sklearn_with_ties(data):
    s, y = data
    assert auroc(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(scores_labels)
def test_cohens_d_closed_form_and_antisymmetry(data):
    s, y = np.array(data[0]), np.array(data[1])
    a, b = s[y == 1], s[y == 0]
    d = cohens_d(s, y)
    assert cohens_d(s, 1 - y) == pytest.approx(-d)
    if a.size + b.size > 2:
        pooled = np.sqrt(
            (
                (a.size - 1) * a.var(ddof=1 if a.size > 1 else 0)
                + (b.size - 1) * b.var(ddof=1 if b.size > 1 else 0)
            )
            / (a.size + b.size - 2)
        )
        if pooled > 0:
            assert d == pytest.approx((a.mean() - b.mean()) / pooled)


def test_bootstrap_ci_brackets_the_estimate_and_is_seeded():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 200)
    s = rng.standard_normal(400) + y
    lo, hi = bootstrap_ci(auroc, s, y, n_boot=500, seed=3)
    assert lo < auroc(s, y) < hi and hi - lo < 0.15
    assert bootstrap_ci(auroc, s, y, n_boot=500, seed=3) == (lo, hi)
    lo_d, hi_d = bootstrap_ci(cohens_d, s, y, n_boot=300)
    assert lo_d < 1.0 < hi_d  # true d = 1


def test_metric_errors():
    with pytest.raises(ValueprobeError, match="needs both classes"):
        auroc([1, 2, 3], [1, 1, 1])
    with pytest.raises(ValueprobeError, match="3 scores but 2 labels"):
        cohens_d([1, 2, 3], [0, 1])
    with pytest.raises(ValueprobeError, match="non-finite scores at rows \\[1\\]"):
        auroc([0, np.nan, 1], [0, 1, 1])


def test_shuffle_control_moves_single_class_groups():
    """Within-group shuffling cannot move one-class groups; they swap labels as whole groups."""

    rng = np.random.default_rng(0)
    groups = np.repeat(np.array([f"g{i}" for i in range(20)]), 5)
    y = np.repeat(np.arange(20) % 2 == 0, 5)  # every group holds one class
    keep = np.ones_like(y)
    out = shuffle_within_group(y, groups, keep, rng)
    assert out.sum() == y.sum() and not np.array_equal(out, y)
    for g in np.unique(groups):  # still constant within each group
        assert len(set(out[groups == g].tolist())) == 1
    mixed = np.tile([True, False], 50)
    shuffled = shuffle_within_group(mixed, groups, keep, rng)
    for g in np.unique(groups):
        assert shuffled[groups == g].sum() == mixed[groups == g].sum()
