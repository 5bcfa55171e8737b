"""Sampling with common random numbers: each row draws from its own generator, whatever its batch.

A steering sweep compares strengths on the same (prompt, sample) with the same random numbers,
so a difference between two strengths comes from the steering, not from the dice. `RowSampler`
is a ``transformers`` logits processor: every step each row takes exactly one uniform from its
own ``torch.Generator`` (seeded by `row_seed`) and inverts its own CDF, so a row's draws do not
depend on which rows share its batch or chunk. It hands ``generate`` a one-hot score, so
``generate`` runs greedy on top of it (``do_sample=False``).

    >>> sampler = RowSampler([row_seed(0, p, s) for p, s in rows], temperature=0.8, top_p=0.95)
    >>> lm.model.generate(ids, attention_mask=mask, do_sample=False, logits_processor=[sampler])

`Decoding` is how a call draws its tokens (samples, seed, lengths, greedy or temperature and
top-p): ``vp.generate``, ``vp.guide`` and the sweep take one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from valueprobe.errors import ValueprobeError

__all__ = ["BLOCK", "Decoding", "RowSampler", "row_seed"]

BLOCK = 32  # uniforms drawn per row at a time for `RowSampler.__call__` (one host copy per block)


@dataclass(frozen=True)
class Decoding:
    """How tokens are drawn.

    Attributes:
        max_new_tokens: > 0. min_new_tokens: EOS is blocked before this many (fixed-length benchmarks).
        samples: samples per (prompt, α); seed: the base seed of every row's generator
            (`row_seed(seed, prompt, sample)`: common random numbers across strengths).
        greedy: argmax decoding (then samples are identical); temperature > 0 and top_p in (0, 1]
            shape sampling otherwise.

    >>> vp.generate(lm, axis, prompts, alphas=[-2, 0, 2], decoding=Decoding(greedy=True, max_new_tokens=12))
    """

    max_new_tokens: int = 48
    min_new_tokens: int = 0
    samples: int = 1
    seed: int = 0
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0


def row_seed(seed: int, prompt: int, sample: int) -> int:
    """The seed of one (prompt, sample): shared by every strength and direction of a sweep.

    >>> row_seed(0, 3, 1) == row_seed(0, 3, 1) != row_seed(0, 3, 2)
    True
    """
    return int(np.random.SeedSequence([seed, prompt, sample]).generate_state(1, dtype=np.uint64)[0] >> 1)


class RowSampler:
    """Temperature / top-p sampling, one generator per row (a ``LogitsProcessor``).

    Which token a uniform picks is defined by the full sort (`_by_full_sort`: the vocabulary by
    probability, descending, ties by token id, and the inverse CDF of its running sum). Sorting
    49k float64 probabilities per row per step was most of the sampler's cost, so each row first
    tries its ``shortlist`` most likely tokens (`_by_shortlist`) and keeps that pick only where it
    provably equals the full sort's; the other rows take the full sort. Committed sampled results
    therefore stay valid, bit for bit.

    Args:
        seeds: one seed per batch row, in row order.
        temperature: > 0; divides the logits.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (1.0: all).
        shortlist: how many of the most likely tokens to try before sorting the whole vocabulary.
    """

    def __init__(
        self, seeds: Sequence[int], *, temperature: float = 1.0, top_p: float = 1.0, shortlist: int = 64
    ) -> None:
        if not temperature > 0:
            raise ValueprobeError(f"temperature must be > 0, got {temperature}: use greedy decoding for 0")
        if not 0 < top_p <= 1:
            raise ValueprobeError(f"top_p must be in (0, 1], got {top_p}")
        if shortlist < 1:
            raise ValueprobeError(f"shortlist must be >= 1, got {shortlist}")
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature = temperature
        self.top_p = top_p
        self.shortlist = shortlist
        self.full_sorts = 0  # rows that needed the full sort, for benchmarks and tests
        # `__call__`'s uniforms, drawn BLOCK per row at a time and copied to the device once per
        # block (a host copy every step makes a GPU wait; issue 27). rand(k) on a CPU generator
        # is k single draws in order, so the numbers are the same as one draw per step.
        self._block: Tensor | None = None
        self._used = 0

    def rows(self, index: Sequence[int]) -> RowSampler:
        """A sampler over some of these rows (in ``index`` order) sharing their generators, so each
        kept row's draws go on as if nothing had left (guided decoding drops rows mid-run). For
        `sample`'s one-draw-per-call use: `next_uniforms` draws ahead, so do not mix the two."""
        out = copy.copy(self)
        out._block, out._used = None, 0
        out.generators = [self.generators[i] for i in index]
        return out

    def draw(self) -> Float[Tensor, " batch"]:
        """One uniform per row, from the row's own generator."""
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])

    def draws(self, n: int, device: torch.device | str) -> Float[Tensor, "batch n"]:
        """Each row's next ``n`` uniforms, ``[rows, n]`` on ``device`` in one copy: the numbers
        ``n`` calls of `draw` would give (rand(n) on a CPU generator is n single draws in order)."""
        return torch.stack([torch.rand(n, generator=g, dtype=torch.float64) for g in self.generators]).to(
            device
        )

    def sample(
        self, scores: Float[Tensor, "batch vocab"], uniform: Float[Tensor, " batch"] | None = None
    ) -> Int[Tensor, " batch"]:
        """The token each row draws from its distribution, by inverse CDF at its uniform (the
        next one of each row's generator, or ``uniform`` when given, on the scores' device)."""
        if scores.shape[0] != len(self.generators):
            raise ValueprobeError(f"{scores.shape[0]} rows but {len(self.generators)} seeds")
        # one float64 copy of the [rows, vocab] scores, divided in place: the bits of
        # scores.double() / T without a second copy (two per step was most of a batch's allocations)
        probs = torch.softmax(scores.to(torch.float64, copy=True).div_(self.temperature), dim=-1)
        if uniform is None:
            uniform = self.draw().to(probs.device)
        # CPU only: there the running sum is a sequential loop, so a prefix of it is bit-identical
        # to the prefix of the full one. A CUDA scan associates by row length (and sorts fast).
        if probs.device.type != "cpu" or probs.shape[1] <= self.shortlist:
            return _by_full_sort(probs, uniform, self.top_p)
        token, full_sorts = _cpu_shortlist_pick(probs, uniform, self.top_p, self.shortlist)
        self.full_sorts += full_sorts
        return token

    def next_uniforms(self, device: torch.device, *, block: int = BLOCK) -> Float[Tensor, " batch"]:
        """Each row's next uniform on ``device``, from a block of ``block`` draws per row copied
        there once per block: the same numbers as `draw`, without a host copy every step."""
        if self._block is None or self._used == self._block.shape[1]:
            draws = [torch.rand(block, generator=g, dtype=torch.float64) for g in self.generators]
            self._block, self._used = torch.stack(draws).to(device), 0
        elif self._block.device != device:
            self._block = self._block.to(device)
        self._used += 1
        return self._block[:, self._used - 1]

    def __call__(self, input_ids: Int[Tensor, "batch pos"], scores: Float[Tensor, "batch vocab"]) -> Tensor:
        token = self.sample(scores, self.next_uniforms(scores.device))
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, token[:, None], 0.0)
        return out


def _cpu_shortlist_pick(
    probs: Float[Tensor, "batch vocab"], uniform: Float[Tensor, " batch"], top_p: float, k: int
) -> tuple[Int[Tensor, " batch"], int]:
    """`_by_full_sort`'s tokens, by `_by_shortlist` where that is exact and the full sort for the
    rest; and how many rows needed the full sort. CPU tensors only (its ``nonzero`` would make a
    GPU wait; on a GPU the full sort runs for every row)."""
    token, exact = _by_shortlist(probs, uniform, top_p, k)
    rest = (~exact).nonzero().squeeze(1)
    if rest.numel():
        token[rest] = _by_full_sort(probs[rest], uniform[rest], top_p)
    return token, int(rest.numel())


def _by_full_sort(
    probs: Float[Tensor, "batch vocab"], uniform: Float[Tensor, " batch"], top_p: float
) -> Int[Tensor, " batch"]:
    """The definition: sort by probability (ties by token id), cut at top_p, invert the CDF at u."""
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    cdf = ranked.cumsum(-1)
    if top_p < 1:
        keep = (cdf - ranked) < top_p  # the first token is always kept
        ranked = ranked * keep
        cdf = ranked.cumsum(-1)
    u = uniform * cdf[:, -1]
    pick = torch.searchsorted(cdf, u[:, None]).clamp(max=cdf.shape[1] - 1)
    return order.gather(1, pick).squeeze(1)


def _by_shortlist(
    probs: Float[Tensor, "batch vocab"], uniform: Float[Tensor, " batch"], top_p: float, k: int
) -> tuple[Int[Tensor, " batch"], Bool[Tensor, " batch"]]:
    """`_by_full_sort`'s pick from the k most likely tokens, and where it is provably the same.

    The k largest probabilities, descending, are the full sort's first k values whichever tied
    tokens `topk` chose, so their running sum is the full CDF's first k entries, bit for bit (a
    sequential sum). A pick is exact when:
    - the CDF reaches u inside the k;
    - the picked probability is strictly above the k-th one, so every token ranked up to it is
      in the k and ordered (value desc, id asc) as the stable sort orders it;
    - u itself is known. With top_p < 1 and the cut inside the k, the full CDF's last entry is the
      k-th kept sum (every later token is cut: its cdf − p is at least the k-th's). With top_p = 1
      it is the whole sorted sum, which `probs.sum` gives only to within the rounding bound of
      any summation of n non-negative terms, (n − 1)·2⁻⁵³ relative to the exact sum, for each of
      the two; so the pick must be the same at both ends of that interval (widened to 4n·2⁻⁵³).
    """
    values, index = probs.topk(k, dim=-1, sorted=True)
    by_id, perm = index.sort(dim=-1)
    ranked, order = values.gather(1, perm).sort(dim=-1, descending=True, stable=True)
    token_ids = by_id.gather(1, order)
    cdf = ranked.cumsum(-1)
    if top_p == 1:
        known = torch.ones_like(uniform, dtype=torch.bool)
        slack = 4 * probs.shape[1] * 2.0**-53
        total = probs.sum(-1)
        low, high = uniform * (total * (1 - slack)), uniform * (total * (1 + slack))
    else:
        kept = (cdf - ranked) < top_p
        known = ~kept[:, -1]  # the cut falls inside the k
        cdf = (ranked * kept).cumsum(-1)
        low = high = uniform * cdf[:, -1]
    pick = torch.searchsorted(cdf, high[:, None])
    same = torch.searchsorted(cdf, low[:, None]) == pick
    inside = pick < k
    pick = pick.clamp(max=k - 1)
    above_kth = ranked.gather(1, pick) > ranked[:, -1:]
    exact = known & (same & inside & above_kth).squeeze(1)
    return token_ids.gather(1, pick).squeeze(1), exact
