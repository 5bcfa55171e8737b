"""An `Effect` from per-unit figures of the axis and of every random direction.

    from valueprobe.audit.effects import mean_effect, statistic_effect
    e = mean_effect("value main effect", "value", "+", per_conv, dirs=dirs)      # per_conv [n, 1 + k]
    r = statistic_effect("Spearman ρ with the cut", "rival", "±", rho, n_units=48, unit="ρ")

Column 0 is the axis, columns 1.. the random directions, all in their neutral σ
(`valueprobe.audit.reading.Directions.in_reference`). A mean effect's CI is the bootstrap of the
axis's per-unit mean (`valueprobe.stats.null.mean_ci`); a statistic's (a correlation, an AUROC) is
the bootstrap over units of the statistic itself (`valueprobe.stats.metrics.cluster_ci`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from valueprobe.audit.reading import Directions
from valueprobe.audit.records import Effect, Role, Sign
from valueprobe.stats.metrics import cluster_ci
from valueprobe.stats.null import mean_ci, null_range, percentile_in

__all__ = ["N_BOOT", "mean_effect", "statistic_effect"]

N_BOOT = 1000


def mean_effect(
    name: str,
    role: Role,
    expected: Sign,
    per_unit: np.ndarray,
    *,
    dirs: Directions,
    seed: int = 0,
) -> Effect:
    """The mean over units of a per-unit effect [n, 1 + k] in neutral σ: the axis's in its recorded
    σ (its neutral σ when it has none), with CI, the null over the random columns and the sign count."""
    x = np.asarray(per_unit, dtype=np.float64)
    axis = x[:, 0]
    factor = dirs.axis_units()
    unit = "σ"
    if not np.isfinite(factor):
        factor, unit = 1.0, "σ (neutral)"
    lo, hi = mean_ci(axis, n_boot=N_BOOT, seed=seed)
    null = x[:, 1:].mean(axis=0)
    ref = float(axis.mean())
    return Effect(
        name=name,
        role=role,
        expected=expected,
        estimate=ref * factor,
        ci=(lo * factor, hi * factor),
        unit=unit,
        reference=ref,
        null=null_range(null),
        null_percentile=percentile_in(ref, null),
        n=int(axis.size),
        n_positive=int((axis > 0).sum()),
    )


def statistic_effect(
    name: str,
    role: Role,
    expected: Sign,
    statistic: Callable[[np.ndarray, slice], np.ndarray],
    *,
    n_units: int,
    unit: str,
    neutral: float = 0.0,
    seed: int = 0,
) -> Effect:
    """A scale-free statistic: ``statistic(units, columns)`` gives its value for the directions in
    ``columns`` on the resampled ``units`` (indices into the test's units). Its CI resamples units
    for the axis alone; the null is its value for each random direction on all units."""
    every = np.arange(n_units)
    values = np.asarray(statistic(every, slice(None)), dtype=np.float64)
    axis, null = float(values[0]), values[1:]
    lo, hi = cluster_ci(lambda idx: float(statistic(idx, slice(0, 1))[0]), n_units, n_boot=N_BOOT, seed=seed)
    return Effect(
        name=name,
        role=role,
        expected=expected,
        estimate=axis,
        ci=(lo, hi),
        unit=unit,
        reference=axis,
        null=null_range(null) if null.size else (float("nan"), float("nan")),
        null_percentile=percentile_in(axis, null) if null.size else float("nan"),
        n=n_units,
        neutral=neutral,
    )
