"""valueprobe: find, read and steer the value axis of language models.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")
    >>> axis = vp.ValueAxis.load("smollm2-135m-value", lm=lm)      # a shipped axis, or a probe folder
    >>> res = vp.score_dataset(axis, lm, vp.read_jsonl("code")[:50])  # a shipped dataset, or a JSONL path
    >>> gens = vp.generate(lm, vp.SteeringSpec(axis, unit="norm"), ["Is 7 prime?"], alphas=[-25, 0, 25])

The names below are what the notebooks and the README use, plus the result types they return;
everything else is reached through its module (``valueprobe.stats.metrics.auroc``, ``valueprobe.vocab.Site``).
"""

from __future__ import annotations

import warnings

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.attribute.records import Attribution
from valueprobe.attribute.run import AttributeSettings, attribution
from valueprobe.audit.records import Audit
from valueprobe.audit.run import AuditSettings, run_audit
from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.guided.records import Guided
from valueprobe.guided.run import guide
from valueprobe.model.load import LoadedModel, load, wrap
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.fit import FitReport, fit_probe
from valueprobe.probe.layer_sweep import LayerSweepResult
from valueprobe.probe.transfer import TransferResult
from valueprobe.read.readout import ScoreSettings, logit_lens, score_dataset, val
from valueprobe.read.scores import ScoreResult
from valueprobe.report.attribution import attribution_figures
from valueprobe.report.audit import audit_figures
from valueprobe.report.effects import trace_figure
from valueprobe.report.plots import shift_figure, sweep_figure, transfer_heatmap
from valueprobe.steering.decode.generation import Generation, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import Steering, steer
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.tune.pairs import read_pairs
from valueprobe.tune.shift import ShiftSettings, shift
from valueprobe.tune.shift_records import ShiftResult
from valueprobe.tune.train import TuneResult, TuneSettings, train
from valueprobe.version import __version__

__all__ = [
    # load a model, read data
    "load",
    "wrap",
    "read_jsonl",
    # capture and fit
    "capture",
    "CaptureSettings",
    "capture_to_store",
    "fit_probe",
    "sweep_figure",
    "shift_figure",
    "trace_figure",
    "transfer_heatmap",
    # read and steer
    "ValueAxis",
    "SteeringSpec",
    "Decoding",
    "val",
    "score_dataset",
    "ScoreSettings",
    "logit_lens",
    "generate",
    "steer",
    "guide",
    # where value comes from: attribution, patching, ablation
    "attribution",
    "AttributeSettings",
    "attribution_figures",
    # is it value? the axis against the end of the turn, each test beside random directions
    "run_audit",
    "AuditSettings",
    "audit_figures",
    # result and record types
    "ActivationStore",
    "Attribution",
    "Audit",
    "Example",
    "FitReport",
    "Generation",
    "Guided",
    "LoadedModel",
    "ScoreResult",
    "ShiftResult",
    "Steering",
    "LayerSweepResult",
    "TransferResult",
    "TuneResult",
    "ValueprobeError",
    # tune and measure the shift
    "TuneSettings",
    "read_pairs",
    "train",
    "shift",
    "ShiftSettings",
    "__version__",
]


def __getattr__(name: str) -> object:
    # "sweep" alone is the α sweep (steering/experiment/sweep.py); the layer sweep's result was
    # vp.SweepResult before issue 29 and is still reachable under that name, with a warning.
    if name == "SweepResult":
        warnings.warn(
            "vp.SweepResult is vp.LayerSweepResult (the layer sweep's result)",
            DeprecationWarning,
            stacklevel=2,
        )
        return LayerSweepResult
    raise AttributeError(f"module 'valueprobe' has no attribute {name!r}")
