"""Token rows into one padded batch: the pad id, and left or right padding with its mask.

    >>> from valueprobe.hooks.padding import pad_id_for, pad_rows
    >>> ids, mask = pad_rows([[5, 6, 7], [8]], pad_id=pad_id_for(lm.tokenizer), side="left")
    >>> mask
    tensor([[1, 1, 1],
            [0, 0, 1]])

Capture pads left or right (`valueprobe.activations.capture`), generation left, so that every
row's last prompt token sits in the last column and ``generate`` appends after it; P(yes) pads
right, so that real tokens keep positions 0..n-1 and never attend to a pad. Pad cells are masked
out, so the pad id only has to be a valid token: the tokenizer's pad token, else its EOS, else 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

__all__ = ["Side", "pad_id_for", "pad_rows"]

Side = Literal["left", "right"]


def pad_id_for(tokenizer: Any) -> int:
    """The id padding cells get: the tokenizer's pad token, else its EOS token, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return 0 if pad is None else int(pad)


def pad_rows(
    rows: Sequence[Sequence[int]], *, pad_id: int, side: Side | str
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Token ids ``[batch, pos]`` padded to the longest row with ``pad_id``, and the attention mask.

    Args:
        rows: the token ids of each row (at least one row, none empty).
        pad_id: the id of the padding cells (`pad_id_for`).
        side: ``"left"`` (each row ends in the last column) or ``"right"`` (each starts in the first).

    >>> pad_rows([[5, 6], [7]], pad_id=0, side="right")
    (tensor([[5, 6], [7, 0]]), tensor([[1, 1], [1, 0]]))
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        start = width - len(r) if side == "left" else 0
        ids[i, start : start + len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, start : start + len(r)] = 1
    return ids, mask
