"""Dose-response of a steering sweep: each metric's slope against α, beside its controls.

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_code.jsonl --out runs/steer-code

>>> from valueprobe.steering.experiment.dose import summarize_rows
>>> result = summarize_rows(rows, unit="sigma", metrics=["code_lines"])
>>> headers, table = result.table()
>>> dose_response_figure(result).write_html("dose.html")   # valueprobe.report.effects

Rules, as in the paper: a metric is read over valid outputs only (rows where it applies, see
`valueprobe.steering.experiment.behaviour`); for each direction, a strength is dropped when more than half of its
outputs are degenerate; the slope is the OLS slope of the metric on α over the kept rows, with a
bootstrap CI that resamples prompts. The null is the slopes of the random directions; the axis is
"outside" when its slope lies outside the null's central 95% range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from valueprobe.records import Record, insert_after
from valueprobe.stats.metrics import Slope, dose_slope
from valueprobe.stats.null import null_range
from valueprobe.steering.experiment.behaviour import dropped
from valueprobe.steering.experiment.prompting import NONE
from valueprobe.steering.experiment.settings import SweepSettings

__all__ = ["Effect", "SteerSweep", "SweepRow", "summarize_rows", "AXIS", "RANDOM_PREFIX", "OTHER_PREFIX"]

AXIS = "axis"
RANDOM_PREFIX = "random-"
OTHER_PREFIX = "other:"


@dataclass(frozen=True)
class SweepRow(Record):
    """One generated output of a sweep, with its metrics (None where a metric does not apply)."""

    OMIT = {"condition": NONE}  # a plain-prompt row is written as rows were before conditions existed

    prompt_id: str
    group: str
    alpha: float
    direction: str
    sample: int
    seed: int | None
    text: str
    metrics: dict[str, float | None] = field(compare=False)
    condition: str = (
        NONE  # the prompt condition (`valueprobe.steering.experiment.prompting`); none: the plain prompt
    )

    def key(self) -> tuple[str, float, str, int, str]:
        return (self.prompt_id, self.alpha, self.direction, self.sample, self.condition)


@dataclass(frozen=True)
class Curve(Record):
    """Mean of a metric at each kept α for one direction, with a 95% CI over prompts."""

    KEYS = {"alphas": "alpha", "means": "mean"}

    alphas: tuple[float, ...]
    means: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]


@dataclass(frozen=True)
class Effect(Record):
    """One metric on one subset of prompts: the axis against the other axis and the random null.

    Its JSON also says whether each slope is outside the null (``outside_null``,
    ``other_outside_null``): derived, so written for the file's readers and not read back."""

    KEYS = {"null": "null_slopes", "dropped": "dropped_alphas"}

    metric: str
    subset: str
    axis: Slope
    other: Slope | None
    other_name: str | None
    null: tuple[float, ...]  # slope of each random direction
    null_range: tuple[float, float]
    dropped: tuple[float, ...]  # strengths dropped for the axis (degenerate rule)
    curves: dict[str, Curve] = field(compare=False)  # "axis", "other", "null" (band: lo/hi over directions)

    @property
    def outside(self) -> bool | None:
        lo, hi = self.null_range
        if not (np.isfinite(self.axis.slope) and np.isfinite(lo)):
            return None
        return bool(self.axis.slope < lo or self.axis.slope > hi)

    @property
    def other_outside(self) -> bool | None:
        lo, hi = self.null_range
        if self.other is None or not (np.isfinite(self.other.slope) and np.isfinite(lo)):
            return None
        return bool(self.other.slope < lo or self.other.slope > hi)

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        return insert_after(d, "null_range", outside_null=self.outside, other_outside_null=self.other_outside)


@dataclass(frozen=True)
class SteerSweep(Record):
    """Every effect of one sweep. ``step`` is the α step the table reports slopes per (25 for norm).

    ``effects`` are the plain prompt's; ``prompted`` holds the same effects under each prompt
    condition (`valueprobe.steering.experiment.prompting`): at α = 0 they are prompting alone, along α
    prompting and steering together.

    Its JSON puts the slope step (derived from the unit, not read back) second and the effects after
    the settings (``{}``: none), as sweeps always wrote it.
    """

    OMIT = {"prompted": {}}  # a sweep without prompt conditions writes what it always wrote

    unit: str
    effects: tuple[Effect, ...]
    n_rows: int
    settings: SweepSettings | None = field(default=None, compare=False)  # None: a combined or ad-hoc summary
    prompted: dict[str, tuple[Effect, ...]] = field(default_factory=dict)

    @property
    def step(self) -> float:
        return 25.0 if self.unit == "norm" else 1.0

    def table(self) -> tuple[list[str], list[list[object]]]:
        per = f"per {self.step:g} {self.unit}"
        headers = [
            "metric",
            "subset",
            f"axis slope ({per})",
            "95% CI",
            "other axis",
            "null 95% range",
            "outside null",
            "dropped α",
        ]
        rows: list[list[object]] = []
        k = self.step
        for e in self.effects:
            rows.append(
                [
                    e.metric,
                    e.subset,
                    e.axis.slope * k,
                    f"[{e.axis.ci[0] * k:+.4f}, {e.axis.ci[1] * k:+.4f}]",
                    "-" if e.other is None else e.other.slope * k,
                    f"[{e.null_range[0] * k:+.4f}, {e.null_range[1] * k:+.4f}]" if e.null else "-",
                    {True: "yes", False: "no", None: "-"}[e.outside],
                    ",".join(f"{a:g}" for a in e.dropped) or "-",
                ]
            )
        return headers, rows

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        head = {"unit": d.pop("unit"), "slope_step": self.step, "n_rows": d.pop("n_rows")}
        return {**head, "settings": d.pop("settings") or {}, "effects": d.pop("effects"), **d}

    @classmethod
    def _read(cls, d: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**d, "settings": d.get("settings") or None}

    def csv(self) -> str:
        lines = [
            "metric,subset,axis_slope,axis_lo,axis_hi,other_slope,null_lo,null_hi,outside_null,slope_step"
        ]
        for e in self.effects:
            other = "" if e.other is None else f"{e.other.slope:.6g}"
            lines.append(
                f"{e.metric},{e.subset},{e.axis.slope:.6g},{e.axis.ci[0]:.6g},{e.axis.ci[1]:.6g},"
                f"{other},{e.null_range[0]:.6g},{e.null_range[1]:.6g},{e.outside},{self.step:g}"
            )
        return "\n".join(lines) + "\n"


def _valid(
    rows: Sequence[SweepRow], metric: str, drop: set[float]
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    keep = [r for r in rows if r.alpha not in drop and r.metrics.get(metric) is not None]
    x = np.array([r.alpha for r in keep], dtype=np.float64)
    y = np.array([r.metrics[metric] for r in keep], dtype=np.float64)
    return x, y, [r.prompt_id for r in keep]


def _drops(rows: Sequence[SweepRow]) -> set[float]:
    return set(dropped([r.alpha for r in rows], [bool(r.metrics.get("degenerate")) for r in rows]))


def _curve(x: np.ndarray, y: np.ndarray, prompts: list[str], *, seed: int, n_boot: int = 300) -> Curve:
    alphas, means, lo, hi = [], [], [], []
    rng = np.random.default_rng(seed)
    p = np.asarray(prompts, dtype=object)
    for a in np.unique(x):
        at = x == a
        ids, inv = np.unique(p[at].astype(str), return_inverse=True)
        per_prompt = np.bincount(inv, weights=y[at]) / np.bincount(inv)  # each prompt weighs the same
        boots = rng.choice(per_prompt, size=(n_boot, per_prompt.size)).mean(axis=1)
        alphas.append(float(a))
        means.append(float(per_prompt.mean()))
        lo.append(float(np.percentile(boots, 2.5)))
        hi.append(float(np.percentile(boots, 97.5)))
    return Curve(tuple(alphas), tuple(means), tuple(lo), tuple(hi))


def _null_band(curves: list[Curve]) -> Curve | None:
    if not curves:
        return None
    alphas = sorted({a for c in curves for a in c.alphas})
    lo, hi, mid = [], [], []
    for a in alphas:
        vals = [c.means[c.alphas.index(a)] for c in curves if a in c.alphas]
        lo.append(float(np.percentile(vals, 2.5)))
        hi.append(float(np.percentile(vals, 97.5)))
        mid.append(float(np.mean(vals)))
    return Curve(tuple(alphas), tuple(mid), tuple(lo), tuple(hi))


def subsets(rows: Sequence[SweepRow], *, by_group: bool) -> list[str]:
    """Each group when ``by_group`` (direct vs inverted, harmful vs benign), else all rows pooled."""
    return sorted({r.group for r in rows}) if by_group else ["all"]


def summarize_rows(
    rows: Sequence[SweepRow],
    *,
    unit: str,
    metrics: Sequence[str],
    by_group: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
    settings: SweepSettings | None = None,
    condition: str = NONE,
) -> SteerSweep:
    """Slopes, CIs, null ranges and curves of ``metrics`` for every subset of ``rows`` under one
    prompt ``condition`` (the plain prompt by default; rows of other conditions are left out).

    Args:
        rows: the sweep's outputs (directions ``axis``, ``other:NAME``, ``random-K``).
        unit: the unit α was given in (``norm`` tables report slopes per 25).
        metrics: metric names present in each row's ``metrics``.
        by_group: one effect per group (for files whose groups are conditions, e.g. the confidence
            question and its inverted control), instead of one over all rows.
        n_boot, seed: the prompt bootstrap.
    """
    rows = [r for r in rows if r.condition == condition]
    by_dir: dict[str, list[SweepRow]] = {}
    for r in rows:
        by_dir.setdefault(r.direction, []).append(r)
    effects = []
    for subset in subsets(rows, by_group=by_group):
        for metric in metrics:
            per: dict[str, tuple[Slope, Curve | None, tuple[float, ...]]] = {}
            for name, drows in sorted(by_dir.items()):
                sub = [r for r in drows if subset == "all" or r.group == subset]
                drop = _drops(sub)
                x, y, p = _valid(sub, metric, drop)
                slope = dose_slope(
                    x, y, p, n_boot=n_boot if name == AXIS or name.startswith(OTHER_PREFIX) else 0, seed=seed
                )
                curve = _curve(x, y, p, seed=seed) if x.size else None
                per[name] = (slope, curve, tuple(sorted(drop)))
            axis_curve = per[AXIS][1] if AXIS in per else None
            if axis_curve is None:
                continue
            null = tuple(s.slope for n, (s, _, _) in per.items() if n.startswith(RANDOM_PREFIX))
            other = next(((n, v) for n, v in per.items() if n.startswith(OTHER_PREFIX)), None)
            curves: dict[str, Curve] = {AXIS: axis_curve}
            band = _null_band([c for n, (_, c, _) in per.items() if n.startswith(RANDOM_PREFIX) and c])
            if band is not None:
                curves["null"] = band
            if other is not None and other[1][1] is not None:
                curves["other"] = other[1][1]
            effects.append(
                Effect(
                    metric=metric,
                    subset=subset,
                    axis=per[AXIS][0],
                    other=None if other is None else other[1][0],
                    other_name=None if other is None else other[0][len(OTHER_PREFIX) :],
                    null=null,
                    null_range=null_range(null),
                    dropped=per[AXIS][2],
                    curves=curves,
                )
            )
    return SteerSweep(unit=unit, effects=tuple(effects), n_rows=len(rows), settings=settings)
