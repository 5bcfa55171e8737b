"""Fit the value axis from activation stores: the layer sweep, then the transfer matrix, then σ.

``valueprobe fit --store runs/icrl --method diff_means --out probes/value`` calls :func:`fit_probe`::

    from valueprobe.probe.fit import fit_probe
    report = fit_probe(["runs/icrl", "runs/code"], method="diff_means", lm=lm)
    report.axis.save("probes/value"); print(report.summary())

With ``lm`` the axis's μ, σ and mean norm are measured over the neutral reference
(:func:`valueprobe.probe.calibrate.calibrate`); without, they are its fitting set's, and the axis
says so when it is loaded.

The primitives live below this module: :func:`valueprobe.probe.layer_sweep.sweep_layers` (held-out groups,
controls) and :func:`valueprobe.probe.transfer.transfer_matrix` (family to family).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.calibrate import calibrate
from valueprobe.probe.fitters import Method, MethodArg
from valueprobe.probe.layer_sweep import LayerSweepResult, sweep_layers
from valueprobe.probe.source import Source, Stores
from valueprobe.probe.transfer import TransferResult, transfer_matrix
from valueprobe.vocab import LayerSpec, Target

__all__ = ["FitReport", "fit_probe"]


@dataclass(frozen=True, eq=False)
class FitReport:
    """What ``valueprobe fit`` produces: the axis (its metrics hold the sweep and transfer as
    ``to_dict()``), the sweep, and the transfer matrix (None with one store)."""

    axis: ValueAxis
    sweep: LayerSweepResult
    transfer: TransferResult | None

    def summary(self) -> str:
        lines = [self.sweep.summary()]
        if self.transfer is not None:
            lines.append(self.transfer.summary())
        return "\n".join(lines)


def fit_probe(
    stores: Stores,
    *,
    method: MethodArg = Method.diff_means,
    layers: LayerSpec = None,
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    train_groups: int | None = None,
    seed: int = 0,
    transfer: bool = True,
    target: Target = Target.auto,
    share_groups: bool = False,
    lm: LoadedModel | None = None,
) -> FitReport:
    """Sweep layers on the union of the stores, then (with two or more stores) the transfer matrix
    between them at the chosen layer; the returned axis carries both in ``metrics``.

    Args:
        stores: store folders (or stores), a list or ``{family: store}``.
        method: fitter name or zero-argument factory; layers: a layer spec ("all", "10:20", "::2").
        transfer: with two or more stores, also the transfer matrix at the best layer.
        share_groups: the stores hold the same groups (ICRL and its control): hold a group out in all.
        lm: the stores' model: μ, σ and the mean norm are then measured over the neutral reference.

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
    metrics = {"sweep": sweep.to_dict()}
    result = None
    if transfer and len(src.stores) > 1:
        result = transfer_matrix(
            dict(zip(src.names, src.stores, strict=True)),
            layer=sweep.best_layer,
            method=method,
            n_splits=n_splits,
            seed=seed,
            target=target,
        )
        metrics["transfer"] = result.to_dict()
    axis = replace(sweep.axis, metrics=metrics)
    return FitReport(axis if lm is None else calibrate(axis, lm), sweep, result)
