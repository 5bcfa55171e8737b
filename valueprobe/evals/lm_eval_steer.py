"""A spec as lm-evaluation-harness's own steer config: what ``lm_eval --model steered`` reads.

    valueprobe export --to lm-eval --probe smollm2-135m-value --unit norm --alpha 15 --layer 20 --out steer.pt
    lm_eval --model steered --model_args pretrained=HuggingFaceTB/SmolLM2-135M-Instruct,steer_path=steer.pt ...

    >>> config = steer_config(lm, SteeringSpec(axis, unit="norm", layers=[18, 20]), alpha=15.0)
    >>> write_steer_config(config, "steer.pt")

lm-eval's ``SteeredModel`` (``lm_eval/models/hf_steered.py``, lm-eval 0.4.13) takes a ``.pt`` file
mapping hook points (names in ``model.base_model.named_modules()``) to ``{"action",
"steering_vector", "steering_coefficient", "bias", "head_index"}``, and hooks each point's output
at every position of every forward:

- ``add``: the output plus ``steering_vector · steering_coefficient``. Written with the vector one
  unit of α (``unit_size · v̂``: `ValueAxis.unit_size`) and the coefficient α, so the coefficient in
  the file is valueprobe's α in the spec's unit: the same addition ``vp.steer`` makes. Several
  layers are several hook points; several axes at one point add up into one vector.
- ``clamp``: the output's projection on ``v̂`` set to ``steering_coefficient``. That is
  valueprobe's ``set`` (score ``t``: the projection μ + t·σ), ``ablate`` (projection 0) and a
  ``clamp`` whose bounds meet, each at α = 1 (the whole move). Other strengths of these, a clamp
  to a range, and ``add-norm`` have no lm-eval action and are refused in one line.

Where: ``resid_post[L]`` is the output of decoder block L; ``resid_pre[L]`` that of block L - 1
(``resid_pre[0]`` is inside the embedding for some families and is refused); ``attn_out`` and
``mlp_out`` the block's attention and MLP submodules (lm-eval takes a tuple output's first
element, the attention output). lm-eval steers every position, prompt and continuation: a spec
with another phase, a window or a condition is refused. The file is ``torch.save`` of tensors,
numbers and strings only: ``torch.load(weights_only=True)`` reads it (lm-eval itself loads it with
``weights_only=False``, its pickle path; read a file only from someone you trust).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write
from valueprobe.hooks.patch import SUBMODULES
from valueprobe.model.load import LoadedModel
from valueprobe.steering.hook.handle import Specified
from valueprobe.steering.hook.spec import SteerPoint, as_spec
from valueprobe.vocab import HookSite, Op

__all__ = ["check_expressible", "check_steer_path", "hookpoint", "steer_config", "write_steer_config"]

SteerConfig = dict[str, dict[str, Any]]


def _module(lm: LoadedModel, site: HookSite, layer: int) -> nn.Module:
    """The module whose output is ``site`` at ``layer``."""
    if site == HookSite.resid_post:
        return lm.layers[layer]
    if site == HookSite.resid_pre:
        if layer == 0:
            raise ValueprobeError(
                "resid_pre of layer 0 is the embedding output, which lm-eval's steered model cannot"
                " reach in every family: export resid_post or a later layer (--layers, --site)"
            )
        return lm.layers[layer - 1]
    block = lm.layers[layer]
    for name in SUBMODULES[site]:
        sub = getattr(block, name, None)
        if isinstance(sub, nn.Module):
            return sub
    raise ValueprobeError(f"block {layer} has no {site.value} submodule ({', '.join(SUBMODULES[site])})")


def hookpoint(lm: LoadedModel, site: HookSite, layer: int) -> str:
    """The name lm-eval's steered model hooks for ``site`` at ``layer`` (its ``base_model``'s module name)."""
    target = _module(lm, site, layer)
    base = getattr(lm.model, "base_model", lm.model)
    for name, module in base.named_modules():
        if module is target:
            return name
    raise ValueprobeError(
        f"{site.value}[{layer}] is not a module of the model's base_model: lm-eval cannot hook it"
    )


def _clamp_value(spec_op: Any, t: SteerPoint) -> float:
    """The projection lm-eval's clamp sets: the one valueprobe's operator moves to at α = 1."""
    if spec_op.op == Op.ablate:
        return 0.0
    score = spec_op.target if spec_op.op == Op.set else spec_op.lo
    return t.mu + score * t.sigma


def check_expressible(spec: Specified, *, alpha: float) -> None:
    """Refuse, in one line and without a model, a spec or α lm-eval's steered model cannot express."""
    spec = as_spec(spec)
    if not math.isfinite(alpha):
        raise ValueprobeError(f"--alpha {alpha} must be a finite number")
    if spec.positions != "all" or spec.window is not None or spec.condition is not None:
        raise ValueprobeError(
            "lm-eval's steered model steers every position of every forward: export a spec with positions"
            " all, no window and no condition"
        )
    op = spec.op
    clamps = op.op in (Op.ablate, Op.set) or (op.op == Op.clamp and op.lo is not None and op.lo == op.hi)
    if op.op != Op.add and not (clamps and alpha == 1.0):
        raise ValueprobeError(
            f"lm-eval's steered model adds or clamps to one value: --op {op.describe()} at α {alpha:g} has no"
            " lm-eval action (export add, or ablate / set / a clamp with lo = hi at α = 1)"
        )


def steer_config(lm: LoadedModel, spec: Specified, *, alpha: float) -> SteerConfig:
    """lm-eval's steer config for ``spec`` at ``alpha`` (see the module doc for what is expressible)."""
    spec = as_spec(spec)
    check_expressible(spec, alpha=alpha)
    op = spec.op
    config: SteerConfig = {}
    for t in spec.points(lm):
        name = hookpoint(lm, HookSite(str(t.point.site)), t.point.layer)
        if op.op == Op.add:
            vector = t.unit_size * t.direction.float()
            if name in config:  # several axes at one point: their additions add up (same α)
                vector = config[name]["steering_vector"] + vector
            config[name] = _entry("add", vector, alpha)
        elif name in config:
            raise ValueprobeError(f"two clamps at {name}: lm-eval keeps one action per hook point")
        else:
            config[name] = _entry("clamp", t.direction.float().clone(), _clamp_value(op, t))
    return config


def _entry(action: str, vector: torch.Tensor, coefficient: float) -> dict[str, Any]:
    return {
        "action": action,
        "steering_vector": vector.contiguous(),
        "steering_coefficient": float(coefficient),
        "bias": None,
        "head_index": None,
    }


def check_steer_path(path: str | Path) -> Path:
    """``path``, or one line when its name does not end in ``.pt`` (lm-eval reads no other name)."""
    path = Path(path)
    if path.suffix not in (".pt", ".pth"):
        raise ValueprobeError(
            f"--out {path}: lm-eval reads a steer config from a .pt file; end the name in .pt"
        )
    return path


def write_steer_config(config: SteerConfig, path: str | Path) -> Path:
    """``config`` as lm-eval's ``.pt`` steer file (atomically)."""
    return atomic_write(check_steer_path(path), lambda tmp: torch.save(config, tmp))
