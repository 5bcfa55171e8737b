"""What a harness run steers: a spec read from a file or a probe name, its random-direction null,
and the checks made before a harness starts (the probe fits the model, |α| within the cap).

    >>> spec = eval_spec("runs/spec.json", probe=None)            # or eval_spec(None, probe="smollm2-135m-value")
    >>> check_fit(lm, spec)                                       # as `valueprobe steer` refuses a probe
    >>> check_alphas(spec, [-30, 30], n_layers=lm.n_layers)       # one line past the server's cap
    >>> null = along_random(spec, 3, seed=0)                      # random direction 3, the axis's sizes

The null of every harness run is `along_random`: the spec with its direction replaced by random
unit direction K of `valueprobe.stats.null.random_directions` (the one scheme), keeping
everything else, so α adds a vector of the same norm at the same place (`ValueAxis.unit_size`
sizes both), and named ``random-K`` as the steering sweep names its controls.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.serve.protocol import ALPHA_RULE, Limits
from valueprobe.stats.null import random_directions
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Op

__all__ = ["AXIS", "RANDOM_PREFIX", "along_random", "check_alphas", "check_fit", "eval_spec"]


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
