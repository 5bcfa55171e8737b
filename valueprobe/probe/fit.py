"""Fit the value axis from activation stores: the layer sweep, then the transfer matrix; and calibration.

``valueprobe fit --store runs/icrl --method diff_means --out probes/value`` calls :func:`fit_probe`::

    from valueprobe.probe.fit import fit_probe
    report = fit_probe(["runs/icrl", "runs/code"], method="diff_means")
    report.axis.save("probes/value"); print(report.summary())

The primitives live below this module: :func:`valueprobe.probe.layer_sweep.sweep_layers` (held-out groups,
controls) and :func:`valueprobe.probe.transfer.transfer_matrix` (family to family).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from valueprobe.model.fingerprint import check_records
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.fitters import Method, MethodArg
from valueprobe.probe.layer_sweep import LayerSweepResult, sweep_layers
from valueprobe.probe.project import layer_moments
from valueprobe.probe.source import Source, Stores
from valueprobe.probe.transfer import TransferResult, transfer_matrix
from valueprobe.vocab import LayerSpec, Target

__all__ = ["FitReport", "calibrate", "fit_probe"]


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
) -> FitReport:
    """Sweep layers on the union of the stores, then (with two or more stores) the transfer matrix
    between them at the chosen layer; the returned axis carries both in ``metrics``.

    Args:
        stores: store folders (or stores), a list or ``{family: store}``.
        method: fitter name or zero-argument factory; layers: a layer spec ("all", "10:20", "::2").
        transfer: with two or more stores, also the transfer matrix at the best layer.
        share_groups: the stores hold the same groups (ICRL and its control): hold a group out in all.

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
    return FitReport(replace(sweep.axis, metrics=metrics), sweep, result)


def calibrate(axis: ValueAxis, stores: Stores | Source, *, force: bool = False) -> ValueAxis:
    """Recompute μ, σ and the mean norm of every axis layer over all rows of ``stores``.

    Args:
        force: calibrate on stores of another model (fingerprint differs) anyway.

    >>> axis = calibrate(axis_a - axis_b, "runs/neutral-smollm2")
    """
    src = stores if isinstance(stores, Source) else Source(stores, target=Target.label, need_both=False)
    check_records(
        src.fingerprint, axis.fingerprint, what=f"store {src.model_id} and axis {axis.model_id}", force=force
    )
    moments = [layer_moments(src, layer, axis.direction(layer).double().numpy()) for layer in axis.layers]
    mu, sigma, norm = (torch.tensor(col, dtype=torch.float32) for col in zip(*moments, strict=True))
    return replace(
        axis,
        mu=mu,
        sigma=sigma,
        mean_norm=norm,
        sigma_reference=f"all {len(src.y)} rows of {', '.join(src.names)}",
    )
