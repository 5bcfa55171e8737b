"""Steering operators: what a steering hook does to the hidden state h at each cell it touches.

    >>> import valueprobe as vp
    >>> with vp.steer(lm, vp.SteeringSpec(axis, op="ablate"), 1.0):          # necessity: remove h·v̂
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)
    >>> clamp = vp.SteeringSpec(axis, op=Operator("clamp", lo=-1.0, hi=1.0))  # keep the score in [-1, 1] σ
    >>> with vp.steer(lm, clamp, 1.0):
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)

Per cell, with v̂ the steered unit direction, p = h·v̂, u the size of one unit of α (σ, 1 % of
the mean residual norm, or 1, times the axis's ``scale``: `valueprobe.probe.axis.ValueAxis.unit_size`),
and μ, σ the axis's mean and standard deviation of p at the steered layer (its reference set, so
the σ-score is (p − μ)/σ, as `valueprobe.probe.axis.ValueAxis.score` reads it):

    add        h + α·u·v̂
    ablate     h − α·p·v̂                              α = 1: h − (h·v̂)v̂, steering-vectors' ablation
    set        h + α·(μ + t·σ − p)·v̂                  α = 1: ablate, then add (μ + t·σ)·v̂: score = t
    clamp      h + α·(clip(p, μ + lo·σ, μ + hi·σ) − p)·v̂   α = 1: score held inside [lo, hi]
    add-norm   (h + α·u·v̂)·‖h‖ / ‖h + α·u·v̂‖           add, then rescale to ‖h‖ (repeng's normalize)

Each moves h by α times a size along v̂, computed by `valueprobe.hooks.addition.addition` (the one
function every route and engine adds with): the size is u for add and add-norm, the distance to
the operator's goal for ablate, set and clamp. α = 0 leaves a cell bit for bit under every
operator, so a sweep's α = 0 rows stay the baseline.

For ``ablate``, ``set`` and ``clamp`` α is unit-free: the share of the move the operator makes
(1 = exactly; a sweep ``--alphas 0,1`` compares off with on); ``t``, ``lo`` and ``hi`` are in σ and
ignore the axis's ``scale`` (as readouts do). Along ``-axis`` both v̂ and μ flip, so the scores and
bounds are those of ``-axis``. Along a random control direction the axis's μ and σ are used, as
the strengths are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.addition import addition
from valueprobe.vocab import Op, choice

__all__ = ["OPS", "Operator", "OperatorPoint", "as_operator"]

OPS: tuple[str, ...] = tuple(o.value for o in Op)


class OperatorPoint(Protocol):
    """What an operator needs of a steered point (`valueprobe.steering.hook.spec.SteerPoint` is one)."""

    @property
    def direction(self) -> Float[Tensor, " d_model"]: ...  # unit vector, float32

    def direction_on(self, device: torch.device) -> Float[Tensor, " d_model"]: ...  # kept there after

    @property
    def unit_size(self) -> float: ...

    @property
    def mu(self) -> float: ...  # mean projection at the point's axis layer

    @property
    def sigma(self) -> float: ...  # its standard deviation


def _ablate_goal(op: Operator, p: Tensor, t: OperatorPoint) -> Tensor:
    return torch.zeros_like(p)


def _set_goal(op: Operator, p: Tensor, t: OperatorPoint) -> Tensor:
    assert op.target is not None
    return torch.full_like(p, t.mu + op.target * t.sigma)


def _clamp_goal(op: Operator, p: Tensor, t: OperatorPoint) -> Tensor:
    lo = -math.inf if op.lo is None else t.mu + op.lo * t.sigma
    hi = math.inf if op.hi is None else t.mu + op.hi * t.sigma
    return p.clamp(lo, hi)


# The projection each moving operator sends p to (α = 1); add and add-norm move by α·u instead.
_GOALS: dict[Op, Callable[[Operator, Tensor, OperatorPoint], Tensor]] = {
    Op.ablate: _ablate_goal,
    Op.set: _set_goal,
    Op.clamp: _clamp_goal,
}
# which operator takes which option, for one-line refusals
_OPTIONS: dict[str, Op] = {"lo": Op.clamp, "hi": Op.clamp, "target": Op.set}


@dataclass(frozen=True)
class Operator:
    """One steering operator and its settings (see the module doc for each closed form).

    Args:
        op: ``add`` (default), ``ablate``, ``set``, ``clamp`` or ``add-norm``.
        lo, hi: the clamp's bounds in σ (either may be None: unbounded on that side); lo <= hi.
        target: the σ-score ``set`` moves to.

    >>> Operator("clamp", lo=-1.0, hi=1.0).needs_sigma
    True
    """

    op: Op = Op.add
    lo: float | None = None
    hi: float | None = None
    target: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", choice(Op, str(self.op), what="operator (--op)"))
        for name, owner in _OPTIONS.items():
            value = getattr(self, name)
            if value is not None and self.op != owner:
                raise ValueprobeError(f"--{name} goes with --op {owner.value}, not --op {self.op.value}")
            if value is not None and not math.isfinite(value):
                raise ValueprobeError(f"--{name} {value} is not a finite number of σ")
        if self.op == Op.set and self.target is None:
            raise ValueprobeError("--op set needs --target: the σ-score to move the projection to")
        if self.op == Op.clamp and self.lo is None and self.hi is None:
            raise ValueprobeError("--op clamp needs --lo and/or --hi: the bounds in σ")
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            raise ValueprobeError(
                f"--op clamp: the bound lo {self.lo:g} is above hi {self.hi:g}; give lo <= hi"
            )

    @property
    def needs_sigma(self) -> bool:
        """Whether the operator reads the axis's μ and σ (set, clamp)."""
        return self.op in (Op.set, Op.clamp)

    def describe(self) -> str:
        """Short text for records and messages, e.g. ``clamp[-1, 1]``."""
        if self.op == Op.set:
            return f"set[{self.target:g}]"
        if self.op == Op.clamp:
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            hi = "inf" if self.hi is None else f"{self.hi:g}"
            return f"clamp[{lo}, {hi}]"
        return self.op.value

    def __call__(
        self, h: Float[Tensor, "batch new d_model"], alpha: Float[Tensor, "batch new"], target: OperatorPoint
    ) -> Float[Tensor, "batch new d_model"]:
        """The operator applied at every cell with its α (callers keep α = 0 cells as they were)."""
        v = target.direction_on(h.device)  # copied to the device once per run, not per step
        if self.op in (Op.add, Op.add_norm):
            step = addition(alpha, target.unit_size, v)
            if self.op == Op.add:
                return h + step.to(h.dtype)
            x = h.float() + step
            ratio = h.float().norm(dim=-1, keepdim=True) / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
            return (x * ratio).to(h.dtype)
        p = h.float() @ v
        return h + addition(alpha, _GOALS[self.op](self, p, target) - p, v).to(h.dtype)


def as_operator(op: Operator | Op | str | None) -> Operator:
    """An `Operator` from itself, a name (``"ablate"``) or None (``add``)."""
    if isinstance(op, Operator):
        return op
    return Operator(Op.add if op is None else choice(Op, str(op), what="operator (--op)"))
