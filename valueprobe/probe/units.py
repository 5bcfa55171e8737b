"""α in both units, side by side: σ of the neutral reference and % of the layer's mean residual norm.

    >>> both = alpha_units(axis, 2.0, layer=20, unit="sigma")
    >>> str(both)
    '+2σ (+14.8% of the norm)'
    >>> check_push(axis, [-4, 4], layer=20, unit="sigma", allow_large=False)   # refuses past 100 %

Every α a command prints or writes appears in both units (`AlphaUnits`), converted by the one
conversion, `valueprobe.probe.axis.ValueAxis.unit_size`. A push past 100% of the layer's mean
residual norm replaces the residual more than it steers it; it is refused in one line unless the
caller allows it (``--allow-large``), and the output's settings record that it did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis, log
from valueprobe.probe.reference import SigmaReference
from valueprobe.records import Record
from valueprobe.vocab import Unit

__all__ = ["BEFORE_REFERENCES", "LARGE_PUSH", "AlphaUnits", "alpha_units", "check_push", "in_units_of"]

BEFORE_REFERENCES = ""  # what a file written before σ references were recorded is taken to record
LARGE_PUSH = 100.0  # % of the layer's mean residual norm past which a push is refused unless allowed


@dataclass(frozen=True)
class AlphaUnits(Record):
    """One strength in both units: ``sigma`` (σ of the axis's reference; NaN when uncalibrated)
    and ``norm`` (% of the layer's mean residual norm; NaN without norm statistics)."""

    sigma: float
    norm: float

    def __str__(self) -> str:
        sigma = "?σ" if math.isnan(self.sigma) else f"{self.sigma:+.3g}σ"
        norm = "?" if math.isnan(self.norm) else f"{self.norm:+.3g}%"
        return f"{sigma} ({norm} of the norm)"


def _size(axis: ValueAxis, layer: int, unit: Unit) -> float:
    """One unit's size at ``layer``, NaN where the axis lacks its statistics."""
    try:
        return axis.unit_size(layer, unit)
    except ValueprobeError:
        return math.nan


def alpha_units(axis: ValueAxis, alpha: float, *, layer: int, unit: Unit | str) -> AlphaUnits:
    """``alpha`` given in ``unit`` at ``layer``, in σ and in % of the mean residual norm.

    >>> alpha_units(axis, 30, layer=20, unit="norm").sigma     # the same push in σ
    """
    raw = alpha * axis.unit_size(layer, unit)  # what steering adds along v̂
    return AlphaUnits(sigma=raw / _size(axis, layer, Unit.sigma), norm=raw / _size(axis, layer, Unit.norm))


def check_push(
    axis: ValueAxis,
    alphas: Sequence[float],
    *,
    layer: int,
    unit: Unit | str,
    allow_large: bool,
    option: str = "--alphas",
) -> None:
    """Refuse, in one line, a strength past `LARGE_PUSH` % of the layer's mean residual norm
    unless ``allow_large``; an axis without norm statistics is not checked."""
    if allow_large:
        return
    for alpha in alphas:
        both = alpha_units(axis, alpha, layer=layer, unit=unit)
        if abs(both.norm) > LARGE_PUSH:
            raise ValueprobeError(
                f"{option}: α = {alpha:g} {Unit(unit).value} at layer {layer} is {both}: a push past"
                f" {LARGE_PUSH:.0f}% of the layer's mean residual norm replaces the residual; give a"
                " smaller strength, or --allow-large to run it anyway"
            )


def in_units_of(axis: ValueAxis, recorded: str | None, *, where: str) -> ValueAxis:
    """``axis`` with the statistics a spec (or result) was written in, never silently rescaled.

    ``recorded`` is the σ reference written with it; `BEFORE_REFERENCES` for a file written before
    references were recorded (a steering spec of format 1); None: nothing to match (the axis as it
    is). The axis's own statistics when they match; the ones its recalibration replaced
    (`ValueAxis.former`) when those match, or for a file written before, with one line saying so;
    else one `ValueprobeError` line.
    """
    if recorded is None or recorded == str(axis.sigma_reference):
        return axis
    formerly = axis.formerly and str(SigmaReference.read(axis.formerly["sigma_reference"]))
    if formerly and recorded in (BEFORE_REFERENCES, formerly):
        old = axis.former()
        layer = old.best_layer
        log.warning(
            f"{where}: written when σ was measured over {old.sigma_reference}; its α is read in those units"
            f" (1σ = {alpha_units(old, 1, layer=layer, unit=Unit.sigma).norm:.1f}% of the norm at layer {layer},"
            f" where the axis's σ now is {alpha_units(axis, 1, layer=layer, unit=Unit.sigma).norm:.1f}%):"
            " save the spec again to use the axis's current units"
        )
        return old
    if recorded == BEFORE_REFERENCES:  # and the axis was never recalibrated: its units are as written
        return axis
    raise ValueprobeError(
        f"{where}: written when σ was measured over {recorded}, but the axis now has {axis.sigma_reference}"
        " and keeps no record of that one: write the spec again for the axis as it is"
    )
