"""The reference route: plain PyTorch forward hooks, through the public hook layer (`patch`).

The nnsight and TransformerLens routes are tested against this one (and this one against
``output_hidden_states``). Selected with ``backend="hooks"``:

>>> from valueprobe.backends import residuals
>>> acts = residuals(lm, ids, mask, layers=[3, -1], site="resid_post", backend="hooks")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.backends._shared import Read, as_output, forward_kwargs
from valueprobe.backends.patch import Point, StopForward, intervene, record
from valueprobe.vocab import Site

if TYPE_CHECKING:
    from valueprobe.models import LoadedModel


def _point(read: Read) -> Point:
    block, is_input = read
    return Point(block, Site.resid_pre if is_input else Site.resid_post)


class HooksRoute:
    """Plain forward hooks on the loaded model itself (`valueprobe.backends.Route`)."""

    name = "hooks"

    def read(
        self,
        lm: LoadedModel,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"],
        *,
        reads: Sequence[Read],
        position_ids: Int[Tensor, "batch pos"],
        reduce: Callable[[Tensor], Tensor] | None = None,
        remote: bool | str = False,
    ) -> dict[Read, Tensor]:
        """The residual at each read in one forward; the last read stops it (no unembed).

        ``reduce`` runs inside the hook (capture's token selection), so only its result is kept.
        """
        points = [_point(r) for r in reads]
        device = lm.device
        with record(lm, points, reduce=reduce, stop=True) as rec, torch.no_grad(), suppress(StopForward):
            lm.model(input_ids=input_ids.to(device), **forward_kwargs(attention_mask, position_ids, device))
        return {r: rec[p] for r, p in zip(reads, points, strict=True)}

    def steered_logits(
        self,
        lm: LoadedModel,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"],
        *,
        block: int,
        site: Site,
        delta: Float[Tensor, "batch pos d_model"],
        position_ids: Int[Tensor, "batch pos"],
        remote: bool | str = False,
    ) -> Float[Tensor, "batch pos vocab"]:
        """Logits with ``delta`` added to the residual at (block, site). See `backends.steered_logits`."""
        param = next(lm.model.parameters())
        delta = delta.to(device=param.device, dtype=param.dtype)
        with intervene(lm, Point(block, site), lambda h, step: h + delta), torch.no_grad():
            output = lm.model(
                input_ids=input_ids.to(param.device),
                **forward_kwargs(attention_mask, position_ids, param.device),
            )
        return as_output(output.logits)
