"""Three routes, one answer, and the public hook layer they stand on.

Hook layer (`patch`): ``record(lm, points)`` and ``intervene(lm, point, fn)``, handles that are
also context managers; ``fn(h, step)`` runs at every forward, each step of ``generate`` included.

Routes: residual capture and additive steering through plain hooks,
nnsight 0.8 (and so NDIF remote execution) and TransformerLens 4's ``TransformerBridge``;
steered generation (``route_for(name).generate(Decode(...))``) through plain hooks and nnsight.

``tests/test_routes.py`` checks the three agree with each other and with
``output_hidden_states`` to 1e-4 on tiny random models. Typical use, from the capture engine:

>>> from valueprobe.hooks.route import residuals
>>> acts = residuals(lm, batch.input_ids, batch.attention_mask, layers=[6, -1], site="resid_post",
...                  include_embed=True, route="nnsight")
>>> acts[6].shape, acts["embed"].shape        # float32, CPU: [batch, pos, d_model]

Conventions (TransformerLens's): ``resid_pre[L]`` is the input of decoder block L,
``resid_post[L]`` its raw output, so ``resid_post[L] == resid_pre[L+1]`` and the last
``resid_post`` is *before* the final norm (unlike HF's last ``hidden_states``). ``"embed"``
is ``resid_pre[0]``. Values at padded positions are unspecified: routes differ there
(eager vs SDPA attention over fully masked rows); read only where ``attention_mask`` is 1.

Positions: with ``position_ids=None`` every route is given
``position_ids_from_mask(attention_mask)`` (each row counted from its first real token, as in
``generate``), so left- and right-padded batches give the unpadded activations. Left alone,
the three would disagree: an HF forward counts 0..pos-1 whatever the mask, while nnsight and
the bridge each derive positions from a left-padded mask.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.addition import steering_delta
from valueprobe.hooks.decode import Addition, Additions, Decode, Plan
from valueprobe.hooks.forward import (
    Forward,
    Read,
    Reduce,
    as_output,
    check_inputs,
    position_ids_from_mask,
)
from valueprobe.hooks.patch import Handle, Intervention, Point, Recording, Step, intervene, record
from valueprobe.vocab import RouteName, Site, layer_out_of_range

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = [
    "ROUTES",
    "Addition",
    "Additions",
    "Decode",
    "Handle",
    "Intervention",
    "Plan",
    "Point",
    "Recording",
    "Route",
    "RouteName",
    "Site",
    "Step",
    "intervene",
    "position_ids_from_mask",
    "record",
    "residuals",
    "route_for",
    "steered_logits",
]


@runtime_checkable
class Route(Protocol):
    """What each route implements: one forward that reads, one that steers, and a steered generate.

    ``read`` and ``steered_logits`` get the pass as a `Forward` record (batch, explicit positions,
    ``remote``), already checked by `residuals` / `steered_logits`: blocks are 0-based, reads are
    ``(block, reads the block's input?)`` in execution order, and only the nnsight route is ever
    given ``remote``. ``reduce`` is applied to each ``[batch, pos, d_model]`` read, inside the hook
    where the route can.

    ``generate`` runs one batched, steered ``generate`` described by a `Decode` record (the
    steering as data and as Python hooks; each route takes the form it can run) and returns the
    token ids, prompt then new tokens. A route that cannot generate, or cannot run what the record
    asks (a ``live`` run on a graph route), raises one `ValueprobeError` naming the routes that can.
    """

    name: str

    def read(self, fwd: Forward, reads: Sequence[Read], reduce: Reduce | None) -> dict[Read, Tensor]: ...

    def steered_logits(
        self, fwd: Forward, at: Read, delta: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos vocab"]: ...

    def generate(self, run: Decode) -> Int[Tensor, "batch seq"]: ...


# The registry: route name -> (module, class). Imported on first use: nnsight and
# TransformerLens take seconds to import and most runs never touch them.
_ROUTES: dict[str, tuple[str, str]] = {
    RouteName.hooks: ("valueprobe.hooks.hooks_route", "HooksRoute"),
    RouteName.nnsight: ("valueprobe.hooks.nnsight_route", "NnsightRoute"),
    RouteName.tlens: ("valueprobe.hooks.tlens_route", "TlensRoute"),
}
_LOADED: dict[str, Route] = {}
ROUTES: tuple[str, ...] = tuple(_ROUTES)


def route_for(route: str, *, remote: bool | str = False) -> Route:
    """The `Route` registered under ``route``; one clear error for an unknown name or a bad remote."""
    if route not in _ROUTES:
        raise ValueprobeError(f"unknown route {route!r}: use one of {', '.join(ROUTES)}")
    if remote and route != RouteName.nnsight:
        raise ValueprobeError(
            f"remote execution (NDIF) goes through nnsight: use route='nnsight', not {route!r}"
        )
    if route not in _LOADED:
        module, cls = _ROUTES[route]
        _LOADED[route] = getattr(importlib.import_module(module), cls)()
    return _LOADED[route]


def plan_reads(
    lm: LoadedModel, layers: Sequence[int], site: Site | str, include_embed: bool
) -> tuple[dict[int, int], list[Read]]:
    """The block of each requested layer (keyed as given, so -1 stays -1), and the reads in
    execution order: block by block, a block's input before its output. nnsight must be read in
    that order, and the hooks route stops the forward after the last read.

    Layer specs were parsed and resolved upstream (`valueprobe.vocab.LayerSelection`); here plain
    indices are only bounds-checked, as Python indexes the block list.
    """
    n = lm.n_layers
    for layer in layers:
        if not -n <= int(layer) < n:
            raise layer_out_of_range(int(layer), n)
    blocks = {int(layer): int(layer) % n for layer in layers}
    wanted = {(b, site == "resid_pre") for b in blocks.values()} | ({(0, True)} if include_embed else set())
    return blocks, sorted(wanted, key=lambda r: (r[0], not r[1]))


def residuals(
    lm: LoadedModel,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    *,
    layers: Sequence[int],
    site: Site | str,
    include_embed: bool = False,
    route: RouteName | str = RouteName.hooks,
    position_ids: Int[Tensor, "batch pos"] | None = None,
    remote: bool | str = False,
    reduce: Reduce | None = None,
) -> dict[int | str, Float[Tensor, "batch pos d_model"]]:
    """Residual-stream activations at ``site`` for each of ``layers``, in one forward pass.

    Args:
        lm: the loaded model (``valueprobe.model.load.load`` / ``wrap``).
        input_ids, attention_mask: the padded batch, left or right padded.
        layers: 0-based decoder blocks; negative counts from the end. The result is keyed
            by the values given (so ``-1`` stays ``-1``).
        site: ``"resid_pre"`` (block input) or ``"resid_post"`` (block output).
        include_embed: also return ``"embed"``, the embedding output (== ``resid_pre[0]``).
        route: ``"hooks"`` (plain forward hooks), ``"nnsight"`` or ``"tlens"``.
        position_ids: explicit positions; None means `position_ids_from_mask(attention_mask)`.
        remote: nnsight only. ``True`` runs the trace on NDIF against the checkpoint named
            ``lm.model_id`` (needs an NDIF API key and network); ``"local"`` serializes it as
            for NDIF but runs here; a URL string picks another NDIF host.
        reduce: applied to each ``[batch, pos, d_model]`` tensor (e.g. capture's token
            selection). The hooks route applies it inside the hook, so the full tensor is never
            kept; the other routes apply it to what they return.

    Returns:
        ``{layer: tensor}`` (plus ``"embed"``), each float32, detached, on the CPU, ``[batch, pos, d_model]``.

    >>> acts = residuals(lm, ids, mask, layers=[0, -1], site="resid_post", route="tlens")
    """
    check_inputs(input_ids, attention_mask, position_ids, site)
    impl = route_for(route, remote=remote)
    positions = position_ids_from_mask(attention_mask) if position_ids is None else position_ids
    blocks, reads = plan_reads(lm, layers, site, include_embed)
    got = impl.read(Forward(lm, input_ids, attention_mask, positions, remote), reads, reduce)
    out: dict[int | str, Tensor] = {
        key: as_output(got[(b, site == "resid_pre")]) for key, b in blocks.items()
    }
    if include_embed:
        out["embed"] = as_output(got[(0, True)])
    return out


def steered_logits(
    lm: LoadedModel,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    *,
    layer: int,
    vector: Float[Tensor, " d_model"],
    alpha: float | Float[Tensor, " batch"] = 1.0,
    site: Site | str = Site.resid_post,
    positions: Bool[Tensor, "batch pos"] | None = None,
    route: RouteName | str = RouteName.hooks,
    position_ids: Int[Tensor, "batch pos"] | None = None,
    remote: bool | str = False,
) -> Float[Tensor, "batch pos vocab"]:
    """Logits of one forward pass with ``h += alpha * vector`` at (``layer``, ``site``).

    The intervention the steering module builds on, here so all three routes can be
    checked against each other. ``vector`` is used as given (normalize it yourself).

    Args:
        layer: the decoder block (negative counts from the end).
        vector: the direction to add, ``[d_model]``.
        alpha: one scale, or one per row ``[batch]``.
        site: add to the block's input (``"resid_pre"``) or output (``"resid_post"``).
        positions: boolean ``[batch, pos]``, where to add; None adds at every position.
        route, position_ids, remote: as in `residuals`.

    Returns:
        float32 CPU logits ``[batch, pos, vocab]``.

    >>> base = steered_logits(lm, ids, mask, layer=6, vector=v, alpha=0.0)
    >>> up = steered_logits(lm, ids, mask, layer=6, vector=v, alpha=4.0, route="nnsight")
    """
    check_inputs(input_ids, attention_mask, position_ids, site)
    impl = route_for(route, remote=remote)
    batch, pos = input_ids.shape
    param = next(lm.model.parameters())
    # For NDIF the local model may be a meta skeleton; the trace casts the delta on the server.
    dtype, device = (torch.float32, torch.device("cpu")) if remote else (param.dtype, param.device)
    delta = steering_delta(vector, alpha, positions, (batch, pos), dtype=dtype, device=device)
    fixed = position_ids_from_mask(attention_mask) if position_ids is None else position_ids
    _, (at,) = plan_reads(lm, [layer], site, include_embed=False)
    return impl.steered_logits(Forward(lm, input_ids, attention_mask, fixed, remote), at, delta)
