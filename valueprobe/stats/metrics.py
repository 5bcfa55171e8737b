"""Effect sizes and their uncertainty: AUROC, Cohen's d, stratified bootstrap CIs, mean ± sd.

Used by the layer sweep, the transfer matrix and ``valueprobe score``:

>>> from valueprobe.stats.metrics import auroc, cohens_d, bootstrap_ci
>>> auroc([0.1, 0.9, 0.4], [0, 1, 1])
1.0
>>> lo, hi = bootstrap_ci(auroc, scores, labels, n_boot=1000, seed=0)

and by steering sweeps, for the dose-response slope against α and the random-direction null:

>>> dose_slope(alphas, yes, prompt_ids).slope   # beside stats.null.null_range(random_slopes)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from valueprobe.errors import ValueprobeError
from valueprobe.records import Record

Metric = Callable[[np.ndarray, np.ndarray], float]


def _split(scores: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray, what: str):
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1) >= 0.5  # graded labels: success means >= 0.5
    if s.shape != y.shape:
        raise ValueprobeError(f"{what}: {s.size} scores but {y.size} labels; pass one label per score")
    if not np.isfinite(s).all():
        bad = np.flatnonzero(~np.isfinite(s))[:5].tolist()
        raise ValueprobeError(f"{what}: non-finite scores at rows {bad}; check the activations for NaN/inf")
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        only = "1 (success)" if n_pos else "0 (failure)"
        raise ValueprobeError(
            f"{what} needs both classes, but all {y.size} labels are {only}; add examples of the other class"
        )
    return s[y], s[~y]


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for ``labels >= 0.5`` (Mann-Whitney U, ties count 1/2).

    Args:
        scores: [n] higher = more likely success.
        labels: [n] 1 = success, 0 = failure (floats are thresholded at 0.5).

    >>> auroc([1, 2, 3, 4], [0, 0, 1, 1])
    1.0
    """
    pos, neg = _split(scores, labels, "AUROC")
    ranks = rankdata(np.concatenate([pos, neg]))  # average ranks handle ties
    u = ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2
    return float(u / (pos.size * neg.size))


def cohens_d(scores: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> float:
    """Cohen's d: (mean_success - mean_failure) / pooled standard deviation (ddof=1 per class).

    Returns ``inf``/``-inf`` when both classes are constant but differ, 0 when all scores are equal.

    >>> round(cohens_d([0, 2, 4, 6], [0, 0, 1, 1]), 3)
    2.828
    """
    pos, neg = _split(scores, labels, "Cohen's d")
    diff = pos.mean() - neg.mean()
    dof = pos.size + neg.size - 2
    ss = ((pos - pos.mean()) ** 2).sum() + ((neg - neg.mean()) ** 2).sum()
    pooled = np.sqrt(ss / dof) if dof > 0 else 0.0
    if pooled == 0.0:
        return 0.0 if diff == 0 else float(np.sign(diff) * np.inf)
    return float(diff / pooled)


def bootstrap_ci(
    metric: Metric,
    scores: Sequence[float] | np.ndarray,
    labels: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``metric(scores, labels)``.

    Resamples within each class (stratified), so every resample keeps both classes and
    the class balance of the data.

    Args:
        metric: e.g. :func:`auroc` or :func:`cohens_d`.
        n_boot: number of resamples.
        level: coverage, 0.95 gives the 2.5 and 97.5 percentiles.
        seed: seed of the resampling.

    >>> bootstrap_ci(auroc, scores, labels, n_boot=1000, seed=0)
    (0.81, 0.93)
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    _split(s, y, "bootstrap")  # validates shapes, finiteness, both classes
    pos_idx, neg_idx = np.flatnonzero(y >= 0.5), np.flatnonzero(y < 0.5)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    for b in range(n_boot):
        idx = np.concatenate([rng.choice(pos_idx, pos_idx.size), rng.choice(neg_idx, neg_idx.size)])
        stats[b] = metric(s[idx], y[idx])
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return (float("nan"), float("nan"))
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


@dataclass(frozen=True)
class MeanSd(Record):
    """A metric over splits: its mean and sample sd (``{"mean", "sd"}`` in JSON, as `mean_sd` gives)."""

    mean: float
    sd: float

    @classmethod
    def of(cls, a: np.ndarray) -> MeanSd:
        return cls(**mean_sd(a))


def mean_sd(a: np.ndarray) -> dict[str, float]:
    """``{"mean", "sd"}`` of a metric over splits (NaN ignored; sample sd, 0 for one value)."""
    a = np.asarray(a, dtype=np.float64)
    return {"mean": float(np.nanmean(a)), "sd": float(np.nanstd(a, ddof=1)) if a.size > 1 else 0.0}


# Dose-response: the slope of a behaviour against steering strength, with prompts as the unit.


@dataclass(frozen=True)
class Slope(Record):
    """OLS slope of a metric against α (per unit of α), with a bootstrap CI over prompts."""

    slope: float
    ci: tuple[float, float]
    n_prompts: int
    n_rows: int


def _weighted_slopes(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """OLS slope of y on x for each row of weights ``w`` [boot, n] (a weight = times a row was drawn)."""
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = (w * x).sum(axis=1, keepdims=True) / total
        my = (w * y).sum(axis=1, keepdims=True) / total
        sxx = (w * (x - mx) ** 2).sum(axis=1)
        sxy = (w * (x - mx) * (y - my)).sum(axis=1)
        return np.where(sxx > 1e-12, sxy / np.where(sxx > 1e-12, sxx, 1.0), np.nan)


def dose_slope(
    alphas: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    prompts: Sequence[str],
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Slope:
    """OLS slope of ``values`` on ``alphas`` and its percentile bootstrap CI, resampling prompts.

    Rows of one prompt (its strengths and samples) share the prompt's randomness, so they are
    resampled together: each bootstrap draws prompts with replacement and keeps all their rows.
    A slope is NaN when fewer than two distinct α remain.

    Args:
        alphas: [n] the strength of each row.
        values: [n] the metric of each row (rows where it does not apply already removed).
        prompts: [n] the prompt id of each row.
        n_boot: bootstrap resamples.
        level: CI coverage.
        seed: seed of the resampling.

    >>> s = dose_slope([-1, 0, 1, -1, 0, 1], [0, 1, 2, 1, 2, 3], ["a"] * 3 + ["b"] * 3)
    >>> s.slope
    1.0
    """
    x = np.asarray(alphas, dtype=np.float64).reshape(-1)
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    if not (x.size == y.size == len(prompts)):
        raise ValueprobeError(f"dose_slope: {x.size} alphas, {y.size} values, {len(prompts)} prompt ids")
    names, index = np.unique(np.asarray(prompts, dtype=object).astype(str), return_inverse=True)
    if x.size == 0:
        return Slope(float("nan"), (float("nan"), float("nan")), 0, 0)
    slope = float(_weighted_slopes(x, y, np.ones((1, x.size)))[0])
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(
        names.size, np.full(names.size, 1.0 / names.size), size=n_boot
    )  # [boot, prompts]
    boots = _weighted_slopes(x, y, counts[:, index].astype(np.float64))
    boots = boots[np.isfinite(boots)]
    tail = (1 - level) / 2 * 100
    ci = tuple(float(v) for v in np.percentile(boots, [tail, 100 - tail])) if boots.size else (np.nan, np.nan)
    return Slope(slope, (float(ci[0]), float(ci[1])), int(names.size), int(x.size))


# Statistics of many directions at once, and a bootstrap over the units (clusters) they come from.


def cluster_ci(
    statistic: Callable[[np.ndarray], float],
    n_units: int,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic(units)``, where ``units`` [n_units] are unit indices
    drawn with replacement: tokens of one answer, or cuts of one conversation, stay together.

    >>> cluster_ci(lambda idx: float(x[idx].mean()), len(x))   # the same as a bootstrap of a mean
    """
    if n_units < 2 or n_boot < 1:
        return (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, n_units, size=(n_boot, n_units))
    stats = np.array([statistic(row) for row in idx], dtype=np.float64)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return (float("nan"), float("nan"))
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def spearman_columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of ``x`` [n] with each column of ``y`` [n, k] (ties get mean ranks);
    NaN for a column without spread.

    >>> spearman_columns(np.arange(4.0), np.array([[1.0], [2.0], [3.0], [5.0]]))
    array([1.])
    """
    rx = rankdata(np.asarray(x, dtype=np.float64))
    ry = np.apply_along_axis(rankdata, 0, np.asarray(y, dtype=np.float64).reshape(len(rx), -1))
    return pearson_columns(rx, ry)


def pearson_columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson correlation of ``x`` [n] with each column of ``y`` [n, k]; NaN without spread."""
    xc = np.asarray(x, dtype=np.float64) - np.mean(x)
    yc = np.asarray(y, dtype=np.float64).reshape(len(xc), -1)
    yc = yc - yc.mean(axis=0)
    denom = np.sqrt((xc**2).sum() * (yc**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, xc @ yc / np.where(denom > 0, denom, 1.0), np.nan)


def partial_correlations(y: np.ndarray, predictors: np.ndarray) -> np.ndarray:
    """Partial correlation of each column of ``y`` [n, k] with each predictor [n, p], the other
    predictors held fixed (both residualised on them and an intercept): [p, k].

    >>> partial_correlations(y, np.stack([remaining, position], axis=1))   # [2, directions]
    """
    y = np.asarray(y, dtype=np.float64).reshape(len(predictors), -1)
    x = np.asarray(predictors, dtype=np.float64).reshape(len(y), -1)
    out = np.empty((x.shape[1], y.shape[1]))
    for j in range(x.shape[1]):
        others = np.column_stack([np.ones(len(x)), np.delete(x, j, axis=1)])
        beta_x = np.linalg.lstsq(others, x[:, j], rcond=None)[0]
        beta_y = np.linalg.lstsq(others, y, rcond=None)[0]
        out[j] = pearson_columns(x[:, j] - others @ beta_x, y - others @ beta_y)
    return out
