"""Fit the value axis on activation stores and sweep layers with held-out groups and controls.

``valueprobe fit --store runs/icrl --method diff_means --out probes/value`` calls :func:`fit_probe`::

    from valueprobe.sweep import fit_probe
    report = fit_probe(["runs/icrl", "runs/code"], method="diff_means")
    report.axis.save("probes/value")

Targets: in a store whose rows carry ``pre``/``post`` span labels (ICRL), positive = ``post``
rows and negative = ``pre`` rows, other rows are ignored; otherwise the example label
(``>= 0.5`` = success). Everything streams shard by shard, one layer at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from valueprobe.axis import ValueAxis
from valueprobe.fingerprint import check_records
from valueprobe.metrics import _mean_sd, _oriented_auroc, _shuffle_within_group, auroc, cohens_d
from valueprobe.probe import Fitter, Method, make_fitter, unit_or_zero
from valueprobe.source import (
    POSITION_CONTROLS,
    LayerKey,
    Source,
    Split,
    Stores,
    Target,
    _resolve_layers,
    grouped_splits,
)

if TYPE_CHECKING:
    from valueprobe.transfer import TransferResult


@dataclass
class _LayerFit:
    direction: np.ndarray  # [d_model] unit, all fitting rows
    mu: float
    sigma: float
    mean_norm: float
    proj: np.ndarray  # [n_rows, n_cols] projections: full, then per split (fit, shuffled, random)


def _run_layer(
    src: Source,
    layer: LayerKey,
    method: Method,
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
    fit_unit = (lambda f: unit_or_zero(f, src.d_model)) if layer == "embed" else (lambda f: f.fit().unit)
    unit = fit_unit(full)
    cols = [unit]
    for (fit, shuf, _), r in zip(per_split, random_dirs, strict=True):
        cols += [fit_unit(fit), unit_or_zero(shuf, src.d_model), r]
    w = np.stack(cols, axis=1)  # [d_model, n_cols]
    proj = np.empty((len(src.y), w.shape[1]))
    for x, sl in src.iter_layer(layer):
        proj[sl] = x @ w
    ref = proj[src.keep, 0]
    return _LayerFit(unit, float(ref.mean()), float(ref.std()), norm_sum / int(src.keep.sum()), proj)


@dataclass(frozen=True, eq=False)
class SweepResult:
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
            m = _mean_sd(a)
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
        name, value = self.strongest_control
        h = _mean_sd(self.heldout_auroc)
        # The held-out AUROC is read at each split's own validation-chosen layer (an honest
        # estimate of the whole procedure), so it can differ from the starred row of the table.
        chosen = ", ".join(str(c) for c in self.chosen_layers)
        return (
            f"best layer {self.best_layer} (chosen on validation groups): held-out AUROC"
            f" {h['mean']:.3f} ± {h['sd']:.3f} over {len(self.splits)} splits, each at its own"
            f" validation-chosen layer ({chosen}); strongest control {name}"
            f" {value:.3f}; margin {self.margin:+.3f}"
        )

    def to_dict(self) -> dict:
        """JSON-ready metrics, stored in probe.json under ``metrics.sweep``."""
        return {
            "method": self.method,
            "best_layer": self.best_layer,
            "n_splits": len(self.splits),
            "chosen_layers": list(self.chosen_layers),
            "heldout_auroc": _mean_sd(self.heldout_auroc),
            "by_layer": {
                str(layer): {
                    "val_auroc": _mean_sd(self.val_auroc[i]),
                    "test_auroc": _mean_sd(self.test_auroc[i]),
                    "cohens_d": _mean_sd(self.test_d[i]),
                    "shuffled_auroc": _mean_sd(self.shuffled_auroc[i]),
                    "random_auroc": _mean_sd(self.random_auroc[i]),
                }
                for i, layer in enumerate(self.layers)
            },
            "controls": {k: _mean_sd(v) for k, v in self.controls().items()},
            "strongest_control": self.strongest_control[0],
            "margin": self.margin,
            "cosine_layers": list(self.layers),
            "cosine": self.cosine.tolist(),
            "splits": [
                {"train": sorted(s.train), "val": sorted(s.val), "test": sorted(s.test)} for s in self.splits
            ],
        }


def _axis(
    src: Source,
    method: Method,
    layers: list[int],
    fits: list[_LayerFit],
    best: int,
    metrics: dict,
    reference: str,
) -> ValueAxis:
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    return ValueAxis(
        directions=torch.from_numpy(np.stack([f.direction for f in fits])).float(),
        layers=tuple(layers),
        mu=t([f.mu for f in fits]),
        sigma=t([f.sigma for f in fits]),
        mean_norm=t([f.mean_norm for f in fits]),
        best_layer=best,
        site=src.site,
        method=method if isinstance(method, str) else getattr(method, "__name__", "custom"),
        model_id=src.model_id,
        fingerprint=src.fingerprint,
        d_model=src.d_model,
        sigma_reference=reference,
        metrics=metrics,
        datasets=src.provenance(),
    )


def _reference(src: Source) -> str:
    return f"fitting set: {int(src.keep.sum())} rows of {', '.join(src.names)}, both classes pooled"


def fit_store(
    stores: Stores | Source,
    *,
    method: Method = "diff_means",
    layers: str | Sequence[int] | None = None,
    best_layer: int | None = None,
    target: Target = "auto",
) -> ValueAxis:
    """Fit one direction per layer on every fitting row of the store(s); no held-out evaluation.

    Without ``best_layer`` the axis's default layer is the one with the largest in-sample
    Cohen's d (recorded in ``metrics.best_layer_rule``); use :func:`sweep_layers` to choose it on
    held-out groups instead.

    >>> axis = fit_store("runs/icrl-smollm2", method="span_diff", layers="10:20")
    """
    src = stores if isinstance(stores, Source) else Source(stores, target=target)
    layers = _resolve_layers(layers, src)
    fits = [_run_layer(src, layer, method, [], [], np.zeros((0, src.d_model))) for layer in layers]
    k = src.keep
    in_sample = {
        layer: {"auroc": auroc(f.proj[k, 0], src.y[k]), "cohens_d": cohens_d(f.proj[k, 0], src.y[k])}
        for layer, f in zip(layers, fits, strict=True)
    }
    rule = "given"
    if best_layer is None:
        best_layer, rule = max(in_sample, key=lambda x: in_sample[x]["cohens_d"]), "in-sample Cohen's d"
    metrics = {"in_sample": {str(k): v for k, v in in_sample.items()}, "best_layer_rule": rule}
    return _axis(src, method, layers, fits, best_layer, metrics, _reference(src))


def sweep_layers(
    stores: Stores | Source,
    *,
    method: Method = "diff_means",
    layers: str | Sequence[int] | None = None,
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    train_groups: int | None = None,
    seed: int = 0,
    target: Target = "auto",
) -> SweepResult:
    """Held-out-group AUROC of the probe at every layer, with controls, plus the all-group axis.

    Args:
        method: fitter name (see ``valueprobe.probe.METHODS``) or a zero-argument factory.
        layers: which store layers to sweep (default: all).
        n_splits: repeated random group splits; metrics are mean ± sd over them.
        val_frac, test_frac: fractions of the groups held out for layer choice and for test.
        train_groups: exact number of training groups instead (the paper: 35 rules).

    >>> sweep = sweep_layers("runs/icrl-smollm2", method="diff_means", n_splits=5)
    >>> print(sweep.summary())
    """
    src = stores if isinstance(stores, Source) else Source(stores, target=target)
    layers = _resolve_layers(layers, src)
    keep_groups = src.group[src.keep]
    splits = grouped_splits(
        keep_groups,
        src.y[src.keep],
        n_splits=n_splits,
        val_frac=val_frac,
        test_frac=test_frac,
        train_groups=train_groups,
        seed=seed,
    )
    rng = np.random.default_rng(seed + 1)
    shuffled = [_shuffle_within_group(src.y, src.group, src.keep, rng) for _ in splits]
    masks = [
        {part: src.keep & np.isin(src.group, list(getattr(sp, part))) for part in ("train", "val", "test")}
        for sp in splits
    ]
    y = src.y

    def evaluate(fit: _LayerFit) -> np.ndarray:  # [5, n_splits]: val, test, d, shuffled, random
        out = np.empty((5, len(splits)))
        for s, m in enumerate(masks):
            c = 1 + 3 * s
            out[:, s] = (
                auroc(fit.proj[m["val"], c], y[m["val"]]),
                auroc(fit.proj[m["test"], c], y[m["test"]]),
                cohens_d(fit.proj[m["test"], c], y[m["test"]]),
                auroc(fit.proj[m["test"], c + 1], shuffled[s][m["test"]]),
                _oriented_auroc(fit.proj[:, c + 2], y, m["train"], m["test"]),
            )
        return out

    def random_dirs() -> np.ndarray:
        r = rng.standard_normal((len(splits), src.d_model))
        return r / np.linalg.norm(r, axis=1, keepdims=True)

    fits, stats = [], []
    for layer in layers:
        fits.append(_run_layer(src, layer, method, splits, shuffled, random_dirs()))
        stats.append(evaluate(fits[-1]))
        fits[-1].proj = np.empty((0, 0))  # free the projections; keep direction and calibration
    st = np.stack(stats)  # [n_layers, 5, n_splits]
    embed = None
    if src.has_embed:
        embed = evaluate(_run_layer(src, "embed", method, splits, shuffled, random_dirs()))[1]
    position = {
        name: np.array([_oriented_auroc(getattr(src, name), y, m["train"], m["test"]) for m in masks])
        for name in POSITION_CONTROLS
    }
    best = layers[int(np.argmax(st[:, 0].mean(axis=1)))]
    chosen = tuple(layers[int(i)] for i in np.argmax(st[:, 0], axis=0))
    heldout = np.array([st[layers.index(c), 1, s] for s, c in enumerate(chosen)])
    dirs = np.stack([f.direction for f in fits])
    result = SweepResult(
        method=str(method),
        layers=tuple(layers),
        val_auroc=st[:, 0],
        test_auroc=st[:, 1],
        test_d=st[:, 2],
        shuffled_auroc=st[:, 3],
        random_auroc=st[:, 4],
        embed_auroc=embed,
        position_auroc=position,
        cosine=dirs @ dirs.T,
        best_layer=best,
        chosen_layers=chosen,
        heldout_auroc=heldout,
        splits=tuple(splits),
        axis=_axis(src, method, layers, fits, best, {}, _reference(src)),
    )
    return replace(result, axis=_with_metrics(result.axis, {"sweep": result.to_dict()}))


def _with_metrics(axis: ValueAxis, metrics: dict) -> ValueAxis:
    return replace(axis, metrics={**axis.metrics, **metrics})


def calibrate(axis: ValueAxis, stores: Stores, *, force: bool = False) -> ValueAxis:
    """Recompute μ, σ and the mean norm of every axis layer over all rows of ``stores``.

    >>> axis = calibrate(axis_a - axis_b, "runs/neutral-smollm2")
    """
    src = Source(stores, target="label", need_both=False) if not isinstance(stores, Source) else stores
    check_records(src.fingerprint, axis.fingerprint, what=f"store {src.model_id} and axis {axis.model_id}",
                  force=force)  # fmt: skip
    mu, sigma, norm = [], [], []
    for layer in axis.layers:
        v = axis.direction(layer).double().numpy()
        proj, norms = [], []
        for x, _ in src.iter_layer(layer):
            proj.append(x @ v)
            norms.append(np.linalg.norm(x, axis=1))
        p = np.concatenate(proj)
        mu.append(p.mean())
        sigma.append(p.std())
        norm.append(np.concatenate(norms).mean())
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    return replace(
        axis,
        mu=t(mu),
        sigma=t(sigma),
        mean_norm=t(norm),
        sigma_reference=f"all {len(src.y)} rows of {', '.join(src.names)}",
    )


@dataclass(frozen=True, eq=False)
class FitReport:
    """What ``valueprobe fit`` produces: the axis (with metrics), its sweep, and the transfer matrix."""

    axis: ValueAxis
    sweep: SweepResult
    transfer: TransferResult | None

    def summary(self) -> str:
        lines = [self.sweep.summary()]
        if self.transfer is not None:
            lines.append(self.transfer.summary())
        return "\n".join(lines)


def fit_probe(
    stores: Stores,
    *,
    method: Method = "diff_means",
    layers: str | Sequence[int] | None = None,
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    train_groups: int | None = None,
    seed: int = 0,
    transfer: bool = True,
    target: Target = "auto",
    share_groups: bool = False,
) -> FitReport:
    """Sweep layers on the union of the stores, then (with two or more stores) the transfer matrix
    between them at the chosen layer; the returned axis carries both in ``metrics``.

    >>> report = fit_probe({"icrl": "runs/icrl", "code": "runs/code"}, method="diff_means")
    >>> report.axis.save("probes/value"); print(report.summary())
    """
    src = Source(stores, target=target, share_groups=share_groups)
    sweep = sweep_layers(
        src,
        method=method,
        layers=layers,
        n_splits=n_splits,
        val_frac=val_frac,
        test_frac=test_frac,
        train_groups=train_groups,
        seed=seed,
    )
    result = None
    if transfer and len(src.stores) > 1:
        from valueprobe.transfer import transfer_matrix

        result = transfer_matrix(
            dict(zip(src.names, src.stores, strict=True)),
            layer=sweep.best_layer,
            method=method,
            n_splits=n_splits,
            seed=seed,
            target=target,
        )
    axis = sweep.axis if result is None else _with_metrics(sweep.axis, {"transfer": result.to_dict()})
    return FitReport(axis, sweep, result)
