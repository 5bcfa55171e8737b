"""What a harness run steers: the steering arguments both harness adapters take (`EvalSteering`,
read once from the harness's model arguments), and how they resolve on a model.

    >>> steering, rest = EvalSteering.parse(
    ...     {"probe": "smollm2-135m-value", "alpha": 15, "random": 3, "batch_size": "8"},
    ...     beside=LMEvalOptions, harness="lm-eval")   # LMEvalOptions: the lm-eval model's own keys
    >>> spec = steering.resolve(lm)    # the spec along random direction 3, checked against lm

The pieces it resolves through, each usable alone:

    >>> spec = eval_spec("runs/spec.json", probe=None)            # or eval_spec(None, probe="smollm2-135m-value")
    >>> check_fit(lm, spec)                                       # as `valueprobe steer` refuses a probe
    >>> check_alphas(spec, [-30, 30], n_layers=lm.n_layers)       # one line past the server's cap
    >>> null = along_random(spec, 3, seed=0)                      # random direction 3, the axis's sizes

A harness hands its model's arguments over as it guessed their types: lm-eval's ``--model_args
k=v,...`` (``create_from_arg_string`` / ``create_from_arg_obj``) as text, whole numbers, numbers
and booleans; Inspect's ``-M k=v`` (the provider's ``**model_args``) as YAML reads them. `ModelArgs`
converts each value to its field's type, and `EvalSteering.parse` refuses, in one line naming the
keys it knows, a key that is neither a steering argument nor one of the adapter's own.

The null of every harness run is `along_random`: the spec with its direction replaced by random
unit direction K of `valueprobe.stats.null.random_directions` (the one scheme), keeping
everything else, so α adds a vector of the same norm at the same place (`ValueAxis.unit_size`
sizes both), and named ``random-K`` as the steering sweep names its controls.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, Self, TypeVar, Union, get_args, get_origin, get_type_hints

import torch

from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.serve.protocol import ALPHA_RULE, Limits
from valueprobe.stats.null import random_directions
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Op

__all__ = [
    "AXIS",
    "RANDOM_PREFIX",
    "EvalSteering",
    "ModelArgs",
    "along_random",
    "check_alphas",
    "check_fit",
    "eval_spec",
]


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError


def _int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value)
    raise ValueError


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError
    number = float(value)
    if not math.isfinite(number):
        raise ValueError
    return number


def _text(value: object) -> str:
    # a harness reads `device=0` or a file named `7` as a number: a whole number is its text
    if isinstance(value, str | Path) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise ValueError


# what a value a harness typed may become, by the field's type; other field types (a steering
# spec, a loaded model) pass only as themselves, which an in-process caller gives
CONVERT: dict[object, tuple[Callable[[object], Any], str]] = {
    bool: (_bool, "true or false"),
    int: (_int, "a whole number"),
    float: (_float, "a finite number"),
    str: (_text, "text"),
    Path: (lambda value: Path(_text(value)), "a file path"),
}


def _kinds(hint: object) -> tuple[object, ...]:
    """The types a field's hint allows (a union's members, or the hint)."""
    return get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)


def _typed(name: str, value: object, hint: object, harness: str) -> object:
    """``value`` as the field's type, or one line naming the key and what it takes."""
    kinds = _kinds(hint)
    if value is None and type(None) in kinds:
        return None
    for kind in kinds:
        if get_origin(kind) is Literal and value in get_args(kind):
            return value
        if isinstance(kind, type) and kind not in CONVERT and isinstance(value, kind):
            return value
    for kind in kinds:
        if kind in CONVERT:
            try:
                return CONVERT[kind][0](value)
            except (TypeError, ValueError):
                continue
    wanted = [
        " or ".join(map(str, get_args(k))) if get_origin(k) is Literal else CONVERT[k][1]
        for k in kinds
        if k in CONVERT or get_origin(k) is Literal
    ]
    raise ValueprobeError(f"{harness} model argument {name}={value!r}: give {' or '.join(wanted)}")


A = TypeVar("A", bound="ModelArgs")


@dataclass(frozen=True)
class ModelArgs:
    """A frozen record of model arguments a harness passes: one field per key, each with a default."""

    @classmethod
    def names(cls) -> list[str]:
        """The keys this record reads, in order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_args(cls, given: Mapping[str, object], *, harness: str) -> Self:
        """The record of ``given`` (keys of this record only), each value converted to its field's type."""
        hints = get_type_hints(cls)
        return cls(**{name: _typed(name, value, hints[name], harness) for name, value in given.items()})


@dataclass(frozen=True)
class EvalSteering(ModelArgs):
    """The steering arguments of both harness adapters: ``spec`` (a steering spec file, or in
    process the spec) or ``probe`` (a shipped axis's name or a folder, every default), ``alpha``
    (in the spec's unit), ``random`` (steer along random direction K instead: the null),
    ``seed`` (of the random directions; lm-eval's sampling too), ``allow_large`` (α past the
    server's cap), ``force`` (a probe of another architecture)."""

    spec: SteeringSpec | Path | None = None
    probe: str | None = None
    alpha: float = 0.0
    random: int | None = None
    seed: int = 0
    allow_large: bool = False
    force: bool = False

    @classmethod
    def parse(cls, given: Mapping[str, object], *, beside: type[A], harness: str) -> tuple[EvalSteering, A]:
        """A harness's model arguments split into the steering and the adapter's own (``beside``),
        each typed; a key of neither is refused in one line naming every key the model takes."""
        known = [*cls.names(), *beside.names()]
        unknown = [key for key in given if key not in known]
        if unknown:
            raise ValueprobeError(
                f"{harness} model argument {unknown[0]!r} is not one valueprobe's model takes:"
                f" use {', '.join(known)}"
            )
        mine = {k: v for k, v in given.items() if k in cls.names()}
        rest = {k: v for k, v in given.items() if k not in mine}
        return cls.from_args(mine, harness=harness), beside.from_args(rest, harness=harness)

    def resolve(self, lm: LoadedModel) -> SteeringSpec:
        """The spec this steers on ``lm`` (along random direction ``random`` when given), refused
        in one line when its probe does not fit ``lm`` or ``alpha`` is past the cap."""
        chosen = eval_spec(self.spec, probe=self.probe)
        spec = chosen if self.random is None else along_random(chosen, self.random, seed=self.seed)
        check_fit(lm, spec, force=self.force)
        check_alphas(spec, [self.alpha], n_layers=lm.n_layers, allow_large=self.allow_large)
        return spec


def eval_spec(spec: SteeringSpec | str | Path | None, *, probe: str | None) -> SteeringSpec:
    """The spec a harness run steers: a spec, a spec file, or a probe (a shipped axis's name or a
    folder) with every default; one `ValueprobeError` line if both or neither are given."""
    if isinstance(spec, SteeringSpec):
        return spec.check()
    if spec is not None and probe is not None:
        raise ValueprobeError("give the steering as spec=FILE or as probe=NAME, not both")
    if spec is not None:
        return SteeringSpec.load(spec).check()
    if probe is None:
        raise ValueprobeError(
            "no steering given: pass spec=SPEC.json (SteeringSpec.save writes one) or probe=NAME"
        )
    return SteeringSpec(probe=probe).check()


def along_random(spec: SteeringSpec, k: int, *, seed: int = 0) -> SteeringSpec:
    """``spec`` along random unit direction ``k`` (seed ``seed``) instead of its axis: the same
    layers, site, unit, operator, phase and condition, so α adds a vector of the same norm."""
    if k < 0:
        raise ValueprobeError(f"random direction {k}: give a whole number >= 0")
    axes = spec.axes()
    if len(axes) > 1:
        raise ValueprobeError(
            "a random-direction null steers one axis's place and sizes: give a spec with one probe"
        )
    rows = random_directions(axes[0].d_model, k + 1, seed=seed)
    return replace(spec, direction=torch.from_numpy(rows[k]).float(), direction_name=f"{RANDOM_PREFIX}{k}")


def check_fit(lm: LoadedModel, spec: SteeringSpec, *, force: bool = False) -> None:
    """Refuse, in one line, a spec whose probe does not fit ``lm`` (width, layers, architecture),
    before any harness starts: the checks `valueprobe steer` makes."""
    for axis in spec.axes():
        axis.check(lm, force=force)
    if spec.condition is not None and spec.condition.axis is not None:
        spec.condition.axis.check(lm, force=force)
    spec.points(lm)


def check_alphas(
    spec: SteeringSpec, alphas: list[float], *, n_layers: int, allow_large: bool = False
) -> None:
    """Refuse, in one line, an α past the cap `valueprobe serve` applies at a steered layer (the
    addition no larger than the residual it is added to), unless ``allow_large``."""
    if allow_large:
        return
    limits = Limits(model="", spec=spec)
    adds = spec.op.op in (Op.add, Op.add_norm)  # the other operators' α is a share of their move
    for layer in spec.steered_layers(n_layers):
        cap = limits.alpha_cap(layer, spec.unit.value) if adds else 1.0
        large = [a for a in alphas if abs(a) > cap]
        if large:
            rule = ALPHA_RULE if adds else "the operator's share of its move: 0 off, 1 on"
            raise ValueprobeError(
                f"--alphas {large[0]:g} is past the cap {cap:.4g} {spec.unit.value} at layer {layer}"
                f" ({rule}): give smaller strengths, or --allow-large"
            )
