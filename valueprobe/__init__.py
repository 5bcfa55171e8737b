"""valueprobe: find, read and steer the value axis of language models.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")
    >>> axis = vp.ValueAxis.load("probes/smollm2-135m-value", lm=lm)
    >>> res = vp.score_dataset(axis, lm, vp.read_jsonl("data/code.jsonl")[:50])

The CLI (``valueprobe --help``) and the notebooks use only the names below.
"""

from __future__ import annotations

from valueprobe.axis import ValueAxis
from valueprobe.capture import capture
from valueprobe.datasets import build as build_datasets
from valueprobe.datasets.io import Example, Span, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.fit import FitReport, calibrate, fit_probe
from valueprobe.generation import Generation, generate
from valueprobe.metrics import auroc, cohens_d
from valueprobe.models import LoadedModel, load, wrap
from valueprobe.plots import sweep_figure, transfer_heatmap
from valueprobe.readout import logit_lens, score_dataset, val
from valueprobe.scores import ScoreResult
from valueprobe.store import ActivationStore, capture_to_store
from valueprobe.sweep import SweepResult
from valueprobe.transfer import TransferResult, transfer_matrix
from valueprobe.version import __version__
from valueprobe.vocab import Backend, Positions, Site, Unit

__all__ = [
    "ActivationStore",
    "Backend",
    "Example",
    "FitReport",
    "Generation",
    "LoadedModel",
    "Positions",
    "ScoreResult",
    "Site",
    "Span",
    "SweepResult",
    "TransferResult",
    "Unit",
    "ValueAxis",
    "ValueprobeError",
    "__version__",
    "auroc",
    "build_datasets",
    "calibrate",
    "capture",
    "capture_to_store",
    "cohens_d",
    "fit_probe",
    "generate",
    "load",
    "logit_lens",
    "read_jsonl",
    "score_dataset",
    "steer",
    "sweep_figure",
    "transfer_heatmap",
    "transfer_matrix",
    "val",
    "wrap",
]
