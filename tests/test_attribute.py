"""Direct attribution, patching and ablation against trusted references, on tiny random models.

References: the residual stream from ``output_hidden_states`` (the terms must sum to its projection),
TransformerLens's own per-head results and ``decompose_resid`` (the same terms), whole-sequence
patching done by hand with ``intervene`` (exact patching runs only the tokens after the shared
prefix and must give the same numbers), and closed forms on planted data.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from test_steer import planted_axis

from valueprobe.activations.encode import encode
from valueprobe.attribute.ablation import Means, _metric, ablation_hooks
from valueprobe.attribute.components import Component, direct_terms, patchable
from valueprobe.attribute.contrast import Classes
from valueprobe.attribute.direct import Projector, direct_rows
from valueprobe.attribute.gradient import attrib_pair
from valueprobe.attribute.pairs import read_patch_pairs
from valueprobe.attribute.patching import PatchPlan, pair_runs, patch_pair
from valueprobe.attribute.readout import Readout
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.patch import Point, intervene, record
from valueprobe.hooks.tlens_route import bridge
from valueprobe.model.parts import block_parts
from valueprobe.stats.null import random_directions

FAMILIES = ("llama", "qwen2", "gpt2", "gpt_neox")
TEXTS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def add(a, b):\n    return a + b\n",
    "Wait, that's not right. Let me recompute: 12 * 7 = 84.",
    "Do you think your answer is correct? Yes.",
    "The quick brown fox jumps over the lazy dog - twice, maybe 3 times?",
]


def contrast() -> list[Example]:
    """Five texts, labels alternating, each with a pre and a post span."""
    return [
        Example(
            id=f"t{i}", text=t, label=i % 2, group=f"g{i % 3}",
            spans=(Span(0, len(t) // 2, "pre"), Span(len(t) // 2, len(t), "post")),
        )
        for i, t in enumerate(TEXTS)
    ]  # fmt: skip


def pair_examples(n: int = 2, *, question: bool = True) -> list[Example]:
    """``n`` matched pairs: one chat, its feedback +1 (label 1) or -1 (label 0), then a yes/no question."""
    out = []
    for i in range(n):
        for label, sign in ((1, "+"), (0, "-")):
            msgs = [
                {
                    "role": "user",
                    "content": f"Rewrite the sentence so that it follows the hidden rule. The quick fox {i}",
                },
                {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."},
                {
                    "role": "user",
                    "content": f"{sign}1. Rewrite the sentence: the capital of France is Paris.",
                },
                {"role": "assistant", "content": "The capital of Italy is Rome, maybe."},
            ]
            if question:
                msgs.append({"role": "user", "content": "Do you think your answer is correct?"})
            spans = (Span(0, 20, "pre", message=3), Span(20, len(msgs[3]["content"]), "post", message=3))
            out.append(
                Example(id=f"p{i}-{label}", messages=tuple(msgs), label=label, group=f"g{i}", spans=spans,
                        meta={"pair": f"p{i}", "behaviour": "yes_no"})
            )  # fmt: skip
    return out


def _projector(lm, layer: int, n_random: int = 3) -> Projector:
    axis = planted_axis(lm)
    return Projector.build(
        lm, axis.direction(layer), layer=layer, random=random_directions(lm.d_model, n_random, seed=0)
    )


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("positions", ["last", "mean", "spans"])
def test_terms_sum_to_the_projection_of_the_residual(tiny_lm_factory, arch, positions):
    lm = tiny_lm_factory(arch)
    layer = lm.n_layers - 2  # hidden_states[L + 1] is resid_post[L] below the last block (no final norm)
    proj = _projector(lm, layer)
    enc = encode(lm, contrast(), positions=positions)
    got = direct_rows(lm, proj, enc, batch_size=2)
    assert got.contributions.shape == (len(got.rows), len(direct_terms(lm, layer)), 4)
    # the reference: output_hidden_states, one example at a time, the same token rows
    ref = []
    for e in enc:
        with torch.no_grad():
            hs = lm.model(torch.tensor([e.input_ids]), output_hidden_states=True).hidden_states[layer + 1][0]
        ref += [hs[toks].double().mean(0) @ proj.directions.T for _, toks in e.selections]
    ref_t = torch.stack(ref)
    scale = float(ref_t.abs().max())
    assert torch.allclose(got.total, ref_t, atol=1e-5 * scale)
    # float32 rounding: the model summed the residual in float32, the terms are summed in float64
    assert float((got.contributions.sum(1) - got.total).abs().max()) <= 1e-5 * scale


def test_a_family_without_a_per_head_split_is_refused_naming_those_with_one(tiny_lm_factory):
    lm = tiny_lm_factory("gemma2")  # post-attention norms: its heads do not add to the residual
    with pytest.raises(ValueprobeError) as exc:
        block_parts(lm)
    msg = str(exc.value)
    assert "\n" not in msg and "gemma2" in msg
    for family in ("llama", "qwen2", "gpt2", "gpt_neox"):
        assert family in msg


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_terms_match_transformer_lens_per_head_results_and_decompose_resid(tiny_lm_factory, arch):
    """TransformerLens's own per-head results (hook_z through its W_O) and decompose_resid give the
    same per-component projections as valueprobe (TransformerBridge over the same weights)."""
    lm = tiny_lm_factory(arch)
    layer = lm.n_layers - 1
    proj = _projector(lm, layer)
    ex = contrast()[:1]
    enc = encode(lm, ex, positions="mean")
    got = direct_rows(lm, proj, enc, batch_size=1).contributions[0, :, 0]  # the axis column
    names = [c.name for c in direct_terms(lm, layer)]
    v = proj.directions[0]
    with torch.no_grad():
        _, cache = bridge(lm).run_with_cache(torch.tensor([enc[0].input_ids]))
        heads, head_labels = cache.stack_head_results(
            layer=layer + 1, return_labels=True
        )  # [heads, 1, pos, d]
        resid, labels = cache.decompose_resid(layer=layer + 1, return_labels=True)  # [terms, 1, pos, d]
    tl_heads = heads[:, 0].double().mean(1) @ v
    tl = dict(zip(labels, (resid[:, 0].double().mean(1) @ v).tolist(), strict=True))
    scale = float(tl_heads.abs().max())
    for label, value in zip(head_labels, tl_heads.tolist(), strict=True):
        assert got[names.index(label)].item() == pytest.approx(value, abs=1e-5 * scale)
    assert got[names.index("embed")].item() == pytest.approx(
        tl["embed"] + tl.get("pos_embed", 0.0), abs=1e-5 * scale
    )
    for b in range(layer + 1):
        assert got[names.index(f"L{b}.mlp")].item() == pytest.approx(tl[f"{b}_mlp_out"], abs=1e-5 * scale)
        attn = [got[names.index(n)].item() for n in names if n.startswith(f"L{b}H") or n == f"L{b}.attn_bias"]
        assert sum(attn) == pytest.approx(tl[f"{b}_attn_out"], abs=1e-5 * scale)


def _read(lm, layer: int, *, behaviour: bool) -> Readout:
    return Readout.of(lm, planted_axis(lm, sigma=0.05), layer=layer, behaviour=behaviour)


def _whole_sequence(lm, read, pair, point, *, cols=None, pos=None) -> torch.Tensor:
    """Patch ``point`` from the clean row into the corrupt row over the whole sequence, by hand."""
    src_ids, ids = torch.tensor([pair.clean.input_ids]), torch.tensor([pair.corrupt.input_ids])
    if point is not None:
        with record(lm, [point]) as rec, torch.no_grad():
            lm.model(src_ids)
        src = rec[point]

    def swap(h, step):
        h = h.clone()
        if cols is not None:
            h[..., cols] = src[..., cols]
        elif pos is not None:
            h[:, pos] = src[:, pos]
        else:
            h = src.clone()
        return h

    at = Point(read.layer, "resid_post")
    ctx = intervene(lm, point, swap) if point is not None else record(lm, [])
    with ctx, record(lm, [at]) as r, torch.no_grad():
        out = lm.model(ids)
    sigma = read.sigma_of(r[at][0].double() @ read.direction.double() @ read.weights(pair.clean))
    return torch.stack([sigma, read.yes_no(out.logits[:, -1])[0]])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_exact_patching_equals_patching_the_whole_sequence(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    read = _read(lm, 1, behaviour=True)
    (pair,) = read_patch_pairs(lm, pair_examples(1), positions="spans", span_labels=["post"])
    assert 0 < pair.first_diff < pair.n_tokens
    plan = PatchPlan.of(lm, layer=1, resid_layers=[0, 1])
    runs = pair_runs(lm, read, pair, plan)
    effects, grid, base = patch_pair(lm, read, pair, plan, runs, dest=1, batch_size=7)
    dest = _whole_sequence(lm, read, pair, None)
    assert torch.allclose(base, dest, atol=1e-6)
    width = plan.d_head
    for i, c in enumerate(plan.components):
        if c.kind == "head":
            got = _whole_sequence(
                lm, read, pair, Point(c.layer, "attn_z"), cols=slice(c.head * width, (c.head + 1) * width)
            )
        else:
            got = _whole_sequence(lm, read, pair, Point(c.layer, "mlp_out"))
        assert torch.allclose(effects[i], got - dest, atol=1e-6), c.name
    read_at = pair.clean.selections[0][1][0]
    for j, layer in enumerate(plan.resid_layers):
        for p in (
            pair.first_diff,
            pair.first_diff + 1,
            read_at,
            pair.n_tokens - 1,
        ):  # a few cells: each is 2 forwards
            got = _whole_sequence(lm, read, pair, Point(layer, "resid_post"), pos=p)
            assert torch.allclose(grid[j, p - pair.first_diff], got - dest, atol=1e-6)
    # the read is linear in the read layer's cells: their effects add up to clean minus corrupt
    at_read = grid[plan.resid_layers.index(1), :, 0].sum()
    assert float(at_read) == pytest.approx(float(runs.read[0] - runs.read[1]), abs=1e-6)
    assert float(runs.read[0] - runs.read[1]) != 0.0


def test_attribution_patching_is_exact_where_the_read_is_linear_and_ranks_like_exact(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    read = _read(lm, 1, behaviour=False)
    pairs = read_patch_pairs(lm, pair_examples(2), positions="spans", span_labels=["post"])
    plan = PatchPlan.of(lm, layer=1, resid_layers=[0, 1])
    for pair in pairs:
        runs = pair_runs(lm, read, pair, plan)
        exact, grid, _ = patch_pair(lm, read, pair, plan, runs, dest=1)
        approx, agrid, _ = attrib_pair(lm, read, pair, plan, runs, dest=1)
        # the read layer's own MLP and residual cells enter the read linearly: the estimate is exact
        last = [i for i, c in enumerate(plan.components) if c == Component("mlp", 1)]
        assert torch.allclose(approx[last, 0], exact[last, 0], atol=1e-7)
        assert torch.allclose(agrid[1, :, 0], grid[1, :, 0], atol=1e-7)
        assert spearmanr(approx[:, 0], exact[:, 0]).statistic > 0.9


def test_pairs_of_unequal_length_name_the_pair_and_the_first_differing_position(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    rows = pair_examples(1, question=False)
    msgs = [dict(m) for m in rows[1].messages]
    msgs[2]["content"] = msgs[2]["content"].replace("-1.", "-1 no, not at all.")
    bad = Example(
        id=rows[1].id, messages=tuple(msgs), label=0, group="g0", spans=rows[1].spans, meta=rows[1].meta
    )
    with pytest.raises(ValueprobeError) as exc:
        read_patch_pairs(lm, [rows[0], bad], positions="last")
    msg = str(exc.value)
    clean = encode(lm, [rows[0]], positions="last")[0].input_ids
    corrupt = encode(lm, [bad], positions="last")[0].input_ids
    first = next(i for i, (a, b) in enumerate(zip(clean, corrupt, strict=False)) if a != b)
    assert "\n" not in msg and "'p0'" in msg and f"position {first}" in msg


def test_pairs_need_meta_pair_and_one_row_of_each_label(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    rows = pair_examples(1)
    with pytest.raises(ValueprobeError, match="meta.pair"):
        read_patch_pairs(lm, [contrast()[0]], positions="last")
    with pytest.raises(ValueprobeError, match="one row of label 1"):
        read_patch_pairs(lm, [rows[0], rows[0]], positions="last")


def test_mean_ablation_holds_each_ablated_output_at_its_mean_and_leaves_the_model_as_it_was(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    ids = torch.tensor([encode(lm, contrast()[:1], positions="last")[0].input_ids])
    with torch.no_grad():
        before = lm.model(ids).logits
    z0 = torch.randn(lm.d_model)
    means = Means(z={0: z0, 1: torch.randn(lm.d_model)}, mlp={1: torch.randn(lm.d_model)})
    points = [Point(0, "attn_z"), Point(1, "mlp_out")]
    width = lm.d_model // 4
    with (
        ablation_hooks(lm, [Component("head", 0, head=2), Component("mlp", 1)], means),
        record(lm, points) as rec,
        torch.no_grad(),
    ):
        lm.model(ids)
    z = rec[points[0]][0]
    assert torch.equal(z[:, 2 * width : 3 * width], z0[2 * width : 3 * width].expand(z.shape[0], -1))
    assert not torch.equal(z[:, :width], z0[:width].expand(z.shape[0], -1))
    assert torch.equal(rec[points[1]][0], means.mlp[1].expand(z.shape[0], -1))
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, before)
    with pytest.raises(RuntimeError), ablation_hooks(lm, [Component("mlp", 1)], means), torch.no_grad():
        lm.model(ids)
        raise RuntimeError("an exception inside the ablated forward")
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, before)  # the hooks came off in finally


def test_a_set_is_necessary_only_when_its_drop_leaves_the_random_sets():
    null = [0.9, 0.88, 0.91, 0.87, 0.9] * 8
    beyond = _metric("AUROC", [0.9, 0.6, *null], 0.5)
    assert beyond.necessary and beyond.drop == pytest.approx(0.3)
    inside = _metric("AUROC", [0.9, 0.89, *null], 0.5)
    assert not inside.necessary
    # a separation below chance: a drop moves it up toward 0.5
    below = _metric("AUROC", [0.1, 0.4, *[1 - x for x in null]], 0.5)
    assert below.necessary and below.drop == pytest.approx(0.3)


def test_paired_gap_and_auroc_against_closed_forms():
    rng = np.random.default_rng(0)
    units = [f"u{i}" for i in range(20) for _ in range(2)]
    y = np.array([1, 0] * 20, dtype=float)
    base = np.repeat(rng.normal(0, 5, 20), 2)  # what a unit shares: large, cancels when paired
    x = base + y * 0.5 + rng.normal(0, 0.01, 40)
    cls = Classes.of(y, units)
    assert cls.paired and cls.gap(x[:, None])[0] == pytest.approx(0.5, abs=0.01)
    assert cls.auroc(x) == 1.0  # within pairs every class-1 row is above its partner
    lo, hi = cls.gap_ci(x[:, None], n_boot=500)
    assert lo[0] < cls.gap(x[:, None])[0] < hi[0] and hi[0] - lo[0] < 0.02  # the shared part cancels
    unpaired = Classes.of(y, [f"e{i}" for i in range(40)])
    assert not unpaired.paired
    assert unpaired.gap(x[:, None])[0] == pytest.approx(x[y == 1].mean() - x[y == 0].mean())
    t = np.tile(np.arange(2.0), 20)
    r = cls.within_unit_r(np.stack([t * 3 + base, -t + base], 1), t)
    assert r == pytest.approx([1.0, -1.0])


def test_patchable_components_are_every_head_and_mlp_up_to_the_layer(tiny_lm_factory):
    lm = tiny_lm_factory("gpt2")
    comps = patchable(lm, 1)
    assert [c.name for c in comps] == [f"L{b}H{h}" for h in range(4) for b in (0,)] + ["L0.mlp"] + [
        f"L1H{h}" for h in range(4)
    ] + ["L1.mlp"]
    assert "L0.attn_bias" in [c.name for c in direct_terms(lm, 1)]  # GPT-2's c_proj has a bias
    for c in direct_terms(lm, 1):
        assert Component.parse(c.name) == c


@pytest.mark.slow
def test_default_model_terms_sum_to_the_axis_and_match_transformer_lens(default_lm):
    """SmolLM2 through TransformerBridge: its per-head results and decompose_resid at the
    reward-history axis's layer give valueprobe's terms, and the terms sum to h_L·v̂."""
    from pathlib import Path

    from valueprobe.datasets.io import read_jsonl
    from valueprobe.probe.axis import ValueAxis

    root = Path(__file__).resolve().parents[1]
    axis = ValueAxis.load(root / "probes" / "smollm2-135m-reward-history", lm=default_lm)
    layer = axis.best_layer
    ex = read_jsonl(root / "data" / "icrl_pairs.jsonl")[:2]
    proj = Projector.build(default_lm, axis.direction(layer), layer=layer, random=random_directions(576, 2))
    enc = encode(default_lm, ex, positions="spans", span_labels=["post"])
    got = direct_rows(default_lm, proj, enc, batch_size=2)
    scale = float(got.total[:, 0].abs().max())
    assert float((got.contributions.sum(1) - got.total).abs().max()) <= 1e-5 * scale
    names = [c.name for c in direct_terms(default_lm, layer)]
    toks = enc[0].selections[0][1]
    with torch.no_grad():
        _, cache = bridge(default_lm).run_with_cache(torch.tensor([enc[0].input_ids]))
        heads, labels = cache.stack_head_results(layer=layer + 1, return_labels=True)
        mlps, mlp_labels = cache.decompose_resid(
            layer=layer + 1, mode="mlp", incl_embeds=False, return_labels=True
        )
    v = proj.directions[0]
    tl = (heads[:, 0, toks].double().mean(1) @ v).tolist() + (mlps[:, 0, toks].double().mean(1) @ v).tolist()
    ours = [got.contributions[0, names.index(n), 0].item() for n in labels]
    ours += [got.contributions[0, names.index(f"L{n.split('_')[0]}.mlp"), 0].item() for n in mlp_labels]
    assert np.allclose(ours, tl, atol=1e-4 * scale)


def test_ablation_reads_with_a_cache_what_whole_forwards_give(tiny_lm_factory):
    """The held-out read (a pair's shared prefix once, left-padded, each row's own tokens and each
    last token three times over its KV cache) equals whole forwards of each example alone: the read σ
    of each row, and the steering slope from α = ±s σ added at the last token."""
    from valueprobe.attribute.ablation import _read_batch

    lm = tiny_lm_factory("llama")
    rows = pair_examples(2)
    rows[2] = Example(
        **{**rows[2].__dict__, "messages": (*rows[2].messages[:-1], {"role": "user", "content": "Correct?"})}
    )
    encs = encode(lm, rows[:3], positions="spans")  # a pair, then a row of another length: it is padded
    assert len(encs[0].input_ids) == len(encs[1].input_ids) != len(encs[2].input_ids)
    first_diff = next(
        i for i, (a, b) in enumerate(zip(encs[0].input_ids, encs[1].input_ids, strict=True)) if a != b
    )
    assert first_diff > 0  # the pair shares a prefix: it runs once
    groups = [encs[:2], encs[2:]]
    read = _read(lm, 1, behaviour=True)
    sigma, slopes = _read_batch(lm, read, groups, 2.0)
    at = Point(1, "resid_post")
    want, want_slopes = [], []
    for enc in encs:
        ids = torch.tensor([enc.input_ids])
        with record(lm, [at]) as rec, torch.no_grad():
            lm.model(ids)
        proj = rec[at][0].double() @ read.direction.double()
        want += [read.sigma_of(proj[toks].mean()) for _, toks in enc.selections]
        got = []
        for alpha in (-2.0, 2.0):

            def add(h, step, a=alpha):
                h = h.clone()
                h[:, -1] += a * read.sigma * read.direction.to(h)
                return h

            with intervene(lm, at, add), torch.no_grad():
                got.append(read.yes_no(lm.model(ids).logits[:, -1])[0])
        want_slopes.append(float((got[1] - got[0]) / 4.0))
    assert torch.allclose(sigma, torch.stack(want), atol=1e-5)
    assert slopes.tolist() == pytest.approx(want_slopes, abs=1e-5)
    no_behaviour, none = _read_batch(lm, _read(lm, 1, behaviour=False), groups, 2.0)
    assert torch.allclose(no_behaviour, torch.stack(want), atol=1e-5) and torch.isnan(none).all()


def test_the_random_sets_match_the_top_sets_kinds(tiny_lm_factory, monkeypatch):
    from valueprobe.attribute import ablation
    from valueprobe.attribute.summary import row_classes

    lm = tiny_lm_factory("llama")
    read = _read(lm, 1, behaviour=False)
    enc = encode(lm, pair_examples(2), positions="spans", span_labels=["post"])
    held = ablation.held_out(lm, enc, ["p0", "p0", "p1", "p1"], lambda r, u: row_classes(r, u, "label"))
    means = ablation.mean_outputs(lm, enc, layer=1)
    seen = []
    real = ablation.ablation_hooks

    def spy(lm_, components, means_):
        seen.append(sorted(c.kind for c in components))
        return real(lm_, components, means_)

    monkeypatch.setattr(ablation, "ablation_hooks", spy)
    top = [Component("head", 1, head=0), Component("head", 0, head=3), Component("mlp", 1)]
    res = ablation.ablate(lm, read, held, top, means, n_draws=4, seed=1)
    assert seen[0] == [] and seen[1] == ["head", "head", "mlp"]
    assert all(kinds == ["head", "head", "mlp"] for kinds in seen[2:]) and len(seen) == 6
    assert res.components == ("L1H0", "L0H3", "L1.mlp") and len(res.auroc.null) == 4 and res.steer is None


def test_position_share_counts_the_gap_of_terms_that_track_position():
    from report_data import attribution_record

    res = attribution_record("direct")
    terms = tuple(
        replace(t, gap=g, position_r=r)
        for t, g, r in zip(
            res.terms, [0.0, 3.0, -1.0, 0.5] + [0.0] * 10, [0.1, 0.9, -0.6, 0.2] + [0.0] * 10, strict=False
        )
    )
    assert replace(res, terms=terms).position_share() == pytest.approx(4.0 / 4.5)
    nan = tuple(replace(t, position_r=float("nan")) for t in res.terms)
    assert np.isnan(replace(res, terms=nan).position_share())
