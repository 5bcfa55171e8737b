"""Conditional steering and the threshold search, against closed forms on a tiny model.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_condition.py``
References: the unsteered ``output_hidden_states`` (the score the gate reads at resid_post[1] is
that of blocks 0 and 1, which the steering does not change), and sklearn's F1 for the search.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score
from test_operators import SIGMA, cached_and_full, op_axis  # tests/ is on sys.path under pytest
from test_steer import PROMPTS, _batch, _forward

from valueprobe.errors import ValueprobeError
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.condition import (
    Condition,
    evaluate_condition,
    find_condition_point,
    find_threshold,
)
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.spec import SteeringSpec

ARCHS = ("llama", "gpt2", "gpt_neox")
THRESHOLD = 0.5  # σ: the tiny models' scores on the planted axis spread over about ±4


def expected_fire(score: torch.Tensor, real: torch.Tensor, when: str, latch: bool) -> torch.Tensor:
    """Where the condition holds, from its definition: crossing cells, or every cell from a row's first."""
    hit = (score > THRESHOLD if when == "above" else score < THRESHOLD) & real
    if latch:
        first = torch.where(hit.any(1), hit.float().argmax(1), torch.full((len(hit),), hit.shape[1]))
        hit = torch.arange(hit.shape[1])[None, :] >= first[:, None]
    return hit & real


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("when", "latch"), [("above", False), ("below", False), ("above", True)])
def test_operator_fires_exactly_where_the_planted_axis_crosses(tiny_lm_factory, arch, when, latch):
    """Under the KV cache and left padding: the steered cells are the closed form of the condition
    on the unsteered scores, and nowhere else moves."""
    lm = tiny_lm_factory(arch)
    axis = op_axis(lm)
    ids, mask = _batch(lm)
    alpha = torch.tensor([3.0, -2.0, 1.5, 2.0])
    cond = Condition(THRESHOLD, when=when, latch=latch)
    out, base, real = cached_and_full(lm, ids, mask, 6, SteeringSpec(axis, condition=cond), alpha)
    h = base.hidden_states[2]
    fire = expected_fire(axis.score(h, 1), real, when, latch)
    assert fire.any() and (real & ~fire).any()  # some cells cross and some do not
    want = h + (alpha * SIGMA)[:, None, None] * axis.direction(1)
    torch.testing.assert_close(out.hidden_states[2][fire], want[fire], atol=1e-5, rtol=0)
    assert torch.equal(out.hidden_states[2][~fire], h[~fire])


def test_a_latch_starts_over_with_each_new_sequence(tiny_lm_factory):
    """One handle, the same batch twice: the second forward (cache offset 0 again) fires where a fresh
    handle fires, from each row's first crossing, not on every cell of the rows the first latched."""
    lm = tiny_lm_factory("llama")
    axis = op_axis(lm)
    ids, mask = _batch(lm)
    spec = SteeringSpec(axis, condition=Condition(THRESHOLD, latch=True))
    alpha = torch.tensor([3.0, -2.0, 1.5, 2.0])
    with steer(lm, spec, alpha):
        _forward(lm, ids, mask)
        again = _forward(lm, ids, mask, output_hidden_states=True)
    with steer(lm, spec, alpha):
        fresh = _forward(lm, ids, mask, output_hidden_states=True)
    real = mask.bool()
    fire = expected_fire(
        axis.score(_forward(lm, ids, mask, output_hidden_states=True).hidden_states[2], 1),
        real,
        "above",
        True,
    )
    assert (fire.any(1) & (real & ~fire).any(1)).any()  # a latched row has real cells before its crossing
    assert torch.equal(again.hidden_states[2], fresh.hidden_states[2])


def test_condition_in_generate_traces_alpha_exactly_at_crossing_tokens(tiny_lm_factory):
    """Through `generate`: the α a row's trace records is α at the tokens whose score crosses and 0
    elsewhere; a probe other than the steered axis can be the condition."""
    lm = tiny_lm_factory("llama")
    axis, reader = op_axis(lm), -op_axis(lm)
    cond = Condition(THRESHOLD, when="above", axis=reader)
    gens = generate(
        lm,
        SteeringSpec(axis, condition=cond),
        PROMPTS,
        decoding=Decoding(greedy=True, max_new_tokens=6),
        alphas=[2.0],
        trace=True,
        progress=False,
    )
    fired = 0
    for prompt, g in zip(PROMPTS, gens, strict=True):
        ids, _ = _batch(lm, [prompt])
        seq = torch.tensor([ids[0].tolist() + list(g.token_ids)])
        h = _forward(lm, seq, torch.ones_like(seq), output_hidden_states=True).hidden_states[2][0]
        crosses = reader.score(h, 1) > THRESHOLD
        n = len(g.trace.alpha) - 1  # the last token is never fed back
        assert [a != 0 for a in g.trace.alpha[:n]] == crosses[:n].tolist()
        assert all(a in (0.0, 2.0) for a in g.trace.alpha[:n])
        fired += int(crosses[:n].sum())
    assert 0 < fired < sum(len(g.trace.alpha) - 1 for g in gens)
    with pytest.raises(ValueprobeError, match="^a condition: nnsight's generate graph only adds"):
        generate(lm, SteeringSpec(axis, condition=cond), PROMPTS[:1], route="nnsight", progress=False)


def test_condition_bad_input(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = op_axis(lm)
    with pytest.raises(ValueprobeError, match="use above or below"):
        Condition(0.0, when="over")  # type: ignore[arg-type]
    with pytest.raises(ValueprobeError, match="not a finite number"):
        Condition(float("nan"))
    with pytest.raises(ValueprobeError, match="no σ calibration"):
        steer(lm, SteeringSpec(axis, condition=Condition(0.0, axis=axis + op_axis(lm)), unit="raw"), 1.0)


# --- the threshold search -----------------------------------------------------------------------


def _planted(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = np.concatenate([rng.normal(-1.0, 0.3, 40), rng.normal(1.5, 0.3, 30)])
    return scores, np.r_[np.zeros(40), np.ones(30)]


def test_threshold_search_separates_planted_scores_at_the_gap_midpoint():
    scores, labels = _planted()
    fit = find_threshold(scores, labels)
    assert (fit.when, fit.f1, fit.fired) == ("above", 1.0, 30)
    assert fit.threshold == pytest.approx((scores[:40].max() + scores[40:].min()) / 2)
    flipped = find_threshold(scores, 1 - labels)
    assert (flipped.when, flipped.f1) == ("below", 1.0) and flipped.threshold == pytest.approx(fit.threshold)


def test_threshold_search_is_sklearns_best_f1_over_every_cut():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 200)
    scores = rng.normal(0, 1, 200) + 0.8 * labels  # overlapping: no perfect threshold
    fit = find_threshold(scores, labels)
    cuts = np.unique(scores)
    cuts = (cuts[:-1] + cuts[1:]) / 2
    best = max(max(f1_score(labels, scores > c), f1_score(labels, scores < c)) for c in cuts)
    assert fit.f1 == pytest.approx(best)
    side = scores > fit.threshold if fit.when == "above" else scores < fit.threshold
    assert fit.f1 == pytest.approx(f1_score(labels, side)) and fit.f1 < 1.0
    again = evaluate_condition(scores, labels, fit.condition())
    assert (again.f1, again.precision, again.recall) == pytest.approx((fit.f1, fit.precision, fit.recall))


def test_condition_point_picks_the_separating_layer():
    scores, labels = _planted()
    noise = np.random.default_rng(1).normal(0, 1, scores.size)
    fit = find_condition_point({3: noise, 7: scores, 9: noise * 2}, labels)
    assert (fit.layer, fit.f1) == (7, 1.0)


def test_a_threshold_no_example_crosses_is_refused_with_the_range():
    scores, labels = _planted()
    lo, hi = scores.min(), scores.max()
    with pytest.raises(
        ValueprobeError,
        match=rf"threshold 9 σ: no example reads above it \(the scores range from {lo:.3g} to {hi:.3g}\)",
    ):
        evaluate_condition(scores, labels, Condition(9.0))
    with pytest.raises(ValueprobeError, match="no example reads below it"):
        evaluate_condition(scores, labels, Condition(-9.0, when="below"))
    with pytest.raises(ValueprobeError, match="no threshold separates"):
        find_threshold([1.0, 1.0], [0, 1])
    with pytest.raises(ValueprobeError, match="no example has label 1"):
        find_threshold([1.0, 2.0], [0, 0])
    with pytest.raises(ValueprobeError, match="3 scores but 2 labels"):
        find_threshold([1.0, 2.0, 3.0], [0, 1])
