"""``valueprobe eval``: a harness task across strengths, along the axis and random directions of the
same norm, into one table and one figure.

    valueprobe eval --harness lm-eval --task arithmetic --probe smollm2-135m-value --unit norm \\
        --alphas -30,0,30 --random-directions 8 --limit 40 --out runs/eval-arithmetic

    >>> result = run_eval(lm, spec, EvalSettings("inspect", "arithmetic", (-30.0, 0.0, 30.0)), out="runs/e")

The settings are the unsteered model once (α = 0 is the same model along every direction, bit for
bit), then every other α along the axis, then along each random direction ``random-K``
(`valueprobe.evals.steering.along_random`). Each is one harness run of the task
(`valueprobe.evals.harness`) on the model loaded once. A run is the part 0/1 of itself: its points
are kept in ``OUT/eval-part.json`` as they come (a rerun resumes: a part written when σ was
measured over another reference too, where α is not in σ, its α in σ restated), then ``eval.json``,
``eval.csv`` and ``eval.html`` are written; ``--shard I/N`` runs the I-th contiguous share of the settings and
``valueprobe merge`` joins the parts (`valueprobe.evals.parts`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from valueprobe.errors import ValueprobeError
from valueprobe.evals.harness import HARNESSES, Harness
from valueprobe.evals.parts import PART, EvalPart, read_part
from valueprobe.evals.records import EvalPoint, EvalResult, EvalSettings
from valueprobe.evals.steering import AXIS, RANDOM_PREFIX, along_random
from valueprobe.evals.tasks import shipped_task
from valueprobe.model.load import LoadedModel
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import ShardSpec, Unit

__all__ = ["OTHER_UNIT", "eval_part", "eval_settings", "run_eval"]

ONE_PROCESS = ShardSpec(0, 1)  # a run that is not sharded is its own only part
OTHER_UNIT = {"sigma": "norm", "norm": "sigma", "raw": "norm"}  # every α is also stated in this unit
SIGMA_KEYS = ("format_version", "sigma_reference")  # what a spec's JSON says of σ (format 2 added it)


def eval_settings(settings: EvalSettings) -> list[tuple[str, float]]:
    """The (direction, α) settings of a run, in order: α = 0 once, the axis, each random direction."""
    moved = [a for a in settings.alphas if a != 0]
    randoms = [f"{RANDOM_PREFIX}{k}" for k in range(settings.random_directions)]
    return [(AXIS, 0.0)] * (len(moved) < len(settings.alphas)) + [
        (d, a) for d in [AXIS, *randoms] for a in moved
    ]


def _other_alpha(spec: SteeringSpec, alpha: float, layer: int) -> float:
    """``alpha`` in the other unit at ``layer`` (NaN where the axis lacks that unit's statistics)."""
    axis = spec.first_axis()
    try:
        return alpha * axis.unit_size(layer, spec.unit) / axis.unit_size(layer, OTHER_UNIT[spec.unit.value])
    except ValueprobeError:
        return math.nan


def _steering(spec: SteeringSpec, direction: str, seed: int) -> SteeringSpec:
    return spec if direction == AXIS else along_random(spec, int(direction[len(RANDOM_PREFIX) :]), seed=seed)


def _without_sigma(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in SIGMA_KEYS}


def _steers(spec: dict[str, Any]) -> dict[str, Any]:
    """What a recorded spec steers: its JSON, less how σ was measured unless α is in σ (a push in
    % of the norm, or raw, is the same push whatever σ's reference)."""
    return spec if spec.get("unit") == Unit.sigma.value else _without_sigma(spec)


def _resumed(out: Path, part: EvalPart, shard: ShardSpec) -> dict[tuple[str, float], EvalPoint]:
    """The points an earlier run of this part left in ``out`` (none if it left none); one line
    when they are of another run."""
    if not (out / PART).exists():
        return {}
    old, old_shard = read_part(out)
    if (old.fingerprint, old.settings, old_shard) != (part.fingerprint, part.settings, shard):
        raise ValueprobeError(
            f"{out} holds a part of another run (model, settings or shard): use a new --out"
        )
    if _steers(old.spec) != _steers(part.spec):
        other_sigma = _without_sigma(old.spec) == _without_sigma(part.spec)  # both in σ, then
        why = "its α is in σ, measured over another reference" if other_sigma else "another steering spec"
        raise ValueprobeError(f"{out} holds a part of another run ({why}): use a new --out")
    return {p.key(): p for p in old.points}


def eval_part(
    lm: LoadedModel,
    spec: SteeringSpec,
    settings: EvalSettings,
    *,
    out: str | Path,
    shard: ShardSpec = ONE_PROCESS,
    progress: bool = True,
    harness: Harness | None = None,
) -> EvalPart:
    """Score shard ``shard`` of the run's settings into the part file ``out/eval-part.json``,
    resuming the points already there (when they are of this run)."""
    out = Path(out)
    task = shipped_task(settings.task)
    run = harness or HARNESSES[settings.harness]
    unit = spec.unit.value
    todo = eval_settings(settings)
    share = shard.examples(len(todo), block=1)
    mine = todo[share.start : share.stop]
    part = EvalPart(
        model=lm.model_id,
        fingerprint=lm.fingerprint,
        spec=spec.to_dict(),
        unit=unit,
        other_unit=OTHER_UNIT[unit],
        metric=task.metric[settings.harness],
        settings=settings,
        todo=len(mine),
    )
    done = _resumed(out, part, shard)
    out.mkdir(parents=True, exist_ok=True)
    layer = spec.steered_layers(lm.n_layers)[0]
    # α in the other unit is a conversion, not a measurement: a resumed point states it in the
    # axis's units as they are now (σ recalibrated since the point was scored, say)
    points = [replace(done[k], alpha_other=_other_alpha(spec, k[1], layer)) for k in mine if k in done]
    left = [k for k in mine if k not in done]
    for direction, alpha in tqdm(
        left, desc=f"{settings.harness} {task.name}", unit="setting", disable=not progress
    ):
        got = run(
            lm,
            _steering(spec, direction, settings.seed),
            alpha,
            task=task,
            limit=settings.limit,
            batch_size=settings.batch_size,
        )
        point = EvalPoint(
            direction=direction,
            alpha=alpha,
            alpha_other=_other_alpha(spec, alpha, layer),
            score=got.score,
            stderr=got.stderr,
            n=got.n,
        )
        points.append(point)
        part = EvalPart(**{**part.__dict__, "points": tuple(points)})
        part.write(out, shard)
    order = {k: i for i, k in enumerate(mine)}  # a resumed part keeps the settings' order
    part = EvalPart(**{**part.__dict__, "points": tuple(sorted(points, key=lambda p: order[p.key()]))})
    part.write(out, shard)
    return part


def run_eval(
    lm: LoadedModel,
    spec: SteeringSpec,
    settings: EvalSettings,
    *,
    out: str | Path,
    progress: bool = True,
    harness: Harness | None = None,
) -> EvalResult:
    """Every setting in one process (part 0/1 in ``out``), then the run's ``eval.json``,
    ``eval.csv`` and ``eval.html`` beside it."""
    part = eval_part(lm, spec, settings, out=out, progress=progress, harness=harness)
    result = part.result(part.points)
    result.write(out)
    return result
