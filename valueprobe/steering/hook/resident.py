"""What a steering hook reads at every forward, moved to the hidden state's device once per call.

On a GPU, copying a host tensor to the device (``v.to(h.device)``) or reading a host float out of
a tensor at every decode step makes the step wait for the device; issue 27 measured three such
syncs per step in the hook alone. `OnDevice` keeps one copy of a tensor per device it has been
asked for, so the first forward pays the copy and every later step finds it there; `Scorer` is
`valueprobe.probe.axis.ValueAxis.score` at one layer with its direction held that way and μ, σ
as Python floats (the same operations, so the same bits).

    >>> v = OnDevice(direction)
    >>> h + alpha[..., None] * v.on(h.device)              # copies once, then reuses
    >>> score = Scorer(axis, 12)(h)                          # [batch, new] σ-scores, on h's device
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.probe.axis import ValueAxis

__all__ = ["OnDevice", "Scorer"]


class OnDevice:
    """One tensor and its copies on the devices it has been asked for (host copy kept as given)."""

    def __init__(self, host: Tensor) -> None:
        self.host = host
        self._copies: dict[torch.device, Tensor] = {host.device: host}

    def on(self, device: torch.device) -> Tensor:
        """The tensor on ``device``, copied there the first time only."""
        copy = self._copies.get(device)
        if copy is None:
            copy = self._copies[device] = self.host.to(device)
        return copy


class Scorer:
    """``axis.score(h.float(), layer)`` at every forward without a host read or copy per call."""

    def __init__(self, axis: ValueAxis, layer: int) -> None:
        self.sigma = axis.sigma_at(layer)  # refuses an unknown or uncalibrated layer in one line
        i = axis.layers.index(layer)
        self.direction = OnDevice(axis.directions[i].float())
        self.mu = float(axis.mu[i])

    def __call__(self, h: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        return (h.float() @ self.direction.on(h.device) - self.mu) / self.sigma
