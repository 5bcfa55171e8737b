"""Batched decoding over one KV cache that rows can leave and roll back in: guided decoding's loop.

    >>> dec = CachedDecoder(lm, [[5, 6, 7], [8, 9]], pad_id=0)
    >>> logits = dec.prefill()                  # [rows, vocab] at each prompt's last token
    >>> logits = dec.step(torch.tensor([11, 12]))  # feed one token per row
    >>> dec.unfeed(1, 2)                        # row 1 forgets its last 2 fed tokens
    >>> dec.keep([1])                           # row 0 leaves the batch (pruned or finished)

Why not ``generate``: pruning drops rows mid-run and rollback takes tokens back, both per row.
``keep`` selects the rows of the cache (`DynamicCache.batch_select_indices`), so a dropped row costs
nothing after it goes. ``unfeed`` masks a row's last cells out of the attention; whenever the
trailing columns are masked in every row they are cropped off the cache (`DynamicCache.crop`),
so a batch of one row, or rows that roll back together, get a true crop. Either way the next
logits equal a fresh forward over the kept prefix (tests/test_guide.py): positions are counted
over the unmasked cells (as ``generate`` counts them over left padding), so a masked hole shifts
nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers import DynamicCache

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_rows
from valueprobe.model.load import LoadedModel

__all__ = ["CachedDecoder"]


class CachedDecoder:
    """One batch of rows decoding over a `DynamicCache` (see the module doc).

    Attributes:
        mask: ``[rows, columns]`` attention mask over every column the cache holds.
        rows: each batch row's index among the rows first given (rows leave through `keep`).
    """

    def __init__(self, lm: LoadedModel, prompts: Sequence[Sequence[int]], *, pad_id: int) -> None:
        ids, mask = pad_rows(prompts, pad_id=pad_id, side="left")
        self.lm = lm
        self.device = lm.device
        self.ids = ids.to(self.device)
        self.mask = mask.to(self.device)
        self.rows = list(range(len(prompts)))
        self.cache = DynamicCache(config=lm.model.config)
        # transformers 5.24 renamed the forward's past_key_values to cache (the old name warns)
        self.cache_key = (
            "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"
        )

    def prefill(self) -> Float[Tensor, "rows vocab"]:
        """Run the prompts; the logits at each row's last prompt token."""
        return self._forward(self.ids)

    def step(self, tokens: Int[Tensor, " rows"]) -> Float[Tensor, "rows vocab"]:
        """Feed one token per row (tokens on the model's device feed without a copy); the logits at it."""
        ones = torch.ones(len(self.rows), 1, dtype=self.mask.dtype, device=self.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        if tokens.device != self.device:  # guided decoding's loop keeps them there: no copy a step
            tokens = tokens.to(self.device)
        return self._forward(tokens.reshape(-1, 1))

    def _forward(self, ids: Int[Tensor, "rows new"]) -> Float[Tensor, "rows vocab"]:
        # a cell's position counts the real cells before it: left padding and rolled-back holes add none
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        cache = {self.cache_key: self.cache}
        with torch.no_grad():
            out = self.lm.model(
                input_ids=ids, attention_mask=self.mask, position_ids=positions, use_cache=True, **cache
            )
        returned = [getattr(out, key, None) for key in ("cache", "past_key_values")]
        if not any(c is self.cache for c in returned):
            raise ValueprobeError(
                f"{self.lm.model_id} returns no KV cache from its forward: guided decoding steps on one"
                " (and rollback crops it); use a model transformers runs with a cache"
            )
        return out.logits[:, -1].float()

    def croppable(self) -> bool:
        """Whether `unfeed` can put the cache back as it was (no sliding window, no recurrent state)."""
        return bool(getattr(self.cache, "is_croppable", False))

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows (indices into the current batch), in this order."""
        if list(rows) == list(range(len(self.rows))):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.rows = [self.rows[i] for i in rows]

    def unfeed(self, row: int, n: int) -> None:
        """Take back the last ``n`` fed cells of batch row ``row`` (prompt cells included, if asked).

        Raises:
            ValueprobeError: the cache cannot be cropped (a sliding-window or recurrent cache), or
                the row has fewer than ``n`` real cells.
        """
        if not self.croppable():
            raise ValueprobeError(
                f"rollback needs a KV cache that can be cropped, and {self.lm.model_id}'s"
                f" ({type(self.cache).__name__} with {_layer_kinds(self.cache)}) cannot: use best-of-n or prune"
            )
        real = torch.nonzero(self.mask[row]).flatten()
        if n > real.numel():
            raise ValueprobeError(f"cannot take back {n} cells of a row that holds {real.numel()}")
        if n > 0:
            self.mask[row, real[-n:]] = 0
        alive = self.mask.any(dim=0)
        dead = int(alive.shape[0] - (torch.nonzero(alive).max() + 1)) if bool(alive.any()) else 0
        if dead > 0:
            self.cache.crop(-dead)
            self.mask = self.mask[:, :-dead]


def _layer_kinds(cache: DynamicCache) -> str:
    kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])})
    return ", ".join(kinds) or "no layers"
