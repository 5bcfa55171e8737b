"""Transfer matrix: fit the axis on one contrast family, evaluate it on another.

The test of the central claim, that one axis serves all the contrasts::

    from valueprobe.transfer import transfer_matrix
    from valueprobe.plots import transfer_heatmap
    tr = transfer_matrix({"icrl": "runs/icrl", "code": "runs/code", "refusal": "runs/refusal"}, layer=18)
    print(tr.summary()); transfer_heatmap(tr).write_html("transfer.html")

Rows are the family fitted on, columns the family evaluated on. Off-diagonal cells fit on all
of A and score all of B; diagonal cells are held-out-group AUROCs within the family (from
:func:`valueprobe.sweep.sweep_layers`), so no cell is scored on its own fitting rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from valueprobe.axis import ValueAxis
from valueprobe.errors import ValueprobeError
from valueprobe.fingerprint import check_records
from valueprobe.metrics import _mean_sd, _shuffle_within_group, auroc, cohens_d
from valueprobe.probe import Method, make_fitter, unit_or_zero
from valueprobe.source import POSITION_CONTROLS, LayerKey, Source, StoreArg, Target
from valueprobe.sweep import sweep_layers


@dataclass(frozen=True, eq=False)
class TransferResult:
    """[n_families, n_families] matrices, row = fitted on, column = evaluated on.

    ``controls`` holds the AUROC of each control per cell: ``embed`` (same fit at the embedding
    output), ``shuffled`` (fit on A and scored on B with both families' labels permuted within
    group: the permutation null), ``random`` (random direction, sign
    chosen on the fitting family), ``position:token_index`` / ``position:relative_index`` / ``position:n_tokens`` (1-D scores,
    sign chosen on the fitting family).
    """

    families: tuple[str, ...]
    layer: int
    method: str
    auroc: np.ndarray
    cohens_d: np.ndarray
    cosine: np.ndarray  # between the family-specific all-row directions
    controls: dict[str, np.ndarray]
    notes: tuple[str, ...] = ()

    @property
    def strongest_control(self) -> np.ndarray:
        """[F, F] AUROC of the strongest control in each cell."""
        return np.nanmax(np.stack(list(self.controls.values())), axis=0)

    @property
    def margin(self) -> np.ndarray:
        """[F, F] AUROC minus the strongest control's AUROC."""
        return self.auroc - self.strongest_control

    def _off(self, a: np.ndarray) -> np.ndarray:
        return a[~np.eye(len(self.families), dtype=bool)]

    def table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows): one row per (fit on, evaluated on) cell."""
        headers = ["fit on", "eval on", "AUROC", "Cohen's d", "cos", *self.controls, "margin"]
        rows = []
        for i, a in enumerate(self.families):
            for j, b in enumerate(self.families):
                rows.append(
                    [
                        a,
                        b + (" (held-out)" if i == j else ""),
                        f"{self.auroc[i, j]:.3f}",
                        f"{self.cohens_d[i, j]:.2f}",
                        f"{self.cosine[i, j]:.2f}",
                        *(f"{c[i, j]:.3f}" for c in self.controls.values()),
                        f"{self.margin[i, j]:+.3f}",
                    ]
                )
        return headers, rows

    def summary(self) -> str:
        off = self._off(self.auroc)
        return (
            f"transfer at layer {self.layer} ({len(self.families)} families): off-diagonal AUROC"
            f" {np.nanmean(off):.3f} (min {np.nanmin(off):.3f}), mean margin over the strongest control"
            f" {np.nanmean(self._off(self.margin)):+.3f}, mean cosine {np.nanmean(self._off(self.cosine)):.2f}"
        )

    def to_dict(self) -> dict:
        """JSON-ready, stored in probe.json under ``metrics.transfer``."""
        return {
            "families": list(self.families),
            "layer": self.layer,
            "method": self.method,
            "auroc": self.auroc.tolist(),
            "cohens_d": self.cohens_d.tolist(),
            "cosine": self.cosine.tolist(),
            "controls": {k: v.tolist() for k, v in self.controls.items()},
            "margin": self.margin.tolist(),
            "off_diagonal_auroc": _mean_sd(self._off(self.auroc)),
            "notes": list(self.notes),
        }


@dataclass
class _FamilyFit:
    units: dict[LayerKey, np.ndarray]  # fitted direction per layer key
    shuffled: dict[LayerKey, np.ndarray]
    random: np.ndarray  # [d_model], sign chosen on this family
    position_sign: dict[str, float]


def _fit_family(src: Source, keys: list[LayerKey], method: Method, rng: np.random.Generator) -> _FamilyFit:
    y_shuf = _shuffle_within_group(src.y, src.group, src.keep, rng)
    units, shuffled = {}, {}
    class_diff = np.zeros(src.d_model)
    for key in keys:
        fit, shuf = make_fitter(method), make_fitter(method)
        pair_keys = src.keys(fit.pair_by)
        sums, counts = np.zeros((2, src.d_model)), np.zeros(2)
        for x, sl in src.iter_layer(key):
            m = src.keep[sl]
            if not m.any():
                continue
            kk = None if pair_keys is None else pair_keys[sl][m]
            fit.update(x[m], src.y[sl][m], keys=kk)
            shuf.update(x[m], y_shuf[sl][m], keys=kk)
            yb = src.y[sl][m]
            sums[1] += x[m][yb].sum(axis=0)
            sums[0] += x[m][~yb].sum(axis=0)
            counts += [(~yb).sum(), yb.sum()]
        strict = key != "embed"  # controls: no signal is a result, not an error
        units[key] = fit.fit().unit if strict else unit_or_zero(fit, src.d_model)
        shuffled[key] = unit_or_zero(shuf, src.d_model)
        if key == keys[0]:
            class_diff = sums[1] / counts[1] - sums[0] / counts[0]
    r = rng.standard_normal(src.d_model)
    r /= np.linalg.norm(r)
    r = r if r @ class_diff >= 0 else -r  # a one-parameter probe: only the sign is fitted
    k = src.keep
    signs = {
        name: 1.0 if getattr(src, name)[k & src.y].mean() >= getattr(src, name)[k & ~src.y].mean() else -1.0
        for name in POSITION_CONTROLS
    }
    return _FamilyFit(units, shuffled, r, signs)


def transfer_matrix(
    stores: Mapping[str, StoreArg],
    *,
    layer: int,
    method: Method = "diff_means",
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    seed: int = 0,
    target: Target = "auto",
) -> TransferResult:
    """Fit on each family, evaluate on every other; diagonal = held-out groups within the family.

    Args:
        stores: family name -> store (or store path), e.g. ``{"icrl": ..., "code": ...}``.
        layer: the layer to compare at (usually the sweep's best layer).
        n_splits, val_frac, test_frac: grouped splits for the diagonal cells.

    >>> tr = transfer_matrix({"icrl": "runs/icrl", "code": "runs/code"}, layer=18)
    """
    if len(stores) < 2:
        raise ValueprobeError(f"a transfer matrix needs at least two families, got {list(stores)}")
    Source(stores, target=target)  # same model, site and d_model across families; both classes in each
    srcs = {name: Source({name: s}, target=target) for name, s in stores.items()}
    names = tuple(srcs)
    for src in srcs.values():
        src.check_layer(layer)
    keys: list[LayerKey] = [layer] + (["embed"] if all(s.has_embed for s in srcs.values()) else [])
    rng = np.random.default_rng(seed)
    fits = {n: _fit_family(srcs[n], keys, method, rng) for n in names}
    f = len(names)
    nan = lambda: np.full((f, f), np.nan)  # noqa: E731
    auc, d = nan(), nan()
    controls = {
        "embed": nan(),
        "shuffled": nan(),
        "random": nan(),
        **{f"position:{name}": nan() for name in POSITION_CONTROLS},
    }
    if "embed" not in keys:
        del controls["embed"]
    for j, b in enumerate(names):
        src = srcs[b]
        k, y = src.keep, src.y[src.keep]
        y_null = _shuffle_within_group(src.y, src.group, src.keep, rng)[k]
        for key in keys:
            cols = [c for a in names for c in ((fits[a].units[key], fits[a].shuffled[key], fits[a].random))]
            w = np.stack(cols, axis=1)  # [d_model, 3 * F]
            proj = np.empty((len(src.y), w.shape[1]))
            for x, sl in src.iter_layer(key):
                proj[sl] = x @ w
            proj = proj[k]
            for i, a in enumerate(names):
                if i == j:
                    continue
                if key == "embed":
                    controls["embed"][i, j] = auroc(proj[:, 3 * i], y)
                    continue
                auc[i, j], d[i, j] = auroc(proj[:, 3 * i], y), cohens_d(proj[:, 3 * i], y)
                controls["shuffled"][i, j] = auroc(proj[:, 3 * i + 1], y_null)
                controls["random"][i, j] = auroc(proj[:, 3 * i + 2], y)
                for name in POSITION_CONTROLS:
                    controls[f"position:{name}"][i, j] = auroc(
                        fits[a].position_sign[name] * getattr(src, name)[k], y
                    )
    notes = []
    for i, a in enumerate(names):
        try:
            sw = sweep_layers(
                srcs[a],
                method=method,
                layers=[layer],
                n_splits=n_splits,
                val_frac=val_frac,
                test_frac=test_frac,
                seed=seed,
            )
        except ValueprobeError as e:
            notes.append(f"{a}: no held-out diagonal ({e})")
            continue
        auc[i, i], d[i, i] = sw.test_auroc[0].mean(), sw.test_d[0].mean()
        for name, v in sw.controls().items():
            if name in controls:
                controls[name][i, i] = float(np.mean(v))
    units = np.stack([fits[n].units[layer] for n in names])
    return TransferResult(names, layer, str(method), auc, d, units @ units.T, controls, tuple(notes))


def _project(src: Source, key: LayerKey, v: np.ndarray) -> np.ndarray:
    return np.concatenate([x @ v for x, _ in src.iter_layer(key)])[src.keep]


def evaluate_axis(
    axis: ValueAxis,
    stores: Mapping[str, StoreArg],
    *,
    layer: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, dict]:
    """Score a fixed axis on other families: AUROC (with a bootstrap 95% CI) and Cohen's d per store.

    Nothing is refitted, so every number is out of sample; the same direction's projection at the
    embedding output is reported beside it as the control.

    >>> evaluate_axis(ValueAxis.load("probes/x"), {"refusal": "runs/refusal"})["refusal"]["auroc"]
    """
    from valueprobe.metrics import bootstrap_ci

    layer = axis.best_layer if layer is None else layer
    v = axis.direction(layer).double().numpy()
    out: dict[str, dict] = {}
    for name, store in stores.items():
        src = Source({name: store})
        check_records(src.fingerprint, axis.fingerprint, what=f"store {name} and axis {axis.model_id}")
        y = src.y[src.keep]
        p = _project(src, layer, v)
        row = {"auroc": auroc(p, y), "auroc_ci": list(bootstrap_ci(auroc, p, y, n_boot=n_boot, seed=seed))}
        row["cohens_d"] = cohens_d(p, y)
        if src.has_embed:
            row["embed_auroc"] = auroc(_project(src, "embed", v), y)
        out[name] = row
    return out
