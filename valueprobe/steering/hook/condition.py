"""Conditional steering: fire the operator only where a probe reads above or below a threshold.

    >>> import valueprobe as vp
    >>> fit = find_threshold(scores, labels)                 # on labelled data: threshold and side by F1
    >>> cond = Condition(fit.threshold, when=fit.when, latch=True)
    >>> with vp.steer(lm, vp.SteeringSpec(axis, condition=cond), 2.0):   # from the first crossing on
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)

The reading is the σ-score (h·v̂ − μ)/σ of the condition's axis (default: the steered axis) at the
steered point's layer, of the hidden state the operator receives there (before it acts), at every
real cell of every forward: prompt cells included, pads never. ``above`` fires where the score is
> threshold, ``below`` where it is < threshold. Per token (``latch=False``) a cell fires when it
crosses; latched, a row fires at its first crossing cell and every later cell (the latch starts over
when a forward starts a new sequence, KV-cache offset 0). The operator still only touches the cells
its phase allows (`valueprobe.steering.hook.handle.Steering.cells`). Exact under the KV cache: the score
at a point depends only on the blocks before it, which the operator does not change.

The threshold search follows CAST (Lee et al. 2024, "Programming Refusal with Conditional
Activation Steering", ``find_best_condition_point``): on labelled examples' scores, the threshold and
side whose gate best predicts label 1 by F1; `find_condition_point` also picks the layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from jaxtyping import Bool, Float
from numpy.typing import ArrayLike
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.resident import Scorer

if TYPE_CHECKING:
    from valueprobe.hooks.route import Step

__all__ = [
    "Condition",
    "Gate",
    "ThresholdFit",
    "evaluate_condition",
    "find_condition_point",
    "find_threshold",
]

When = Literal["above", "below"]
WHEN: tuple[When, ...] = ("above", "below")


@dataclass(frozen=True, eq=False)
class Condition:
    """Where steering fires: the score (σ) of ``axis`` above or below ``threshold``, per token or latched.

    Args:
        threshold: in σ of the condition axis at the steered layer.
        when: ``above`` (score > threshold) or ``below`` (score < threshold).
        latch: fire from a row's first crossing on, not only at crossing cells.
        axis: the probe read; default the steered axis (it needs the steered layer and σ there).
        probe: the folder of ``axis``; with no ``axis``, the axis is read from it when the gate is made.
    """

    threshold: float
    when: When = "above"
    latch: bool = False
    axis: ValueAxis | None = None
    probe: str | None = None  # the folder ``axis`` is read from (the spec's JSON names it)

    def __post_init__(self) -> None:
        if self.when not in WHEN:
            raise ValueprobeError(f"unknown condition side {self.when!r}: use above or below")
        if not math.isfinite(self.threshold):
            raise ValueprobeError(f"condition threshold {self.threshold} is not a finite number of σ")

    def gate(self, steered: ValueAxis, layer: int) -> Gate:
        """The per-run gate at one steered layer (checks the axis has that layer and its σ)."""
        axis = (
            self.axis
            if self.axis is not None
            else steered
            if self.probe is None
            else ValueAxis.load(self.probe)
        )
        if axis.d_model != steered.d_model:
            raise ValueprobeError(
                f"the condition's axis has d_model {axis.d_model} but the steered axis {steered.d_model}"
            )
        axis.sigma_at(layer)
        return Gate(self, axis, layer)


class Gate:
    """One condition's state over a run at one steered point: which rows have latched."""

    def __init__(self, condition: Condition, axis: ValueAxis, layer: int) -> None:
        self.condition = condition
        self.axis = axis
        self.layer = layer
        self.latched: Tensor | None = None
        self.scorer = Scorer(axis, layer)

    def __call__(self, h: Float[Tensor, "batch new d_model"], step: Step) -> Bool[Tensor, "batch new"]:
        """The cells of this forward where the condition holds (never a pad cell)."""
        score = self.scorer(h.detach())  # no host read or copy per step
        c = self.condition
        hit = (score > c.threshold if c.when == "above" else score < c.threshold) & ~step.pad
        if not c.latch:
            return hit
        if self.latched is None or self.latched.shape[0] != hit.shape[0]:
            self.latched = torch.zeros(hit.shape[0], dtype=torch.bool, device=hit.device)
        # a forward at offset 0 starts a new sequence; the offset may be a device tensor (a static
        # cache), so the latch is cleared by arithmetic, not by a branch that would read it on the host
        latched = self.latched & (step.offset != 0)
        run = (hit.cumsum(dim=1) > 0) | latched[:, None]
        self.latched = run[:, -1].contiguous()  # one stride whatever the forward's width: one graph
        return run


@dataclass(frozen=True)
class ThresholdFit:
    """A condition's quality on labelled examples: the gate ``score <when> threshold`` as a
    predictor of label 1. ``layer`` is set by `find_condition_point`."""

    threshold: float
    when: When
    f1: float
    precision: float
    recall: float
    fired: int  # examples the gate fires on
    layer: int | None = None

    def condition(self, *, latch: bool = False, axis: ValueAxis | None = None) -> Condition:
        """The `Condition` this threshold and side make."""
        return Condition(self.threshold, when=self.when, latch=latch, axis=axis)


def _check(scores: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel() >= 0.5
    if s.size == 0 or s.size != y.size:
        raise ValueprobeError(
            f"threshold search: {s.size} scores but {y.size} labels (need as many, at least one)"
        )
    if not np.isfinite(s).all():
        raise ValueprobeError("threshold search: a score is not finite")
    if not y.any():
        raise ValueprobeError("threshold search: no example has label 1, so F1 is undefined")
    return s, y


def _scores_f1(s: np.ndarray, y: np.ndarray, thresholds: np.ndarray, when: str) -> np.ndarray:
    """``[thresholds, 3]``: F1, precision and recall of each gate (0 where it fires on nothing)."""
    fire = s[:, None] > thresholds[None, :] if when == "above" else s[:, None] < thresholds[None, :]
    tp = (fire & y[:, None]).sum(0).astype(np.float64)
    n_fire = fire.sum(0).astype(np.float64)
    f1 = 2 * tp / (n_fire + y.sum())
    precision = np.divide(tp, n_fire, out=np.zeros_like(tp), where=n_fire > 0)
    return np.stack([f1, precision, tp / y.sum(), n_fire], axis=1)


def find_threshold(scores: ArrayLike, labels: ArrayLike, *, layer: int | None = None) -> ThresholdFit:
    """The threshold (σ) and side whose gate best predicts label 1 on labelled examples, by F1.

    Candidates are the midpoints between consecutive distinct scores, on both sides; ties go to
    ``above``, then to the lower threshold.

    Args:
        scores: one σ-score per example (e.g. ``axis.score`` of its mean residual).
        labels: 1 (or >= 0.5) where the condition should hold.
        layer: recorded in the result.

    >>> find_threshold([-1.0, -0.5, 0.7, 1.2], [0, 0, 1, 1])
    ThresholdFit(threshold=0.1, when='above', f1=1.0, precision=1.0, recall=1.0, fired=2, layer=None)
    """
    s, y = _check(scores, labels)
    distinct = np.unique(s)
    if distinct.size < 2:
        raise ValueprobeError(
            f"threshold search: every score is {distinct[0]:g}; no threshold separates them"
        )
    candidates = (distinct[:-1] + distinct[1:]) / 2
    best: ThresholdFit | None = None
    for when in WHEN:
        table = _scores_f1(s, y, candidates, when)
        i = int(np.argmax(table[:, 0]))
        f1, precision, recall, fired = (float(x) for x in table[i])
        if best is None or f1 > best.f1:
            best = ThresholdFit(float(candidates[i]), when, f1, precision, recall, int(fired), layer)
    assert best is not None
    return best


def find_condition_point(scores_by_layer: Mapping[int, ArrayLike], labels: ArrayLike) -> ThresholdFit:
    """`find_threshold` at each layer; the layer (then threshold and side) with the best F1.

    >>> fit = find_condition_point({layer: axis.score(h[layer], layer) for layer in axis.layers}, labels)
    """
    if not scores_by_layer:
        raise ValueprobeError("threshold search: no layer's scores given")
    fits = [find_threshold(scores, labels, layer=layer) for layer, scores in scores_by_layer.items()]
    return max(fits, key=lambda f: f.f1)  # max keeps the first of equals: the earliest layer given


def evaluate_condition(scores: ArrayLike, labels: ArrayLike, condition: Condition) -> ThresholdFit:
    """F1, precision and recall of a given condition on labelled examples.

    Raises one clear `ValueprobeError` when no example crosses the threshold, showing the range.
    """
    s, y = _check(scores, labels)
    f1, precision, recall, fired = (
        float(x) for x in _scores_f1(s, y, np.array([condition.threshold]), condition.when)[0]
    )
    if fired == 0:
        raise ValueprobeError(
            f"threshold {condition.threshold:g} σ: no example reads {condition.when} it (the scores range"
            f" from {s.min():.3g} to {s.max():.3g}); pick a threshold inside that range"
        )
    return ThresholdFit(condition.threshold, condition.when, f1, precision, recall, int(fired))
