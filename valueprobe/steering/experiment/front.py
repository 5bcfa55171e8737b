"""The effect-vs-KL front: how much a direction moves the target for what it costs the model.

    valueprobe replicate steer --out probes/steering-smollm2-135m       # front.html, one panel per target

    >>> front = effect_front(rows, side.metric("kl"), target)    # rows: a sweep's generations
    >>> front.useful                                              # the α that count, maybe none

Each steered direction at each α is a point: x is the KL of the next-token distribution from the
unsteered model's on neutral text (`valueprobe.steering.experiment.side_effects`), y the target's move,
sign·(mean at α − mean at α = 0) over the plain prompt's prompts (each prompt weighs the same), so
up is toward the stated target. The random directions' **front** is their best move at any KL up to
x (the upper envelope of their points). An α of the axis counts as **useful** only where its move
leaves that null at a KL the random directions also reach: KL(α) ≤ the random directions' largest KL,
and its move above their front there. At a KL no random direction reaches, the axis is not judged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from valueprobe.errors import ValueprobeError
from valueprobe.records import Record
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX, SweepRow
from valueprobe.steering.experiment.prompting import NONE, Goal
from valueprobe.steering.experiment.side_effects import SideMetric

__all__ = ["Front", "FrontPoint", "direction_means", "effect_front", "envelope"]


@dataclass(frozen=True)
class FrontPoint:
    """One (direction, α): its KL from the unsteered model and the target's signed move."""

    direction: str
    alpha: float
    kl: float
    effect: float


def direction_means(
    rows: Sequence[SweepRow], metric: str, subset: str, *, condition: str = NONE
) -> dict[str, dict[float, float]]:
    """direction -> α -> the metric's mean over prompts (a prompt's rows averaged first), over the
    rows where it applies, on ``subset`` (``all``: every group)."""
    sums: dict[tuple[str, float, str], list[float]] = {}
    for r in rows:
        value = r.metrics.get(metric)
        if r.condition != condition or value is None or (subset != "all" and r.group != subset):
            continue
        sums.setdefault((r.direction, r.alpha, r.prompt_id), []).append(float(value))
    per: dict[tuple[str, float], list[float]] = {}
    for (d, a, _), vals in sums.items():
        per.setdefault((d, a), []).append(float(np.mean(vals)))
    out: dict[str, dict[float, float]] = {}
    for (d, a), vals in per.items():
        out.setdefault(d, {})[a] = float(np.mean(vals))
    return out


def envelope(points: Sequence[FrontPoint], kl: float) -> float:
    """The best move among ``points`` at KL at most ``kl`` (-inf when none is that cheap)."""
    moves = [p.effect for p in points if p.kl <= kl and math.isfinite(p.effect)]
    return max(moves) if moves else -math.inf


@dataclass(frozen=True)
class Front(Record):
    """The axis's points and the random directions' points for one target, and the α that count."""

    metric: str
    subset: str
    sign: int
    axis: tuple[FrontPoint, ...]
    random: tuple[FrontPoint, ...]

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        # derived, written for the file's readers and not read back
        return {**d, "useful_alphas": list(self.useful), "max_random_kl": self.max_random_kl}

    @property
    def max_random_kl(self) -> float:
        kls = [p.kl for p in self.random if math.isfinite(p.kl)]
        return max(kls) if kls else -math.inf

    def beyond(self, p: FrontPoint) -> bool:
        """Whether an axis point leaves the random front at a KL the random directions reach."""
        return p.alpha != 0 and p.kl <= self.max_random_kl and p.effect > envelope(self.random, p.kl)

    @property
    def useful(self) -> tuple[float, ...]:
        return tuple(p.alpha for p in self.axis if self.beyond(p))

    def random_front(self) -> list[tuple[float, float]]:
        """The random directions' front as (KL, best move) steps, KL rising."""
        steps: list[tuple[float, float]] = []
        for p in sorted(self.random, key=lambda q: q.kl):
            best = envelope(self.random, p.kl)
            if not steps or best > steps[-1][1]:
                steps.append((p.kl, best))
        return steps

    def table(self) -> tuple[list[str], list[list[object]]]:
        headers = [
            "α",
            "KL (nats/token)",
            "move toward target",
            "random front at that KL",
            "random reach this KL",
            "useful",
        ]
        rows: list[list[object]] = [
            [f"{p.alpha:g}", p.kl, p.effect, envelope(self.random, p.kl), "yes" if p.kl <= self.max_random_kl else "no",
             "yes" if self.beyond(p) else "no"]
            for p in self.axis
        ]  # fmt: skip
        return headers, rows


def effect_front(rows: Sequence[SweepRow], kl: SideMetric, target: Goal) -> Front:
    """The front of ``target`` from a sweep's rows and the KL each (direction, α) costs.

    Raises one line when the rows hold no α = 0 for the axis (no baseline to move from).
    """
    means = direction_means(rows, target.metric, target.subset)
    if AXIS not in means or 0.0 not in means[AXIS]:
        raise ValueprobeError(
            f"the sweep has no α = 0 row of the axis for {target.metric} on {target.subset}: add 0 to --alphas"
        )
    base = means[AXIS][0.0]  # α = 0 is the same model whichever direction
    points: dict[str, list[FrontPoint]] = {}
    for d, by_alpha in means.items():
        if d not in kl.values:
            continue
        for i, a in enumerate(kl.alphas):
            if a in by_alpha:
                move = target.sign * (by_alpha[a] - base)
                points.setdefault(d, []).append(FrontPoint(d, a, kl.values[d][i], move))
    random = tuple(p for d, ps in points.items() if d.startswith(RANDOM_PREFIX) for p in ps)
    return Front(target.metric, target.subset, target.sign, tuple(points.get(AXIS, ())), random)
