"""Does steering beat asking? Steering, prompting and both, side by side, from one sweep's curves.

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl --out runs/steer-open

    >>> rows = prompt_baseline(sweep, target)          # sweep: a SteerSweep run with --conditions toward,away
    >>> rows[0].verdict
    'asking beats steering'

For each effect (a metric on a subset of prompts) of a sweep run with the ``toward`` and ``away``
prompt conditions (`valueprobe.steering.experiment.prompting`), read at the sweep's largest strength α*:

- **steering**: the axis at ±α* under the plain prompt, beside the random directions' central 95%
  at the same strengths (the null);
- **prompting**: α = 0 under the system prompt asking for the behaviour (``toward``) or its opposite
  (``away``);
- **prompting + steering**: ``toward`` at +α* and ``away`` at −α*, beside the random directions'
  range under the same prompt.

Every figure is a mean over prompts with its 95% bootstrap CI (the sweep's curves). Where the
conditions file states the set's target (`valueprobe.steering.experiment.prompting.Goal`), the verdict compares
the behaviour's move toward the target, sign·(mean − plain α = 0), of steering at +α* with that of
prompting: one wins when its CI lies wholly beyond the other's (intervals of means, not of their
difference: a conservative rule), else they are not told apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from valueprobe.records import Record
from valueprobe.steering.experiment.dose import AXIS, Curve, Effect, SteerSweep
from valueprobe.steering.experiment.prompting import Goal

__all__ = ["Mean", "PromptBaseline", "baseline_table", "prompt_baseline"]


@dataclass(frozen=True)
class Mean:
    """A mean over prompts with its 95% bootstrap CI."""

    mean: float
    lo: float
    hi: float

    def signed(self, sign: int) -> tuple[float, float]:
        """The CI of sign × the mean, low end first."""
        a, b = sign * self.lo, sign * self.hi
        return (min(a, b), max(a, b))


def _at(curve: Curve | None, alpha: float) -> Mean | None:
    if curve is None or alpha not in curve.alphas:
        return None
    i = curve.alphas.index(alpha)
    return Mean(curve.means[i], curve.lo[i], curve.hi[i])


def _range(curve: Curve | None, alpha: float) -> tuple[float, float] | None:
    m = _at(curve, alpha)
    return None if m is None else (m.lo, m.hi)


@dataclass(frozen=True)
class PromptBaseline(Record):
    """One effect judged three ways (see the module doc). ``alpha`` is α*, in the sweep's unit;
    ``sign`` the target's (+1 / -1), None when the effect is not the set's stated target."""

    metric: str
    subset: str
    alpha: float
    sign: int | None
    plain: Mean
    steer_up: Mean
    steer_down: Mean
    null_up: tuple[float, float] | None
    null_down: tuple[float, float] | None
    toward: Mean | None
    away: Mean | None
    toward_up: Mean | None
    away_down: Mean | None
    null_toward_up: tuple[float, float] | None
    null_away_down: tuple[float, float] | None

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        # derived, written for the file's readers and not read back
        return {**d, "verdict": self.verdict, "steering_leaves_null": self.steering_leaves_null}

    @property
    def verdict(self) -> str:
        """Steering at +α* against prompting toward the behaviour, on the target's sign."""
        if self.sign is None or self.toward is None:
            return "-"
        base = self.sign * self.plain.mean
        s_lo, s_hi = (x - base for x in self.steer_up.signed(self.sign))
        p_lo, p_hi = (x - base for x in self.toward.signed(self.sign))
        if not all(math.isfinite(v) for v in (s_lo, s_hi, p_lo, p_hi)):
            return "no estimate"
        if s_lo > p_hi:
            return "steering beats asking"
        if p_lo > s_hi:
            return "asking beats steering"
        return "not told apart"

    @property
    def steering_leaves_null(self) -> bool | None:
        """Whether the axis at +α* lies outside the random directions' range there."""
        if self.null_up is None or not math.isfinite(self.steer_up.mean):
            return None
        return bool(self.steer_up.mean < self.null_up[0] or self.steer_up.mean > self.null_up[1])


def _alpha_star(e: Effect) -> float | None:
    """The largest strength the axis kept (the degenerate rule may drop some), with its negative."""
    kept = [a for a in e.curves[AXIS].alphas if a > 0 and -a in e.curves[AXIS].alphas]
    return max(kept) if kept else None


def _one(e: Effect, prompted: Mapping[str, Effect], target: Goal | None) -> PromptBaseline | None:
    alpha = _alpha_star(e)
    plain = _at(e.curves[AXIS], 0.0)
    if alpha is None or plain is None:
        return None
    up, down = _at(e.curves[AXIS], alpha), _at(e.curves[AXIS], -alpha)
    assert up is not None and down is not None
    toward, away = prompted.get("toward"), prompted.get("away")

    def curve(p: Effect | None, key: str) -> Curve | None:
        return None if p is None else p.curves.get(key)

    is_target = target is not None and (target.metric, target.subset) == (e.metric, e.subset)
    return PromptBaseline(
        metric=e.metric,
        subset=e.subset,
        alpha=alpha,
        sign=target.sign if is_target and target is not None else None,
        plain=plain,
        steer_up=up,
        steer_down=down,
        null_up=_range(e.curves.get("null"), alpha),
        null_down=_range(e.curves.get("null"), -alpha),
        toward=_at(curve(toward, AXIS), 0.0),
        away=_at(curve(away, AXIS), 0.0),
        toward_up=_at(curve(toward, AXIS), alpha),
        away_down=_at(curve(away, AXIS), -alpha),
        null_toward_up=_range(curve(toward, "null"), alpha),
        null_away_down=_range(curve(away, "null"), -alpha),
    )


def prompt_baseline(sweep: SteerSweep, target: Goal | None = None) -> tuple[PromptBaseline, ...]:
    """Steering, prompting and both for every effect of ``sweep`` (see the module doc).

    Args:
        sweep: a summarised sweep; without ``toward``/``away`` conditions the prompting columns are None.
        target: the set's stated target (`valueprobe.steering.experiment.prompting.read_target`); its effect
            gets a verdict.
    """
    out = []
    for e in sweep.effects:
        prompted = {
            c: p
            for c, effects in sweep.prompted.items()
            for p in effects
            if (p.metric, p.subset) == (e.metric, e.subset)
        }
        row = _one(e, prompted, target)
        if row is not None:
            out.append(row)
    return tuple(out)


def baseline_table(rows: tuple[PromptBaseline, ...], *, unit: str) -> tuple[list[str], list[list[object]]]:
    """Headers and rows: each figure as mean [CI], the null as [lo, hi]."""

    def m(x: Mean | None) -> str:
        return "-" if x is None else f"{x.mean:.3f} [{x.lo:.3f}, {x.hi:.3f}]"

    def r(x: tuple[float, float] | None) -> str:
        return "-" if x is None else f"[{x[0]:.3f}, {x[1]:.3f}]"

    headers = ["metric", "subset", "α*", "plain α=0", "steer +α*", "random +α*", "steer −α*", "random −α*",
               "prompt toward", "prompt away", "toward +α*", "away −α*", "verdict"]  # fmt: skip
    body: list[list[object]] = [
        [b.metric, b.subset, f"{b.alpha:g} {unit}", m(b.plain), m(b.steer_up), r(b.null_up), m(b.steer_down),
         r(b.null_down), m(b.toward), m(b.away), m(b.toward_up), m(b.away_down), b.verdict]
        for b in rows
    ]  # fmt: skip
    return headers, body
