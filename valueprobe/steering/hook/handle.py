"""Steer along an axis: add α·v̂ to the residual stream, on prompt, generated or all tokens.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m"); axis = vp.ValueAxis.load("probes/value-smollm2", lm=lm)
    >>> with vp.steer(lm, axis, 2.0):                     # +2 σ at the axis's own layer and site
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)
    >>> gens = vp.generate(lm, axis, ["Is 7 prime?"], alphas=[-2, 0, 2], samples=2, max_new_tokens=48)

Strength units (`valueprobe.vocab.Unit`): ``sigma`` moves the projection on the axis by exactly
α σ of its reference set (adds α·σ·v̂); ``norm`` adds α % of the layer's mean residual norm
(the paper's unit: α = 25 is 8.4% on Qwen3-8B's layer 21 in their table); ``raw`` adds α·v̂.
``k * axis`` multiplies every strength by k.

Exactness: the addition runs in a hook on the decoder block at every forward, and under the KV
cache a forward carries only the new columns (`valueprobe.hooks.route.Step`), so each position gets
one addition once, the prompt pass included (which is what steers the first generated token).
Pad cells are never touched, and cells with α = 0 are passed through bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.route import Handle, Point, Recording, Step, intervene, record
from valueprobe.probe.axis import ValueAxis, check_combinable
from valueprobe.steering.hook.condition import Condition, Gate
from valueprobe.steering.hook.operators import Operator, as_operator
from valueprobe.vocab import HookSite, LayerSpec, Site, Unit, choice, parse_layers

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = [
    "Attach",
    "SteerPoint",
    "Steering",
    "check_phase",
    "check_unit",
    "steer",
    "steer_plan",
    "steer_points",
]

Where = Literal["prompt", "generated", "all"]
WHERE: tuple[str, ...] = ("prompt", "generated", "all")


@dataclass(frozen=True)
class SteerPoint:
    """One place steering writes: the point, its unit direction, and the size of one unit of α there."""

    point: Point
    direction: Float[Tensor, " d_model"]  # unit vector, float32
    unit_size: float  # σ, mean_norm / 100 or 1, times axis.scale
    layer: int  # the axis layer this target reads its statistics from
    mu: float = math.nan  # the axis's mean projection at that layer (set and clamp read it)
    sigma: float = math.nan  # its σ there (NaN when uncalibrated: set and clamp refuse)

    def score(self, axis: ValueAxis, h: Tensor) -> Tensor:
        """The projection of ``h`` on the axis at this layer, in σ (float32)."""
        return torch.as_tensor(axis.score(h.float(), self.layer))


# unit -> (the axis statistic one unit is a fraction of, its name in errors, that fraction, the fix)
_UNIT_STATS: dict[Unit, tuple[str, str, float, str]] = {
    Unit.sigma: ("sigma", "σ", 1.0, "calibrate it with valueprobe.probe.fit.calibrate or use --unit raw"),
    Unit.norm: (
        "mean_norm",
        "mean residual norm",
        0.01,
        "refit the probe with norm statistics or use --unit sigma",
    ),
}


def check_unit(axis: ValueAxis, layer: int, unit: Unit | str) -> float:
    """The size of one unit of α at ``layer``: the one check of σ / %-norm units.

    Raises one clear `ValueprobeError` when the axis lacks the layer or the statistics the unit
    needs. Needs no model, so the CLI (``steer``, ``trace``) runs it before one loads.

    >>> size = check_unit(axis, axis.best_layer, "norm")   # 1 % of that layer's mean residual norm
    """
    unit = Unit(unit)
    if layer not in axis.layers:
        raise ValueprobeError(
            f"the axis has no layer {layer}: pick one of its layers {list(axis.layers)} (--layer)"
        )
    if unit == Unit.raw:
        return float(axis.scale)
    stat, name, fraction, fix = _UNIT_STATS[unit]
    value = float(getattr(axis, stat)[axis.layers.index(layer)])
    if not (math.isfinite(value) and value > 0):
        raise ValueprobeError(f"axis layer {layer} has no {name} statistics for --unit {unit.value}: {fix}")
    return value * fraction * float(axis.scale)


def steer_points(
    lm: LoadedModel,
    axis: ValueAxis,
    *,
    layers: LayerSpec = None,
    site: HookSite | Site | str | None = None,
    unit: Unit | str = Unit.sigma,
    direction: Float[Tensor, " d_model"] | None = None,
    op: Operator | str | None = None,
) -> list[SteerPoint]:
    """Resolve where and how hard one unit of α pushes: one `SteerPoint` per steered layer.

    Args:
        lm: the model (its width and depth are checked against the axis).
        axis: gives the direction, σ and mean norms; layers default to its best layer.
        layers: any layers the axis has (``"18:22"``, ``[12, 21]``...).
        site: ``resid_pre``, ``resid_post``, ``attn_out`` or ``mlp_out`` (the block's attention or MLP
            output, along the axis's residual direction and with its statistics); default the
            axis's own site.
        unit: ``sigma``, ``norm`` or ``raw`` (see the module doc).
        direction: steer along this vector instead of v̂ (normalized; e.g. a random control),
            keeping the axis's layer statistics so strengths match.
        op: the operator the points serve; ``set`` and ``clamp`` need the axis's σ at each layer.
    """
    if axis.d_model != lm.d_model:
        raise ValueprobeError(
            f"the axis is for d_model {axis.d_model} but the model has {lm.d_model}: "
            f"use a probe fitted on this architecture (the axis is from {axis.model_id})"
        )
    unit = Unit(unit)
    operator = as_operator(op)
    chosen = [axis.best_layer] if layers is None else parse_layers(layers, n_layers=lm.n_layers)
    sizes = [check_unit(axis, layer, unit) for layer in chosen]
    if operator.needs_sigma:  # one clear line for an uncalibrated axis, before any hook
        for layer in chosen:
            axis.sigma_at(layer)
    point_site = choice(HookSite, str(site or axis.site), what="site")
    out = []
    for layer, size in zip(chosen, sizes, strict=True):
        v = axis.direction(layer) if direction is None else direction
        if v.shape != (lm.d_model,):
            raise ValueprobeError(f"steering direction has shape {tuple(v.shape)}, expected ({lm.d_model},)")
        v = v.detach().float().cpu()
        i = axis.layers.index(layer)
        mu, sigma = float(axis.mu[i]), float(axis.sigma[i])
        out.append(SteerPoint(Point(layer, point_site), v / v.norm(), size, layer, mu, sigma))
    return out


def check_phase(where: str, window: tuple[int, int] | None, prompt_length: int | None) -> None:
    """Refuse, in one line, positions and a window that do not make one phase."""
    if where not in WHERE:
        raise ValueprobeError(f"unknown positions {where!r}: use one of {', '.join(WHERE)}")
    if window is not None:
        a, b = window
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b):
            raise ValueprobeError(f"window {list(window)} must be whole generated-token indices 0 <= a < b")
        if where == "prompt":
            raise ValueprobeError("a window holds generated tokens: it cannot go with positions='prompt'")
    if (where != "all" or window is not None) and prompt_length is None:
        raise ValueprobeError("positions other than 'all' need prompt_length (the padded prompt width)")


def steer_plan(
    lm: LoadedModel,
    axes: ValueAxis | Sequence[ValueAxis],
    *,
    layers: LayerSpec = None,
    site: HookSite | Site | str | None = None,
    unit: Unit | str = Unit.sigma,
    direction: Float[Tensor, " d_model"] | None = None,
    op: Operator | str | None = None,
) -> tuple[ValueAxis, list[SteerPoint]]:
    """The first axis and the points of every axis, in order: `steer_points` of each.

    Several axes steer together, each with its own strength: its ``scale`` (``2 * a``, ``-b``)
    times the row's α. They must share d_model and architecture (`check_combinable`), and a
    ``direction`` override takes one axis only.
    """
    listed = [axes] if isinstance(axes, ValueAxis) else list(axes)
    if not listed:
        raise ValueprobeError("no axis to steer along: give one axis or a list of axes")
    check_combinable(listed)
    if direction is not None and len(listed) > 1:
        raise ValueprobeError("a steering direction override takes one axis, not several")
    points = [
        t
        for axis in listed
        for t in steer_points(lm, axis, layers=layers, site=site, unit=unit, direction=direction, op=op)
    ]
    return listed[0], points


# What a steering hook asks for α: (target, pre-intervention hidden state, step, cells it may touch)
AlphaSource = Callable[[SteerPoint, Tensor, Step, Tensor], Float[Tensor, "batch new"]]


class Steering(Handle):
    """The handle `steer` returns: hooks that add α·v̂; ``.alpha`` may be changed between calls.

    Attributes:
        alpha: ``[batch]`` strengths in the chosen unit (a scalar broadcasts).
        prompt_length: the (padded) prompt width; columns at or past it are generated tokens.
        reads: with ``trace=True``, per target point, one ``[batch, new]`` σ-score per forward of
            the residual *before* the addition.
        read_layers: also record the σ-score of the residual (resid_post, after any steering
            upstream) at these layers at every forward; `traced` returns them with ``reads``.
        window: ``(a, b)``: steer only generated tokens a <= i < b (i = 0 is the first generated
            token, at column ``prompt_length``); see `cells`.
        condition: fire only where a probe reads past a threshold (`valueprobe.steering.hook.condition`).
    """

    def __init__(
        self,
        lm: LoadedModel,
        axis: ValueAxis,
        points: Sequence[SteerPoint],
        *,
        alpha: float | Tensor,
        where: Where,
        prompt_length: int | None,
        trace: bool,
        source: AlphaSource | None = None,
        read_layers: Sequence[int] = (),
        op: Operator | str | None = None,
        window: tuple[int, int] | None = None,
        condition: Condition | None = None,
    ) -> None:
        super().__init__()
        check_phase(where, window, prompt_length)
        self.window = None if window is None else (int(window[0]), int(window[1]))
        self.condition = condition
        self.gates = [None if condition is None else condition.gate(axis, t.layer) for t in points]
        self.axis = axis
        self.op = as_operator(op)
        self.points = list(points)
        self.alpha = torch.as_tensor(alpha, dtype=torch.float32).reshape(-1)
        self.where = where
        self.prompt_length = prompt_length
        self.trace = trace
        self.source = source
        self.reads: dict[Point, list[Tensor]] = {t.point: [] for t in self.points}
        self.applied: dict[Point, list[Tensor]] = {t.point: [] for t in self.points}
        self.recordings: dict[Point, Recording] = {}
        try:
            # hooks on one point run newest first: register in reverse, so the points act in order
            for t, gate in reversed(list(zip(self.points, self.gates, strict=True))):
                self.join(intervene(lm, t.point, self._hook(t, gate)))
            for layer in dict.fromkeys(read_layers):
                p = Point(layer, Site.resid_post)
                self.recordings[p] = record(lm, [p], reduce=partial(_score, axis, layer))
                self.join(self.recordings[p])
        except BaseException:
            self.remove()
            raise

    def traced(self) -> tuple[dict[Point, list[Tensor]], list[Tensor]]:
        """Per point, one ``[batch, new]`` σ-score per forward (the first steered point before its
        addition, then each read layer); and the α applied at the first steered point."""
        main = self.points[0].point
        values = {main: self.reads[main]} | {p: r.values[p] for p, r in self.recordings.items()}
        return values, self.applied[main]

    def cells(self, step: Step) -> Bool[Tensor, "batch new"]:
        """The cells of this forward steering may touch: not padding, and in the chosen phase:
        every column (``all``), prompt columns (< ``prompt_length``), generated ones (>= it), or the
        generated tokens ``a <= column − prompt_length < b`` of a ``window``."""
        ok = ~step.pad
        if self.where == "all" and self.window is None:
            return ok
        assert self.prompt_length is not None
        generated = step.columns() - self.prompt_length  # < 0 in the prompt
        if self.window is not None:
            keep = (generated >= self.window[0]) & (generated < self.window[1])
        else:
            keep = generated < 0 if self.where == "prompt" else generated >= 0
        return ok & keep[None, :]

    def _hook(self, target: SteerPoint, gate: Gate | None) -> Callable[[Tensor, Step], Tensor | None]:
        def fn(h: Tensor, step: Step) -> Tensor | None:
            cells = self.cells(step)
            if gate is not None:
                cells = cells & gate(h, step).to(cells.device)
            if self.trace and target is self.points[0]:
                self.reads[target.point].append(target.score(self.axis, h.detach()).cpu())
            if self.source is not None:
                alpha = self.source(target, h, step, cells).to(h.device)
            else:
                a = self.alpha.to(h.device)
                if a.numel() not in (1, h.shape[0]):
                    raise ValueprobeError(f"alpha has {a.numel()} values for a batch of {h.shape[0]} rows")
                alpha = a.reshape(-1, 1).expand(h.shape[0], h.shape[1])
            alpha = torch.where(cells, alpha, torch.zeros_like(alpha))
            if self.trace:
                self.applied[target.point].append(alpha.detach().cpu())
            touch = alpha != 0
            if not bool(touch.any()):
                return None
            return torch.where(touch[..., None], self.op(h, alpha, target), h)

        return fn

    def __enter__(self) -> Steering:
        return self


def _score(axis: ValueAxis, layer: int, h: Tensor) -> Tensor:
    return torch.as_tensor(axis.score(h.float(), layer)).cpu()


class Attach:
    """A `valueprobe.hooks.decode.Decode` ``hooks`` factory that keeps the `Steering` it attached,
    so the caller reads its traces after the route has run and removed it."""

    def __init__(self, make: Callable[[], Steering]) -> None:
        self.make = make
        self.handle: Steering | None = None

    def __call__(self) -> Steering:
        self.handle = self.make()
        return self.handle


def steer(
    lm: LoadedModel,
    axis: ValueAxis | Sequence[ValueAxis],
    alpha: float | Float[Tensor, " batch"] = 1.0,
    *,
    layers: LayerSpec = None,
    site: HookSite | Site | str | None = None,
    positions: Where = "all",
    unit: Unit | str = Unit.sigma,
    prompt_length: int | None = None,
    direction: Float[Tensor, " d_model"] | None = None,
    trace: bool = False,
    op: Operator | str | None = None,
    window: tuple[int, int] | None = None,
    condition: Condition | None = None,
) -> Steering:
    """Add α·v̂ at every forward until removed: a handle and a context manager.

    Args:
        lm: the loaded model.
        axis: the value axis (``ValueAxis.load``); ``-axis`` steers the other way; a list of axes
            steers along each at once, each with its own strength (``[2 * a, -b]``: 2α along a,
            α along -b), each operator in list order at a shared point.
        alpha: one strength, or one per batch row (``[batch]``), in ``unit``.
        layers: default the axis's best layer; any layers the axis has.
        site: default the axis's site; ``attn_out`` / ``mlp_out`` steer the block's attention / MLP
            output (refused in one line for a family whose blocks name no such submodule).
        positions: ``all`` (the paper's choice), ``prompt`` or ``generated`` (columns at or past
            ``prompt_length``, the padded prompt width of the batch).
        window: ``(a, b)``: only generated tokens a <= i < b (i = 0 at column ``prompt_length``).
        condition: fire only where a probe reads past a threshold (`valueprobe.steering.hook.condition`).
        unit: ``sigma`` (default), ``norm`` (% of mean residual norm) or ``raw``.
        direction: steer along another vector with the axis's statistics (random controls).
        trace: keep the σ-score of the residual before the addition at each forward.
        op: the operator (`valueprobe.steering.hook.operators`): ``add`` (default), ``ablate``, ``set``,
            ``clamp``, ``add-norm``, or an `Operator` with its bounds or target.

    >>> with steer(lm, axis, torch.tensor([-2.0, 0.0, 2.0]), positions="generated", prompt_length=ids.shape[1]):
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=20)
    """
    first, points = steer_plan(lm, axis, layers=layers, site=site, unit=unit, direction=direction, op=op)
    return Steering(
        lm,
        first,
        points,
        alpha=alpha,
        where=positions,
        prompt_length=prompt_length,
        trace=trace,
        op=op,
        window=window,
        condition=condition,
    )
