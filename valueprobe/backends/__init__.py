"""Three backends, one answer: residual capture and additive steering through plain hooks,
nnsight 0.8 (and so NDIF remote execution) and TransformerLens 4's ``TransformerBridge``.

``tests/test_backends.py`` checks the three agree with each other and with
``output_hidden_states`` to 1e-4 on tiny random models. Typical use, from the capture engine:

>>> from valueprobe.backends import residuals
>>> acts = residuals(lm, batch.input_ids, batch.attention_mask, layers=[6, -1], site="resid_post",
...                  include_embed=True, backend="nnsight")
>>> acts[6].shape, acts["embed"].shape        # float32, CPU: [batch, pos, d_model]

Conventions (TransformerLens's): ``resid_pre[L]`` is the input of decoder block L,
``resid_post[L]`` its raw output, so ``resid_post[L] == resid_pre[L+1]`` and the last
``resid_post`` is *before* the final norm (unlike HF's last ``hidden_states``). ``"embed"``
is ``resid_pre[0]``. Values at padded positions are unspecified: backends differ there
(eager vs SDPA attention over fully masked rows); read only where ``attention_mask`` is 1.

Positions: with ``position_ids=None`` every backend is given
``position_ids_from_mask(attention_mask)`` (each row counted from its first real token, as in
``generate``), so left- and right-padded batches give the unpadded activations. Left alone,
the three would disagree: an HF forward counts 0..pos-1 whatever the mask, while nnsight and
the bridge each derive positions from a left-padded mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from valueprobe.backends._shared import (
    as_output,
    check_inputs,
    plan_reads,
    position_ids_from_mask,
    steering_delta,
)
from valueprobe.errors import ValueprobeError
from valueprobe.vocab import Backend, LayerKey, Site

if TYPE_CHECKING:
    from valueprobe.models import LoadedModel

BACKENDS: tuple[str, ...] = tuple(Backend)

__all__ = ["BACKENDS", "Backend", "Site", "position_ids_from_mask", "residuals", "steered_logits"]


def _check_backend(backend: str, remote: bool | str) -> None:
    if backend not in BACKENDS:
        raise ValueprobeError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if remote and backend != "nnsight":
        raise ValueprobeError(
            f"remote execution (NDIF) goes through nnsight: use backend='nnsight', not {backend!r}"
        )


def residuals(
    lm: LoadedModel,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    *,
    layers: Sequence[int],
    site: Site,
    include_embed: bool = False,
    backend: Backend = Backend.hooks,
    position_ids: Int[Tensor, "batch pos"] | None = None,
    remote: bool | str = False,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> dict[LayerKey, Float[Tensor, "batch pos d_model"]]:
    """Residual-stream activations at ``site`` for each of ``layers``, in one forward pass.

    Args:
        lm: the loaded model (``valueprobe.models.load`` / ``wrap``).
        input_ids, attention_mask: the padded batch, left or right padded.
        layers: 0-based decoder blocks; negative counts from the end. The result is keyed
            by the values given (so ``-1`` stays ``-1``).
        site: ``"resid_pre"`` (block input) or ``"resid_post"`` (block output).
        include_embed: also return ``"embed"``, the embedding output (== ``resid_pre[0]``).
        backend: ``"hooks"`` (plain forward hooks), ``"nnsight"`` or ``"tlens"``.
        position_ids: explicit positions; None means `position_ids_from_mask(attention_mask)`.
        remote: nnsight only. ``True`` runs the trace on NDIF against the checkpoint named
            ``lm.model_id`` (needs an NDIF API key and network); ``"local"`` serializes it as
            for NDIF but runs here; a URL string picks another NDIF host.
        reduce: applied to each ``[batch, pos, d_model]`` tensor (e.g. capture's token
            selection). The hooks route applies it inside the hook, so the full tensor is never
            kept; the other routes apply it to what they return.

    Returns:
        ``{layer: tensor}`` (plus ``"embed"``), each float32, detached, on the CPU, ``[batch, pos, d_model]``.

    >>> acts = residuals(lm, ids, mask, layers=[0, -1], site="resid_post", backend="tlens")
    """
    check_inputs(input_ids, attention_mask, position_ids, site)
    _check_backend(backend, remote)
    positions = position_ids_from_mask(attention_mask) if position_ids is None else position_ids
    blocks, reads = plan_reads(lm, layers, site, include_embed)
    if backend == "hooks":
        from valueprobe.backends import hooks

        got = hooks.read(lm, input_ids, attention_mask, reads=reads, position_ids=positions, reduce=reduce)
    else:
        if backend == "nnsight":
            from valueprobe.backends import nnsight_backend

            got = nnsight_backend.read(
                lm, input_ids, attention_mask, reads=reads, position_ids=positions, remote=remote
            )
        else:
            from valueprobe.backends import tlens_backend

            got = tlens_backend.read(lm, input_ids, attention_mask, reads=reads, position_ids=positions)
        if reduce is not None:
            got = {r: reduce(h) for r, h in got.items()}
    out: dict[LayerKey, Tensor] = {key: as_output(got[(b, site == "resid_pre")]) for key, b in blocks.items()}
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
    site: Site = Site.resid_post,
    positions: Bool[Tensor, "batch pos"] | None = None,
    backend: Backend = Backend.hooks,
    position_ids: Int[Tensor, "batch pos"] | None = None,
    remote: bool | str = False,
) -> Float[Tensor, "batch pos vocab"]:
    """Logits of one forward pass with ``h += alpha * vector`` at (``layer``, ``site``).

    The intervention the steering module builds on, here so all three backends can be
    checked against each other. ``vector`` is used as given (normalize it yourself).

    Args:
        layer: the decoder block (negative counts from the end).
        vector: the direction to add, ``[d_model]``.
        alpha: one scale, or one per row ``[batch]``.
        site: add to the block's input (``"resid_pre"``) or output (``"resid_post"``).
        positions: boolean ``[batch, pos]``, where to add; None adds at every position.
        backend, position_ids, remote: as in `residuals`.

    Returns:
        float32 CPU logits ``[batch, pos, vocab]``.

    >>> base = steered_logits(lm, ids, mask, layer=6, vector=v, alpha=0.0)
    >>> up = steered_logits(lm, ids, mask, layer=6, vector=v, alpha=4.0, backend="nnsight")
    """
    check_inputs(input_ids, attention_mask, position_ids, site)
    _check_backend(backend, remote)
    batch, pos = input_ids.shape
    param = next(lm.model.parameters())
    # For NDIF the local model may be a meta skeleton; the trace casts the delta on the server.
    dtype, device = (torch.float32, torch.device("cpu")) if remote else (param.dtype, param.device)
    delta = steering_delta(vector, alpha, positions, (batch, pos), dtype=dtype, device=device)
    fixed = position_ids_from_mask(attention_mask) if position_ids is None else position_ids
    (block,) = plan_reads(lm, [layer], site, include_embed=False)[0].values()
    if backend == "hooks":
        from valueprobe.backends import hooks

        return hooks.steered_logits(
            lm, input_ids, attention_mask, block=block, site=site, delta=delta, position_ids=fixed
        )
    if backend == "nnsight":
        from valueprobe.backends import nnsight_backend

        return nnsight_backend.steered_logits(
            lm,
            input_ids,
            attention_mask,
            block=block,
            site=site,
            delta=delta,
            position_ids=fixed,
            remote=remote,
        )
    from valueprobe.backends import tlens_backend

    return tlens_backend.steered_logits(
        lm, input_ids, attention_mask, block=block, site=site, delta=delta, position_ids=fixed
    )
