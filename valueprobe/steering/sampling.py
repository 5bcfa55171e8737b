"""Sampling with common random numbers: each row draws from its own generator, whatever its batch.

A steering sweep compares strengths on the same (prompt, sample) with the same random numbers,
so a difference between two strengths comes from the steering, not from the dice. `RowSampler`
is a ``transformers`` logits processor: every step each row takes exactly one uniform from its
own ``torch.Generator`` (seeded by `row_seed`) and inverts its own CDF, so a row's draws do not
depend on which rows share its batch or chunk. It hands ``generate`` a one-hot score, so
``generate`` runs greedy on top of it (``do_sample=False``).

    >>> sampler = RowSampler([row_seed(0, p, s) for p, s in rows], temperature=0.8, top_p=0.95)
    >>> lm.model.generate(ids, attention_mask=mask, do_sample=False, logits_processor=[sampler])
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.errors import ValueprobeError

__all__ = ["RowSampler", "row_seed"]


def row_seed(seed: int, prompt: int, sample: int) -> int:
    """The seed of one (prompt, sample): shared by every strength and direction of a sweep.

    >>> row_seed(0, 3, 1) == row_seed(0, 3, 1) != row_seed(0, 3, 2)
    True
    """
    return int(np.random.SeedSequence([seed, prompt, sample]).generate_state(1, dtype=np.uint64)[0] >> 1)


class RowSampler:
    """Temperature / top-p sampling, one generator per row (a ``LogitsProcessor``).

    Args:
        seeds: one seed per batch row, in row order.
        temperature: > 0; divides the logits.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (1.0: all).
    """

    def __init__(self, seeds: Sequence[int], *, temperature: float = 1.0, top_p: float = 1.0) -> None:
        if not temperature > 0:
            raise ValueprobeError(f"temperature must be > 0, got {temperature}: use greedy decoding for 0")
        if not 0 < top_p <= 1:
            raise ValueprobeError(f"top_p must be in (0, 1], got {top_p}")
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature = temperature
        self.top_p = top_p

    def rows(self, index: Sequence[int]) -> RowSampler:
        """A sampler over some of these rows (in ``index`` order) sharing their generators, so each
        kept row's draws go on as if nothing had left (guided decoding drops rows mid-run)."""
        out = copy.copy(self)
        out.generators = [self.generators[i] for i in index]
        return out

    def draw(self) -> Float[Tensor, " batch"]:
        """One uniform per row, from the row's own generator."""
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])

    def sample(self, scores: Float[Tensor, "batch vocab"]) -> Int[Tensor, " batch"]:
        """The token each row draws from its distribution, by inverse CDF at its uniform."""
        if scores.shape[0] != len(self.generators):
            raise ValueprobeError(f"{scores.shape[0]} rows but {len(self.generators)} seeds")
        probs = torch.softmax(scores.double() / self.temperature, dim=-1)
        ranked, order = probs.sort(dim=-1, descending=True, stable=True)
        cdf = ranked.cumsum(-1)
        if self.top_p < 1:
            keep = (cdf - ranked) < self.top_p  # the first token is always kept
            ranked = ranked * keep
            cdf = ranked.cumsum(-1)
        u = self.draw().to(cdf.device) * cdf[:, -1]
        pick = torch.searchsorted(cdf, u[:, None]).clamp(max=cdf.shape[1] - 1)
        return order.gather(1, pick).squeeze(1)

    def __call__(self, input_ids: Int[Tensor, "batch pos"], scores: Float[Tensor, "batch vocab"]) -> Tensor:
        token = self.sample(scores)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, token[:, None].to(out.device), 0.0)
        return out
