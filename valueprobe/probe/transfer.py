"""Transfer matrix: fit the axis on one contrast family, evaluate it on another.

The test of the central claim, that one axis serves all the contrasts::

    from valueprobe.probe.transfer import transfer_matrix
    from valueprobe.report.plots import transfer_heatmap
    tr = transfer_matrix({"icrl": "runs/icrl", "code": "runs/code", "refusal": "runs/refusal"}, layer=18)
    print(tr.summary()); transfer_heatmap(tr).write_html("transfer.html")

Rows are the family fitted on, columns the family evaluated on. Off-diagonal cells fit on all
of A and score all of B; diagonal cells are held-out-group AUROCs within the family (from
:func:`valueprobe.probe.layer_sweep.sweep_layers`), so no cell is scored on its own fitting rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from valueprobe.errors import ValueprobeError
from valueprobe.model.fingerprint import check_records
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.baselines import position_sign, shuffle_within_group
from valueprobe.probe.fitters import Method, MethodArg, make_fitter, method_name, unit_or_zero
from valueprobe.probe.layer_sweep import sweep_layers
from valueprobe.probe.project import project_layer
from valueprobe.probe.source import Source, StoreArg
from valueprobe.records import Record
from valueprobe.stats.metrics import MeanSd, auroc, bootstrap_ci, cohens_d
from valueprobe.stats.null import unit_directions
from valueprobe.vocab import LayerKey, Target

__all__ = ["AxisEvaluation", "TransferResult", "TransferSummary", "evaluate_axis", "transfer_matrix"]


@dataclass(frozen=True, eq=False)
class TransferResult:
    """[n_families, n_families] matrices, row = fitted on, column = evaluated on.

    Controls, the AUROC of each per cell: ``embed_auroc`` (same fit at the embedding output; None
    without an embed layer), ``shuffled_auroc`` (fit on A and scored on B with both families' labels
    permuted within group: the permutation null), ``random_auroc`` (random direction, sign chosen on
    the fitting family), ``position_auroc`` (1-D position scores ``token_index`` /
    ``relative_index`` / ``n_tokens``, sign chosen on the fitting family).
    """

    families: tuple[str, ...]
    layer: int
    method: str
    auroc: np.ndarray
    cohens_d: np.ndarray
    cosine: np.ndarray  # between the family-specific all-row directions
    embed_auroc: np.ndarray | None
    shuffled_auroc: np.ndarray
    random_auroc: np.ndarray
    position_auroc: dict[str, np.ndarray]  # position score name -> [F, F]
    notes: tuple[str, ...] = ()

    def controls(self) -> dict[str, np.ndarray]:
        """Each control's [F, F] AUROC by its reported name (``embed``, ``shuffled``, ``random``,
        ``position:NAME``)."""
        out = {} if self.embed_auroc is None else {"embed": self.embed_auroc}
        out |= {"shuffled": self.shuffled_auroc, "random": self.random_auroc}
        return out | {f"position:{k}": v for k, v in self.position_auroc.items()}

    @property
    def strongest_control(self) -> np.ndarray:
        """[F, F] AUROC of the strongest control in each cell."""
        return np.nanmax(np.stack(list(self.controls().values())), axis=0)

    @property
    def margin(self) -> np.ndarray:
        """[F, F] AUROC minus the strongest control's AUROC."""
        return self.auroc - self.strongest_control

    def _off(self, a: np.ndarray) -> np.ndarray:
        return a[~np.eye(len(self.families), dtype=bool)]

    def table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows): one row per (fit on, evaluated on) cell."""
        controls = self.controls()
        headers = ["fit on", "eval on", "AUROC", "Cohen's d", "cos", *controls, "margin"]
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
                        *(f"{c[i, j]:.3f}" for c in controls.values()),
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

    def record(self) -> TransferSummary:
        """What this matrix saves: the cells, each control's cells, the margin (``to_dict`` writes it)."""
        m = lambda a: tuple(tuple(row) for row in np.asarray(a).tolist())  # noqa: E731
        return TransferSummary(
            families=tuple(self.families),
            layer=self.layer,
            method=self.method,
            auroc=m(self.auroc),
            cohens_d=m(self.cohens_d),
            cosine=m(self.cosine),
            controls={k: m(v) for k, v in self.controls().items()},
            margin=m(self.margin),
            off_diagonal_auroc=MeanSd.of(self._off(self.auroc)),
            notes=tuple(self.notes),
        )

    def to_dict(self) -> dict:
        """JSON-ready, stored in probe.json under ``metrics.transfer`` (`TransferSummary`)."""
        return self.record().to_dict()


Matrix = tuple[tuple[float, ...], ...]  # [F, F]: row fitted on, column evaluated on


@dataclass(frozen=True)
class TransferSummary(Record):
    """What a transfer matrix saves (``probe.json`` ``metrics.transfer``, the demo's ``transfer``);
    the report draws from it."""

    families: tuple[str, ...]
    layer: int
    method: str
    auroc: Matrix
    cohens_d: Matrix
    cosine: Matrix
    controls: dict[str, Matrix]
    margin: Matrix  # AUROC minus the strongest control's, per cell
    off_diagonal_auroc: MeanSd
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _FamilyFit:
    units: dict[LayerKey, np.ndarray]  # fitted direction per layer key
    shuffled: dict[LayerKey, np.ndarray]
    random: np.ndarray  # [d_model], sign chosen on this family
    position_sign: dict[str, float]


def _fit_family(src: Source, keys: list[LayerKey], method: MethodArg, rng: np.random.Generator) -> _FamilyFit:
    y_shuf = shuffle_within_group(src.y, src.group, src.keep, rng)
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
    r = unit_directions(rng, 1, src.d_model)[0]
    r = r if r @ class_diff >= 0 else -r  # a one-parameter probe: only the sign is fitted
    signs = {name: position_sign(p, src.y, src.keep) for name, p in src.position.items()}
    return _FamilyFit(units, shuffled, r, signs)


@dataclass(frozen=True)
class _Cells:
    """The [F, F] AUROC (and Cohen's d) matrices of a transfer matrix, NaN until a cell is scored."""

    auroc: np.ndarray
    cohens_d: np.ndarray
    embed: np.ndarray
    shuffled: np.ndarray
    random: np.ndarray
    position: dict[str, np.ndarray]  # position score name -> [F, F]

    @classmethod
    def empty(cls, f: int, position_names: Iterable[str]) -> _Cells:
        def nan() -> np.ndarray:
            return np.full((f, f), np.nan)

        return cls(nan(), nan(), nan(), nan(), nan(), {name: nan() for name in position_names})


def _score_across(
    cells: _Cells,
    srcs: Sequence[Source],
    fits: Sequence[_FamilyFit],
    keys: list[LayerKey],
    rng: np.random.Generator,
) -> None:
    """The off-diagonal cells: family i's directions (fitted on all of i) scored on all of family j."""
    for j, src in enumerate(srcs):
        k, y = src.keep, src.y[src.keep]
        y_null = shuffle_within_group(src.y, src.group, src.keep, rng)[k]
        for key in keys:
            units, shuf, rand = (
                p[k]  # [kept rows, F]: column i is family i's direction
                for p in project_layer(
                    src,
                    key,
                    np.stack([fit.units[key] for fit in fits], axis=1),
                    np.stack([fit.shuffled[key] for fit in fits], axis=1),
                    np.stack([fit.random for fit in fits], axis=1),
                )
            )
            for i in range(len(fits)):
                if i == j:
                    continue
                if key == "embed":
                    cells.embed[i, j] = auroc(units[:, i], y)
                    continue
                cells.auroc[i, j], cells.cohens_d[i, j] = auroc(units[:, i], y), cohens_d(units[:, i], y)
                cells.shuffled[i, j] = auroc(shuf[:, i], y_null)
                cells.random[i, j] = auroc(rand[:, i], y)
                for name, p in src.position.items():
                    cells.position[name][i, j] = auroc(fits[i].position_sign[name] * p[k], y)


def _score_within(
    cells: _Cells,
    srcs: Mapping[str, Source],
    *,
    layer: int,
    method: MethodArg,
    n_splits: int,
    val_frac: float,
    test_frac: float,
    seed: int,
) -> list[str]:
    """The diagonal cells: held-out-group means of a one-layer sweep within each family. Returns a
    note for each family that has none."""
    notes = []
    for i, (name, src) in enumerate(srcs.items()):
        try:
            sw = sweep_layers(
                src,
                method=method,
                layers=[layer],
                n_splits=n_splits,
                val_frac=val_frac,
                test_frac=test_frac,
                seed=seed,
            )
        except ValueprobeError as e:
            notes.append(f"{name}: no held-out diagonal ({e})")
            continue
        cells.auroc[i, i], cells.cohens_d[i, i] = sw.test_auroc[0].mean(), sw.test_d[0].mean()
        cells.shuffled[i, i], cells.random[i, i] = sw.shuffled_auroc[0].mean(), sw.random_auroc[0].mean()
        if sw.embed_auroc is not None:
            cells.embed[i, i] = sw.embed_auroc.mean()
        for pos, v in sw.position_auroc.items():
            cells.position[pos][i, i] = v.mean()
    return notes


def transfer_matrix(
    stores: Mapping[str, StoreArg],
    *,
    layer: int,
    method: MethodArg = Method.diff_means,
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    seed: int = 0,
    target: Target = Target.auto,
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
    for src in srcs.values():
        src.check_layer(layer)
    with_embed = all(s.has_embed for s in srcs.values())
    keys: list[LayerKey] = [layer, "embed"] if with_embed else [layer]
    rng = np.random.default_rng(seed)
    fits = [_fit_family(src, keys, method, rng) for src in srcs.values()]
    cells = _Cells.empty(len(srcs), [name for name, _ in next(iter(srcs.values())).position.items()])
    _score_across(cells, list(srcs.values()), fits, keys, rng)
    notes = _score_within(
        cells,
        srcs,
        layer=layer,
        method=method,
        n_splits=n_splits,
        val_frac=val_frac,
        test_frac=test_frac,
        seed=seed,
    )
    units = np.stack([fit.units[layer] for fit in fits])
    return TransferResult(
        families=tuple(srcs),
        layer=layer,
        method=method_name(method),
        auroc=cells.auroc,
        cohens_d=cells.cohens_d,
        cosine=units @ units.T,
        embed_auroc=cells.embed if with_embed else None,
        shuffled_auroc=cells.shuffled,
        random_auroc=cells.random,
        position_auroc=cells.position,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class AxisEvaluation(Record):
    """A fixed axis scored on one family, nothing refitted: AUROC with a bootstrap 95% CI, Cohen's d,
    and the control, the same direction's AUROC at the embedding output (None without one: no key)."""

    OMIT = {"embed_auroc": None}

    auroc: float
    auroc_ci: tuple[float, float]
    cohens_d: float
    embed_auroc: float | None


def evaluate_axis(
    axis: ValueAxis,
    stores: Mapping[str, StoreArg],
    *,
    layer: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, AxisEvaluation]:
    """Score a fixed axis on other families: AUROC (with a bootstrap 95% CI) and Cohen's d per store.

    Nothing is refitted, so every number is out of sample; the same direction's projection at the
    embedding output is reported beside it as the control.

    >>> evaluate_axis(ValueAxis.load("probes/x"), {"refusal": "runs/refusal"})["refusal"].auroc
    """
    layer = axis.best_layer if layer is None else layer
    v = axis.direction(layer).double().numpy()
    out: dict[str, AxisEvaluation] = {}
    for name, store in stores.items():
        src = Source({name: store})
        check_records(src.fingerprint, axis.fingerprint, what=f"store {name} and axis {axis.model_id}")
        y = src.y[src.keep]
        (p,) = project_layer(src, layer, v)
        p = p[src.keep]
        embed = None
        if src.has_embed:
            (e,) = project_layer(src, "embed", v)
            embed = auroc(e[src.keep], y)
        ci = bootstrap_ci(auroc, p, y, n_boot=n_boot, seed=seed)
        out[name] = AxisEvaluation(auroc(p, y), ci, cohens_d(p, y), embed)
    return out
