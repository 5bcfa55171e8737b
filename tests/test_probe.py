"""Fitters against planted directions and sklearn; the ValueAxis artifact (arithmetic, save/load, checks)."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import norm
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from valueprobe.errors import ValueprobeError
from valueprobe.model.fingerprint import FingerprintWarning
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.fitters import (
    METHODS,
    DiffMeans,
    Logistic,
    MassMeanLDA,
    PairedPCA,
    SpanDiff,
    make_fitter,
)
from valueprobe.stats.metrics import auroc

D, DELTA = 16, 1.5  # planted class-mean separation along v, isotropic unit noise


def planted(n_pairs: int, *, seed: int, d: int = D, delta: float = DELTA, offset: float = 50.0):
    """n_pairs (failure, success) rows sharing a key; a large common offset mimics residual-stream means."""
    rng = np.random.default_rng(seed)
    v = np.random.default_rng(123).standard_normal(d)
    v /= np.linalg.norm(v)
    y = np.tile([0.0, 1.0], n_pairs)
    x = rng.standard_normal((2 * n_pairs, d)) + np.outer(y - 0.5, v) * delta + offset
    keys = np.repeat([f"conv{i}" for i in range(n_pairs)], 2)
    return x, y, keys, v


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_recovers_the_planted_direction(method):
    x, y, keys, v = planted(3000, seed=0)
    direction = make_fitter(method).update(x, y, keys=keys).fit()
    assert direction.unit @ v > 0.99
    assert np.linalg.norm(direction.unit) == pytest.approx(1.0)
    x_test, y_test, _, _ = planted(2000, seed=1)
    analytic = norm.cdf(DELTA / np.sqrt(2))  # AUROC of two unit Gaussians DELTA apart
    assert auroc(x_test @ direction.unit, y_test) == pytest.approx(analytic, abs=0.015)
    # the intercept thresholds near the midpoint: balanced accuracy ~ Φ(DELTA/2)
    pred = x_test @ direction.unit + direction.intercept > 0
    assert (pred == (y_test > 0.5)).mean() == pytest.approx(norm.cdf(DELTA / 2), abs=0.03)


@pytest.mark.parametrize("method", list(METHODS))
def test_positive_means_success(method):
    x, y, keys, v = planted(500, seed=2)
    assert make_fitter(method).update(x, 1 - y, keys=keys).fit().unit @ v < -0.9


@pytest.mark.parametrize("method", list(METHODS))
def test_streaming_fit_equals_one_shot(method):
    x, y, keys, _ = planted(400, seed=3)
    one = make_fitter(method).update(x, y, keys=keys).fit()
    streamed = make_fitter(method)
    for chunk in np.array_split(np.arange(len(y)), 7):  # chunks split pairs across batches
        streamed.update(x[chunk], y[chunk], keys=keys[chunk])
    two = streamed.fit()
    np.testing.assert_allclose(two.unit, one.unit, atol=1e-6)
    assert two.intercept == pytest.approx(one.intercept, abs=1e-5)


def test_logistic_matches_sklearn_called_directly():
    x, y, _, _ = planted(300, seed=4, offset=0.0)
    raw = Logistic(C=0.5, standardize=False).update(x, y).fit()
    ref = LogisticRegression(C=0.5, max_iter=1000).fit(x, y)
    w = ref.coef_[0]
    np.testing.assert_allclose(raw.raw, w, rtol=1e-6, atol=1e-8)
    assert raw.intercept == pytest.approx(ref.intercept_[0] / np.linalg.norm(w), rel=1e-6)

    x2, _, _, _ = planted(300, seed=4, offset=50.0)
    std = Logistic(C=0.5).update(x2, y).fit()
    pipe = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, max_iter=1000)).fit(x2, y)
    np.testing.assert_allclose(np.sign(x2 @ std.unit + std.intercept), np.sign(pipe.decision_function(x2)))
    np.testing.assert_allclose(
        x2 @ std.raw + std.intercept * np.linalg.norm(std.raw),
        pipe.decision_function(x2),
        rtol=1e-6,
        atol=1e-6,
    )


def test_span_diff_is_the_mean_of_per_conversation_differences():
    x, y, keys, _ = planted(50, seed=5)
    # uneven rows per conversation: the paper averages per conversation first
    x, y, keys = (
        np.concatenate([x, x[:6] + 1.0]),
        np.concatenate([y, y[:6]]),
        np.concatenate([keys, keys[:6]]),
    )
    expected = np.mean(
        [x[(keys == k) & (y == 1)].mean(0) - x[(keys == k) & (y == 0)].mean(0) for k in np.unique(keys)],
        axis=0,
    )
    got = SpanDiff().update(x, y, keys=keys).fit()
    np.testing.assert_allclose(got.raw, expected, atol=1e-9)


def test_lda_matches_closed_form():
    x, y, _, _ = planted(200, seed=6, offset=3.0)
    lam = 0.2
    m1, m0 = x[y == 1].mean(0), x[y == 0].mean(0)
    sw = ((x[y == 1] - m1).T @ (x[y == 1] - m1) + (x[y == 0] - m0).T @ (x[y == 0] - m0)) / (len(y) - 2)
    cov = (1 - lam) * sw + lam * np.trace(sw) / D * np.eye(D)
    np.testing.assert_allclose(
        MassMeanLDA(shrinkage=lam).update(x, y).fit().raw, np.linalg.solve(cov, m1 - m0), rtol=1e-8
    )


def test_paired_pca_is_first_singular_vector_of_differences():
    x, y, keys, _ = planted(100, seed=7)
    diffs = x[1::2] - x[::2]
    ref = np.linalg.svd(diffs, full_matrices=False)[2][0]
    got = PairedPCA().update(x, y, keys=keys).fit().unit
    assert abs(got @ ref) == pytest.approx(1.0, abs=1e-10)


def test_fitter_bad_input_is_one_clear_error():
    x, y, keys, _ = planted(20, seed=8)
    with pytest.raises(ValueprobeError, match="both classes"):
        DiffMeans().update(x, np.ones_like(y)).fit()
    bad = x.copy()
    bad[[3, 7]] = np.nan
    with pytest.raises(ValueprobeError, match=r"rows \[3, 7\]"):
        DiffMeans().update(bad, y)
    with pytest.raises(ValueprobeError, match="pairing key"):
        SpanDiff().update(x, y)
    with pytest.raises(ValueprobeError, match="no pairing key"):
        SpanDiff().update(x, y, keys=[str(i) for i in range(len(y))]).fit()
    with pytest.raises(ValueprobeError, match="unknown probe method"):
        make_fitter("svm")


# ---- the artifact ----------------------------------------------------------------------------------


ARCH = "aaaaaaaaaaaaaaaa"  # the architecture part of the fake fingerprints


def make_axis(
    d: int = 8, layers=(2, 3, 5), *, seed: int = 0, fingerprint: str = ARCH + "-0123456789abcdef"
) -> ValueAxis:
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((len(layers), d))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    return ValueAxis(
        directions=torch.tensor(dirs, dtype=torch.float32),
        layers=tuple(layers),
        mu=torch.tensor(rng.standard_normal(len(layers)), dtype=torch.float32),
        sigma=torch.tensor(rng.uniform(0.5, 2, len(layers)), dtype=torch.float32),
        mean_norm=torch.tensor(rng.uniform(10, 20, len(layers)), dtype=torch.float32),
        best_layer=layers[1],
        site="resid_post",
        method="diff_means",
        model_id="tiny",
        fingerprint=fingerprint,
        d_model=d,
        metrics={"sweep": {"best_layer": layers[1], "auroc": [0.5, 0.75], "note": None}},
        datasets=({"name": "icrl", "dataset_sha256": "ab" * 32},),
    )


def fake_lm(
    *, d_model: int = 8, fingerprint: str = ARCH + "-0123456789abcdef", n_layers: int = 6, legacy: str = ""
):
    return SimpleNamespace(
        d_model=d_model,
        fingerprint=fingerprint,
        n_layers=n_layers,
        model_id="tiny",
        legacy_fingerprint=legacy,
    )


def assert_same_axis(a: ValueAxis, b: ValueAxis) -> None:
    for name in ("directions", "mu", "sigma", "mean_norm"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in (
        "layers",
        "best_layer",
        "site",
        "method",
        "model_id",
        "fingerprint",
        "d_model",
        "scale",
        "sigma_reference",
        "metrics",
        "datasets",
        "ops",
        "version",
    ):
        assert getattr(a, name) == getattr(b, name), name


def test_artifact_round_trips_exactly(tmp_path):
    axis = 3 * -make_axis()
    axis.save(tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["axis.safetensors", "probe.json"]
    info = json.loads((tmp_path / "p" / "probe.json").read_text())  # strict JSON
    assert info["format_version"] == 1 and info["d_model"] == 8 and info["best_layer"] == 3
    assert_same_axis(ValueAxis.load(tmp_path / "p", lm=fake_lm()), axis)


def test_load_checks_model(tmp_path):
    make_axis().save(tmp_path / "p")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the axis's own model: no warning
        ValueAxis.load(tmp_path / "p", lm=fake_lm())
    with pytest.warns(FingerprintWarning, match="other weights .*descendant"):  # a fine-tune: read it
        ValueAxis.load(tmp_path / "p", lm=fake_lm(fingerprint=ARCH + "-ffffffffffffffff"))
    other_arch = fake_lm(fingerprint="bbbbbbbbbbbbbbbb-0123456789abcdef")
    with pytest.raises(ValueprobeError, match="another architecture or vocabulary .*--force"):
        ValueAxis.load(tmp_path / "p", lm=other_arch)
    with pytest.warns(FingerprintWarning):
        ValueAxis.load(tmp_path / "p", lm=other_arch, force=True)
    with pytest.raises(ValueprobeError, match="d_model 8 .* d_model 16"):
        ValueAxis.load(tmp_path / "p", lm=fake_lm(d_model=16), force=True)
    with pytest.raises(ValueprobeError, match="layers 0..3"):
        make_axis().check(fake_lm(n_layers=4))
    with pytest.raises(ValueprobeError, match="not a probe folder"):
        ValueAxis.load(tmp_path / "nothing")
    (tmp_path / "p" / "probe.json").write_text("{not json")
    with pytest.raises(ValueprobeError, match="unreadable probe"):
        ValueAxis.load(tmp_path / "p")


def test_legacy_single_hash_probe_compares_the_old_hash(tmp_path):
    """Probes saved before the two-part fingerprint carry one hash: it is checked as the weights part."""
    make_axis(fingerprint="0123456789abcdef").save(tmp_path / "p")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ValueAxis.load(tmp_path / "p", lm=fake_lm(legacy="0123456789abcdef"))
    with pytest.warns(FingerprintWarning, match="other weights"):
        ValueAxis.load(tmp_path / "p", lm=fake_lm(legacy="fedcba9876543210"))


def test_axis_arithmetic_and_indexing():
    axis = make_axis()
    h = torch.randn(4, 8)
    torch.testing.assert_close((-axis).score(h), -axis.score(h))
    torch.testing.assert_close((-axis).project(h, 5), -axis.project(h, 5))
    doubled = 2 * axis
    assert doubled.scale == 2.0 and torch.equal(doubled.directions, axis.directions)
    torch.testing.assert_close(doubled.score(h), axis.score(h))  # scale is steering strength only
    torch.testing.assert_close(doubled.vector(alpha=1.5), axis.direction() * 3 * float(axis.sigma[1]))
    torch.testing.assert_close(
        axis.vector(5, alpha=10, units="norm"), axis.direction(5) * float(axis.mean_norm[2]) / 10
    )
    assert torch.equal((-1 * axis).directions, (-axis).directions)
    one = axis[5]
    assert one.layers == (5,) and one.best_layer == 5 and torch.equal(one.direction(), axis.direction(5))
    with pytest.raises(ValueprobeError, match="layer 4 is not in this axis; it has layers 2..3, 5"):
        axis[4]
    other = make_axis(layers=(3, 5, 7), seed=1)
    diff = axis - other
    assert diff.layers == (3, 5)
    want = axis.direction(3) - other.direction(3)
    torch.testing.assert_close(diff.direction(3), want / want.norm())
    assert torch.linalg.norm(diff.directions, dim=1).allclose(torch.ones(2))
    with pytest.raises(ValueprobeError, match="no σ calibration"):
        diff.score(h)
    with pytest.raises(ValueprobeError, match="different architectures"):
        axis - make_axis(fingerprint="bbbbbbbbbbbbbbbb-0123456789abcdef")
    with pytest.warns(FingerprintWarning, match="other weights"):  # base axis minus a fine-tune's axis
        axis - make_axis(layers=(3, 5, 7), seed=1, fingerprint=ARCH + "-ffffffffffffffff")
    with pytest.raises(ValueprobeError, match="different widths"):
        axis - make_axis(d=16)
    with pytest.raises(ValueprobeError, match="cancel"):
        axis - axis


def test_score_is_sigma_units():
    axis = make_axis()
    h = np.random.default_rng(0).standard_normal((5, 8))
    v = axis.direction(2).double().numpy()
    np.testing.assert_allclose(
        axis.score(h, 2), (h @ v - float(axis.mu[0])) / float(axis.sigma[0]), rtol=1e-6
    )
