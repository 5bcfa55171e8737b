"""One request's steering as it travels to vLLM's workers: ``SamplingParams.extra_args["valueprobe"]``.

    >>> spec = VllmSteer(probe="smollm2-135m-value", alpha=2.0, layer=20)   # a shipped name, or an absolute path
    >>> SamplingParams(max_tokens=32, extra_args=spec.extra_args())     # the offline LLM
    >>> {"model": ..., "prompt": ..., "vllm_xargs": {"valueprobe": json.dumps(spec.to_dict())}}   # over HTTP

Every field is checked here (`VllmSteer.parse`), in the process that takes the request, so a bad
one is refused in one line naming the field and never reaches a worker. The worker resolves the
probe folder once per (probe, layer, unit, site) (`resolve`): the vector it adds is α times one
unit of the axis at that layer (`valueprobe.steering.handle.check_unit`) along v̂, or along
``direction`` (a control) with the axis's statistics, exactly as the hooks route sizes it.

A steered request changes the KV of every position it steers, so it must not share prefix-cache
blocks with an unsteered request or another strength: `VllmSteer.salt` is the cache salt that the
plugin folds into the request's first block hash (vLLM's ``cache_salt`` extra key). α = 0 has no
salt: it is bit-identical to no steering, so sharing is exact.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.handle import WHERE, check_unit
from valueprobe.vocab import Site, Unit

__all__ = ["EXTRA_KEY", "Resolved", "VllmSteer", "resolve"]

EXTRA_KEY = "valueprobe"  # the key of SamplingParams.extra_args / vllm_xargs the plugin reads


@dataclass(frozen=True)
class VllmSteer:
    """One request's steering and readout, as plain JSON values.

    Attributes:
        probe: a shipped axis's name, or the probe folder (an absolute path every worker can read).
        alpha: strength in ``unit``; 0 adds nothing (bit-identical to no steering).
        unit: ``sigma``, ``norm`` or ``raw`` (`valueprobe.vocab.Unit`).
        layer: the axis layer steered (and read, unless ``read_layer``); None: the probe's best.
        site: ``resid_post`` (the block's output) or ``resid_pre`` (its input, = resid_post[layer − 1]).
        positions: ``all``, ``prompt`` or ``generated`` tokens.
        direction: steer along this vector instead of v̂ (a control), sized by the axis's statistics.
        key: where the worker keeps this request's per-token values (None: no readout).
        read_layer: the layer the value is read at (default ``layer``); read before the addition
            at the steered layer, after it downstream.
    """

    probe: str
    alpha: float = 0.0
    unit: str = "sigma"
    layer: int | None = None
    site: str = "resid_post"
    positions: str = "all"
    direction: tuple[float, ...] | None = None
    key: str | None = None
    read_layer: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["direction"] = None if self.direction is None else list(self.direction)
        return {k: v for k, v in out.items() if v is not None}

    def extra_args(self) -> dict[str, Any]:
        """``SamplingParams(extra_args=...)`` for this steering."""
        return {EXTRA_KEY: self.to_dict()}

    @property
    def steers(self) -> bool:
        return self.alpha != 0.0

    def salt(self) -> str | None:
        """The prefix-cache salt of this steering: None when it adds nothing."""
        if not self.steers:
            return None
        fields = {k: v for k, v in self.to_dict().items() if k not in ("key", "read_layer")}
        return "valueprobe:" + hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]

    @classmethod
    def parse(cls, raw: Any) -> VllmSteer:
        """The steering from ``extra_args["valueprobe"]`` (a mapping, or its JSON text as ``vllm_xargs``
        carries it), every field checked against the probe; one `ValueprobeError` naming the field."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise ValueprobeError(
                    f"{EXTRA_KEY}: not JSON: give an object with probe, alpha, ..."
                ) from None
        if not isinstance(raw, Mapping):
            raise ValueprobeError(f"{EXTRA_KEY}: expected an object, got {type(raw).__name__}")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueprobeError(f"{EXTRA_KEY}.{sorted(unknown)[0]}: unknown field")
        spec = cls(
            probe=_text(raw, "probe", None),
            alpha=_number(raw, "alpha"),
            unit=_choice(raw, "unit", [u.value for u in Unit], "sigma"),
            layer=_layer(raw, "layer"),
            site=_choice(raw, "site", [Site.resid_post.value, Site.resid_pre.value], "resid_post"),
            positions=_choice(raw, "positions", list(WHERE), "all"),
            direction=_direction(raw),
            key=_text(raw, "key", ""),
            read_layer=_layer(raw, "read_layer"),
        )
        resolve(spec)  # the probe, its layers, its unit statistics, the direction's width
        return spec


def _text(raw: Mapping[str, Any], name: str, default: str | None) -> Any:
    value = raw.get(name, default)
    if value is None or not isinstance(value, str) or not value:
        if default == "" and name not in raw:
            return None
        raise ValueprobeError(f"{EXTRA_KEY}.{name}: expected a non-empty string, got {value!r}")
    return value


def _number(raw: Mapping[str, Any], name: str) -> float:
    value = raw.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueprobeError(f"{EXTRA_KEY}.{name}: expected a finite number, got {value!r}")
    return float(value)


def _layer(raw: Mapping[str, Any], name: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueprobeError(f"{EXTRA_KEY}.{name}: expected a whole layer index, got {value!r}")
    return value


def _choice(raw: Mapping[str, Any], name: str, allowed: list[str], default: str) -> str:
    value = raw.get(name, default)
    if value not in allowed:
        raise ValueprobeError(f"{EXTRA_KEY}.{name}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _direction(raw: Mapping[str, Any]) -> tuple[float, ...] | None:
    value = raw.get("direction")
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value
    ):
        raise ValueprobeError(f"{EXTRA_KEY}.direction: expected a list of finite numbers")
    return tuple(float(x) for x in value)


@dataclass(frozen=True)
class Resolved:
    """What a worker needs of one steering: the block whose output it changes and the vectors.

    Attributes:
        block: the decoder block whose output is the steered point (resid_pre[L] is block L − 1's).
        delta: α·unit·v̂ (float32) added at every steered position.
        read_block: the block whose output the value is read at; read_v, mu, sigma: its statistics.
    """

    block: int
    delta: Float[Tensor, " d_model"]
    read_block: int
    read_v: Float[Tensor, " d_model"]
    mu: float
    sigma: float


@lru_cache(maxsize=64)
def _axis(probe: str) -> ValueAxis:
    """A probe folder, or a shipped axis by name (`valueprobe.probe.registry`)."""
    try:
        return ValueAxis.load(probe)
    except ValueprobeError as e:
        raise ValueprobeError(f"{EXTRA_KEY}.probe: {e}") from None


def _block(axis: ValueAxis, layer: int, site: str, field: str) -> int:
    if layer not in axis.layers:
        raise ValueprobeError(
            f"{EXTRA_KEY}.{field}: the probe has no layer {layer}; it has {list(axis.layers)}"
        )
    block = layer - 1 if site == Site.resid_pre.value else layer
    if block < 0:
        raise ValueprobeError(f"{EXTRA_KEY}.{field}: resid_pre[0] is the embedding, not a block output")
    return block


def resolve(spec: VllmSteer) -> Resolved:
    """The worker's view of ``spec``: blocks and float32 vectors (`ValueprobeError` on a bad field)."""
    return _resolve(spec)


@lru_cache(maxsize=4096)
def _resolve(spec: VllmSteer) -> Resolved:
    axis = _axis(spec.probe)
    layer = axis.best_layer if spec.layer is None else spec.layer
    read = layer if spec.read_layer is None else spec.read_layer
    block = _block(axis, layer, spec.site, "layer")
    read_block = _block(axis, read, spec.site, "read_layer")
    size = check_unit(axis, layer, spec.unit) if spec.steers else 0.0
    v = axis.direction(layer).float()
    if spec.direction is not None:
        d = torch.tensor(spec.direction, dtype=torch.float32)
        if d.shape != v.shape or not float(d.norm()) > 0:
            raise ValueprobeError(
                f"{EXTRA_KEY}.direction: expected {v.shape[0]} numbers, not all zero; got {d.shape[0]}"
            )
        v = d / d.norm()
    i = axis.layers.index(read)
    sigma = float(axis.sigma[i])
    return Resolved(
        block=block,
        delta=(spec.alpha * size) * v,
        read_block=read_block,
        read_v=axis.direction(read).float(),
        mu=float(axis.mu[i]),
        sigma=sigma if math.isfinite(sigma) and sigma > 0 else math.nan,
    )
