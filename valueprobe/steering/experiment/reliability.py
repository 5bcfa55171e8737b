"""Does steering work on each item, or only on average? Per-item slopes, the share that move the
wrong way, and how steerability shifts under a second wording of the same items.

    valueprobe replicate steer --out probes/steering-smollm2-135m        # reliability beside each target

    >>> rel = item_reliability(rows, target)                  # rows: a sweep's generations
    >>> rel.against, rel.null_against, rel.shift.change

After Tan et al. ("Analyzing the generalization and reliability of steering vectors", 2024): an
item's **steerability** is the OLS slope of its metric on α (its samples pooled), per unit of α.
For the axis, and as the null for each random direction (same α, same items):

- ``against``: the share of items whose slope has the opposite sign to the target's (the
  "anti-steerable" items), ``with_`` the share moving the intended way; the rest did not move;
- the slope distribution (quantiles, and every slope for the figure);
- the **prompt shift**: the same items under the ``reworded`` condition
  (`valueprobe.steering.experiment.prompting`): the mean slope in each wording, their difference with a 95%
  bootstrap CI over items (paired), the share of items whose slope changes sign, and the rank
  correlation of the items' slopes across the two wordings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from valueprobe.records import Record
from valueprobe.stats.null import mean_ci, null_range
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX, SweepRow
from valueprobe.steering.experiment.prompting import NONE, Goal

__all__ = ["PromptShift", "Reliability", "item_reliability", "item_slopes"]

REWORDED = "reworded"
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def item_slopes(
    rows: Sequence[SweepRow], metric: str, subset: str, *, direction: str = AXIS, condition: str = NONE
) -> dict[str, float]:
    """item (prompt id) -> the OLS slope of ``metric`` on α over its rows (NaN with < 2 distinct α)."""
    by_item: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        v = r.metrics.get(metric)
        if r.direction != direction or r.condition != condition or v is None:
            continue
        if subset == "all" or r.group == subset:
            by_item.setdefault(r.prompt_id, []).append((r.alpha, float(v)))
    out = {}
    for item, pairs in by_item.items():
        x, y = np.array(pairs).T
        sxx = float(((x - x.mean()) ** 2).sum())
        out[item] = float(((x - x.mean()) * (y - y.mean())).sum() / sxx) if sxx > 0 else float("nan")
    return out


def _shares(slopes: np.ndarray, sign: int) -> tuple[float, float]:
    """(with, against): the shares of items moving the target's way and the other way."""
    s = slopes[np.isfinite(slopes)] * sign
    if s.size == 0:
        return float("nan"), float("nan")
    return float((s > 0).mean()), float((s < 0).mean())


@dataclass(frozen=True)
class PromptShift:
    """Steerability in the plain wording against a second wording of the same items."""

    n_items: int
    mean_plain: float
    mean_reworded: float
    change: float  # reworded − plain, mean over items
    change_ci: tuple[float, float]
    sign_flips: float  # share of items whose slope changes sign between wordings
    rank_correlation: float  # Spearman's rho of the items' slopes across wordings


def _rank(x: np.ndarray) -> np.ndarray:
    order = x.argsort(kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(x.size)
    for v in np.unique(x):  # ties share their mean rank
        ranks[x == v] = ranks[x == v].mean()
    return ranks


def prompt_shift(plain: Mapping[str, float], reworded: Mapping[str, float]) -> PromptShift | None:
    """The shift between two wordings' per-item slopes (None: fewer than 3 items in both)."""
    items = sorted(k for k in plain if k in reworded and np.isfinite(plain[k]) and np.isfinite(reworded[k]))
    if len(items) < 3:
        return None
    a, b = np.array([plain[k] for k in items]), np.array([reworded[k] for k in items])
    ra, rb = _rank(a), _rank(b)
    rho = float(np.corrcoef(ra, rb)[0, 1]) if ra.std() > 0 and rb.std() > 0 else float("nan")
    flips = float((np.sign(a) != np.sign(b)).mean())
    return PromptShift(
        len(items), float(a.mean()), float(b.mean()), float((b - a).mean()), mean_ci(b - a), flips, rho
    )


@dataclass(frozen=True)
class Reliability(Record):
    """Per-item reliability of one target (see the module doc); slopes per unit of α."""

    metric: str
    subset: str
    sign: int
    n_items: int
    with_: float
    against: float
    null_against: tuple[float, float]  # the random directions' central 95% of ``against``
    quantiles: tuple[float, ...]  # of the axis's slopes, at QUANTILES
    slopes: tuple[float, ...]  # the axis's, one per item
    null_slopes: tuple[float, ...]  # every random direction's items' slopes, pooled
    shift: PromptShift | None


def item_reliability(rows: Sequence[SweepRow], target: Goal) -> Reliability:
    """Per-item slopes of ``target`` for the axis and every random direction, and the prompt shift."""
    axis = item_slopes(rows, target.metric, target.subset)
    slopes = np.array([axis[k] for k in sorted(axis)])
    finite = slopes[np.isfinite(slopes)]
    with_, against = _shares(slopes, target.sign)
    randoms = sorted({r.direction for r in rows if r.direction.startswith(RANDOM_PREFIX)})
    null_items = [
        np.array(list(item_slopes(rows, target.metric, target.subset, direction=d).values())) for d in randoms
    ]
    null_against = null_range(np.array([_shares(s, target.sign)[1] for s in null_items]))
    reworded = item_slopes(rows, target.metric, target.subset, condition=REWORDED)
    pooled = np.concatenate(null_items) if null_items else np.array([])
    return Reliability(
        metric=target.metric,
        subset=target.subset,
        sign=target.sign,
        n_items=int(finite.size),
        with_=with_,
        against=against,
        null_against=null_against,
        quantiles=tuple(float(q) for q in np.quantile(finite, QUANTILES)) if finite.size else (),
        slopes=tuple(float(s) for s in finite),
        null_slopes=tuple(float(s) for s in pooled[np.isfinite(pooled)]),
        shift=prompt_shift(axis, reworded) if reworded else None,
    )
