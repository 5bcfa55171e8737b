"""Direct attribution: the axis projection at the read layer, split into the terms that write it.

    >>> from valueprobe.attribute.direct import Projector, direct_rows
    >>> proj = Projector.build(lm, axis.direction(22), layer=22, random=random_directions(576, 32))
    >>> got = direct_rows(lm, proj, encode(lm, examples, positions="spans"), batch_size=8)
    >>> got.contributions.shape                      # [rows, terms, 1 + 32]: axis, then each random direction
    >>> got.contributions[..., 0].sum(1) - got.total[:, 0]    # ~1e-6: the terms sum to h_L·v̂

``resid_post[L]`` is the embedding plus every head's ``z_h @ W_O[h]``, output bias and MLP output of
blocks 0..L (`valueprobe.attribute.components.direct_terms`), so ``h_L·v̂`` splits into their
projections exactly. One forward per batch: hooks on each block's ``attn_z`` (the output
projection's input) and ``mlp_out`` reduce to the chosen token rows inside the forward, which
stops after block L; each head's projection is then ``z_h · (W_O[h] v̂)``, a dot product per row.
The same terms are projected on random unit directions too (columns 1..R), the null of each term.
Projections are summed in float64; the residual itself was summed by the model in its own dtype,
so the terms meet ``h_L·v̂`` within that dtype's rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.activations.capture import Rows, iter_batches, reduce_batch
from valueprobe.activations.encode import Encoded
from valueprobe.attribute.components import Component, direct_terms
from valueprobe.hooks.padding import pad_id_for
from valueprobe.hooks.patch import Point, StopForward, record
from valueprobe.model.load import LoadedModel
from valueprobe.model.parts import head_weights
from valueprobe.vocab import HookSite, PaddingSide, PartSite

__all__ = ["DirectRows", "Projector", "direct_rows"]


@dataclass(frozen=True)
class Projector:
    """The directions direct attribution projects on, carried through each block's W_O.

    ``directions`` is ``[1 + R, d_model]`` (row 0 the axis's unit direction at ``layer``, then R
    random unit directions); ``heads[b]`` is ``W_O[h] @ directions.T`` of block b (``[heads,
    d_head, 1 + R]``) and ``biases[b]`` its output bias's projections (None without one).
    """

    layer: int
    terms: tuple[Component, ...]
    directions: Float[Tensor, "k d_model"]
    heads: tuple[Float[Tensor, "head d_head k"], ...]
    biases: tuple[Float[Tensor, " k"] | None, ...]

    @classmethod
    def build(cls, lm: LoadedModel, axis: Tensor, *, layer: int, random: np.ndarray) -> Projector:
        """For the axis direction ``axis`` [d_model] at ``layer``, and ``random`` [R, d_model] unit rows."""
        d = torch.cat([axis.double().reshape(1, -1), torch.from_numpy(np.asarray(random, np.float64))])
        d = d / d.norm(dim=1, keepdim=True)
        heads, biases = [], []
        for block in range(layer + 1):
            w, b = head_weights(lm, block)
            heads.append(torch.einsum("hdm,km->hdk", w.double().cpu(), d))
            biases.append(None if b is None else b.double().cpu() @ d.T)
        return cls(layer, direct_terms(lm, layer), d, tuple(heads), tuple(biases))

    @property
    def width(self) -> int:
        """1 + R: the axis and the random directions."""
        return int(self.directions.shape[0])


@dataclass(frozen=True)
class DirectRows:
    """Per-row terms of a batch of examples: ``contributions`` ``[rows, terms, 1 + R]`` (float64,
    the raw projections ``term·direction``) and ``total`` ``[rows, 1 + R]``, the residual's."""

    rows: Rows
    contributions: Float[Tensor, "row term k"]
    total: Float[Tensor, "row k"]

    @staticmethod
    def concat(parts: Sequence[DirectRows]) -> DirectRows:
        return DirectRows(
            Rows.concat([p.rows for p in parts]),
            torch.cat([p.contributions for p in parts]),
            torch.cat([p.total for p in parts]),
        )


def _points(layer: int) -> list[Point]:
    blocks = range(layer + 1)
    return [
        Point(0, HookSite.resid_pre),
        *(Point(b, PartSite.attn_z) for b in blocks),
        *(Point(b, HookSite.mlp_out) for b in blocks),
        Point(layer, HookSite.resid_post),
    ]


def _project(proj: Projector, got: dict[Point, Tensor]) -> tuple[Tensor, Tensor]:
    """The [rows, terms, k] projections and the [rows, k] total from one batch's reduced reads."""
    d = proj.directions
    cols = [got[Point(0, HookSite.resid_pre)].double() @ d.T]
    for block in range(proj.layer + 1):
        w = proj.heads[block]  # [heads, d_head, k]
        z = got[Point(block, PartSite.attn_z)].double()
        cols += list(torch.einsum("rhd,hdk->rhk", z.reshape(z.shape[0], *w.shape[:2]), w).unbind(1))
        bias = proj.biases[block]
        if bias is not None:  # a constant per token, so also per mean of tokens
            cols.append(bias.expand(z.shape[0], -1))
        cols.append(got[Point(block, HookSite.mlp_out)].double() @ d.T)
    return torch.stack(cols, dim=1), got[Point(proj.layer, HookSite.resid_post)].double() @ d.T


def direct_rows(
    lm: LoadedModel,
    proj: Projector,
    encoded: Sequence[Encoded],
    *,
    batch_size: int = 8,
    padding_side: PaddingSide = PaddingSide.right,
) -> DirectRows:
    """The terms of every row of ``encoded`` (rows as capture selects them), one forward per batch."""
    parts = []
    points = _points(proj.layer)
    device = lm.device
    for batch in iter_batches(
        encoded, batch_size=batch_size, padding_side=padding_side, pad_id=pad_id_for(lm.tokenizer)
    ):
        on = batch.selection_on(device)
        with (
            record(lm, points, reduce=partial(reduce_batch, batch=on), stop=True) as rec,
            torch.no_grad(),
            suppress(StopForward),
        ):
            lm.model(
                input_ids=on.input_ids.to(device),
                attention_mask=on.attention_mask.to(device),
                position_ids=on.position_ids.to(device),
                use_cache=False,
            )
        contributions, total = _project(proj, {p: rec[p] for p in points})
        parts.append(DirectRows(batch.rows, contributions, total))
    return DirectRows.concat(parts)
