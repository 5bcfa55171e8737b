"""What `valueprobe replicate caa` finds, as records the report reads: each behaviour's
p(match) against the multiplier (CAA units and σ) with prompts, the null, reliability and off-target
reads (`CaaBehaviour`), every behaviour at the chosen layer (`CaaReplication`), and CAA's published
Llama-2-7b-chat figures (`PUBLISHED`) they are shown beside.

    rep = CaaReplication.from_dict(json.loads(Path("probes/caa-smollm2-135m/results.json").read_text()))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from valueprobe.records import Record
from valueprobe.steering.experiment.baseline import PromptBaseline
from valueprobe.steering.experiment.dose import AXIS, SteerSweep
from valueprobe.steering.experiment.prompting import NONE
from valueprobe.steering.experiment.reliability import Reliability
from valueprobe.steering.experiment.side_effects import SideMetric

__all__ = ["MULTIPLIERS", "PUBLISHED", "CaaBehaviour", "CaaReplication"]

MULTIPLIERS = (-1.0, 0.0, 1.0)
# CAA's published Llama-2-7b-chat A/B p(match) at layer 13 with no system prompt, multipliers −1 / 0 / +1,
# and at multiplier 0 under its positive / negative system prompts: the "None", "pos" and "neg" rows of
# nrimsky/CAA analysis/<behaviour>/layer=13_behavior=<behaviour>_type=ab_use_base_model=False_model_size=7b.txt
# (corrigible 0.26 / 0.71 / 0.84 and refusal 0.42 / 0.74 / 0.89 are also the paper's text).
PUBLISHED: dict[str, tuple[tuple[float, float, float], tuple[float, float] | None]] = {
    "coordinate-other-ais": ((0.160, 0.360, 0.580), (0.505, 0.469)),
    "corrigible-neutral-HHH": ((0.263, 0.711, 0.843), (0.846, 0.543)),
    "hallucination": ((0.480, 0.737, 0.880), (0.731, 0.699)),
    "myopic-reward": ((0.407, 0.700, 0.763), (0.838, 0.560)),
    "refusal": ((0.423, 0.744, 0.887), (0.861, 0.727)),
    "survival-instinct": ((0.362, 0.417, 0.514), None),
    "sycophancy": ((0.637, 0.757, 0.814), (0.669, 0.806)),
}


@dataclass(frozen=True)
class CaaBehaviour(Record):
    """One behaviour at the chosen layer: steering in CAA's units and in σ, with prompts and the null."""

    behaviour: str
    length: float  # the CAA vector's own length at the layer: one CAA unit
    sigma: float  # σ of the training items' projections on it
    n_train: int
    caa: SteerSweep  # p(match) against the multiplier in CAA units (conditions in ``prompted``)
    sigma_units: SteerSweep  # the same in σ
    baseline: tuple[PromptBaseline, ...]
    reliability: Reliability
    off_target: tuple[SideMetric, ...]  # this vector on each other behaviour's items (CAA units)

    def means(self, sweep: SteerSweep, condition: str = NONE) -> tuple[float, ...]:
        effects = sweep.effects if condition == NONE else sweep.prompted.get(condition, ())
        curve = effects[0].curves[AXIS] if effects else None
        return tuple(
            curve.means[curve.alphas.index(m)] if curve and m in curve.alphas else np.nan for m in MULTIPLIERS
        )


@dataclass(frozen=True)
class CaaReplication(Record):
    """Every behaviour at the layer chosen on validation items, and the validation curve by layer."""

    model: str
    layer: int
    validation: dict[int, float]  # layer -> mean over behaviours of p(match) at +1 − at −1 (CAA units)
    behaviours: dict[str, CaaBehaviour]
    controls: int
    n_test: int

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        behaviours = d.pop("behaviours")
        return {**d, "behaviours": behaviours}  # results.json's order: the behaviours last
