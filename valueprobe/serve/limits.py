"""What every request's steering is checked against, and what ``/v1/models`` says of the probe.

    >>> limits = Limits("smollm2-135m", SteeringSpec(probe="smollm2-135m-value"), max_alpha=8)
    >>> limits.alpha_cap(20, "sigma")                           # 8.0: |α| beyond it is a 400
    >>> random_spec(7, limits.spec).direction_name              # 'random-7'

A request's ``steering`` is ``{"alpha": 2, "unit": "sigma", "layer": 20, "positions": "all",
"window": [0, 8], "random": 7}``, all but ``alpha`` optional: the rest default to the server's
steering spec (``serve --spec``, else the probe's best layer in σ on every position). ``random``
steers along random unit direction number ``random`` (`valueprobe.stats.null.random_directions`,
by seed) with the axis's unit sizes, so the addition has the axis's norm: the null beside every
steered reading, drawn by the client (the workbench draws one per session) and named
``random-<seed>`` in the response. |α| is capped (`Limits.alpha_cap`): a push beyond the cap is a
400 naming it. `valueprobe.serve.protocol.parse_steering` reads the field with these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from valueprobe.errors import ValueprobeError
from valueprobe.serve.errors import RequestError
from valueprobe.stats.null import random_directions
from valueprobe.steering.decode.reading import VALUE_AT
from valueprobe.steering.hook.spec import SteeringSpec, check_phase

__all__ = [
    "ALPHA_RULE",
    "NORM_MULTIPLE",
    "STEERING_KEYS",
    "UNITS",
    "Limits",
    "check_layer",
    "probe_card",
    "random_spec",
    "served_layer",
    "steering_window",
]

UNITS = ("sigma", "norm")
STEERING_KEYS = ("alpha", "unit", "layer", "positions", "window", "random")
NORM_MULTIPLE = 1.0
ALPHA_RULE = (
    f"|alpha| * unit size <= {NORM_MULTIPLE:g} x the layer's mean residual norm (the probe's mean_norm):"
    " no addition larger than the residual it is added to"
)
VALUE_MEANING = (
    "each token's (h.v - mu)/sigma at the value layer in the forward that produced it; at the steered"
    " layer read after the addition (value_at: after, the default: it shows the steering) or before it;"
    " at a later layer it is after the steering, at an earlier one before it"
)


@dataclass(frozen=True)
class Limits:
    """What every request is checked against: the served model's id, the server's steering spec
    (its probe, and the defaults of every request's steering), the α cap."""

    model: str
    spec: SteeringSpec
    max_alpha: float | None = None
    max_tokens: int = 4096
    max_n: int = 16

    def alpha_cap(self, layer: int, unit: str) -> float:
        """The largest |α| served at ``layer`` in ``unit``: ``--max-alpha``, else the probe's rule
        (`ALPHA_RULE`): the addition α·unit stays within ``NORM_MULTIPLE`` × the layer's mean
        residual norm. No norm statistics and no ``--max-alpha``: nothing is served steered (0)."""
        if self.max_alpha is not None:
            return self.max_alpha
        axis = self.spec.first_axis()
        norm = float(axis.mean_norm[axis.layers.index(layer)])
        if not (math.isfinite(norm) and norm > 0):
            return 0.0
        return NORM_MULTIPLE * norm / axis.unit_size(layer, unit)

    def caps(self) -> dict[str, Any]:
        """The α caps ``/v1/models`` states: the rule, and the cap per unit and layer."""
        rule = "--max-alpha" if self.max_alpha is not None else ALPHA_RULE
        layers = self.spec.first_axis().layers
        per = {u: {str(layer): round(self._cap_or_nan(layer, u), 4) for layer in layers} for u in UNITS}
        return {"rule": rule, "by_unit": per}

    def _cap_or_nan(self, layer: int, unit: str) -> float:
        try:
            return self.alpha_cap(layer, unit)
        except ValueprobeError:  # a unit the probe cannot express (no σ calibration)
            return 0.0


def check_layer(value: Any, limits: Limits, param: str, default: int | None) -> int:
    """A request's layer (``steering.layer``, ``value_layer``): one the probe has, else a 400."""
    axis = limits.spec.first_axis()
    if value is None:
        return axis.best_layer if default is None else default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(param, f"must be an integer layer, got {value!r}")
    if value not in axis.layers:
        raise RequestError(param, f"the probe has no layer {value}: use one of {list(axis.layers)}")
    return value


def served_layer(spec: SteeringSpec) -> int | None:
    """The server spec's steered layer, when it names exactly one (else each request's default is the best)."""
    return spec.layers[0] if isinstance(spec.layers, tuple) and len(spec.layers) == 1 else None


def steering_window(value: Any, positions: str) -> tuple[int, int] | None:
    """``steering.window``: ``[a, b]``, generated tokens a <= i < b, checked with the positions."""
    if value is None:
        return None
    ok = isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)
    try:
        if not ok:
            raise ValueprobeError(f"must be [a, b], generated tokens a <= i < b, got {value!r}")
        check_phase(positions, (value[0], value[1]))
    except ValueprobeError as exc:
        raise RequestError("steering.window", str(exc)) from None
    return (value[0], value[1])


def random_spec(value: Any, spec: SteeringSpec) -> SteeringSpec:
    """The spec along random unit direction ``value`` (a seed), with the axis's unit sizes."""
    if value is None:
        return spec
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise RequestError("steering.random", f"must be a whole seed in [0, 2**32), got {value!r}")
    direction = torch.from_numpy(random_directions(spec.first_axis().d_model, 1, seed=value)[0]).float()
    return replace(spec, direction=direction, direction_name=f"random-{value}")


def probe_card(limits: Limits) -> dict[str, Any]:
    """What ``/v1/models`` says of the probe: its layers, the steering and value defaults, where
    the value is read relative to the steering, the α caps with their rule, and each layer's
    units (one σ and 1 % of the mean residual norm, raw), so α is shown in both."""
    spec = limits.spec
    axis = spec.first_axis()
    return {
        "probe": str(spec.probe) if spec.probe is not None else axis.model_id,
        "layers": list(axis.layers),
        "best_layer": axis.best_layer,
        "site": str(axis.site),
        "steering_defaults": {
            "layer": served_layer(spec) or axis.best_layer,
            "unit": spec.unit.value,
            "positions": spec.positions,
            "window": None if spec.window is None else list(spec.window),
            "op": spec.op.describe(),
        },
        "value": {
            "unit": "sigma",
            "default_layer": spec.read_layer if spec.read_layer is not None else axis.best_layer,
            "default_at": "after",
            "value_at": list(VALUE_AT),
            "meaning": VALUE_MEANING,
        },
        "max_alpha": limits.caps(),
        "unit_sizes": {str(layer): _unit_sizes(axis, layer) for layer in axis.layers},
    }


def _unit_sizes(axis: Any, layer: int) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for unit in UNITS:
        try:
            out[unit] = axis.unit_size(layer, unit)
        except ValueprobeError:  # no σ calibration, or no norm statistics, at this layer
            out[unit] = None
    return out
