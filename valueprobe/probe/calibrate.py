"""Calibrate an axis: μ and σ of its projection at every layer over the one neutral reference.

    >>> axis = vp.calibrate(axis, lm)                        # the shipped neutral_text, on lm
    valueprobe calibrate --probe runs/old-axis --out runs/old-axis-calibrated
    valueprobe fit --store runs/icrl --out runs/my-axis      # fit calibrates the axis it writes

Every fitted axis (``fit``, ``replicate axis``, the demo) and every axis made by arithmetic goes
through :func:`calibrate`, so α = 1σ is the same kind of push on every axis: one standard
deviation of the projection over ordinary text (`valueprobe.probe.reference`). The mean residual
norm (α in % of the norm) is the axis's own, measured when it was fitted, so every strength given
in % of the norm keeps its meaning; an axis without one (an imported control vector) gets the
reference's. The text is read in chunks and only running sums are kept, so a large model needs no
more memory than one chunk.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.datasets.shipped import dataset_path
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.reference import NEUTRAL_RULE, NEUTRAL_TEXT, SigmaReference
from valueprobe.vocab import Positions

__all__ = ["calibrate", "reference_examples"]

CHUNK = 16  # paragraphs per capture: the residuals of one chunk are all that is held at once


def reference_examples(reference: str | Path = NEUTRAL_TEXT) -> tuple[Path, list[Example]]:
    """The reference's file and its paragraphs (plain text only: a chat would add its template)."""
    path = dataset_path(reference)
    examples = read_jsonl(path)
    for ex in examples:
        if ex.text is None:
            raise ValueprobeError(
                f"{path}: {ex.id!r} is a chat; a σ reference is plain text (give each row a 'text')"
            )
    return path, examples


def calibrate(
    axis: ValueAxis,
    lm: LoadedModel,
    *,
    reference: str | Path = NEUTRAL_TEXT,
    batch_size: int = 8,
    force: bool = False,
) -> ValueAxis:
    """μ and σ (population sd) of ``h·v̂`` at every axis layer, over every token of the reference
    but position 0 (the attention sink), read as plain text on ``lm``. A layer without a mean
    residual norm gets the reference's (the mean L2 norm of h over the same tokens).

    The statistics replaced are kept in ``formerly`` the first time (what was written in their
    units is read in them, `ValueAxis.former`); the reference is recorded in ``sigma_reference``.

    Args:
        reference: the shipped ``neutral_text`` (the one every axis shares), or another JSONL of
            plain text (recorded by its path; such an axis says so when loaded).
        force: calibrate on a model of another architecture than the axis's (d_model checked).

    >>> axis = vp.calibrate(axis_a - axis_b, lm)
    >>> axis.sigma_reference.standard
    True
    """
    axis.check(lm, force=force)
    path, examples = reference_examples(reference)
    settings = CaptureSettings(
        layers=list(axis.layers), site=axis.site, positions=Positions.all, batch_size=batch_size
    )
    v = axis.directions.double()  # [n_layers_kept, d_model]
    sums = np.zeros((3, len(axis.layers)))  # Σ proj, Σ proj², Σ ‖h‖ per layer
    n_tokens = 0
    for start in range(0, len(examples), CHUNK):
        res = capture(lm, examples[start : start + CHUNK], settings, progress=False)
        keep = torch.from_numpy(res.rows.token_index > 0)
        n_tokens += int(keep.sum())
        for i, layer in enumerate(axis.layers):
            h = res.acts[layer][keep].double()  # [tokens, d_model]
            proj = h @ v[i]
            sums[:, i] += (float(proj.sum()), float((proj**2).sum()), float(h.norm(dim=1).sum()))
    if n_tokens < 2:
        raise ValueprobeError(
            f"{path}: the σ reference has {n_tokens} tokens past position 0: give more text"
        )
    mu = sums[0] / n_tokens
    sigma = np.sqrt(np.maximum(sums[1] / n_tokens - mu**2, 0.0))
    shared = Path(path).resolve() == dataset_path(NEUTRAL_TEXT).resolve()
    ref = SigmaReference(
        name=NEUTRAL_TEXT if shared else str(reference),
        rule=NEUTRAL_RULE,
        sha256=sha256_file(path),
        n_tokens=n_tokens,
    )
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    kept = torch.isfinite(axis.mean_norm) & (axis.mean_norm > 0)
    return replace(
        axis,
        mu=t(mu),
        sigma=t(sigma),
        mean_norm=torch.where(kept, axis.mean_norm, t(sums[2] / n_tokens)),
        sigma_reference=ref,
        formerly=axis.formerly or _formerly(axis),
    )


def _formerly(axis: ValueAxis) -> dict:
    """The statistics a first recalibration replaces, when they are worth keeping (not NaN)."""
    if axis.sigma_reference.standard or not axis.calibrated(axis.best_layer):
        return {}
    as_list = lambda x: [float(y) for y in x.tolist()]  # noqa: E731
    return {
        "sigma_reference": axis.sigma_reference.to_dict(),
        "mu": as_list(axis.mu),
        "sigma": as_list(axis.sigma),
        "mean_norm": as_list(axis.mean_norm),
    }
