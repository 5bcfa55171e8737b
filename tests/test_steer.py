"""Steering, batched sweeps, sampling and the PID, against exact references on tiny models.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_steer.py``
References: ``output_hidden_states`` (h + α·σ·v̂ exactly), the unhooked model (bit-identical),
a full no-cache forward of the final sequence (logits of every generated token), and each row
run alone (batched = unbatched).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_rows
from valueprobe.hooks.route import ROUTES, Point, intervene, position_ids_from_mask, record
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import Tracing, encode_prompts, generate
from valueprobe.steering.decode.pid import PID, control
from valueprobe.steering.decode.sampling import Decoding, RowSampler, row_seed
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Site

ARCHS = ("llama", "gpt2", "gpt_neox")
PROMPTS = ["The capital of France is", "def add(a, b):", "Wait, that's not right. Let me", "Do"]


def planted_axis(lm, *, sigma: float = 0.5, mean_norm: float = 8.0, seed: int = 1) -> ValueAxis:
    """A random unit axis at every layer with known statistics (μ = 0.1, σ and mean norm as given)."""
    n, d = lm.n_layers, lm.d_model
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, d, generator=g)
    return ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True),
        layers=tuple(range(n)),
        mu=torch.full((n,), 0.1),
        sigma=torch.full((n,), sigma),
        mean_norm=torch.full((n,), mean_norm),
        best_layer=1,
        site="resid_post",
        method="planted",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=d,
    )


def _batch(lm, prompts=PROMPTS):
    return pad_rows(encode_prompts(lm, prompts), pad_id=0, side="left")


def _forward(lm, ids, mask, **kw):
    with torch.no_grad():
        return lm.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_steered_layer_output_is_h_plus_alpha_sigma_v(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm)
    ids, mask = _batch(lm)
    alpha = torch.tensor([2.0, -1.5, 0.0, 3.0])
    base = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    with steer(lm, SteeringSpec(axis, layers=1), alpha):
        got = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    # hidden_states[2] is resid_post[1]: exactly h + α·σ·v̂ at real cells, untouched at pads
    want = base[2] + (alpha * 0.5)[:, None, None] * axis.direction(1)
    real = mask.bool()
    torch.testing.assert_close(got[2][real], want[real], atol=1e-6, rtol=0)
    assert torch.equal(got[2][~real], base[2][~real])  # pad cells bit for bit
    assert torch.equal(got[1], base[1])  # upstream untouched
    # in σ units the score moves by exactly α
    moved = axis.score(got[2], 1) - axis.score(base[2], 1)
    torch.testing.assert_close(moved[real], alpha[:, None].expand_as(moved)[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("unit", ["sigma", "norm", "raw"])
@pytest.mark.parametrize("k", [1.0, 2.0, -0.5])
def test_units_and_scaled_axis_add_their_closed_form(tiny_lm_factory, unit, k):
    """One unit of α is σ, mean_norm / 100 or 1 (the planted 0.5, 0.08 and 1), times the axis's
    scale: ``k * axis`` adds k·α·unit·v̂ (a negative k steers along -v̂)."""
    lm = tiny_lm_factory("llama")
    axis = k * planted_axis(lm, sigma=0.5, mean_norm=8.0)
    size = {"sigma": 0.5, "norm": 8.0 / 100, "raw": 1.0}[unit]
    v = planted_axis(lm).direction(1)  # the unscaled, unflipped v̂
    ids, mask = _batch(lm)
    alpha = torch.tensor([2.0, -1.5, 0.0, 30.0])
    base = _forward(lm, ids, mask, output_hidden_states=True).hidden_states[2]
    with steer(lm, SteeringSpec(axis, layers=1, unit=unit), alpha):
        got = _forward(lm, ids, mask, output_hidden_states=True).hidden_states[2]
    want = base + (k * alpha * size)[:, None, None] * v
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    assert torch.equal(got[~real], base[~real])
    # the axis's own steering vector says the same
    torch.testing.assert_close(axis.vector(1, alpha=2.0, units=unit), 2.0 * k * size * v, atol=1e-6, rtol=0)


def uneven_axis(lm) -> ValueAxis:
    """`planted_axis` with μ, σ and the mean norm different at every layer (4 layers)."""
    axis = planted_axis(lm)
    return ValueAxis(
        **{
            **axis.__dict__,
            "mu": torch.tensor([0.1, -0.3, 0.7, 0.2]),
            "sigma": torch.tensor([0.5, 1.25, 3.0, 2.0]),
            "mean_norm": torch.tensor([4.0, 9.0, 20.0, 12.0]),
        }
    )


@pytest.mark.parametrize("unit", ["sigma", "norm", "raw"])
def test_several_layers_each_take_their_own_unit_and_statistics(tiny_lm_factory, unit):
    """Steering layers 0 and 2 at once with an axis whose σ, mean norm and μ differ per layer: each
    layer adds α·(its own unit)·(its own v̂); the axis's steering vector says the same per layer;
    and ``set`` moves each layer's score to the target in that layer's own μ and σ."""
    lm = tiny_lm_factory("llama", n_layers=4)  # resid_post[2] is not the last (normed) hidden state
    axis = uneven_axis(lm)
    size = {"sigma": axis.sigma, "norm": axis.mean_norm / 100, "raw": torch.ones(4)}[unit]
    ids, mask = _batch(lm)
    real = mask.bool()
    alpha = torch.tensor([2.0, -1.5, 0.0, 3.0])[:, None, None]
    base = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    with steer(lm, SteeringSpec(axis, layers=[0], unit=unit), alpha.flatten()):
        only_0 = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    with steer(lm, SteeringSpec(axis, layers=[0, 2], unit=unit), alpha.flatten()):
        both = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    # hidden_states[L + 1] is resid_post[L]; layer 2 adds to what reaches it under layer 0's steering
    for layer, before in ((0, base[1]), (2, only_0[3])):
        want = before + alpha * size[layer] * axis.direction(layer)
        torch.testing.assert_close(both[layer + 1][real], want[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(
            axis.vector(layer, alpha=2.0, units=unit),
            2.0 * size[layer] * axis.direction(layer),
            atol=1e-6,
            rtol=0,
        )
    with steer(lm, SteeringSpec(axis, layers=[0, 2], op=Operator("set", target=1.5)), 1.0):
        moved = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    for layer in (0, 2):
        score = axis.score(moved[layer + 1], layer)
        torch.testing.assert_close(score[real], torch.full_like(score[real], 1.5), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_alpha_zero_bit_identical_and_v_then_minus_v(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm)
    ids, mask = _batch(lm)
    base = _forward(lm, ids, mask).logits
    with steer(lm, axis, 0.0):
        assert torch.equal(_forward(lm, ids, mask).logits, base)
    with steer(lm, axis, 2.0), steer(lm, -axis, 2.0):
        torch.testing.assert_close(_forward(lm, ids, mask).logits, base, atol=1e-5, rtol=0)
    with steer(lm, axis, 2.0):
        assert not torch.allclose(_forward(lm, ids, mask).logits, base, atol=1e-3)
    assert torch.equal(_forward(lm, ids, mask).logits, base)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("positions", ["all", "generated", "prompt"])
def test_kv_cache_logits_equal_full_forward_every_token(tiny_lm_factory, arch, positions):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm, sigma=2.0)
    ids, mask = _batch(lm)
    width, new = ids.shape[1], 5
    alpha = torch.tensor([3.0, -2.0, 1.0, 0.0])
    runs = {}
    for cache in (True, False):
        with steer(lm, SteeringSpec(axis, positions=positions), alpha, prompt_length=width), torch.no_grad():
            out = lm.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                use_cache=cache,
                output_logits=True,
                return_dict_in_generate=True,
            )
        runs[cache] = out
    assert torch.equal(runs[True].sequences, runs[False].sequences)
    seq = runs[True].sequences
    full_mask = torch.cat([mask, torch.ones(len(seq), new, dtype=mask.dtype)], 1)
    with steer(lm, SteeringSpec(axis, positions=positions), alpha, prompt_length=width):
        out = _forward(lm, seq, full_mask, output_hidden_states=True)
    ref = out.logits  # one forward, no cache: the reference for every cached step
    # The reference's own cells, checked from output_hidden_states against the unsteered forward:
    # resid_post[1] (hidden_states[2]) is h + α·σ·v̂ on the chosen side of the prompt boundary and
    # h on the other (blocks 0 and 1 run before the addition, so h is the same in both runs).
    base = _forward(lm, seq, full_mask, output_hidden_states=True).hidden_states[2]
    got = out.hidden_states[2]
    in_prompt = torch.arange(seq.shape[1]) < width
    chosen = {"all": torch.ones_like(in_prompt), "prompt": in_prompt, "generated": ~in_prompt}[positions]
    real = full_mask.bool()
    moved = real & chosen[None, :]
    want = base + (alpha * 2.0)[:, None, None] * axis.direction(1)
    torch.testing.assert_close(got[moved], want[moved], atol=1e-5, rtol=0)
    assert torch.equal(got[~moved], base[~moved])
    assert moved.any() and (positions == "all" or (real & ~chosen[None, :]).any())
    for t in range(new):  # the first generated token (t = 0) included
        for cache in (True, False):
            torch.testing.assert_close(runs[cache].logits[t], ref[:, width - 1 + t], atol=1e-4, rtol=0)


@pytest.mark.parametrize(("positions", "unit"), [("prompt", "norm"), ("generated", "raw"), ("all", "sigma")])
def test_generate_steers_its_positions_and_unit_like_the_handle(tiny_lm_factory, positions, unit):
    """`generate` against `steer` around ``lm.model.generate`` (checked above, cell by cell, against
    output_hidden_states): the same greedy tokens for the same positions and unit, rows in
    (prompt, α) order; and the records say which unit and strength each row had."""
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm, sigma=3.0, mean_norm=300.0)
    alphas = [-2.0, 2.0]
    gens = generate(lm, SteeringSpec(axis, positions=positions, unit=unit), PROMPTS[:2], decoding=Decoding(greedy=True, max_new_tokens=6), alphas=alphas, progress=False)  # fmt: skip
    encoded = encode_prompts(lm, PROMPTS[:2])
    ids, mask = pad_rows([encoded[p] for p in (0, 0, 1, 1)], pad_id=0, side="left")
    alpha = torch.tensor(alphas * 2)
    with (
        steer(lm, SteeringSpec(axis, positions=positions, unit=unit), alpha, prompt_length=ids.shape[1]),
        torch.no_grad(),
    ):
        out = lm.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=0,
        )
    want = []
    for row in out[:, ids.shape[1] :].tolist():
        want.append(tuple(row[: row.index(0)] if 0 in row else row))
    assert [g.token_ids for g in gens] == want
    assert [(g.prompt, g.alpha, g.unit) for g in gens] == [(p, a, unit) for p in (0, 1) for a in alphas]
    with steer(lm, SteeringSpec(axis, unit=unit), alpha), torch.no_grad():  # the positions matter here
        every = lm.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=0,
        )
    assert positions == "all" or not torch.equal(every, out)


@pytest.mark.parametrize("arch", ARCHS)
def test_per_row_alpha_batch_equals_each_row_alone(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm, sigma=2.0)
    decoding = Decoding(samples=2, max_new_tokens=6, temperature=1.0, seed=3)
    kw = dict(alphas=[-2.0, 0.0, 1.5], decoding=decoding, progress=False)
    batched = generate(lm, axis, PROMPTS[:3], batch_size=18, **kw)
    alone = generate(lm, axis, PROMPTS[:3], batch_size=1, **kw)
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    chunked = generate(lm, axis, PROMPTS[:3], batch_size=4, **kw)  # rows land in other chunks
    assert [g.token_ids for g in chunked] == [g.token_ids for g in alone]
    for g in batched:
        assert g.seed == row_seed(3, g.prompt, g.sample)
    assert len({g.token_ids for g in batched}) > 3  # steering and sampling do change the text


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_common_random_numbers_give_one_text_per_prompt_and_sample(tiny_lm_factory, arch):
    """With a negligible σ the strengths cannot move the logits, so rows that share (prompt, sample)
    draw the same uniforms and must sample the same tokens, whatever α and whatever batch."""
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm, sigma=1e-7)
    alphas = [-3.0, -1.0, 0.0, 2.0, 3.0]
    gens = generate(
        lm,
        axis,
        PROMPTS[:3],
        decoding=Decoding(samples=3, max_new_tokens=8, temperature=1.5, seed=5),
        alphas=alphas,
        batch_size=7,
        progress=False,
    )
    texts: dict[tuple[int, int], set] = {}
    for g in gens:
        texts.setdefault((g.prompt, g.sample), set()).add(g.token_ids)
    assert len(gens) == 3 * 3 * len(alphas) and len(texts) == 3 * 3
    assert all(len(t) == 1 for t in texts.values()), texts
    # ... and the samples of one prompt do differ: the draws are random, just shared across α
    for p in range(3):
        assert len({next(iter(texts[p, s])) for s in range(3)}) > 1


def test_row_draws_do_not_depend_on_batch():
    seeds = [11, 22, 33]
    together = RowSampler(seeds)
    alone = RowSampler([22])
    for _ in range(5):
        assert together.draw()[1] == alone.draw()[0]
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    a = RowSampler(seeds).sample(logits)
    b = RowSampler([33]).sample(logits[2:])
    assert a[2] == b[0]


# Closed forms on probabilities [0.25, 0.75]: n draws, and a bound of 5 binomial standard errors.
P = torch.log(torch.tensor([[0.25, 0.75]]))
N_DRAWS = 4000


def _share_of_token_1(sampler: RowSampler) -> float:
    draws = torch.stack([sampler.sample(P) for _ in range(N_DRAWS)])
    return float((draws == 1).double().mean())


def test_sampler_top_p_keeps_the_smallest_set_reaching_p():
    # sorted: 0.75 then 0.25; 0.75 alone reaches top_p = 0.7, so token 0 is never drawn
    assert _share_of_token_1(RowSampler([1], top_p=0.7)) == 1.0
    # top_p = 0.8 needs both tokens: back to 0.75
    share = _share_of_token_1(RowSampler([1], top_p=0.8))
    assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / N_DRAWS)


def test_sampler_temperature_divides_the_logits():
    # T = 2: p ∝ sqrt(p), so P(token 1) = sqrt(.75) / (sqrt(.25) + sqrt(.75)) ≈ 0.634
    want = math.sqrt(0.75) / (math.sqrt(0.25) + math.sqrt(0.75))
    bound = 5 * math.sqrt(want * (1 - want) / N_DRAWS)  # ≈ 0.038
    assert abs(_share_of_token_1(RowSampler([2], temperature=2.0)) - want) < bound
    # T = 0.5: p ∝ p², P(token 1) = 0.9
    assert abs(_share_of_token_1(RowSampler([3], temperature=0.5)) - 0.9) < 5 * math.sqrt(0.09 / N_DRAWS)


def test_generate_passes_temperature_and_top_p_to_the_sampler(tiny_lm_factory):
    """Through `generate`: a vanishing top_p, or a vanishing temperature, leaves only the argmax,
    so both give the greedy tokens; plain sampling does not."""
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm, sigma=2.0)
    kw = dict(alphas=[-2.0, 2.0], progress=False)
    draw = dict(samples=2, max_new_tokens=8, seed=4)
    greedy = [
        g.token_ids for g in generate(lm, axis, PROMPTS[:2], decoding=Decoding(greedy=True, **draw), **kw)
    ]
    tight_p = [
        g.token_ids
        for g in generate(lm, axis, PROMPTS[:2], decoding=Decoding(top_p=1e-9, temperature=1.0, **draw), **kw)
    ]
    cold = [
        g.token_ids
        for g in generate(lm, axis, PROMPTS[:2], decoding=Decoding(temperature=1e-4, **draw), **kw)
    ]
    hot = [
        g.token_ids for g in generate(lm, axis, PROMPTS[:2], decoding=Decoding(temperature=1.0, **draw), **kw)
    ]
    assert tight_p == greedy and cold == greedy
    assert hot != greedy


def test_sampler_matches_distribution():
    logits = torch.tensor([[0.0, math.log(3.0), -1e9]])
    sampler = RowSampler([0])
    draws = torch.stack([sampler.sample(logits) for _ in range(4000)])
    assert (draws == 2).sum() == 0
    assert abs(float((draws == 1).float().mean()) - 0.75) < 0.03


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_nnsight_route_equals_hooks_route(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm, sigma=3.0)
    for positions in ("all", "generated"):
        kw = dict(
            alphas=[-2.0, 0.0, 2.0], decoding=Decoding(samples=1, max_new_tokens=5, seed=0), progress=False
        )
        spec = SteeringSpec(axis, positions=positions)
        hooks = generate(lm, spec, PROMPTS[:2], **kw)
        nn = generate(lm, spec, PROMPTS[:2], route="nnsight", **kw)
        assert [g.token_ids for g in hooks] == [g.token_ids for g in nn]
    assert len({g.token_ids for g in hooks}) > 2


@pytest.mark.parametrize("route", ["hooks", "nnsight"])
def test_generating_routes_add_alpha_sigma_v_by_hand(tiny_lm_factory, route):
    """Each generating route's tokens are those of a hand-written hook adding α·σ·v̂ at the axis's
    layer on every position (the closed form, apart from the routes and from each other)."""
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm, sigma=3.0)
    v, sigma = axis.direction(1), 3.0
    alphas = [-2.0, 2.0]
    kw = dict(decoding=Decoding(greedy=True, max_new_tokens=6), progress=False)
    got = generate(lm, axis, PROMPTS[:2], alphas=alphas, route=route, **kw)
    for g in got:
        ids, mask = _batch(lm, [PROMPTS[g.prompt]])
        a = torch.tensor(g.alpha)
        with intervene(lm, Point(1), lambda h, step, a=a: h + (a * sigma) * v), torch.no_grad():
            seq = lm.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0
            )
        assert g.token_ids == tuple(seq[0, ids.shape[1] :].tolist())[: len(g.token_ids)], g.alpha
    assert got[0].token_ids != got[1].token_ids  # the two strengths gave two texts


@pytest.mark.parametrize("route", ROUTES)
def test_every_generating_route_gives_the_hooks_routes_greedy_tokens(tiny_lm_factory, route):
    """Each route behind `Route.generate` against the plain hooks route; a route that cannot
    generate says which can, and a graph route refuses what only Python hooks can run."""
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm, sigma=3.0)
    kw = dict(alphas=[-3.0, 0.0, 3.0], decoding=Decoding(greedy=True, max_new_tokens=6), progress=False)
    spec = SteeringSpec(axis, layers=[0, 2])
    if route == "tlens":
        with pytest.raises(ValueprobeError, match="through route 'hooks' or 'nnsight'"):
            generate(lm, spec, PROMPTS[:1], route=route, **kw)
        return
    for positions in ("all", "prompt", "generated"):
        want = generate(lm, replace(spec, positions=positions), PROMPTS, **kw)
        got = generate(lm, replace(spec, positions=positions), PROMPTS, route=route, **kw)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert len({g.token_ids for g in want}) > len(PROMPTS)  # the strengths changed the tokens
    if route != "hooks":
        with pytest.raises(ValueprobeError, match="route 'hooks' only"):
            generate(lm, spec, PROMPTS[:1], route=route, trace=True, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_trace_reads_before_the_addition(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm)
    ids, mask = _batch(lm, PROMPTS[:1])
    (g,) = generate(
        lm,
        axis,
        PROMPTS[:1],
        decoding=Decoding(greedy=True, max_new_tokens=4),
        alphas=[2.0],
        trace=Tracing(value_at="before", read_layers=(2,)),
        progress=False,
    )
    tr = g.trace
    assert tr.at == "before" and tr.read == "resid_post[1], before the addition"
    seq = torch.tensor([list(ids[0]) + list(g.token_ids)])
    base = _forward(lm, seq, torch.ones_like(seq), output_hidden_states=True).hidden_states
    # (the last hidden state is after the final norm, so resid_post[2] is read by a recorder)
    with steer(lm, axis, 2.0), record(lm, [Point(2)]) as rec:
        _forward(lm, seq, torch.ones_like(seq))
    n = len(tr.tokens)
    pre = axis.score(base[2][0], 1)  # resid_post[1] unsteered = what the hook reads before adding
    torch.testing.assert_close(torch.tensor(tr.values["resid_post[1]"][:-1]), pre[: n - 1], atol=1e-4, rtol=0)
    post2 = axis.score(rec[Point(2)][0], 2)  # resid_post[2] downstream of the steering
    torch.testing.assert_close(
        torch.tensor(tr.values["resid_post[2]"][:-1]), post2[: n - 1], atol=1e-4, rtol=0
    )
    assert math.isnan(tr.values["resid_post[1]"][-1])
    assert tr.alpha[:-1] == (2.0,) * (n - 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_trace_and_values_read_after_the_addition_by_default(tiny_lm_factory, arch):
    """The default read point is after the addition (as the server reads it); ``g.values`` has
    every generated token, each read in the forward that produced it: σ, projection and cos equal
    a no-cache forward of the final sequence under the same steering."""
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm)
    (g,) = generate(
        lm, axis, PROMPTS[:1], decoding=Decoding(greedy=True, max_new_tokens=5), alphas=[2.0], trace=True,
        progress=False,
    )  # fmt: skip
    (ids,) = encode_prompts(lm, PROMPTS[:1])
    seq = torch.tensor([ids + list(g.token_ids)])
    with steer(lm, axis, 2.0), record(lm, [Point(1)]) as rec:
        _forward(lm, seq, torch.ones_like(seq))
    h = rec[Point(1)][0]  # resid_post[1] after the addition, every column
    tr, v = g.trace, g.values
    assert tr.at == "after" and tr.read == "resid_post[1], after the addition" == v.read
    n = len(ids)
    torch.testing.assert_close(
        torch.tensor(tr.values["resid_post[1]"][:-1]),
        axis.score(h, 1)[: len(tr.tokens) - 1],
        atol=1e-4,
        rtol=0,
    )
    # token k of the generation was produced at column n - 1 + k: no NaN, the last token included
    want = h[n - 1 : n - 1 + len(g.token_ids)]
    assert v.produced and v.token_ids == g.token_ids and len(v) == len(g.token_ids) == 5
    torch.testing.assert_close(
        torch.tensor(v.sigma).double(), axis.score(want, 1).double(), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        torch.tensor(v.projection).double(), axis.project(want, 1).double(), atol=1e-4, rtol=0
    )
    cos = axis.project(want, 1) / want.norm(dim=-1)
    torch.testing.assert_close(torch.tensor(v.cos).double(), cos.double(), atol=1e-5, rtol=0)
    assert v.tokens == tuple(lm.tokenizer.decode([t]) for t in g.token_ids)
    # the unsteered row reads the same point before and after: nothing was added
    (g0,) = generate(
        lm, axis, PROMPTS[:1], decoding=Decoding(greedy=True, max_new_tokens=5), trace=True, progress=False
    )
    (b0,) = generate(
        lm,
        axis,
        PROMPTS[:1],
        decoding=Decoding(greedy=True, max_new_tokens=5),
        trace=Tracing(value_at="before"),
        progress=False,
    )
    assert g0.trace.values["resid_post[1]"][:-1] == b0.trace.values["resid_post[1]"][:-1]


@pytest.mark.parametrize("arch", ARCHS)
def test_pid_holds_planted_target_and_respects_cap(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm, sigma=0.3)
    layer = 1
    # dead-beat gains: the value the next block receives sits on the target at every generated token
    with record(lm, [Point(layer + 1, Site.resid_pre)]) as rec:
        gens = control(
            lm,
            axis,
            PROMPTS[:2],
            PID(target=2.5, kp=1.0, ki=0.0, kd=0.0, cap=50.0),
            decoding=Decoding(max_new_tokens=6, seed=1),
            progress=False,
        )
    after = torch.cat([axis.score(v, layer) for v in rec.values[Point(layer + 1, Site.resid_pre)][1:]], dim=1)
    torch.testing.assert_close(after, torch.full_like(after, 2.5), atol=1e-4, rtol=0)
    for g in gens:
        z = torch.tensor(g.trace.values["resid_post[1] after"][g.trace.n_prompt : -1])
        torch.testing.assert_close(z, torch.full_like(z, 2.5), atol=1e-4, rtol=0)
    # PI gains: within 0.5 σ of the target, on average, once settled (tokens 8..)
    gens = control(
        lm, axis, PROMPTS[:2], PID(target=2.0), decoding=Decoding(max_new_tokens=16, seed=1), progress=False
    )
    for g in gens:
        z = torch.tensor(g.trace.values["resid_post[1] after"][g.trace.n_prompt + 8 : -1])
        assert float((z - 2.0).abs().mean()) < 0.5
    # an unreachable target: |α| pinned at the cap, never past it
    gens = control(
        lm,
        axis,
        PROMPTS[:2],
        PID(target=80.0, cap=1.5),
        decoding=Decoding(max_new_tokens=6, seed=1),
        progress=False,
    )
    for g in gens:
        a = torch.tensor(g.trace.alpha[g.trace.n_prompt : -1])
        assert float(a.abs().max()) <= 1.5 and torch.allclose(a, torch.full_like(a, 1.5))
        assert all(x == 0.0 for x in g.trace.alpha[: g.trace.n_prompt])


def test_outputs_bit_identical_after_exception_in_generation(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)
    ids, mask = _batch(lm)
    before = _forward(lm, ids, mask).logits

    class Boom:
        calls = 0

        def __call__(self, input_ids, scores):
            Boom.calls += 1
            if Boom.calls == 3:
                raise KeyboardInterrupt
            return scores

    with pytest.raises(KeyboardInterrupt), steer(lm, axis, 4.0), torch.no_grad():
        lm.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
            logits_processor=[Boom()],
        )
    assert torch.equal(_forward(lm, ids, mask).logits, before)


def test_bad_input_one_clear_line(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)
    no_norm = ValueAxis(**{**axis.__dict__, "mean_norm": torch.full((lm.n_layers,), float("nan"))})
    with pytest.raises(ValueprobeError, match="no mean residual norm"):
        steer(lm, SteeringSpec(no_norm, unit="norm"), 1.0)
    with pytest.raises(ValueprobeError, match="has no layer"):
        steer(lm, SteeringSpec(axis[1], layers=2), 1.0)
    other = tiny_lm_factory("llama", d_model=32)
    with pytest.raises(ValueprobeError, match="d_model 64"):
        steer(other, axis, 1.0)
    with pytest.raises(ValueprobeError, match="max_new_tokens"):
        generate(lm, axis, PROMPTS, decoding=Decoding(max_new_tokens=0))
    with pytest.raises(ValueprobeError, match="empty"):
        generate(lm, axis, [""], decoding=Decoding(max_new_tokens=2))
