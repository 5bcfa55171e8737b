"""How tuning moved the axis: one probe, a base model and its tuned descendant, the same token ids.

    valueprobe shift --probe probes/smollm2-135m-value --base smollm2-135m --tuned runs/dpo-ckpt \\
        --data data/preference_safety_prompts.jsonl --targeted harmful --out runs/shift-safety

    >>> res = shift(axis, vp.load("smollm2-135m"), vp.load("runs/dpo-ckpt"), examples, targeted=["harmful"])
    >>> print(res.table()); res.write("runs/shift-safety")

Both models read the examples as tokenized once by the base tokenizer (their vocabularies must be
equal), and both are scored on the same axis with the axis's own μ and σ (its base-model
reference set), so a shift is in base σ. Per group: the mean paired shift with a bootstrap 95%
CI over examples; Cohen's d by label before and after (``contrast``); the share of each
base-defined value quartile the group holds, before and after (the paper's Arena analysis); and
for pairs of groups, d by layer, base vs tuned (the paper's Fig. 10).

A shift *counts* when it leaves two nulls: the same shift along ``n_random`` random unit
directions (each in its own σ over the base model's activations of the data; the axis is put in
the same unit for this comparison), and the shifts of the groups the tuning did not target.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from tqdm.auto import tqdm

from valueprobe.activations.capture import run_encoded
from valueprobe.activations.encode import encode
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.model.fingerprint import Fingerprint, FingerprintWarning
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.fitters import Method, make_fitter
from valueprobe.stats.metrics import cohens_d
from valueprobe.stats.null import mean_ci, null_range, percentile_in, random_directions
from valueprobe.tune.shift_records import GroupShift, PairSeparation, ShiftResult
from valueprobe.vocab import LayerSpec, PaddingSide, Positions, Site, parse_layers

__all__ = ["GroupShift", "PairSeparation", "ShiftResult", "check_descendant", "group_by", "shift"]


def group_by(examples: Sequence[Example], by: str) -> list[Example]:
    """Re-key ``group`` as ``group`` (unchanged), ``label`` (``label=1``) or ``meta.KEY`` (that meta value)."""
    if by == "group":
        return list(examples)
    if by == "label":
        return [replace(ex, group=f"label={ex.label:g}") for ex in examples]
    if by.startswith("meta.") and len(by) > 5:
        key = by[5:]
        missing = [ex.id for ex in examples if key not in ex.meta]
        if missing:
            raise ValueprobeError(
                f"--by {by}: example {missing[0]!r} has no meta.{key}; give every example one"
            )
        return [replace(ex, group=str(ex.meta[key])) for ex in examples]
    raise ValueprobeError(f"--by {by!r}: use group, label or meta.KEY")


def check_descendant(base: LoadedModel, tuned: LoadedModel) -> None:
    """Refuse a tuned model that cannot be fed the base's token ids or read on its axis."""
    if tuned.d_model != base.d_model or tuned.n_layers != base.n_layers:
        raise ValueprobeError(
            f"tuned model {tuned.model_id} has d_model {tuned.d_model} and {tuned.n_layers} layers but the base"
            f" {base.model_id} has d_model {base.d_model} and {base.n_layers}: pass a checkpoint tuned from the base"
        )
    if tuned.tokenizer.get_vocab() != base.tokenizer.get_vocab():
        raise ValueprobeError(
            f"tuned model {tuned.model_id} has another tokenizer vocabulary than {base.model_id}: both must"
            " read the same token ids; pass a checkpoint tuned from the base, with its tokenizer"
        )
    if Fingerprint.parse(tuned.fingerprint).arch != Fingerprint.parse(base.fingerprint).arch:
        raise ValueprobeError(
            f"tuned model {tuned.model_id} ({tuned.fingerprint}) is another architecture than {base.model_id}"
            f" ({base.fingerprint}): pass a checkpoint tuned from the base"
        )


def _example_acts(
    lm: LoadedModel, encoded: Sequence, *, layers: list[int], site: Site, batch_size: int, progress: bool
) -> dict[int, np.ndarray]:
    """Per-example residuals [n_examples, d_model] per layer (rows of one example averaged)."""
    with tqdm(total=len(encoded), desc=f"read {lm.model_id}", unit="ex", disable=not progress) as bar:
        res = run_encoded(
            lm,
            encoded,
            layers=layers,
            site=site,
            include_embed=False,
            batch_size=batch_size,
            padding_side=PaddingSide.right,
            on_batch=bar.update,
        )
    pos = {e.example.id: i for i, e in enumerate(encoded)}
    idx = np.array([pos[i] for i in res.rows.example_id])
    counts = np.bincount(idx, minlength=len(encoded))[:, None].astype(np.float64)
    out = {}
    for layer in layers:
        sums = np.zeros((len(encoded), res.acts[layer].shape[1]))
        np.add.at(sums, idx, res.acts[layer].double().numpy())
        out[layer] = sums / counts
    return out


def _apart(ci: tuple[float, float], point: float, other: tuple[float, float], *, tol: float = 1e-6) -> bool:
    """The CI (or, without one, the point) lies wholly above or below ``other``; gaps under ``tol`` σ are float noise."""
    lo, hi = ci if all(map(math.isfinite, ci)) else (point, point)
    return lo > other[1] + tol or hi < other[0] - tol


def _d(a: np.ndarray, b: np.ndarray) -> float:
    return cohens_d(np.concatenate([a, b]), np.r_[np.ones(a.size), np.zeros(b.size)])


def _quartile_shares(q: np.ndarray, in_group: np.ndarray) -> tuple[float, float, float, float]:
    shares = [float(in_group[q == k].mean()) if (q == k).any() else float("nan") for k in range(4)]
    return shares[0], shares[1], shares[2], shares[3]


def _pair_separations(
    names: list[str],
    members: dict[str, np.ndarray],
    base: dict[int, np.ndarray],
    tuned: dict[int, np.ndarray],
    *,
    targeted: Sequence[str],
    limit: int = 15,
) -> tuple[PairSeparation, ...]:
    """Cohen's d of each pair of groups at each layer (the paper's Fig. 10), base and tuned."""
    pairs = list(itertools.combinations(names, 2))
    if len(pairs) > limit and targeted:  # many groups: only pairs that involve a targeted group
        pairs = [p for p in pairs if p[0] in targeted or p[1] in targeted]

    def d_by_layer(s: dict[int, np.ndarray], a: str, b: str) -> tuple[float, ...]:
        return tuple(_d(s[x][members[a]], s[x][members[b]]) for x in sorted(s))

    return tuple(
        PairSeparation(a=a, b=b, d_base=d_by_layer(base, a, b), d_tuned=d_by_layer(tuned, a, b))
        for a, b in pairs[:limit]
    )


def _refit_cosines(
    axis: ValueAxis,
    h_base: dict[int, np.ndarray],
    h_tuned: dict[int, np.ndarray],
    *,
    rows: np.ndarray,
    labels: np.ndarray,
) -> dict[str, tuple[float, ...]]:
    """Diff-of-means axes fitted on ``rows`` in each model, and their cosines per layer."""

    def refit(h: np.ndarray) -> np.ndarray:
        return make_fitter(Method.diff_means).update(h[rows], labels[rows]).fit().unit

    units = [
        (refit(h_base[x]), refit(h_tuned[x]), axis.direction(x).double().numpy()) for x in sorted(h_base)
    ]
    return {
        "refit_base_vs_refit_tuned": tuple(float(a @ b) for a, b, _ in units),
        "axis_vs_refit_tuned": tuple(float(c @ b) for _, b, c in units),
        "axis_vs_refit_base": tuple(float(c @ a) for a, _, c in units),
    }


def shift(
    axis: ValueAxis,
    base: LoadedModel,
    tuned: LoadedModel,
    examples: Sequence[Example],
    *,
    layers: LayerSpec = None,
    layer: int | None = None,
    tokens: Positions = Positions.mean,
    targeted: Sequence[str] = (),
    contrast: bool = False,
    n_random: int = 32,
    refit: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
    batch_size: int = 8,
    force: bool = False,
    progress: bool = True,
) -> ShiftResult:
    """Score ``examples`` on ``axis`` in both models and measure the per-group shift against two nulls.

    Args:
        axis: a probe of the base model (its μ, σ are the unit of every score).
        base, tuned: the base model and its tuned descendant (same architecture and vocabulary).
        examples: the dataset; ``group`` defines the groups, ``label`` the contrast.
        layers: layers for the by-layer curves (default: every axis layer).
        layer: the headline layer (default: the axis's best layer).
        tokens: ``mean`` over all tokens of each example, its ``last`` token, or ``spans`` (mean per span).
        targeted: groups the tuning aimed at; the others form the second null.
        contrast: report Cohen's d by label inside each group (needs groups holding both labels).
        n_random: random unit directions in the first null (≥ 32 recommended).
        refit: also fit diff-of-means axes on the data in both models; report cos per layer.
        n_boot: bootstrap resamples for the CIs.
        force: read a probe of another architecture (d_model and layers are still checked).
    """
    if not examples:
        raise ValueprobeError("no examples to read: the dataset is empty")
    check_descendant(base, tuned)
    axis.check(base, force=force)
    with warnings.catch_warnings():  # the tuned model differs in weights by design
        warnings.simplefilter("ignore", FingerprintWarning)
        axis.check(tuned, force=force)
    labels = np.array([float(ex.label) for ex in examples])
    group = np.array([ex.group for ex in examples])
    names = sorted(set(group.tolist()))
    unknown = sorted(set(targeted) - set(names))
    if unknown:
        raise ValueprobeError(f"targeted groups {unknown} are not in the data; it has groups {names}")
    two_class = [g for g in names if len(set((labels[group == g] >= 0.5).tolist())) == 2]
    if (contrast or refit) and not two_class:
        raise ValueprobeError(
            f"a contrast needs groups holding both labels (0 and 1), but every group has one label ({names});"
            " drop --contrast/--refit and compare groups by their pair separation"
        )
    layer = axis.best_layer if layer is None else layer
    chosen = parse_layers(layers, n_layers=base.n_layers) if layers is not None else list(axis.layers)
    keep = sorted({x for x in chosen if x in axis.layers} | {layer})
    if layer not in axis.layers:
        raise ValueprobeError(f"layer {layer} is not in the axis; it has layers {list(axis.layers)}")
    encoded = encode(base, examples, positions=tokens)  # one tokenization feeds both models
    site = Site(axis.site)
    h_base = _example_acts(base, encoded, layers=keep, site=site, batch_size=batch_size, progress=progress)
    h_tuned = _example_acts(tuned, encoded, layers=keep, site=site, batch_size=batch_size, progress=progress)

    def scores(h: dict[int, np.ndarray], at: int) -> np.ndarray:
        return np.asarray(axis.score(h[at], at), dtype=np.float64)

    s_base, s_tuned = scores(h_base, layer), scores(h_tuned, layer)
    delta = s_tuned - s_base
    members = {g: group == g for g in names}
    # First null: the same paired shift along random directions, each in its own σ over the data.
    R = random_directions(base.d_model, n_random, seed=seed)  # [n_random, d_model]
    p_base, p_tuned = h_base[layer] @ R.T, h_tuned[layer] @ R.T  # [n, n_random]
    r_sigma = p_base.std(axis=0)
    v = axis.direction(layer).double().numpy()
    axis_sigma_data = float((h_base[layer] @ v).std())
    untargeted = [g for g in names if targeted and g not in targeted]
    by_group_shift = {g: float(delta[members[g]].mean()) for g in names}
    untargeted_range = (
        (min(by_group_shift[g] for g in untargeted), max(by_group_shift[g] for g in untargeted))
        if untargeted
        else None
    )
    q_edges = np.quantile(s_base, [0.25, 0.5, 0.75])
    q_base, q_tuned = np.digitize(s_base, q_edges), np.digitize(s_tuned, q_edges)
    out = []
    for g in names:
        m = members[g]
        rand = (p_tuned[m] - p_base[m]).mean(axis=0) / r_sigma
        data_shift = float(np.mean(delta[m]) * float(axis.sigma[axis.layers.index(layer)]) / axis_sigma_data)
        lo, hi = null_range(rand)
        leaves_random = not lo <= data_shift <= hi
        is_target = g in targeted
        ci = mean_ci(delta[m], n_boot=n_boot, seed=seed)
        leaves_untargeted = (
            untargeted_range is None or not is_target or _apart(ci, by_group_shift[g], untargeted_range)
        )
        with_both = g in two_class and contrast
        out.append(
            GroupShift(
                group=g,
                n=int(m.sum()),
                targeted=is_target,
                base_mean=float(s_base[m].mean()),
                tuned_mean=float(s_tuned[m].mean()),
                shift=by_group_shift[g],
                ci=ci,
                shift_data_sigma=data_shift,
                null_range=(lo, hi),
                null_percentile=percentile_in(data_shift, rand),
                d_before=cohens_d(s_base[m], labels[m]) if with_both else None,
                d_after=cohens_d(s_tuned[m], labels[m]) if with_both else None,
                share=float(m.mean()),
                quartiles_before=_quartile_shares(q_base, m),
                quartiles_after=_quartile_shares(q_tuned, m),
                counts=bool(leaves_random and leaves_untargeted and (is_target or not targeted)),
            )
        )
    by_layer_base = {x: scores(h_base, x) for x in keep}
    by_layer_tuned = {x: scores(h_tuned, x) for x in keep}
    shift_by_layer = {
        g: tuple(float((by_layer_tuned[x] - by_layer_base[x])[members[g]].mean()) for x in keep)
        for g in names
    }
    pairs = _pair_separations(names, members, by_layer_base, by_layer_tuned, targeted=targeted)
    cosine = (
        _refit_cosines(axis, h_base, h_tuned, rows=np.isin(group, two_class), labels=labels)
        if refit
        else None
    )
    records = tuple(
        {"id": ex.id, "group": ex.group, "label": float(ex.label), "base": float(b), "tuned": float(t)}
        for ex, b, t in zip(examples, s_base, s_tuned, strict=True)
    )
    i = axis.layers.index(layer)
    probe = {
        "model_id": axis.model_id,
        "fingerprint": axis.fingerprint,
        "method": axis.method,
        "site": axis.site,
        "mu": float(axis.mu[i]),
        "sigma": float(axis.sigma[i]),
        "sigma_reference": axis.sigma_reference,
        "sigma_data": axis_sigma_data,  # the axis's σ over these examples: sigma / sigma_data converts to data σ
    }
    return ShiftResult(
        base_id=base.model_id,
        tuned_id=tuned.model_id,
        base_fingerprint=base.fingerprint,
        tuned_fingerprint=tuned.fingerprint,
        probe=probe,
        layer=layer,
        layers=tuple(keep),
        tokens=str(tokens),
        n_random=n_random,
        groups=tuple(out),
        shift_by_layer=shift_by_layer,
        pairs=pairs,
        untargeted_range=untargeted_range,
        axis_cosine=cosine,
        records=records,
    )
