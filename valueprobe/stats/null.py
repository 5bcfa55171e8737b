"""Nulls and intervals: random unit directions, where a figure falls among them, bootstrap of a mean.

An axis figure means something only beside what any direction shows on the same tokens: on
last-token contrasts of fixed words ("Yes" vs "No") random directions reach AUROC 0 or 1.
``valueprobe score --null 32`` and ``valueprobe shift`` use these helpers::

    >>> R = random_directions(576, 32, seed=0)          # [32, 576] unit rows
    >>> null = np.array([auroc(h @ r, y) for r in R])
    >>> percentile_in(auroc(h @ v, y), null), null_range(null)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from valueprobe.errors import ValueprobeError
from valueprobe.stats.metrics import auroc, cohens_d

__all__ = [
    "diff_cis",
    "direction_null",
    "mean_ci",
    "mean_cis",
    "null_range",
    "percentile_in",
    "random_directions",
    "random_subsets",
    "unit_directions",
]


def random_directions(d_model: int, n: int, *, seed: int = 0) -> np.ndarray:
    """``n`` random unit directions [n, d_model], uniform on the sphere: the one random-direction null.

    Seed scheme: ``numpy.random.default_rng(seed)`` (PCG64) draws an ``[n, d_model]`` float64
    standard normal matrix in row-major order, and each row is divided by its norm. Row ``k``
    therefore depends only on ``(seed, d_model, k)``: asking for more directions appends rows and
    keeps the first ones. Score nulls, ``shift`` and the steering sweep's ``random-K`` directions
    (as a float32 tensor) all use it. Steering results written before this was the one scheme
    (``probes/steering-smollm2-135m``) drew theirs from a torch generator seeded by
    ``SeedSequence([seed, 7])``: other directions, the same distribution.

    >>> R = random_directions(576, 8, seed=0)
    >>> R.shape, np.allclose(np.linalg.norm(R, axis=1), 1.0)
    ((8, 576), True)
    """
    if n < 1:
        raise ValueprobeError(f"the random-direction null needs at least 1 direction, got {n}")
    return unit_directions(np.random.default_rng(seed), n, d_model)


def unit_directions(rng: np.random.Generator, n: int, d_model: int) -> np.ndarray:
    """``n`` random unit directions [n, d_model] drawn from ``rng``: the one place a direction is drawn.

    :func:`random_directions` is this on a fresh generator by seed; the layer sweep and the
    transfer matrix pass the generator they also shuffle labels with, so their controls keep
    their place in that one stream. Standard normals in row-major order, each row divided by its
    norm (uniform on the sphere).

    >>> unit_directions(np.random.default_rng(0), 2, 576).shape
    (2, 576)
    """
    g = rng.standard_normal((n, d_model))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def null_range(null: Sequence[float] | np.ndarray, *, level: float = 0.95) -> tuple[float, float]:
    """Central ``level`` range of a null sample (2.5th and 97.5th percentiles by default), NaN ignored.

    >>> null_range([-1.0, 0.0, 1.0], level=1.0)
    (-1.0, 1.0)
    """
    x = np.asarray(null, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return (float("nan"), float("nan"))
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(x, [tail, 100 - tail])
    return float(lo), float(hi)


def percentile_in(x: float, null: np.ndarray) -> float:
    """Where ``x`` falls in the null, 0–100 (ties count half): 50 is typical, 100 beats every direction."""
    n = np.asarray(null, dtype=np.float64)
    n = n[np.isfinite(n)]
    if n.size == 0 or not np.isfinite(x):
        return float("nan")
    return float(100.0 * ((n < x).sum() + 0.5 * (n == x).sum()) / n.size)


def mean_ci(x: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Bootstrap CI of the mean of ``x`` [n], resampling its entries (e.g. examples).

    Percentile interval with the resampled means' spread about the sample mean widened by
    √(n/(n−1)): the plain percentile bootstrap uses the biased variance and under-covers in
    small samples (≈ 93.5% for n = 100 normal draws; the simulation test checks 93–97%), and
    kept within [min(x), max(x)], where every resampled mean lies (a hit rate's CI stays in [0, 1]).
    A sample of one, or ``n_boot=0``, gives (nan, nan).

    >>> mean_ci(np.array([0.1, -0.2, 0.4, 0.0]), n_boot=2000)
    """
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size < 2 or n_boot < 1:
        return (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, a.size, size=(n_boot, a.size))
    tail = (1 - level) / 2 * 100
    m = a.mean()
    lo, hi = m + (np.percentile(a[idx].mean(axis=1), [tail, 100 - tail]) - m) * np.sqrt(a.size / (a.size - 1))
    # the widening must not reach means no resample can have (an accuracy's CI stays within [0, 1])
    return float(max(lo, a.min())), float(min(hi, a.max()))


def mean_cis(
    x: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """`mean_ci` of every column of ``x`` [n, k] at once (the same interval, the same draws of row
    indices for every column, so columns that are parts of one sum keep their covariance).

    >>> lo, hi = mean_cis(per_pair_effects)      # [pairs, components] -> two [components] arrays
    """
    a = np.asarray(x, dtype=np.float64)
    if a.shape[0] < 2 or n_boot < 1:
        return np.full(a.shape[1], np.nan), np.full(a.shape[1], np.nan)
    idx = np.random.default_rng(seed).integers(0, a.shape[0], size=(n_boot, a.shape[0]))
    tail = (1 - level) / 2 * 100
    m = a.mean(axis=0)
    boots = np.stack([a[row].mean(axis=0) for row in idx])  # [n_boot, k]
    q = np.percentile(boots, [tail, 100 - tail], axis=0)
    lo, hi = m + (q - m) * np.sqrt(a.shape[0] / (a.shape[0] - 1))
    # the widening must not reach means no resample can have (an accuracy's CI stays within [0, 1])
    return np.maximum(lo, a.min(axis=0)), np.minimum(hi, a.max(axis=0))


def diff_cis(
    a: np.ndarray, b: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of ``mean(a) − mean(b)`` per column, ``a`` [n_a, k] and ``b`` [n_b, k]
    resampled separately (two independent groups, e.g. the examples of two classes).

    >>> lo, hi = diff_cis(scores[y == 1], scores[y == 0])
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    k = a.shape[1]
    if min(a.shape[0], b.shape[0]) < 2 or n_boot < 1:
        return np.full(k, np.nan), np.full(k, np.nan)
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.shape[0], size=(n_boot, a.shape[0]))
    ib = rng.integers(0, b.shape[0], size=(n_boot, b.shape[0]))
    boots = np.stack([a[i].mean(axis=0) - b[j].mean(axis=0) for i, j in zip(ia, ib, strict=True)])
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(boots, [tail, 100 - tail], axis=0)
    return lo, hi


def random_subsets(
    pools: Sequence[tuple[int, int]], n_draws: int, *, seed: int = 0
) -> list[list[np.ndarray]]:
    """``n_draws`` random draws, each one subset of ``k`` items (without replacement) from each pool
    of ``size`` items given as ``(size, k)``: the null of a chosen set of components (k random
    heads and k' random MLPs per draw, say). Seed scheme: one ``numpy.random.default_rng(seed)``
    (PCG64) draws, draw by draw and pool by pool, ``rng.choice(size, k, replace=False)``.

    >>> random_subsets([(270, 3), (30, 2)], 2, seed=0)    # two draws of 3 heads and 2 MLPs
    [[array([...]), array([...])], [array([...]), array([...])]]
    """
    for size, k in pools:
        if not 0 <= k <= size:
            raise ValueprobeError(f"cannot draw {k} of {size} items without replacement")
    rng = np.random.default_rng(seed)
    return [[np.sort(rng.choice(size, k, replace=False)) for size, k in pools] for _ in range(n_draws)]


def direction_null(proj: np.ndarray, labels: np.ndarray, *, auroc_axis: float, d_axis: float) -> dict:
    """AUROC and Cohen's d of each random direction (columns of ``proj`` [n, k]) against ``labels``,
    their central 95% ranges, and where the axis's own figures fall among them (percentiles).

    Random directions come in ± pairs with equal chance, so their AUROCs centre on 0.5; an axis
    AUROC at the 100th percentile beats every direction tried.
    """
    y = np.asarray(labels, dtype=np.float64) >= 0.5
    p = np.asarray(proj, dtype=np.float64)
    aurocs = np.array([auroc(p[:, j], y) for j in range(p.shape[1])])
    ds = np.array([cohens_d(p[:, j], y) for j in range(p.shape[1])])
    return {
        "null_n": int(p.shape[1]),
        "null_auroc_range": list(null_range(aurocs)),
        "null_cohens_d_range": list(null_range(ds)),
        "score_auroc_null_percentile": percentile_in(auroc_axis, aurocs),
        "score_cohens_d_null_percentile": percentile_in(d_axis, ds),
    }
