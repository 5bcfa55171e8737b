"""Closed-loop steering: a PID sets α at every generated token so the value tracks a target in σ.

    >>> gens = control(lm, axis, ["Tell me about your day."], PID(target=2.0, cap=4.0),
    ...                decoding=Decoding(max_new_tokens=40))
    >>> gens[0].trace.alpha[-5:], gens[0].trace.values["resid_post[18] after"][-5:]

At each generated token the hook on the steered block reads y, the token's σ-score *before* the
addition, then adds α·σ·v̂, which moves that token's score to z = y + α exactly. The law, per row:

    e_t = r − y_t
    u_t = kp·e_t + ki·I_t − kd·(y_t − y_{t−1})       (derivative on the measurement: no kick)
    α_t = clip(u_t, −cap, cap)
    I_{t+1} = I_t + (r − z_t)   only while α_t is not at the cap (conditional integration: anti-windup)

The integral runs on the error left *after* steering, so a steady offset is driven to zero;
``kp=1, ki=kd=0`` cancels the error on the same token (dead-beat, up to the cap). Prompt tokens
are left alone. Only the first generated token's score y_1 depends on nothing α has done; later
ones see earlier α through the tokens it chose and through attention above the steered layer.

Hooks route only. Each α is computed in Python from a value read in the same forward pass and
added before the pass continues. nnsight's ``generate`` builds its intervention graph before the
run; locally it could execute such a step, but on NDIF the graph runs on the server and a
Python-side PID would need a network round trip inside every layer call of every token, so the
route that exists for NDIF is not offered here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.activations.prompts import Prompt
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.route import Step
from valueprobe.steering.decode.generation import Generation, Tracing, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import AlphaSource, Specified
from valueprobe.steering.hook.spec import SteerPoint, as_spec
from valueprobe.vocab import LayerSpec, Op, Unit, parse_layers

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel
    from valueprobe.probe.axis import ValueAxis

__all__ = ["PID", "control"]


@dataclass(frozen=True)
class PID:
    """Gains, target (σ) and cap (|α| in σ) of the controller."""

    target: float
    kp: float = 0.6
    ki: float = 0.4
    kd: float = 0.0
    cap: float = 4.0

    def __post_init__(self) -> None:
        if not self.cap > 0:
            raise ValueprobeError(f"PID cap must be > 0, got {self.cap}")
        if min(self.kp, self.ki, self.kd) < 0:
            raise ValueprobeError(f"PID gains must be >= 0, got kp={self.kp} ki={self.ki} kd={self.kd}")


class _Loop:
    """Controller state for one chunk of rows; called by the steering hook (an `AlphaSource`)."""

    def __init__(self, pid: PID, axis: ValueAxis, rows: int) -> None:
        self.pid = pid
        self.axis = axis
        self.integral = torch.zeros(rows)
        self.last_y: Tensor | None = None

    def __call__(self, point: SteerPoint, h: Tensor, step: Step, cells: Tensor) -> Float[Tensor, "batch new"]:
        alpha = torch.zeros(h.shape[0], h.shape[1])
        if step.offset == 0:  # the prompt pass: no generated token yet
            return alpha
        if h.shape[1] != 1:
            raise ValueprobeError("closed-loop steering needs the KV cache (one new token per forward)")
        p = self.pid
        y = point.score(self.axis, h[:, -1].detach()).cpu()
        gain = point.unit_size / float(self.axis.sigma[self.axis.layers.index(point.layer)])
        dy = torch.zeros_like(y) if self.last_y is None else y - self.last_y
        u = p.kp * (p.target - y) + p.ki * self.integral - p.kd * dy
        a = (u / gain).clamp(-p.cap, p.cap)
        free = a.abs() < p.cap
        z = y + gain * a
        self.integral = torch.where(free, self.integral + (p.target - z), self.integral)
        self.last_y = y
        alpha[:, -1] = a
        return alpha


def control(
    lm: LoadedModel,
    spec: Specified,
    prompts: Sequence[Prompt],
    pid: PID,
    *,
    decoding: Decoding = Decoding(),
    read_layers: LayerSpec = (),
    batch_size: int = 32,
    progress: bool = True,
    chat: bool = True,
) -> list[Generation]:
    """Generate with α set per token by ``pid``; each `Generation` carries the α and value traces.

    Args:
        lm, prompts, decoding, batch_size, chat: as in `valueprobe.steering.decode.generation.generate`.
        spec: the steered (and read) layer, one, default the axis's best (an axis means that);
            the PID adds along it, in σ, on generated tokens.
        pid: target in σ, gains and the cap on |α| (σ units).
        read_layers: other layers to trace.

    Returns:
        one `Generation` per (prompt, sample), ``alpha`` = the target; ``trace.values`` holds the
        score before (``"resid_post[L]"``) and after (``"resid_post[L] after"``) the addition.
    """
    spec = replace(as_spec(spec), unit=Unit.sigma, positions="generated", direction_name="axis (pid)")
    if spec.op.op != Op.add or len(spec.steered_layers(lm.n_layers)) != 1:
        raise ValueprobeError(
            "the PID adds along the axis at one layer: give a spec with op add and one layer"
        )
    axis = spec.first_axis()
    reads = [] if not read_layers else parse_layers(read_layers, n_layers=lm.n_layers)
    gens = generate(
        lm,
        spec,
        prompts,
        alphas=[pid.target],
        decoding=decoding,
        # y, what the model carries on its own, read before the addition; z = y + gain·α is added below
        trace=Tracing(value_at="before", read_layers=tuple(reads)),
        batch_size=batch_size,
        source=lambda rows: _source(pid, axis, rows),
        progress=progress,
        chat=chat,
    )
    return [_with_after(g, float(axis.scale)) for g in gens]


def _source(pid: PID, axis: ValueAxis, rows: int) -> AlphaSource:
    return _Loop(pid, axis, rows)


def _with_after(g: Generation, gain: float) -> Generation:
    """Add the controlled value z = y + gain·α to the trace."""
    assert g.trace is not None
    name = g.trace.steered
    after = tuple(y + gain * a for y, a in zip(g.trace.values[name], g.trace.alpha, strict=True))
    return replace(g, trace=replace(g.trace, values={**g.trace.values, f"{name} after": after}))
