"""valueprobe: find, read and steer the value axis of language models.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")
    >>> axis = vp.ValueAxis.load("smollm2-135m-value", lm=lm)      # a shipped axis, or a probe folder
    >>> res = vp.score_dataset(axis, lm, vp.read_jsonl("code")[:50])  # a shipped dataset, or a JSONL path
    >>> v = vp.values(lm, axis, "Is 91 prime?")                       # each token's σ, projection, cos
    >>> (g,) = vp.generate(lm, axis, ["Is 91 prime?"], alphas=[2.0], trace=True)   # g.values: the same record

The names below are what the notebooks and the README use, plus the result types they return;
everything else is reached through its module (``valueprobe.stats.metrics.auroc``, ``valueprobe.vocab.Site``).

Importing the package loads none of them: each name is imported from its home module the first
time it is used (PEP 562), so ``import valueprobe`` and ``valueprobe --help`` need neither torch nor
transformers. A new public name goes in three places, which ``tests/test_layout.py`` holds equal:
the ``TYPE_CHECKING`` imports (what type checkers see), ``_HOMES`` and ``__all__``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from valueprobe.version import __version__

if TYPE_CHECKING:
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
    from valueprobe.probe.calibrate import calibrate
    from valueprobe.probe.fit import FitReport, fit_probe
    from valueprobe.probe.layer_sweep import LayerSweepResult
    from valueprobe.probe.transfer import TransferResult
    from valueprobe.read.readout import ScoreSettings, logit_lens, score_dataset, val
    from valueprobe.read.scores import ScoreResult
    from valueprobe.read.values import Values, values
    from valueprobe.report.attribution import attribution_figures
    from valueprobe.report.audit import audit_figures
    from valueprobe.report.effects import trace_figure
    from valueprobe.report.explore import explore
    from valueprobe.report.plots import shift_figure, sweep_figure, transfer_heatmap
    from valueprobe.steering.decode.generation import Generation, generate
    from valueprobe.steering.decode.sampling import Decoding
    from valueprobe.steering.experiment.trace import value_trace
    from valueprobe.steering.hook.handle import Steering, steer
    from valueprobe.steering.hook.spec import SteeringSpec
    from valueprobe.tune.pairs import read_pairs
    from valueprobe.tune.shift import ShiftSettings, shift
    from valueprobe.tune.shift_records import ShiftResult
    from valueprobe.tune.train import TuneResult, TuneSettings, train

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
    "calibrate",
    "sweep_figure",
    "shift_figure",
    "trace_figure",
    "transfer_heatmap",
    # read and steer
    "ValueAxis",
    "SteeringSpec",
    "Decoding",
    "val",
    "values",
    "value_trace",
    "score_dataset",
    "ScoreSettings",
    "logit_lens",
    "generate",
    "steer",
    "explore",
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
    "Values",
    "ValueprobeError",
    # tune and measure the shift
    "TuneSettings",
    "read_pairs",
    "train",
    "shift",
    "ShiftSettings",
    "__version__",
]

# home module -> the public names it holds (every name of __all__ but __version__)
_HOMES: dict[str, tuple[str, ...]] = {
    "valueprobe.activations.capture": (
        "CaptureSettings",
        "capture",
    ),
    "valueprobe.activations.store": (
        "ActivationStore",
        "capture_to_store",
    ),
    "valueprobe.attribute.records": ("Attribution",),
    "valueprobe.attribute.run": (
        "AttributeSettings",
        "attribution",
    ),
    "valueprobe.audit.records": ("Audit",),
    "valueprobe.audit.run": (
        "AuditSettings",
        "run_audit",
    ),
    "valueprobe.datasets.io": (
        "Example",
        "read_jsonl",
    ),
    "valueprobe.errors": ("ValueprobeError",),
    "valueprobe.guided.records": ("Guided",),
    "valueprobe.guided.run": ("guide",),
    "valueprobe.model.load": (
        "LoadedModel",
        "load",
        "wrap",
    ),
    "valueprobe.probe.axis": ("ValueAxis",),
    "valueprobe.probe.calibrate": ("calibrate",),
    "valueprobe.probe.fit": (
        "FitReport",
        "fit_probe",
    ),
    "valueprobe.probe.layer_sweep": ("LayerSweepResult",),
    "valueprobe.probe.transfer": ("TransferResult",),
    "valueprobe.read.readout": (
        "ScoreSettings",
        "logit_lens",
        "score_dataset",
        "val",
    ),
    "valueprobe.read.scores": ("ScoreResult",),
    "valueprobe.read.values": (
        "Values",
        "values",
    ),
    "valueprobe.report.attribution": ("attribution_figures",),
    "valueprobe.report.audit": ("audit_figures",),
    "valueprobe.report.effects": ("trace_figure",),
    "valueprobe.report.explore": ("explore",),
    "valueprobe.report.plots": (
        "shift_figure",
        "sweep_figure",
        "transfer_heatmap",
    ),
    "valueprobe.steering.decode.generation": (
        "Generation",
        "generate",
    ),
    "valueprobe.steering.decode.sampling": ("Decoding",),
    "valueprobe.steering.experiment.trace": ("value_trace",),
    "valueprobe.steering.hook.handle": (
        "Steering",
        "steer",
    ),
    "valueprobe.steering.hook.spec": ("SteeringSpec",),
    "valueprobe.tune.pairs": ("read_pairs",),
    "valueprobe.tune.shift": (
        "ShiftSettings",
        "shift",
    ),
    "valueprobe.tune.shift_records": ("ShiftResult",),
    "valueprobe.tune.train": (
        "TuneResult",
        "TuneSettings",
        "train",
    ),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # the next use is a plain attribute
        return value
    # "sweep" alone is the α sweep (steering/experiment/sweep.py); the layer sweep's result keeps its
    # old name vp.SweepResult, with a warning.
    if name == "SweepResult":
        warnings.warn(
            "vp.SweepResult is vp.LayerSweepResult (the layer sweep's result)",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__("LayerSweepResult")
    raise AttributeError(f"module 'valueprobe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
