"""How tuning moved the axis: one probe, a base model and its tuned descendant, the same token ids.

    valueprobe shift --probe probes/smollm2-135m-value --base smollm2-135m --tuned runs/dpo-ckpt \\
        --data data/preference_safety_prompts.jsonl --targeted harmful --out runs/shift-safety

    >>> res = shift(axis, vp.load("smollm2-135m"), vp.load("runs/dpo-ckpt"), examples, ShiftSettings(targeted=("harmful",)))
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
from dataclasses import dataclass, replace
from functools import partial

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

__all__ = [
    "GroupShift",
    "Models",
    "PairSeparation",
    "ShiftResult",
    "ShiftSettings",
    "check_descendant",
    "check_groups",
    "group_by",
    "read_both",
    "shift",
    "shift_of_reads",
]


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


@dataclass(frozen=True)
class _Groups:
    """The examples' labels and groups, and which groups hold both labels (a contrast needs them)."""

    labels: np.ndarray
    group: np.ndarray
    names: list[str]
    two_class: list[str]

    @property
    def members(self) -> dict[str, np.ndarray]:
        return {g: self.group == g for g in self.names}

    def mean_shift(
        self, base: dict[int, np.ndarray], tuned: dict[int, np.ndarray]
    ) -> dict[str, tuple[float, ...]]:
        """Each group's mean paired shift at each layer of ``base`` (in its order)."""
        return {
            g: tuple(float((tuned[x] - base[x])[m].mean()) for x in base) for g, m in self.members.items()
        }


def _groups(examples: Sequence[Example], *, targeted: Sequence[str], contrast: bool, refit: bool) -> _Groups:
    """Group the examples; refuse targeted groups the data lacks and a contrast no group can give."""
    if not examples:
        raise ValueprobeError("no examples to read: the dataset is empty")
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
    return _Groups(labels=labels, group=group, names=names, two_class=two_class)


def _check_models(axis: ValueAxis, base: LoadedModel, tuned: LoadedModel, *, force: bool) -> None:
    """The tuned model descends from the base, and the axis reads both."""
    check_descendant(base, tuned)
    axis.check(base, force=force)
    with warnings.catch_warnings():  # the tuned model differs in weights by design
        warnings.simplefilter("ignore", FingerprintWarning)
        axis.check(tuned, force=force)


def _read_layers(
    axis: ValueAxis, base: LoadedModel, layers: LayerSpec, layer: int | None
) -> tuple[int, list[int]]:
    """The headline layer (default: the axis's best) and the axis layers read for the by-layer curves."""
    layer = axis.best_layer if layer is None else layer
    if layer not in axis.layers:
        raise ValueprobeError(f"layer {layer} is not in the axis; it has layers {list(axis.layers)}")
    chosen = parse_layers(layers, n_layers=base.n_layers) if layers is not None else list(axis.layers)
    return layer, sorted({x for x in chosen if x in axis.layers} | {layer})


def _random_shifts(
    axis: ValueAxis, h_base: np.ndarray, h_tuned: np.ndarray, *, layer: int, n_random: int, seed: int
) -> tuple[np.ndarray, float]:
    """Per-example shifts along ``n_random`` random directions, each in its own σ over the base data
    [n, n_random], and the factor that puts an axis shift (in the axis's σ) in the same data-σ unit."""
    R = random_directions(h_base.shape[1], n_random, seed=seed)  # [n_random, d_model]
    p_base, p_tuned = h_base @ R.T, h_tuned @ R.T  # [n, n_random]
    v = axis.direction(layer).double().numpy()
    to_data_sigma = float(axis.sigma[axis.layers.index(layer)]) / float((h_base @ v).std())
    return (p_tuned - p_base) / p_base.std(axis=0), to_data_sigma


def _group_shifts(
    groups: _Groups,
    s_base: np.ndarray,
    s_tuned: np.ndarray,
    rand: np.ndarray,
    to_data_sigma: float,
    *,
    targeted: Sequence[str],
    contrast: bool,
    n_boot: int,
    seed: int,
) -> tuple[tuple[GroupShift, ...], tuple[float, float] | None]:
    """Each group's paired shift against both nulls, and the range of the untargeted groups' shifts."""
    delta = s_tuned - s_base
    members = groups.members
    by_group = {g: float(delta[members[g]].mean()) for g in groups.names}
    untargeted = [g for g in groups.names if targeted and g not in targeted]
    untargeted_range = (
        (min(by_group[g] for g in untargeted), max(by_group[g] for g in untargeted)) if untargeted else None
    )
    q_edges = np.quantile(s_base, [0.25, 0.5, 0.75])
    q_base, q_tuned = np.digitize(s_base, q_edges), np.digitize(s_tuned, q_edges)
    out = []
    for g in groups.names:
        m, is_target = members[g], g in targeted
        null = rand[m].mean(axis=0)
        data_shift = by_group[g] * to_data_sigma
        lo, hi = null_range(null)
        ci = mean_ci(delta[m], n_boot=n_boot, seed=seed)
        leaves_untargeted = (
            untargeted_range is None or not is_target or _apart(ci, by_group[g], untargeted_range)
        )
        with_both = g in groups.two_class and contrast
        out.append(
            GroupShift(
                group=g,
                n=int(m.sum()),
                targeted=is_target,
                base_mean=float(s_base[m].mean()),
                tuned_mean=float(s_tuned[m].mean()),
                shift=by_group[g],
                ci=ci,
                shift_data_sigma=data_shift,
                null_range=(lo, hi),
                null_percentile=percentile_in(data_shift, null),
                d_before=cohens_d(s_base[m], groups.labels[m]) if with_both else None,
                d_after=cohens_d(s_tuned[m], groups.labels[m]) if with_both else None,
                share=float(m.mean()),
                quartiles_before=_quartile_shares(q_base, m),
                quartiles_after=_quartile_shares(q_tuned, m),
                counts=bool(not lo <= data_shift <= hi and leaves_untargeted and (is_target or not targeted)),
            )
        )
    return tuple(out), untargeted_range


def read_both(
    axis: ValueAxis,
    base: LoadedModel,
    tuned: LoadedModel,
    examples: Sequence[Example],
    *,
    layers: LayerSpec = None,
    layer: int | None = None,
    tokens: Positions = Positions.mean,
    batch_size: int = 8,
    force: bool = False,
    progress: bool = True,
) -> tuple[int, dict[int, np.ndarray], dict[int, np.ndarray]]:
    """The headline layer and each example's mean residual [n, d_model] at each read layer, in the
    base model and in the tuned one, fed the same token ids (the base tokenizer's)."""
    _check_models(axis, base, tuned, force=force)
    layer, keep = _read_layers(axis, base, layers, layer)
    encoded = encode(base, examples, positions=tokens)  # one tokenization feeds both models
    read = partial(_example_acts, encoded=encoded, layers=keep, site=Site(axis.site), batch_size=batch_size)
    return layer, read(base, progress=progress), read(tuned, progress=progress)


@dataclass(frozen=True)
class ShiftSettings:
    """The options of one shift (`shift`), shared by every part of a sharded one.

    Attributes:
        by: how the examples were grouped (`group_by`: ``group``, ``label`` or ``meta.KEY``), recorded.
        layers: layers for the by-layer curves (default: every axis layer).
        layer: the headline layer (default: the axis's best layer).
        tokens: ``mean`` over all tokens of each example, its ``last`` token, or ``spans`` (mean per span).
        targeted: groups the tuning aimed at; the others form the second null.
        contrast: report Cohen's d by label inside each group (needs groups holding both labels).
        n_random: random unit directions in the first null (≥ 32 recommended).
        refit: also fit diff-of-means axes on the data in both models; report cos per layer.
        n_boot: bootstrap resamples for the CIs; seed: theirs and the null's.
        batch_size: examples per forward.
    """

    by: str = "group"
    layers: LayerSpec = None
    layer: int | None = None
    tokens: str = "mean"
    targeted: tuple[str, ...] = ()
    contrast: bool = False
    n_random: int = 32
    refit: bool = False
    n_boot: int = 1000
    seed: int = 0
    batch_size: int = 8


def shift(
    axis: ValueAxis,
    base: LoadedModel,
    tuned: LoadedModel,
    examples: Sequence[Example],
    settings: ShiftSettings = ShiftSettings(),
    *,
    force: bool = False,
    progress: bool = True,
) -> ShiftResult:
    """Score ``examples`` on ``axis`` in both models and measure the per-group shift against two nulls.

    Args:
        axis: a probe of the base model (its μ, σ are the unit of every score).
        base, tuned: the base model and its tuned descendant (same architecture and vocabulary).
        examples: the dataset; ``group`` defines the groups, ``label`` the contrast.
        settings: layers, tokens, the targeted groups, contrast, nulls and bootstrap (`ShiftSettings`).
        force: read a probe of another architecture (d_model and layers are still checked).

    >>> res = shift(axis, base, tuned, examples, ShiftSettings(targeted=("harmful",), n_random=64))
    """
    s = settings
    check_groups(examples, targeted=s.targeted, contrast=s.contrast, refit=s.refit)
    layer, h_base, h_tuned = read_both(
        axis, base, tuned, examples, layers=s.layers, layer=s.layer, tokens=Positions(s.tokens),
        batch_size=s.batch_size, force=force, progress=progress,
    )  # fmt: skip
    models = Models(base.model_id, tuned.model_id, base.fingerprint, tuned.fingerprint)
    return shift_of_reads(axis, models, examples, layer, h_base, h_tuned, s)


@dataclass(frozen=True)
class Models:
    """The two models a shift compares, as its record names them."""

    base_id: str
    tuned_id: str
    base_fingerprint: str
    tuned_fingerprint: str


def check_groups(
    examples: Sequence[Example], *, targeted: Sequence[str], contrast: bool, refit: bool
) -> None:
    """Refuse, before any model runs, targeted groups the data lacks and a contrast no group can give."""
    _groups(examples, targeted=targeted, contrast=contrast, refit=refit)


def shift_of_reads(
    axis: ValueAxis,
    models: Models,
    examples: Sequence[Example],
    layer: int,
    h_base: dict[int, np.ndarray],
    h_tuned: dict[int, np.ndarray],
    settings: ShiftSettings,
) -> ShiftResult:
    """The shift from each example's residuals in both models (:func:`read_both`, or the merged
    parts of a sharded shift): everything after the models ran."""
    s = settings
    tokens, targeted, contrast, n_random, refit, n_boot, seed = (
        s.tokens, s.targeted, s.contrast, s.n_random, s.refit, s.n_boot, s.seed,
    )  # fmt: skip
    groups = _groups(examples, targeted=targeted, contrast=contrast, refit=refit)
    keep = sorted(h_base)
    by_layer_base = {x: np.asarray(axis.score(h_base[x], x), dtype=np.float64) for x in keep}
    by_layer_tuned = {x: np.asarray(axis.score(h_tuned[x], x), dtype=np.float64) for x in keep}
    s_base, s_tuned = by_layer_base[layer], by_layer_tuned[layer]
    rand = _random_shifts(axis, h_base[layer], h_tuned[layer], layer=layer, n_random=n_random, seed=seed)
    group_shifts, untargeted_range = _group_shifts(
        groups, s_base, s_tuned, *rand, targeted=targeted, contrast=contrast, n_boot=n_boot, seed=seed
    )
    members = groups.members
    return ShiftResult(
        base_id=models.base_id,
        tuned_id=models.tuned_id,
        base_fingerprint=models.base_fingerprint,
        tuned_fingerprint=models.tuned_fingerprint,
        probe=axis.ref(layer),
        layer=layer,
        layers=tuple(keep),
        tokens=str(tokens),
        n_random=n_random,
        groups=group_shifts,
        shift_by_layer=groups.mean_shift(by_layer_base, by_layer_tuned),
        pairs=_pair_separations(groups.names, members, by_layer_base, by_layer_tuned, targeted=targeted),
        untargeted_range=untargeted_range,
        axis_cosine=(
            _refit_cosines(
                axis, h_base, h_tuned, rows=np.isin(groups.group, groups.two_class), labels=groups.labels
            )
            if refit
            else None
        ),
        records=tuple(
            {"id": ex.id, "group": ex.group, "label": float(ex.label), "base": float(b), "tuned": float(t)}
            for ex, b, t in zip(examples, s_base, s_tuned, strict=True)
        ),
    )
