"""The sampler's shortlist picks exactly the token the full sort picks, for every uniform.

Run: ``python -m pytest -q tests/test_sampling.py``
Reference: `reference_sample`, the sampler as it was before the shortlist (sort the whole
vocabulary in float64 at every step), kept here verbatim as the trusted definition. Committed
sampled results were drawn with it, so any difference, even one token, is a failure.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from valueprobe.steering.decode.sampling import RowSampler


def reference_sample(scores: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float):
    """`RowSampler.sample` before the shortlist (its body, with the row uniforms passed in)."""
    probs = torch.softmax(scores.double() / temperature, dim=-1)
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    cdf = ranked.cumsum(-1)
    if top_p < 1:
        keep = (cdf - ranked) < top_p  # the first token is always kept
        ranked = ranked * keep
        cdf = ranked.cumsum(-1)
    u = uniforms.to(cdf.device) * cdf[:, -1]
    pick = torch.searchsorted(cdf, u[:, None]).clamp(max=cdf.shape[1] - 1)
    return order.gather(1, pick).squeeze(1)


def same_as_reference(scores, seeds, *, steps=3, temperature=1.0, top_p=1.0, shortlist=64) -> RowSampler:
    """Run the sampler ``steps`` times on ``scores``, asserting each pick equals the reference's."""
    sampler = RowSampler(seeds, temperature=temperature, top_p=top_p, shortlist=shortlist)
    twin = RowSampler(seeds)  # the same generators, for the reference's uniforms
    for _ in range(steps):
        got = sampler.sample(scores)
        want = reference_sample(scores, twin.draw(), temperature, top_p)
        assert torch.equal(got, want), (got, want)
    return sampler


def logits(style: str, rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if style == "peaked":
        return 4 * torch.randn(rows, vocab, generator=g)
    if style == "ties":  # few distinct values: many ties, also at the shortlist's boundary
        return torch.randint(0, 3, (rows, vocab), generator=g).float()
    if style == "flat":  # mass spread thin: the shortlist rarely reaches u
        return 1e-3 * torch.randn(rows, vocab, generator=g)
    return torch.zeros(rows, vocab)  # "uniform": every token ties


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    style=st.sampled_from(["peaked", "ties", "flat", "uniform"]),
    rows=st.integers(1, 6),
    vocab=st.integers(2, 400),
    shortlist=st.integers(1, 40),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.7]),
    top_p=st.one_of(st.just(1.0), st.floats(0.05, 1.0)),
    seed=st.integers(0, 2**16),
)
def test_shortlist_picks_the_full_sorts_token(style, rows, vocab, shortlist, temperature, top_p, seed):
    scores = logits(style, rows, vocab, seed)
    seeds = [seed * 7 + r for r in range(rows)]
    same_as_reference(scores, seeds, temperature=temperature, top_p=top_p, shortlist=shortlist)


def test_ties_straddling_the_shortlist_take_the_lowest_ids():
    # six tokens tie for first; topk keeps some 3 of them (not the lowest ids), the stable sort
    # ranks them by id: a pick that lands on a value equal to the 3rd must go to the full sort
    scores = torch.full((1, 100), -30.0)
    scores[0, [5, 17, 40, 41, 90, 99]] = 0.0
    sampler = same_as_reference(scores, [3], steps=200, shortlist=3)
    assert sampler.full_sorts == 200


def test_ties_inside_the_shortlist_are_ordered_by_id():
    # six tokens tie above the rest; topk returns them in no particular order, the full sort by id
    scores = torch.full((4, 1000), -8.0)
    scores[:, [5, 17, 40, 41, 990, 999]] = 0.0
    sampler = same_as_reference(scores, list(range(4)), steps=100, shortlist=8)
    assert sampler.full_sorts < 4 * 100 / 2  # most picks land on the tied six, without the sort


def test_peaked_rows_skip_the_sort_and_flat_rows_take_it():
    peaked = logits("peaked", 16, 49152, 0) * 2  # the default model's vocabulary size
    sampler = same_as_reference(peaked, list(range(16)), steps=4, temperature=0.7)
    assert sampler.full_sorts < 16 * 4 / 4
    flat = logits("flat", 4, 49152, 1)
    sampler = same_as_reference(flat, list(range(4)), steps=2, temperature=0.7)
    assert sampler.full_sorts == 4 * 2


def test_top_p_cut_inside_the_shortlist_is_exact_without_the_sort():
    # probabilities ≈ [0.5, 0.3, 0.1, 0.05, ...]: top_p = 0.85 cuts at the third token
    head = torch.log(torch.tensor([0.5, 0.3, 0.1, 0.05]))
    scores = torch.cat([head, torch.full((200,), -12.0)])[None].repeat(8, 1)
    sampler = same_as_reference(scores, list(range(8)), steps=50, top_p=0.85, shortlist=4)
    assert sampler.full_sorts == 0
    # the cut past the shortlist (top_p = 0.99 needs more than 4 tokens): every row sorts
    sampler = same_as_reference(scores, list(range(8)), steps=5, top_p=0.99, shortlist=4)
    assert sampler.full_sorts == 8 * 5


def _largest_uniform_below(edge: float, total: float) -> torch.Tensor:
    """The largest float64 w with fl(w · total) <= edge: u lands exactly on a CDF step."""
    w = torch.tensor([edge / total], dtype=torch.float64)
    up, down = torch.tensor([2.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)
    while (torch.nextafter(w, up) * total).item() <= edge:
        w = torch.nextafter(w, up)
    while (w * total).item() > edge:
        w = torch.nextafter(w, down)
    return w


def test_a_uniform_on_a_cdf_step_is_not_decided_by_an_unsorted_sum():
    # The full sort scales u by its own running total; probs.sum() adds in another order and differs
    # in the last bits. At a uniform that puts u exactly on a step of the CDF, the two totals pick
    # neighbouring tokens, so the shortlist must hand that row to the full sort.
    seen = 0
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        scores = 3 * torch.randn(1, 5000, generator=g)
        probs = torch.softmax(scores.double(), -1)
        cdf = probs.sort(dim=-1, descending=True, stable=True).values.cumsum(-1)
        total, unsorted = cdf[0, -1].item(), probs.sum().item()
        if unsorted <= total:
            continue
        uniform = _largest_uniform_below(cdf[0, 2].item(), total)
        with_unsorted_total = torch.searchsorted(cdf, (uniform * unsorted)[:, None]).item()
        assert with_unsorted_total == 3  # the trap is real: the unsorted total moves the pick
        sampler = RowSampler([0], shortlist=64)
        sampler.draw = lambda u=uniform: u  # this row's uniform, chosen
        assert torch.equal(sampler.sample(scores), reference_sample(scores, uniform, 1.0, 1.0))
        assert sampler.full_sorts == 1
        seen += 1
    assert seen >= 2
