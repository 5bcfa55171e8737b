"""Steer along an axis: apply a `SteeringSpec` at every forward, α·v̂ added by default.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m"); axis = vp.ValueAxis.load("probes/value-smollm2", lm=lm)
    >>> with vp.steer(lm, axis, 2.0):                     # +2 σ at the axis's own layer and site
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)
    >>> spec = vp.SteeringSpec(axis, positions="generated", unit="norm")
    >>> with vp.steer(lm, spec, torch.tensor([-25.0, 0.0, 25.0]), prompt_length=ids.shape[1]):
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=30)

Strength units (`valueprobe.vocab.Unit`, sized by `valueprobe.probe.axis.ValueAxis.unit_size`):
``sigma`` moves the projection on the axis by exactly α σ of its reference set (adds α·σ·v̂);
``norm`` adds α % of the layer's mean residual norm (the paper's unit: α = 25 is 8.4% on Qwen3-8B's
layer 21 in their table); ``raw`` adds α·v̂. ``k * axis`` multiplies every strength by k.

Exactness: the addition runs in a hook on the decoder block at every forward, and under the KV
cache a forward carries only the new columns (`valueprobe.hooks.route.Step`), so each position gets
one addition once, the prompt pass included (which is what steers the first generated token).
Pad cells are never touched, and cells with α = 0 are passed through bit for bit.

A `Steering` is one batch's steering: made (the spec resolved on the model, α per row), then
attached (`Steering.attach`, which `steer` calls), then removed. A route receives it unattached
(`valueprobe.hooks.decode.Plan`): the hooks route attaches it around ``generate``, a graph route
reads it as data (`Steering.as_additions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.decode import Additions
from valueprobe.hooks.route import Handle, Point, Recording, Step, intervene, record
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.additive import GRAPH, refusal
from valueprobe.steering.hook.condition import Gate
from valueprobe.steering.hook.resident import OnDevice, Scorer
from valueprobe.steering.hook.spec import SteeringSpec, SteerPoint, as_spec, check_phase
from valueprobe.vocab import Site

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["AlphaSource", "Steering", "steer"]

# What a steering hook asks for α: (target, pre-intervention hidden state, step, cells it may touch)
AlphaSource = Callable[[SteerPoint, Tensor, Step, Tensor], Float[Tensor, "batch new"]]
Specified = SteeringSpec | ValueAxis | Sequence[ValueAxis]


class Steering(Handle):
    """One batch's steering: ``spec`` resolved on ``lm``, α per row; ``.alpha`` may change between calls.

    Args:
        lm: the loaded model.
        spec: what to steer (`SteeringSpec`; an axis means every default).
        alpha: ``[batch]`` strengths in the spec's unit (a scalar broadcasts).
        prompt_length: the (padded) prompt width; columns at or past it are generated tokens
            (needed by positions other than ``all`` and by a window).
        trace: keep, per target point, one ``[batch, new]`` σ-score per forward of the residual
            *before* the addition (``reads``), and the α applied (``applied``).
        source: closed-loop α (`AlphaSource`), asked at every forward instead of ``alpha``.
        read_layers: also record the σ-score of the residual (resid_post, after any steering
            upstream) at these layers at every forward; `traced` returns them with ``reads``.
    """

    def __init__(
        self,
        lm: LoadedModel,
        spec: Specified,
        alpha: float | Tensor = 1.0,
        *,
        prompt_length: int | None = None,
        trace: bool = False,
        source: AlphaSource | None = None,
        read_layers: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.lm = lm
        self.spec = as_spec(spec)
        check_phase(self.spec.positions, self.spec.window, prompt_length)
        self.points = self.spec.points(lm)
        self.axis = self.spec.first_axis()
        self._devices: tuple[torch.device, ...] = ()  # the steered blocks' devices, once attached
        self.alpha = alpha
        self.prompt_length = prompt_length
        self.trace = trace
        self.source = source
        self.read_layers = tuple(dict.fromkeys(read_layers))
        self.reads: dict[Point, list[Tensor]] = {t.point: [] for t in self.points}
        self.applied: dict[Point, list[Tensor]] = {t.point: [] for t in self.points}
        self.recordings: dict[Point, Recording] = {}

    @property
    def alpha(self) -> Tensor:
        """``[batch]`` (or one) strengths on the host; setting it drops the device copies."""
        return self._alpha.host

    @alpha.setter
    def alpha(self, value: float | Tensor) -> None:
        host = torch.as_tensor(value, dtype=torch.float32).reshape(-1)
        # the first forward on a device pays α's copy there, later steps reuse it
        self._alpha = OnDevice(host)
        # known on the host, so no step asks the device: all-zero α leaves every forward alone
        self._idle = host.device.type == "cpu" and not bool(host.any())
        for device in self._devices:  # attached: α reaches the blocks' devices now, not in a step
            self._alpha.on(device)

    def attach(self) -> Steering:
        """Put the hooks on the model (one per steered point, a recorder per read layer); returns
        this handle, which removes them on ``.remove()`` or on leaving ``with``."""
        if self._handles:
            raise ValueprobeError("this steering is attached already: remove it before attaching it again")
        condition = self.spec.condition
        gates = [None if condition is None else condition.gate(self.axis, t.layer) for t in self.points]
        self._resident(gates)
        try:
            # hooks on one point run newest first: register in reverse, so the points act in order
            for t, gate in reversed(list(zip(self.points, gates, strict=True))):
                self.join(intervene(self.lm, t.point, self._hook(t, gate)))
            for layer in self.read_layers:
                p = Point(layer, Site.resid_post)
                scorer = Scorer(self.axis, layer)
                scorer.direction.on(_block_device(self.lm, layer))
                self.recordings[p] = record(self.lm, [p], reduce=_detached(scorer))
                self.join(self.recordings[p])
        except BaseException:
            self.remove()
            raise
        return self

    def _resident(self, gates: Sequence[Gate | None]) -> None:
        """α, each point's v̂ and each gate's direction on their block's device now, once per attach.
        Copied lazily at the first forward instead, a compiled forward traced the copy, then found
        it made at the next call and recompiled there (tests/test_compiled.py)."""
        self._devices = tuple(dict.fromkeys(_block_device(self.lm, t.point.layer) for t in self.points))
        for t, gate in zip(self.points, gates, strict=True):
            device = _block_device(self.lm, t.point.layer)
            t.direction_on(device)
            self._alpha.on(device)
            if gate is not None:
                gate.scorer.direction.on(device)

    def as_additions(self) -> Additions:
        """The steering as data, for a route that builds its run as a graph (nnsight, NDIF)."""
        live = self.trace or bool(self.read_layers) or self.source is not None
        beyond = refusal(self.spec, GRAPH)
        return Additions(self.points, self.alpha, self.spec.positions, live=live, beyond=beyond)

    def traced(self) -> tuple[dict[Point, list[Tensor]], list[Tensor]]:
        """Per point, one ``[batch, new]`` σ-score per forward (the first steered point before its
        addition, then each read layer); and the α applied at the first steered point. The hooks
        keep them on the device; they come to the host here, in one copy."""
        main = self.points[0].point
        values = {main: self.reads[main]} | {p: r.values[p] for p, r in self.recordings.items()}
        lists = [*values.values(), self.applied[main]]
        host = to_host([t for parts in lists for t in parts])
        out, at = [], 0
        for parts in lists:
            out.append(host[at : at + len(parts)])
            at += len(parts)
        return dict(zip(values, out[:-1], strict=True)), out[-1]

    def cells(self, step: Step) -> Bool[Tensor, "batch new"]:
        """The cells of this forward steering may touch: not padding, and in the spec's phase:
        every column (``all``), prompt columns (< ``prompt_length``), generated ones (>= it), or the
        generated tokens ``a <= column − prompt_length < b`` of a ``window``."""
        ok = ~step.pad
        where, window = self.spec.positions, self.spec.window
        if where == "all" and window is None:
            return ok
        assert self.prompt_length is not None
        generated = step.columns() - self.prompt_length  # < 0 in the prompt
        if window is not None:
            keep = (generated >= window[0]) & (generated < window[1])
        else:
            keep = generated < 0 if where == "prompt" else generated >= 0
        return ok & keep[None, :]

    def _hook(self, target: SteerPoint, gate: Gate | None) -> Callable[[Tensor, Step], Tensor | None]:
        # Nothing in here reads a device value on the host or copies a host tensor per step:
        # α, v̂ and the scorers' directions reach the device on attach.
        # Nor does it keep Python state that changes per step, so a compiled forward traces it once;
        # the trace lists grow outside the graph (`_appender`).
        scorer = Scorer(self.axis, target.layer) if self.trace and target is self.points[0] else None
        if scorer is not None:
            scorer.direction.on(_block_device(self.lm, target.point.layer))
        keep_read, keep_alpha = _appender(self.reads[target.point]), _appender(self.applied[target.point])

        def fn(h: Tensor, step: Step) -> Tensor | None:
            if self._idle and not self.trace and self.source is None:
                return None
            cells = self.cells(step)
            if gate is not None:
                cells = cells & gate(h, step)
            if scorer is not None:
                keep_read(scorer(h.detach()))
            if self.source is not None:
                alpha = self.source(target, h, step, cells)
            else:
                a = self._alpha.on(h.device)
                if a.numel() not in (1, h.shape[0]):
                    raise ValueprobeError(f"alpha has {a.numel()} values for a batch of {h.shape[0]} rows")
                alpha = a.reshape(-1, 1).expand(h.shape[0], h.shape[1])
            alpha = torch.where(cells, alpha, 0.0)
            if self.trace:
                keep_alpha(alpha.detach())
            if self._idle and self.source is None:
                return None
            return torch.where((alpha != 0)[..., None], self.spec.op(h, alpha, target), h)

        return fn

    def __enter__(self) -> Steering:
        return self


def _block_device(lm: LoadedModel, layer: int) -> torch.device:
    """Where decoder block ``layer`` keeps its weights (blocks may sit on different devices)."""
    weight = next(lm.layers[layer].parameters(), None)
    return lm.device if weight is None else weight.device


def _appender(parts: list[Tensor]) -> Callable[[Tensor], None]:
    """``parts.append``, run outside any compiled graph (a graph break under ``torch.compile``):
    dynamo guards a list it sees appended to, or passed to a call, on its length, which grows every
    decode step, so a traced append recompiled the forward at every step. Bound here, the list
    never enters the graph."""
    return torch.compiler.disable(parts.append)


def _detached(scorer: Scorer) -> Callable[[Tensor], Tensor]:
    return lambda h: scorer(h.detach())


def to_host(parts: Sequence[Tensor]) -> list[Tensor]:
    """Tensors from the device in one copy per device (same shapes and dtypes; CPU ones as they are)."""
    out = list(parts)
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(parts):
        if p.device.type != "cpu":
            by_device.setdefault(p.device, []).append(i)
    for index in by_device.values():
        group = [parts[i] for i in index]
        flat = torch.cat([p.reshape(-1).double() for p in group]).cpu()
        pieces = flat.split([p.numel() for p in group])
        for i, p, piece in zip(index, group, pieces, strict=True):
            out[i] = piece.reshape(p.shape).to(p.dtype)
    return out


def steer(
    lm: LoadedModel,
    spec: Specified,
    alpha: float | Float[Tensor, " batch"] = 1.0,
    *,
    prompt_length: int | None = None,
    trace: bool = False,
) -> Steering:
    """Apply ``spec`` at every forward until removed: a handle and a context manager.

    Args:
        lm: the loaded model.
        spec: what to steer (`valueprobe.steering.hook.spec.SteeringSpec`: layers, site, unit,
            operator, positions or window, condition, a direction); an axis (``-axis``, ``2 * axis``)
            or a list of axes (each at its own strength) means the spec with every default: α·v̂ at
            the axis's best layer and site, on every position, α in σ.
        alpha: one strength, or one per batch row (``[batch]``), in the spec's unit.
        prompt_length: the padded prompt width, for positions ``prompt`` / ``generated`` or a window.
        trace: keep the σ-score of the residual before the addition at each forward.

    >>> with steer(lm, SteeringSpec(axis, positions="generated"), torch.tensor([-2.0, 0.0, 2.0]),
    ...            prompt_length=ids.shape[1]):
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=20)
    """
    return Steering(lm, spec, alpha, prompt_length=prompt_length, trace=trace).attach()
