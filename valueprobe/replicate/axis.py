"""Rebuild the shipped value axis of a model from the committed data, in one command.

    valueprobe replicate axis --model smollm2-135m --data data --runs runs/axis-smollm2-135m \\
        --out probes/smollm2-135m-value

Steps, each resumable (rerun the same command after an interruption):
1. capture every contrast family into ``RUNS/FAMILY`` (all layers plus the embedding output);
2. fit the axis on ICRL with the paper's construction (``span_diff``: per rule, mean of ``post``
   spans minus mean of ``pre`` spans, averaged over rules), sweeping layers with held-out rules
   (35 train rules, the rest split into validation and test, as in the paper), then its μ and σ
   over the neutral reference (`valueprobe.probe.calibrate`);
3. the transfer matrix between the families at the chosen layer (``diff_means`` per family);
4. the logit lens of the axis at the chosen layer (top promoted and suppressed tokens);
5. the matched ICRL control: the same final paragraph after a history that never rewarded the
   rule. If the axis reads value, main ``post`` sits above control ``post`` (identical text); if
   it reads wording or position, ``post`` beats ``pre`` as much in the control as in the main set;
6. with ``history_out``, a second axis fitted on that matched contrast itself (rewarded vs never
   rewarded history, identical final text, rules held out in both conditions), scored without
   refitting on every other family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from valueprobe.activations.capture import CaptureSettings
from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.datasets.io import read_jsonl
from valueprobe.datasets.shipped import DATA_DIR
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.contrast import Contrast, MatchedControl
from valueprobe.probe.fit import FitReport, fit_probe
from valueprobe.probe.fitters import Method
from valueprobe.probe.project import project_layer
from valueprobe.probe.source import Source
from valueprobe.probe.transfer import evaluate_axis, transfer_matrix
from valueprobe.read.readout import logit_lens
from valueprobe.vocab import LayerKey, Positions, Target

__all__ = [
    "FamilySpec",
    "FAMILIES",
    "MatchedControl",
    "capture_families",
    "matched_control",
    "replicate_axis",
]


@dataclass(frozen=True)
class FamilySpec:
    """How one contrast family is read: which file, which tokens, how rows are grouped."""

    file: str
    positions: Positions
    span_labels: tuple[str, ...] | None = None
    group_by: str | None = None
    note: str = ""


FAMILIES: dict[str, FamilySpec] = {
    "icrl": FamilySpec(
        "icrl.jsonl", Positions.spans, note="pre vs post spans of the first post-discovery paragraph"
    ),
    "code": FamilySpec(
        "code.jsonl", Positions.mean, group_by="meta.pair", note="mean over the function's tokens"
    ),
    "backtracking": FamilySpec(
        "backtracking.jsonl",
        Positions.spans,
        span_labels=("prefix",),
        group_by="meta.pair",
        note="mean over the prefix before any backtrack marker",
    ),
    "confidence": FamilySpec(
        "confidence.jsonl", Positions.last, group_by="meta.pair", note="the prefilled response token"
    ),
    "refusal": FamilySpec(
        "refusal.jsonl", Positions.last, group_by="meta.pair", note="the assistant-start token"
    ),
    "icrl_control": FamilySpec(
        "icrl_control.jsonl", Positions.spans, note="matched control for icrl (evaluation only)"
    ),
}
TRANSFER_FAMILIES = ("icrl", "code", "backtracking", "confidence", "refusal")


def capture_families(
    lm: LoadedModel,
    data_dir: str | Path,
    runs_dir: str | Path,
    *,
    families: Mapping[str, FamilySpec] = FAMILIES,
    batch_size: int = 8,
    progress: bool = True,
) -> dict[str, ActivationStore]:
    """Capture (or resume) one store per family under ``runs_dir``; all layers plus ``embed``."""
    data_dir, runs_dir = Path(data_dir), Path(runs_dir)
    stores = {}
    for name, spec in families.items():
        path = data_dir / spec.file
        settings = CaptureSettings(
            layers="all",
            positions=spec.positions,
            span_labels=spec.span_labels,
            group_by=spec.group_by,
            include_embed=True,
            batch_size=batch_size,
        )
        stores[name] = capture_to_store(
            lm,
            read_jsonl(path),
            runs_dir / name,
            settings,
            dataset_path=str(path),
            dataset_sha256=sha256_file(path),
            progress=progress,
        )
    return stores


def _post_pre(store: ActivationStore, v: np.ndarray, layer: LayerKey) -> tuple[np.ndarray, np.ndarray]:
    """Projections of the ``post`` and of the ``pre`` span rows of ``store`` on ``v``."""
    src = Source({"store": store}, target=Target.span)
    (proj,) = project_layer(src, layer, v)
    return proj[src.keep & src.y], proj[src.keep & ~src.y]


def matched_control(
    axis: ValueAxis,
    main: ActivationStore,
    control: ActivationStore,
    *,
    layer: int | None = None,
    seed: int = 0,
) -> MatchedControl:
    """Compare the axis on ICRL conversations with their matched controls (see module docstring).

    AUROCs with bootstrap 95% CIs: ``post_vs_pre_main``, ``post_vs_pre_control`` and
    ``main_post_vs_control_post`` at the axis layer, and the last one at the embedding output,
    where identical text must give 0.5.
    """
    layer = axis.best_layer if layer is None else layer
    v = axis.direction(layer).double().numpy()
    (m_post, m_pre), (c_post, c_pre) = _post_pre(main, v, layer), _post_pre(control, v, layer)
    embed = None
    if main.manifest.has_embed and control.manifest.has_embed:
        embed = Contrast.of(_post_pre(main, v, "embed")[0], _post_pre(control, v, "embed")[0], seed=seed)
    return MatchedControl(
        layer=layer,
        post_vs_pre_main=Contrast.of(m_post, m_pre, seed=seed),
        post_vs_pre_control=Contrast.of(c_post, c_pre, seed=seed),
        main_post_vs_control_post=Contrast.of(m_post, c_post, seed=seed),
        embed_main_post_vs_control_post=embed,
        main_minus_control_post_sigma=float(m_post.mean() - c_post.mean()) / axis.sigma_at(layer),
    )


def replicate_axis(
    lm: LoadedModel,
    *,
    data_dir: str | Path = DATA_DIR,
    runs_dir: str | Path = "runs/axis",
    out: str | Path | None = None,
    n_splits: int = 5,
    train_groups: int = 35,
    seed: int = 0,
    batch_size: int = 8,
    history_out: str | Path | None = None,
    progress: bool = True,
) -> FitReport:
    """Capture all families, fit on ICRL, add transfer and the matched control; save to ``out``.

    Returns the :class:`valueprobe.probe.fit.FitReport` of the main axis (its axis carries every
    metric); with ``history_out`` also fits and saves the matched-control axis (see module doc).
    ``data_dir`` defaults to the shipped datasets (`valueprobe.datasets.shipped`).
    """
    for spec in FAMILIES.values():
        if not (Path(data_dir) / spec.file).exists():
            raise ValueprobeError(
                f"{Path(data_dir) / spec.file} is missing: run `valueprobe datasets build --family all --out {data_dir}`"
            )
    stores = capture_families(lm, data_dir, runs_dir, batch_size=batch_size, progress=progress)
    report = fit_probe(
        {"icrl": stores["icrl"]},
        method=Method.span_diff,
        n_splits=n_splits,
        train_groups=train_groups,
        seed=seed,
        transfer=False,
        lm=lm,
    )
    transfer = transfer_matrix(
        {name: stores[name] for name in TRANSFER_FAMILIES},
        layer=report.sweep.best_layer,
        method=Method.diff_means,
        n_splits=n_splits,
        seed=seed,
    )
    control = matched_control(report.axis, stores["icrl"], stores["icrl_control"], seed=seed)
    lens = logit_lens(report.axis, lm, k=20)
    metrics = {
        **report.axis.metrics,
        "transfer": transfer.to_dict(),
        "icrl_matched_control": control.to_dict(),
        "logit_lens": lens,
        "families": {name: vars(spec) for name, spec in FAMILIES.items()},
    }
    axis = replace(report.axis, metrics=metrics)
    if out is not None:
        axis.save(out)
    if history_out is not None:
        fit_history_axis(stores, n_splits=n_splits, seed=seed, lm=lm).save(history_out)
    return FitReport(axis, report.sweep, transfer)


def fit_history_axis(
    stores: Mapping[str, ActivationStore],
    *,
    n_splits: int = 5,
    seed: int = 0,
    lm: LoadedModel | None = None,
) -> ValueAxis:
    """Fit rewarded-vs-never-rewarded history at identical text, then score it on every family
    (with ``lm``, σ over the neutral reference: `valueprobe.probe.calibrate`)."""
    report = fit_probe(
        {"icrl": stores["icrl"], "icrl_control": stores["icrl_control"]},
        method=Method.diff_means,
        target=Target.label,
        share_groups=True,
        n_splits=n_splits,
        seed=seed,
        transfer=False,
        lm=lm,
    )
    others = {name: stores[name] for name in TRANSFER_FAMILIES}
    evaluated = {name: e.to_dict() for name, e in evaluate_axis(report.axis, others, seed=seed).items()}
    families = {name: vars(spec) for name, spec in FAMILIES.items()}  # how each figure was read
    return replace(
        report.axis, metrics={**report.axis.metrics, "evaluated_on": evaluated, "families": families}
    )
