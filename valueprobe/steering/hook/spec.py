"""What to steer: one frozen value object says everything but α, the only per-row part.

    >>> spec = SteeringSpec(axis, layers=[18, 20], unit="norm", positions="generated")
    >>> with vp.steer(lm, spec, 2.0):                                   # α = +2 % of the mean norm
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)
    >>> gens = vp.generate(lm, spec, prompts, alphas=[-25, 0, 25])    # one α per row
    >>> SteeringSpec(probe="probes/smollm2-135m-value", op=Operator("ablate")).save("runs/ablate.json")
    valueprobe steer --spec runs/ablate.json --alphas 0,1 --prompts data/steer_code.jsonl --out runs/ablate

`vp.steer`, `vp.generate`, `vp.guide`, the α sweep, P(yes), the serve engines (hf and vllm) and
the vLLM plugin all take a spec; an axis (or a list of axes) where a spec is expected means
``SteeringSpec(axis)`` (`as_spec`). Every field but the axis has a default:

- ``axis`` / ``probe``: the value axis (``-axis``, ``2 * axis``, or a list of axes steered at once,
  each at its own strength), and the folder(s) it was read from. A spec read from JSON holds only
  the folder and reads the axis when first used.
- ``layers``: a layer spec (``20``, ``[18, 20]``, ``"18:22"``); default the read layer if one is
  set, else the first axis's best layer.
- ``site``: ``resid_pre``, ``resid_post``, ``attn_out`` or ``mlp_out``; default each axis's own.
- ``unit``: α's unit, ``sigma``, ``norm`` or ``raw`` (`valueprobe.probe.axis.ValueAxis.unit_size`).
- ``op``: the operator and its bounds (`valueprobe.steering.hook.operators.Operator`).
- ``positions``, ``window``: ``all`` (default), ``prompt`` or ``generated`` tokens, or a window
  ``(a, b)`` of generated tokens a <= i < b.
- ``condition``: fire only where a probe reads past a threshold (`condition.Condition`).
- ``read_layer``: where a value is read while generating (serving, guided decoding); default
  the first steered layer.
- ``direction``, ``direction_name``: steer along this vector instead of v̂ (a control), with
  the axis's statistics so strengths match, and the name results record for it.

The JSON form (`to_dict` / `from_dict`, `save` / `load`) is plain JSON with a ``format`` and a
``format_version``; it names each axis by its probe folder, as written (relative paths are read
from the working directory, like every ``--probe``), so an axis made by arithmetic is saved
(``(2 * a).save(path)``) before a spec names it. Unknown keys are refused in one line naming them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.files import write_json
from valueprobe.hooks.route import Point
from valueprobe.probe.axis import ValueAxis, check_combinable
from valueprobe.probe.registry import portable_name
from valueprobe.probe.units import in_units_of
from valueprobe.steering.hook.condition import Condition
from valueprobe.steering.hook.operators import Operator, as_operator
from valueprobe.steering.hook.spec_json import (
    FORMAT,
    FORMAT_VERSION,
    KEYS,
    PARSERS,
    WHERE,
    Where,
    bad,
    check_format,
    condition_dict,
    recorded_references,
)
from valueprobe.vocab import HookSite, LayerSelection, LayerSpec, Unit, choice, parse_layers

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "WHERE",
    "SteerPoint",
    "SteeringSpec",
    "Where",
    "as_spec",
    "check_phase",
]

Axes = ValueAxis | tuple[ValueAxis, ...]


@dataclass(frozen=True, eq=False)
class SteerPoint:
    """One place steering writes: the point, its unit direction, and the size of one unit of α there."""

    point: Point
    direction: Float[Tensor, " d_model"]  # unit vector, float32
    unit_size: float  # ValueAxis.unit_size: σ, mean_norm / 100 or 1, times axis.scale
    layer: int  # the axis layer this target reads its statistics from
    mu: float = math.nan  # the axis's mean projection at that layer (set and clamp read it)
    sigma: float = math.nan  # its σ there (NaN when uncalibrated: set and clamp refuse)
    _resident: dict[torch.device, Tensor] = field(default_factory=dict, init=False, repr=False)

    def direction_on(self, device: torch.device) -> Float[Tensor, " d_model"]:
        """``direction`` on ``device``, copied there the first time only (no host copy per step)."""
        copy = self._resident.get(device)
        if copy is None:
            copy = self._resident[device] = self.direction.to(device)
        return copy

    def score(self, axis: ValueAxis, h: Tensor) -> Tensor:
        """The projection of ``h`` on the axis at this layer, in σ (float32)."""
        return torch.as_tensor(axis.score(h.float(), self.layer))


def check_phase(where: str, window: tuple[int, int] | None, prompt_length: int | None = 0) -> None:
    """Refuse, in one line, positions and a window that do not make one phase (``prompt_length``
    None: the caller cannot say where the prompt ends, so only ``all`` works)."""
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


@dataclass(frozen=True, eq=False)
class SteeringSpec:
    """What to steer (see the module doc for each field): everything but α.

    >>> spec = SteeringSpec(axis, layers=20, op=Operator("clamp", lo=-1.0, hi=1.0))
    >>> SteeringSpec.from_dict(json.loads(json.dumps(spec_with_probe.to_dict()))) == spec_with_probe
    True
    """

    axis: Axes | None = None
    _: KW_ONLY
    probe: str | tuple[str, ...] | None = None
    layers: LayerSpec = None
    site: HookSite | None = None
    unit: Unit = Unit.sigma
    op: Operator = Operator()
    positions: Where = "all"
    window: tuple[int, int] | None = None
    condition: Condition | None = None
    read_layer: int | None = None
    direction: Float[Tensor, " d_model"] | None = field(default=None, repr=False)
    direction_name: str | None = None
    # what each axis's μ, σ and mean norm were measured over when the spec was written (its JSON's
    # ``sigma_reference``); None: take the axes as they are (`valueprobe.probe.units.in_units_of`)
    sigma_reference: tuple[str | None, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise once, here
        if self.axis is None and self.probe is None:
            raise ValueprobeError("a steering spec needs an axis, or the probe folder to read it from")
        if isinstance(self.axis, Sequence):
            put(self, "axis", tuple(self.axis))
        if self.probe is not None and not isinstance(self.probe, str):
            put(self, "probe", tuple(str(p) for p in self.probe))
        put(self, "layers", _layers(self.layers))
        put(
            self,
            "site",
            None if self.site is None else choice(HookSite, str(self.site), what="site (--site)"),
        )
        put(self, "unit", choice(Unit, str(self.unit), what="unit (--unit)"))
        put(self, "op", as_operator(self.op))
        if self.window is not None:
            put(self, "window", tuple(self.window))
        check_phase(self.positions, self.window)
        if self.direction is not None:
            put(self, "direction", torch.as_tensor(self.direction).detach().float().cpu())
            if self.direction.ndim != 1 or not bool(self.direction.norm() > 0):
                raise ValueprobeError("a steering direction must be one non-zero vector [d_model]")

    # ---- the axes and the layers ------------------------------------------------------------------

    def axes(self) -> tuple[ValueAxis, ...]:
        """The axes steered, in order (read from ``probe`` on first use when none was given)."""
        if self.axis is not None:
            return self.axis if isinstance(self.axis, tuple) else (self.axis,)
        loaded = self.__dict__.get("_loaded")
        if loaded is None:
            probes = (self.probe,) if isinstance(self.probe, str) else tuple(self.probe or ())
            recorded = self.sigma_reference or (None,) * len(probes)
            loaded = tuple(
                in_units_of(ValueAxis.load(p), r, where=f"the spec's probe {p}")
                for p, r in zip(probes, recorded, strict=True)
            )
            object.__setattr__(self, "_loaded", loaded)
        return loaded

    def first_axis(self) -> ValueAxis:
        """The first axis: its best layer, site and statistics are the defaults, and the values read."""
        return self.axes()[0]

    def steered_layers(self, n_layers: int) -> list[int]:
        """The steered blocks, 0-based, of a model with ``n_layers`` blocks."""
        if self.layers is None:
            return [self.read_layer if self.read_layer is not None else self.first_axis().best_layer]
        return parse_layers(self.layers, n_layers=n_layers)

    def read_at(self, n_layers: int) -> int:
        """The layer values are read at: ``read_layer``, else the first steered layer."""
        return self.steered_layers(n_layers)[0] if self.read_layer is None else self.read_layer

    def name(self) -> str:
        """What results record for the steered direction: ``direction_name``, else ``axis``."""
        return self.direction_name or "axis"

    def check(self) -> SteeringSpec:
        """Every check that needs no model (layers, unit statistics, the operator's σ, the read
        layer, the direction's width); one `ValueprobeError` line. Returns the spec with its axes
        read (a spec from JSON reads its probe here), so a command checks it before loading a
        model: ``spec = options.to_spec().check()``."""
        axes = self.axes()
        check_combinable(list(axes))
        if self.direction is not None and len(axes) > 1:
            raise ValueprobeError("a steering direction override takes one axis, not several")
        first = axes[0]
        if self.direction is not None and self.direction.shape != (first.d_model,):
            raise ValueprobeError(
                f"steering direction has shape {tuple(self.direction.shape)}, expected ({first.d_model},)"
            )
        known = self.known_layers()
        for axis in axes:
            for layer in known:
                axis.unit_size(layer, self.unit)
                if self.op.needs_sigma:
                    axis.sigma_at(layer)
        if self.read_layer is not None and self.read_layer not in first.layers:
            raise ValueprobeError(
                f"read layer {self.read_layer}: the axis has layers {list(first.layers)} (--read-layer)"
            )
        if self.axis is not None:
            return self
        # the axes read: specs made from this one (dataclasses.replace) keep them, not the folder
        return replace(self, axis=axes if len(axes) > 1 else first)

    def known_layers(self) -> list[int]:
        """The steered layers that are known without a model (None, or whole non-negative ints)."""
        if self.layers is None:
            return self.steered_layers(0)
        if isinstance(self.layers, tuple) and all(x >= 0 for x in self.layers):
            return list(self.layers)
        return []

    def points(self, lm: LoadedModel) -> list[SteerPoint]:
        """Where and how hard one unit of α pushes on ``lm``: one `SteerPoint` per (axis, layer), in
        axis order. Checks the axes against the model's width and each layer's statistics."""
        return self.points_for(n_layers=lm.n_layers, d_model=lm.d_model)

    def points_for(self, *, n_layers: int, d_model: int) -> list[SteerPoint]:
        """`points` for a model known by its depth and width (the vLLM workers' view)."""
        self.check()
        chosen = self.steered_layers(n_layers)
        return [p for axis in self.axes() for p in self._axis_points(axis, chosen, d_model)]

    def _axis_points(self, axis: ValueAxis, layers: list[int], d_model: int) -> list[SteerPoint]:
        if axis.d_model != d_model:
            raise ValueprobeError(
                f"the axis is for d_model {axis.d_model} but the model has {d_model}: "
                f"use a probe fitted on this architecture (the axis is from {axis.model_id})"
            )
        sizes = [axis.unit_size(layer, self.unit) for layer in layers]
        if self.op.needs_sigma:  # one clear line for an uncalibrated axis, before any hook
            for layer in layers:
                axis.sigma_at(layer)
        site = choice(HookSite, str(self.site or axis.site), what="site")
        out = []
        for layer, size in zip(layers, sizes, strict=True):
            v = axis.direction(layer) if self.direction is None else self.direction
            if v.shape != (d_model,):
                raise ValueprobeError(f"steering direction has shape {tuple(v.shape)}, expected ({d_model},)")
            v = v.detach().float().cpu()
            i = axis.layers.index(layer)
            mu, sigma = float(axis.mu[i]), float(axis.sigma[i])
            out.append(SteerPoint(Point(layer, site), v / v.norm(), size, layer, mu, sigma))
        return out

    # ---- equality, the JSON form and the file form ----------------------------------------------

    def _key(self) -> tuple:
        axes = () if self.probe is not None else tuple(id(a) for a in self.axes())
        direction = None if self.direction is None else tuple(self.direction.tolist())
        condition = None if self.condition is None else condition_dict(self.condition, check=False)
        return (
            self.probe, axes, self.layers, self.site, self.unit, self.op, self.positions, self.window,
            json.dumps(condition, sort_keys=True), self.read_layer, direction, self.direction_name,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SteeringSpec) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the module doc); the spec must know its probe folder(s)."""
        if self.probe is None:
            raise ValueprobeError(
                "a steering spec names its axis by its probe folder in JSON: build it with probe= "
                "(the folder the axis was read from)"
            )
        op = self.op
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            # a shipped axis by its name, not by the installed folder (another install moves it)
            "probe": portable_name(self.probe)
            if isinstance(self.probe, str)
            else [portable_name(p) for p in self.probe],
            "layers": list(self.layers) if isinstance(self.layers, tuple) else self.layers,
            "site": None if self.site is None else self.site.value,
            "unit": self.unit.value,
            "op": op.op.value,
            "lo": op.lo,
            "hi": op.hi,
            "target": op.target,
            "positions": self.positions,
            "window": None if self.window is None else list(self.window),
            "condition": None if self.condition is None else condition_dict(self.condition),
            "read_layer": self.read_layer,
            "direction": None if self.direction is None else self.direction.tolist(),
            "direction_name": self.direction_name,
            "sigma_reference": self._references(),
        }

    def _references(self) -> list[str | None]:
        """What each axis's σ was measured over, as written (null: its probe cannot be read now)."""
        try:
            return [str(a.sigma_reference) for a in self.axes()]
        except ValueprobeError:
            n = 1 if isinstance(self.probe, str) else len(self.probe or ())
            return [None] * n

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "steering spec") -> SteeringSpec:
        """The spec again from its JSON form, every field checked: one `ValueprobeError` naming
        ``where`` and the field (``runs/spec.json: layers: ...``)."""
        if not isinstance(d, Mapping):
            raise bad(where, "spec", f"expected a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - set(KEYS))
        if unknown:
            raise bad(where, unknown[0], f"unknown field: use {', '.join(KEYS)}")
        check_format(d, where)
        fields = {key: parse(d.get(key), where, key) for key, parse in PARSERS.items() if key in d}
        fields["sigma_reference"] = recorded_references(d, where)
        bounds = {k: fields.pop(k) for k in ("op", "lo", "hi", "target") if k in fields}
        try:
            op = Operator(**bounds)
        except ValueprobeError as exc:
            raise bad(where, "op", str(exc)) from None
        try:
            return cls(**fields, op=op)
        except ValueprobeError as exc:
            raise bad(where, "spec", str(exc)) from None

    def save(self, path: str | Path) -> Path:
        """Write the JSON form to ``path`` (atomically); ``valueprobe steer --spec`` reads it."""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> SteeringSpec:
        """A spec file (`save`, or another tool's) read and checked field by field."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueprobeError(
                f"--spec {path}: cannot read it ({exc.strerror}): give a spec JSON file"
            ) from None
        except ValueError as exc:
            raise ValueprobeError(f"--spec {path}: not JSON ({exc}): give a spec JSON file") from None
        return cls.from_dict(raw, where=str(path))


def _layers(layers: LayerSpec) -> LayerSpec:
    """A layer spec in one shape: None, a tuple of ints, or the text of ranges (``"18:22"``)."""
    if layers is None:
        return None
    selection = LayerSelection.parse(layers)  # syntax checked now, resolved on a model
    parts = selection.parts
    if parts is not None and all(isinstance(p, int) for p in parts):
        return tuple(p for p in parts if isinstance(p, int))
    return selection.text


def as_spec(spec: SteeringSpec | ValueAxis | Sequence[ValueAxis]) -> SteeringSpec:
    """A spec from itself, an axis or a list of axes (``SteeringSpec(axis)``: every default)."""
    if isinstance(spec, SteeringSpec):
        return spec
    if isinstance(spec, ValueAxis):
        return SteeringSpec(spec)
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return SteeringSpec(tuple(spec))
    raise ValueprobeError(f"expected a SteeringSpec or a ValueAxis, got {type(spec).__name__}")
