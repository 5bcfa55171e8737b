"""Random-direction nulls and bootstrap intervals: coverage in simulation, ``score --null`` against sklearn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.io import Example
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import ScoreSettings, score_dataset
from valueprobe.stats.null import mean_ci, null_range, percentile_in, random_directions


def test_bootstrap_ci_covers_the_mean_93_to_97_percent():
    rng = np.random.default_rng(0)
    hits = 0
    n_sims = 1000
    for s in range(n_sims):
        x = rng.normal(0.7, 2.0, size=100)
        lo, hi = mean_ci(x, n_boot=1000, seed=s)
        hits += lo <= 0.7 <= hi
    assert 0.93 <= hits / n_sims <= 0.97


def test_bootstrap_ci_of_a_hit_rate_stays_within_zero_and_one():
    hits = np.zeros(24)
    hits[0] = 1.0  # 1 of 24 right: the widened percentile interval would reach below 0
    lo, hi = mean_ci(hits, n_boot=1000, seed=0)
    assert lo == 0.0 and 1 / 24 < hi < 1.0
    lo, hi = mean_ci(1.0 - hits, n_boot=1000, seed=0)
    assert hi == 1.0 and 0.0 < lo < 23 / 24


def test_null_helpers():
    R = random_directions(16, 40, seed=3)
    assert R.shape == (40, 16) and np.allclose(np.linalg.norm(R, axis=1), 1.0)
    assert np.array_equal(R, random_directions(16, 40, seed=3))
    # the documented seed scheme: PCG64 normals, row-major, so more directions extend the same draw
    assert np.array_equal(R[:5], random_directions(16, 5, seed=3))
    g = np.random.default_rng(3).standard_normal((40, 16))
    assert np.allclose(R, g / np.linalg.norm(g, axis=1, keepdims=True), rtol=0, atol=1e-15)
    assert percentile_in(5.0, np.arange(4.0)) == 100.0 and percentile_in(1.0, np.arange(3.0)) == 50.0


def yes_no_examples() -> list[Example]:
    stems = ["Is Paris in France?", "Is 12 * 7 = 84?", "Does the fox jump?", "Is Rome in Italy?",
             "Is the dog lazy?", "Do you add a and b?", "Is that right?", "Maybe 3 times?"]  # fmt: skip
    return [
        Example(id=f"{i}-{ans}", text=f"{stem} {ans}", label=int(ans == "Yes"), group="yes-no")
        for i, stem in enumerate(stems)
        for ans in ("Yes", "No")
    ]


def test_score_null_matches_sklearn_on_random_directions(tiny_lm_factory):
    """Last-token contrast of fixed words: the null is recomputed by hand and random directions separate it."""
    lm = tiny_lm_factory("llama")
    exs = yes_no_examples()
    h = (
        capture(lm, exs, CaptureSettings(layers=[0], positions="last"), progress=False)
        .acts[0]
        .double()
        .numpy()
    )
    y = np.array([ex.label for ex in exs])
    v = torch.tensor(h[y == 1].mean(0) - h[y == 0].mean(0), dtype=torch.float32)
    axis = ValueAxis(
        directions=(v / v.norm())[None],
        layers=(0,),
        mu=torch.zeros(1),
        sigma=torch.ones(1),
        mean_norm=torch.ones(1),
        best_layer=0,
        site="resid_post",
        method="diff_means",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=lm.d_model,
    )
    res = score_dataset(
        axis, lm, exs, ScoreSettings(tokens="last", bootstrap=0, null=32, seed=5), progress=False
    )
    row = res.summary[0]
    R = random_directions(lm.d_model, 32, seed=5)
    want = np.array([roc_auc_score(y, h @ r) for r in R])
    assert row["null_n"] == 32
    assert row["null_auroc_range"] == pytest.approx(list(null_range(want)))
    assert row["score_auroc_null_percentile"] == pytest.approx(percentile_in(row["score_auroc"], want))
    # the paper's warning: on fixed last words, many random directions separate the classes almost perfectly
    assert np.mean(np.abs(want - 0.5) > 0.4) >= 0.25
    headers, rows = res.table()
    assert headers[-1].startswith("random AUROC") and rows[0][-1].startswith("[")
