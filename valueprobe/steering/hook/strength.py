"""A spec's strengths in both units, and the check that no push goes past the residual's norm.

    valueprobe steer --probe smollm2-135m-value --alphas=-4,0,4 ...     # ±4σ = ±30% of the norm: runs
    valueprobe steer --probe smollm2-135m-value --alphas=-20,0,20 ...   # ±148%: refused in one line
    valueprobe steer ... --alphas=-20,0,20 --allow-large                 # runs; settings.json says so

    >>> spec_units(spec, [-2, 0, 2])          # (AlphaUnits(sigma=-2.0, norm=-14.8), ...)
    >>> check_strengths(spec, [-2, 0, 2], allow_large=False)

Only operators that add (``add``, ``add-norm``) push by α; for ``ablate``, ``set`` and ``clamp`` α
is the share of the move, and neither applies.
"""

from __future__ import annotations

from collections.abc import Sequence

from valueprobe.probe.units import AlphaUnits, alpha_units, check_push
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Op

__all__ = ["check_strengths", "spec_units"]

ADDS = (Op.add, Op.add_norm)


def spec_units(spec: SteeringSpec, alphas: Sequence[float]) -> tuple[AlphaUnits, ...]:
    """Each α of ``spec`` in σ and in % of the norm, on its first axis at its first steered layer
    known without a model (empty when none is known, or the operator does not add)."""
    layers = spec.known_layers()
    if spec.op.op not in ADDS or not layers:
        return ()
    axis = spec.first_axis()
    return tuple(alpha_units(axis, a, layer=layers[0], unit=spec.unit) for a in alphas)


def check_strengths(
    spec: SteeringSpec, alphas: Sequence[float], *, allow_large: bool, option: str = "--alphas"
) -> None:
    """Refuse, in one line, a strength past 100% of the mean residual norm at any steered layer of
    any axis of ``spec`` (`valueprobe.probe.units.check_push`), unless ``allow_large``."""
    if spec.op.op not in ADDS:
        return
    for axis in spec.axes():
        for layer in spec.known_layers():
            if layer in axis.layers:
                check_push(axis, alphas, layer=layer, unit=spec.unit, allow_large=allow_large, option=option)
