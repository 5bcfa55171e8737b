"""Where a steered generation reads the value: one rule for ``vp.generate``, the trace and the server.

    >>> reading = read_value(lm, steering, layer=20, at="after")    # while ``steering`` is attached
    >>> ...generate...
    >>> reading.latest()    # [batch] σ-scores of the forward that just ran (the server's per-token value)
    >>> reading.series()    # per forward [batch, new, 2]: σ-score and ‖h‖ of every column read

The value is the σ-score ``(h·v̂ − μ)/σ`` of the residual at ``layer`` (the axis's site) in each
forward. At the first steered point it is read ``after`` the addition by default (what the
steering did shows in the value; ``valueprobe serve`` and ``vp.generate(trace=True)`` both read it
there) or ``before`` it (what the model carried on its own, with α beside it; the PID reads that).
At any other layer it is read after any steering upstream, whichever is asked. Every output names
its read point: `describe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from valueprobe.hooks.route import Point, Recording, record
from valueprobe.read.values import Reader
from valueprobe.steering.hook.handle import Steering
from valueprobe.vocab import VALUE_AT, ValueAt

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["VALUE_AT", "ValueAt", "Reading", "describe", "read_value"]


def describe(layer: int, site: str, at: ValueAt, steered: int | None) -> str:
    """The read point in words, as every output names it (``resid_post[20], after the addition``)."""
    where = f"{site}[{layer}]"
    if steered is None:
        return f"{where}, unsteered"
    if layer == steered:
        return f"{where}, {at} the addition"
    return f"{where}, {'after' if layer > steered else 'before'} the addition at layer {steered}"


@dataclass
class Reading:
    """The per-forward readings at one point: a recording that runs after every steering hook
    there (σ-score and ‖h‖ per column), or the handle's own trace before its addition (σ only)."""

    layer: int
    at: ValueAt
    recording: Recording | None
    parts: list[
        Tensor
    ]  # one per forward: [batch, new, 2] (σ, ‖h‖) from a recording; [batch, new] σ from the trace

    def latest(self) -> Tensor:
        """``[batch]`` σ-scores of the last column of the latest forward (on the device)."""
        last = self.parts[-1][:, -1]
        return last[..., 0] if last.ndim == 2 else last

    def series(self) -> list[Tensor]:
        """Every forward's ``[batch, new, 2]`` (σ, ‖h‖); ‖h‖ is NaN where it was not read (before)."""
        return [
            p if p.ndim == 3 else torch.stack([p, torch.full_like(p, math.nan)], dim=-1) for p in self.parts
        ]

    def remove(self) -> None:
        if self.recording is not None:
            self.recording.remove()


def read_value(lm: LoadedModel, steering: Steering, *, layer: int, at: ValueAt) -> Reading:
    """Start reading the value at ``layer`` for a generation steered by ``steering``: before the
    first steered point's addition (its handle must trace) or after every hook there (a recording,
    which `valueprobe.hooks.patch.record` runs after the interventions). Remove it when done."""
    first = steering.points[0]
    if layer == first.layer and at == "before":
        if not steering.trace:
            raise ValueError("reading before the addition needs a steering handle made with trace=True")
        return Reading(layer, at, None, steering.reads[first.point])
    axis = steering.axis
    point = Point(layer, axis.site)
    rec = record(lm, [point], reduce=Reader(axis, layer))
    return Reading(layer, "after" if layer >= first.layer else "before", rec, rec.values[point])
