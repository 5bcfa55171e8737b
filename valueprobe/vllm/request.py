"""One request's steering as it travels to vLLM's workers: ``SamplingParams.extra_args["valueprobe"]``.

    >>> args = VllmArgs(SteeringSpec(probe="/abs/probes/smollm2-135m-value", layers=20), alpha=2.0)
    >>> SamplingParams(max_tokens=32, extra_args=args.extra_args())     # the offline LLM
    >>> {"model": ..., "prompt": ..., "vllm_xargs": {"valueprobe": json.dumps(args.to_dict())}}   # over HTTP

The payload is the steering spec's JSON form (`valueprobe.steering.hook.spec.SteeringSpec`), the
request's α (its only per-row part), the key its per-token values are kept under, and where, at
the steered block itself, the value is read (``value_at``: ``after`` the addition, the default
everywhere, as the HF route's trace and ``valueprobe serve`` read it, or ``before`` it)::

    {"spec": {"probe": "/abs/probes/...", "layers": [20], ...}, "alpha": 2.0, "key": "...", "value_at": "after"}

Every field is checked here (`VllmArgs.parse`), in the process that takes the request, so a bad
one is refused in one line naming the field and never reaches a worker. The vLLM engine steers
with the ``add`` operator on the residual stream (``resid_post`` or ``resid_pre``), at any
positions (``all``, ``prompt``, ``generated``), at one layer or several, one axis per request
(`valueprobe.steering.hook.additive.VLLM`). The worker resolves each spec once (`resolve`): the
vector added at each steered block is `valueprobe.hooks.addition.addition`, α times one unit of
the axis there (`valueprobe.probe.axis.ValueAxis.unit_size`) along v̂, or along the spec's
``direction`` (a control) with the axis's statistics, exactly as the hooks route adds it.

A steered request changes the KV of every position it steers, so it must not share prefix-cache
blocks with an unsteered request or another strength: `VllmArgs.salt` is the cache salt that the
plugin folds into the request's first block hash (vLLM's ``cache_salt`` extra key). α = 0 has no
salt: it is bit-identical to no steering, so sharing is exact.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.addition import addition
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.additive import VLLM, check_additive
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import VALUE_AT, Site

__all__ = ["EXTRA_KEY", "Resolved", "VllmArgs", "resolve"]

EXTRA_KEY = "valueprobe"  # the key of SamplingParams.extra_args / vllm_xargs the plugin reads
_FIELDS = ("spec", "alpha", "key", "value_at")


@dataclass(frozen=True)
class VllmArgs:
    """One request's steering and readout, as vLLM carries it.

    Attributes:
        spec: what to steer and where values are read (its probe an absolute folder every worker
            can read; ``read_layer`` default the first steered layer).
        alpha: strength in the spec's unit; 0 adds nothing (bit-identical to no steering).
        key: where the worker keeps this request's per-token values (None: no readout).
        value_at: at a block the request steers, read the value ``before`` the addition or
            ``after`` it (elsewhere a read is after the steering upstream either way).
    """

    spec: SteeringSpec
    alpha: float = 0.0
    key: str | None = None
    value_at: str = VALUE_AT[0]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": self.spec.to_dict(), "alpha": self.alpha, "value_at": self.value_at}
        return out | ({} if self.key is None else {"key": self.key})

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
        spec = {k: v for k, v in self.spec.to_dict().items() if k not in ("read_layer", "direction_name")}
        text = json.dumps({"spec": spec, "alpha": self.alpha}, sort_keys=True)
        return "valueprobe:" + hashlib.sha256(text.encode()).hexdigest()[:32]

    @classmethod
    def parse(cls, raw: Any) -> VllmArgs:
        """The payload from ``extra_args["valueprobe"]`` (a mapping, or its JSON text as ``vllm_xargs``
        carries it), every field checked against the probe; one `ValueprobeError` naming the field."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise ValueprobeError(
                    f"{EXTRA_KEY}: not JSON: give an object with spec, alpha, key"
                ) from None
        if not isinstance(raw, Mapping):
            raise ValueprobeError(f"{EXTRA_KEY}: expected an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_FIELDS))
        if unknown:
            raise ValueprobeError(f"{EXTRA_KEY}.{unknown[0]}: unknown field: use {', '.join(_FIELDS)}")
        if "spec" not in raw:
            raise ValueprobeError(f"{EXTRA_KEY}.spec: missing: give the steering spec's JSON form")
        spec = SteeringSpec.from_dict(raw["spec"], where=f"{EXTRA_KEY}.spec")
        if isinstance(spec.probe, str):  # one axis read once per worker, not once per request
            spec = replace(spec, axis=_axis(spec.probe))
        args = cls(spec=spec, alpha=_number(raw, "alpha"), key=_key(raw), value_at=_value_at(raw))
        check_spec(args.spec)
        return args


def _number(raw: Mapping[str, Any], name: str) -> float:
    value = raw.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueprobeError(f"{EXTRA_KEY}.{name}: expected a finite number, got {value!r}")
    return float(value)


def _value_at(raw: Mapping[str, Any]) -> str:
    value = raw.get("value_at", VALUE_AT[0])
    if value not in VALUE_AT:
        raise ValueprobeError(f"{EXTRA_KEY}.value_at: expected one of {', '.join(VALUE_AT)}, got {value!r}")
    return str(value)


def _key(raw: Mapping[str, Any]) -> str | None:
    value = raw.get("key")
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueprobeError(f"{EXTRA_KEY}.key: expected a non-empty string, got {value!r}")
    return value


@lru_cache(maxsize=64)
def _axis(probe: str) -> ValueAxis:
    """A probe folder, or a shipped axis by name (`valueprobe.probe.registry`)."""
    try:
        return ValueAxis.load(probe)
    except ValueprobeError as e:
        raise ValueprobeError(f"{EXTRA_KEY}.spec.probe: {e}") from None


def check_spec(spec: SteeringSpec) -> None:
    """Refuse, in one line, a spec the vLLM engine cannot run, and one that does not fit its probe
    (model-free: layers, unit statistics, the read layer, the direction's width)."""
    where = f"{EXTRA_KEY}.spec"
    check_additive(spec, VLLM, where=f"{where}: ")
    try:
        spec.check()
    except ValueprobeError as exc:
        raise ValueprobeError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Resolved:
    """What a worker needs of one request: the blocks whose outputs it changes and the vectors.

    Attributes:
        adds: (block, α·unit·v̂ float32) per steered point; the block whose output is the point
            (resid_pre[L] is block L − 1's).
        read_block: the block whose output the value is read at; read_v, mu, sigma: its statistics.
    """

    adds: tuple[tuple[int, Float[Tensor, " d_model"]], ...]
    read_block: int
    read_v: Float[Tensor, " d_model"]
    mu: float
    sigma: float


def _block(layer: int, site: str, what: str) -> int:
    block = layer - 1 if site == Site.resid_pre.value else layer
    if block < 0:
        raise ValueprobeError(f"{EXTRA_KEY}.spec: {what}: resid_pre[0] is the embedding, not a block output")
    return block


def resolve(args: VllmArgs, n_layers: int) -> Resolved:
    """The worker's view of ``args`` on a model of ``n_layers`` blocks (`ValueprobeError` on a bad field)."""
    return _resolve(args.spec, args.alpha, n_layers)


@lru_cache(maxsize=4096)
def _resolve(spec: SteeringSpec, alpha: float, n_layers: int) -> Resolved:
    axis = spec.first_axis()
    points = spec.points_for(n_layers=n_layers, d_model=axis.d_model) if alpha != 0.0 else []
    strength = torch.tensor(alpha, dtype=torch.float32)  # α as the hooks route holds it
    adds = tuple(
        (_block(p.point.layer, str(p.point.site), "layers"), addition(strength, p.unit_size, p.direction))
        for p in points
    )
    read = spec.read_at(n_layers)
    if read not in axis.layers:
        raise ValueprobeError(
            f"{EXTRA_KEY}.spec: read_layer: the probe has no layer {read}; it has {list(axis.layers)}"
        )
    i = axis.layers.index(read)
    sigma = float(axis.sigma[i])
    return Resolved(
        adds=adds,
        read_block=_block(read, str(spec.site or axis.site), "read_layer"),
        read_v=axis.direction(read).float(),  # values read along the axis, as the hooks route reads them
        mu=float(axis.mu[i]),
        sigma=sigma if math.isfinite(sigma) and sigma > 0 else math.nan,
    )
