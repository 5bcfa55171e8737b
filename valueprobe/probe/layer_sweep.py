"""Sweep layers with held-out groups and controls; fit one direction per layer.

Called by :func:`valueprobe.probe.fit.fit_probe` (``valueprobe fit``), or directly::

    from valueprobe.probe.layer_sweep import sweep_layers
    sweep = sweep_layers("runs/icrl", method="span_diff", layers="::2", n_splits=5)
    print(sweep.summary()); sweep.axis.save("probes/value")

Targets: in a store whose rows carry ``pre``/``post`` span labels (ICRL), positive = ``post``
rows and negative = ``pre`` rows, other rows are ignored; otherwise the example label
(``>= 0.5`` = success). Everything streams shard by shard, one layer at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.baselines import oriented_auroc, shuffle_within_group
from valueprobe.probe.fitters import Fitter, Method, MethodArg, make_fitter, method_name, unit_or_zero
from valueprobe.probe.project import project_layer
from valueprobe.probe.reference import SigmaReference
from valueprobe.probe.source import Source, Split, Stores, grouped_splits, resolve_layers
from valueprobe.records import Record
from valueprobe.stats.metrics import MeanSd, auroc, cohens_d, mean_sd
from valueprobe.stats.null import unit_directions
from valueprobe.vocab import LayerKey, LayerSpec, Target

__all__ = ["LayerAurocs", "SplitGroups", "LayerSweepResult", "LayerSweepSummary", "fit_store", "sweep_layers"]


@dataclass(frozen=True)
class _LayerFit:
    """One layer's directions and every row's projection on them (``S`` = number of splits)."""

    direction: np.ndarray  # [d_model] unit, fitted on all fitting rows
    mu: float
    sigma: float
    mean_norm: float
    full: np.ndarray  # [n_rows] on ``direction``
    fitted: np.ndarray  # [n_rows, S] on each split's training-group direction
    shuffled: np.ndarray  # [n_rows, S] on the direction fitted to within-group-shuffled labels
    random: np.ndarray  # [n_rows, S] on a random unit direction


@dataclass(frozen=True)
class _LayerScores:
    """One layer's held-out metrics, each [S]."""

    val_auroc: np.ndarray
    test_auroc: np.ndarray
    test_d: np.ndarray
    shuffled_auroc: np.ndarray
    random_auroc: np.ndarray


def _run_layer(
    src: Source,
    layer: LayerKey,
    method: MethodArg,
    splits: Sequence[Split],
    shuffled: Sequence[np.ndarray],
    random_dirs: np.ndarray,
) -> _LayerFit:
    """Two streaming passes over one layer: fit every fitter, then project every row."""
    full = make_fitter(method)
    keys = src.keys(full.pair_by)
    per_split: list[tuple[Fitter, Fitter, np.ndarray]] = [
        (make_fitter(method), make_fitter(method), np.isin(src.group, list(sp.train))) for sp in splits
    ]
    norm_sum = 0.0

    def update(f: Fitter, x: np.ndarray, y: np.ndarray, m: np.ndarray, sl: slice) -> None:
        if m.any():
            f.update(x[m], y[m], keys=None if keys is None else keys[sl][m])

    for x, sl in src.iter_layer(layer):
        keep = src.keep[sl]
        update(full, x, src.y[sl], keep, sl)
        norm_sum += float(np.linalg.norm(x[keep], axis=1).sum())
        for (fit, shuf, train), y_shuf in zip(per_split, shuffled, strict=True):
            m = keep & train[sl]
            update(fit, x, src.y[sl], m, sl)
            update(shuf, x, y_shuf[sl], m, sl)

    # The embedding output and the shuffled fits are controls: no signal is a result, not an error.
    def unit_of(f: Fitter) -> np.ndarray:
        return unit_or_zero(f, src.d_model) if layer == "embed" else f.fit().unit

    def columns(units: list[np.ndarray]) -> np.ndarray:  # [d_model, S]
        return np.stack(units, axis=1) if units else np.zeros((src.d_model, 0))

    unit = unit_of(full)
    proj_full, proj_fitted, proj_shuffled, proj_random = project_layer(
        src,
        layer,
        unit,
        columns([unit_of(fit) for fit, _, _ in per_split]),
        columns([unit_or_zero(sh, src.d_model) for _, sh, _ in per_split]),
        columns(list(random_dirs)),
    )
    ref = proj_full[src.keep]
    mean_norm = norm_sum / int(src.keep.sum())
    return _LayerFit(
        unit,
        float(ref.mean()),
        float(ref.std()),
        mean_norm,
        proj_full,
        proj_fitted,
        proj_shuffled,
        proj_random,
    )


@dataclass(frozen=True)
class LayerAurocs(Record):
    """One layer of a saved sweep: each metric over splits."""

    val_auroc: MeanSd
    test_auroc: MeanSd
    cohens_d: MeanSd
    shuffled_auroc: MeanSd
    random_auroc: MeanSd


@dataclass(frozen=True)
class SplitGroups(Record):
    """The groups of one split, sorted (JSON keeps them as lists)."""

    train: tuple[str, ...]
    val: tuple[str, ...]
    test: tuple[str, ...]


@dataclass(frozen=True)
class LayerSweepSummary(Record):
    """What a layer sweep saves (``probe.json`` ``metrics.sweep``, the demo's ``sweep`` and
    ``history``): per-layer AUROCs as mean ± sd over splits, the controls, the chosen layer.

    The report and `valueprobe.report.plots.sweep_figure` draw from it, so a figure redrawn from
    a saved file is the figure of the live run.

    >>> s = LayerSweepSummary.from_dict(json.load(open("probes/smollm2-135m-value/probe.json"))["metrics"]["sweep"])
    >>> s.best_layer, s.margin
    """

    method: str
    best_layer: int
    n_splits: int
    chosen_layers: tuple[int, ...]
    heldout_auroc: MeanSd
    by_layer: dict[int, LayerAurocs]
    controls: dict[str, MeanSd]
    strongest_control: str
    margin: float
    cosine_layers: tuple[int, ...]
    cosine: tuple[tuple[float, ...], ...]  # [n_layers, n_layers]
    splits: tuple[SplitGroups, ...]

    @property
    def layers(self) -> tuple[int, ...]:
        # by layer, not by key order: a probe.json written with sorted keys reads "0", "1", "10", ...
        return tuple(sorted(self.by_layer))

    def summary(self) -> str:
        """One line: the chosen layer, the held-out AUROC, the strongest control and the margin."""
        h = self.heldout_auroc
        # The held-out AUROC is read at each split's own validation-chosen layer (an honest
        # estimate of the whole procedure), so it can differ from the starred row of the table.
        chosen = ", ".join(str(c) for c in self.chosen_layers)
        return (
            f"best layer {self.best_layer} (chosen on validation groups): held-out AUROC"
            f" {h.mean:.3f} ± {h.sd:.3f} over {self.n_splits} splits, each at its own"
            f" validation-chosen layer ({chosen}); strongest control {self.strongest_control}"
            f" {self.controls[self.strongest_control].mean:.3f}; margin {self.margin:+.3f}"
        )


@dataclass(frozen=True, eq=False)
class LayerSweepResult:
    """Held-out AUROC by layer with controls. Arrays are [n_layers, n_splits] unless noted.

    The best layer maximizes mean *validation* AUROC; ``heldout_auroc`` [n_splits] is the test
    AUROC at the layer each split chose on its own validation groups (nested, never tuned on test).
    Controls: (a) ``embed`` the same fit at the embedding output, (b) ``shuffled`` the whole
    measurement with labels permuted within group (fit and scored against the permuted labels:
    the permutation null of the pipeline), (c) ``position:token_index`` / ``position:relative_index`` / ``position:n_tokens`` as 1-D scores, (d) ``random``
    a random unit direction; sign-only choices are made on the training groups.
    """

    method: str
    layers: tuple[int, ...]
    val_auroc: np.ndarray
    test_auroc: np.ndarray
    test_d: np.ndarray
    shuffled_auroc: np.ndarray
    random_auroc: np.ndarray
    embed_auroc: np.ndarray | None  # [n_splits]; None when the store has no embed layer
    position_auroc: dict[str, np.ndarray]  # name -> [n_splits]
    cosine: np.ndarray  # [n_layers, n_layers] between the all-group directions
    best_layer: int
    chosen_layers: tuple[int, ...]  # per split
    heldout_auroc: np.ndarray  # [n_splits]
    splits: tuple[Split, ...]
    axis: ValueAxis = field(repr=False)

    def controls(self) -> dict[str, np.ndarray]:
        """Test AUROC [n_splits] of each control, at each split's chosen layer where it has one."""
        at = [self.layers.index(c) for c in self.chosen_layers]
        cols = np.arange(len(self.splits))
        out = {"shuffled": self.shuffled_auroc[at, cols], "random": self.random_auroc[at, cols]}
        if self.embed_auroc is not None:
            out["embed"] = self.embed_auroc
        out.update({f"position:{k}": v for k, v in self.position_auroc.items()})
        return out

    @property
    def strongest_control(self) -> tuple[str, float]:
        means = {k: float(np.mean(v)) for k, v in self.controls().items()}
        name = max(means, key=lambda k: means[k])
        return name, means[name]

    @property
    def margin(self) -> float:
        """Mean held-out AUROC minus the mean AUROC of the strongest control."""
        return float(np.mean(self.heldout_auroc)) - self.strongest_control[1]

    def table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows) for a printed table: one row per layer, then one per control."""
        headers = ["layer", "val AUROC", "test AUROC", "Cohen's d", "shuffled", "random"]

        def ms(a: np.ndarray) -> str:
            m = mean_sd(a)
            return f"{m['mean']:.3f} ± {m['sd']:.3f}"

        rows = []
        for i, layer in enumerate(self.layers):
            mark = " *" if layer == self.best_layer else ""
            rows.append(
                [
                    f"{layer}{mark}",
                    ms(self.val_auroc[i]),
                    ms(self.test_auroc[i]),
                    ms(self.test_d[i]),
                    ms(self.shuffled_auroc[i]),
                    ms(self.random_auroc[i]),
                ]
            )
        for name, a in self.controls().items():
            if name in ("embed",) or name.startswith("position:"):
                rows.append([f"control {name}", "", ms(a), "", "", ""])
        return headers, rows

    def summary(self) -> str:
        return self.record().summary()

    def record(self) -> LayerSweepSummary:
        """What this sweep saves: per-split arrays reduced to mean ± sd (``to_dict`` writes it)."""
        name, _ = self.strongest_control
        return LayerSweepSummary(
            method=self.method,
            best_layer=self.best_layer,
            n_splits=len(self.splits),
            chosen_layers=tuple(self.chosen_layers),
            heldout_auroc=MeanSd.of(self.heldout_auroc),
            by_layer={
                layer: LayerAurocs(
                    MeanSd.of(self.val_auroc[i]),
                    MeanSd.of(self.test_auroc[i]),
                    MeanSd.of(self.test_d[i]),
                    MeanSd.of(self.shuffled_auroc[i]),
                    MeanSd.of(self.random_auroc[i]),
                )
                for i, layer in enumerate(self.layers)
            },
            controls={k: MeanSd.of(v) for k, v in self.controls().items()},
            strongest_control=name,
            margin=self.margin,
            cosine_layers=tuple(self.layers),
            cosine=tuple(tuple(row) for row in self.cosine.tolist()),
            splits=tuple(
                SplitGroups(*(tuple(sorted(g)) for g in (s.train, s.val, s.test))) for s in self.splits
            ),
        )

    def to_dict(self) -> dict:
        """JSON-ready metrics, stored in probe.json under ``metrics.sweep`` (`LayerSweepSummary`)."""
        return self.record().to_dict()


def _axis(src: Source, method: MethodArg, layers: list[int], fits: list[_LayerFit], best: int) -> ValueAxis:
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    return ValueAxis(
        directions=torch.from_numpy(np.stack([f.direction for f in fits])).float(),
        layers=tuple(layers),
        mu=t([f.mu for f in fits]),
        sigma=t([f.sigma for f in fits]),
        mean_norm=t([f.mean_norm for f in fits]),
        best_layer=best,
        site=src.site,
        method=method_name(method),
        model_id=src.model_id,
        fingerprint=src.fingerprint,
        d_model=src.d_model,
        sigma_reference=SigmaReference(
            f"fitting set: {int(src.keep.sum())} rows of {', '.join(src.names)}, both classes pooled"
        ),
        datasets=src.provenance(),
    )


def fit_store(
    stores: Stores | Source,
    *,
    method: MethodArg = Method.diff_means,
    layers: LayerSpec = None,
    best_layer: int | None = None,
    target: Target = Target.auto,
) -> ValueAxis:
    """Fit one direction per layer on every fitting row of the store(s); no held-out evaluation.

    Without ``best_layer`` the axis's default layer is the one with the largest in-sample
    Cohen's d (recorded in ``metrics.best_layer_rule``); use :func:`sweep_layers` to choose it on
    held-out groups instead.

    >>> axis = fit_store("runs/icrl-smollm2", method="span_diff", layers="10:20")
    """
    src = stores if isinstance(stores, Source) else Source(stores, target=target)
    layer_list = resolve_layers(layers, src)
    fits = [_run_layer(src, layer, method, [], [], np.zeros((0, src.d_model))) for layer in layer_list]
    k = src.keep
    in_sample = {
        layer: {"auroc": auroc(f.full[k], src.y[k]), "cohens_d": cohens_d(f.full[k], src.y[k])}
        for layer, f in zip(layer_list, fits, strict=True)
    }
    rule = "given"
    if best_layer is None:
        best_layer, rule = max(in_sample, key=lambda x: in_sample[x]["cohens_d"]), "in-sample Cohen's d"
    axis = _axis(src, method, layer_list, fits, best_layer)
    return replace(
        axis, metrics={"in_sample": {str(k): v for k, v in in_sample.items()}, "best_layer_rule": rule}
    )


def sweep_layers(
    stores: Stores | Source,
    *,
    method: MethodArg = Method.diff_means,
    layers: LayerSpec = None,
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    train_groups: int | None = None,
    seed: int = 0,
    target: Target = Target.auto,
) -> LayerSweepResult:
    """Held-out-group AUROC of the probe at every layer, with controls, plus the all-group axis.

    Args:
        method: fitter name (see :class:`valueprobe.probe.fitters.Method`) or a zero-argument factory.
        layers: which store layers to sweep (default: all).
        n_splits: repeated random group splits; metrics are mean ± sd over them.
        val_frac, test_frac: fractions of the groups held out for layer choice and for test.
        train_groups: exact number of training groups instead (the paper: 35 rules).

    >>> sweep = sweep_layers("runs/icrl-smollm2", method="diff_means", n_splits=5)
    >>> print(sweep.summary())
    """
    src = stores if isinstance(stores, Source) else Source(stores, target=target)
    layer_list = resolve_layers(layers, src)
    splits = grouped_splits(
        src.group[src.keep],
        src.y[src.keep],
        n_splits=n_splits,
        val_frac=val_frac,
        test_frac=test_frac,
        train_groups=train_groups,
        seed=seed,
    )
    held = _HeldOut.draw(src, splits, np.random.default_rng(seed + 1))
    fits, scores = zip(*(held.run(layer, method) for layer in layer_list), strict=True)
    embed = held.run("embed", method)[1].test_auroc if src.has_embed else None
    position = {
        name: np.array([oriented_auroc(p, src.y, m.train, m.test) for m in held.parts])
        for name, p in src.position.items()
    }
    val = np.stack([sc.val_auroc for sc in scores])  # [n_layers, n_splits]
    test = np.stack([sc.test_auroc for sc in scores])
    best = layer_list[int(np.argmax(val.mean(axis=1)))]
    chosen = tuple(layer_list[int(i)] for i in np.argmax(val, axis=0))
    dirs = np.stack([f.direction for f in fits])
    return LayerSweepResult(
        method=method_name(method),
        layers=tuple(layer_list),
        val_auroc=val,
        test_auroc=test,
        test_d=np.stack([sc.test_d for sc in scores]),
        shuffled_auroc=np.stack([sc.shuffled_auroc for sc in scores]),
        random_auroc=np.stack([sc.random_auroc for sc in scores]),
        embed_auroc=embed,
        position_auroc=position,
        cosine=dirs @ dirs.T,
        best_layer=best,
        chosen_layers=chosen,
        heldout_auroc=np.array([test[layer_list.index(c), s] for s, c in enumerate(chosen)]),
        splits=tuple(splits),
        axis=_axis(src, method, layer_list, list(fits), best),
    )


@dataclass(frozen=True)
class _HeldOut:
    """What every layer of a sweep shares: the splits, their row masks, one within-group label
    shuffle per split, and the generator the random-direction controls are drawn from."""

    src: Source
    splits: Sequence[Split]
    parts: list[_SplitRows]
    shuffled: list[np.ndarray]  # [n_rows] labels per split, permuted within group
    rng: np.random.Generator

    @classmethod
    def draw(cls, src: Source, splits: Sequence[Split], rng: np.random.Generator) -> _HeldOut:
        shuffled = [shuffle_within_group(src.y, src.group, src.keep, rng) for _ in splits]
        return cls(src, splits, [_SplitRows.of(src, sp) for sp in splits], shuffled, rng)

    def run(self, layer: LayerKey, method: MethodArg) -> tuple[_LayerFit, _LayerScores]:
        """Fit and score one layer; the fit keeps its direction and calibration, not its projections."""
        random_dirs = unit_directions(self.rng, len(self.splits), self.src.d_model)  # one per split
        fit = _run_layer(self.src, layer, method, self.splits, self.shuffled, random_dirs)
        empty = np.empty((0, 0))
        return replace(fit, full=empty, fitted=empty, shuffled=empty, random=empty), self.score(fit)

    def score(self, fit: _LayerFit) -> _LayerScores:
        """The held-out metrics of one layer's fit, one value per split."""
        y = self.src.y

        def each(metric) -> np.ndarray:
            return np.array([metric(s, m) for s, m in enumerate(self.parts)])

        return _LayerScores(
            val_auroc=each(lambda s, m: auroc(fit.fitted[m.val, s], y[m.val])),
            test_auroc=each(lambda s, m: auroc(fit.fitted[m.test, s], y[m.test])),
            test_d=each(lambda s, m: cohens_d(fit.fitted[m.test, s], y[m.test])),
            shuffled_auroc=each(lambda s, m: auroc(fit.shuffled[m.test, s], self.shuffled[s][m.test])),
            random_auroc=each(lambda s, m: oriented_auroc(fit.random[:, s], y, m.train, m.test)),
        )


@dataclass(frozen=True)
class _SplitRows:
    """Boolean row masks [n_rows] of one split's fitting rows in its train, val and test groups."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    @classmethod
    def of(cls, src: Source, split: Split) -> _SplitRows:
        def rows(groups: frozenset[str]) -> np.ndarray:
            return src.keep & np.isin(src.group, list(groups))

        return cls(rows(split.train), rows(split.val), rows(split.test))
