"""A Pareto search for a steering setting: the largest move toward the target at a KL no larger than
a bound, chosen on validation prompts and reported on test prompts beside the random directions.

    valueprobe tune-steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl \\
        --layers 18,20,22 --alphas 15,30 --positions all,generated --ops add,add-norm --max-kl 0.5 --out runs/tune

The space is layer × operator × positions × α (each α also with its sign flipped, and α = 0 as the
baseline). Each (layer, operator, positions) is one resumable sweep (`valueprobe.steering.experiment.sweep`)
of every prompt along the axis and ``controls`` random directions, and its side effects
(`valueprobe.steering.experiment.side_effects`: the KL from the unsteered model on neutral text). The prompts
are split once, by item (``meta.pair`` keeps the two framings of a question together), into a
validation half, where the setting is chosen, and a test half, where it is reported: the target's
move with a 95% bootstrap CI over test items, the random directions' front at the same setting
on the test half (`valueprobe.steering.experiment.front`), and whether the chosen α counts as useful there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.records import Record
from valueprobe.stats.null import mean_ci
from valueprobe.steering.experiment.dose import AXIS, SweepRow
from valueprobe.steering.experiment.front import Front, effect_front, envelope
from valueprobe.steering.experiment.prompting import Goal
from valueprobe.steering.experiment.side_effects import SideMetric, text_side_effects
from valueprobe.steering.experiment.sweep import (
    GENERATIONS,
    SweepSettings,
    read_rows,
    run_sweep,
)
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import Where
from valueprobe.vocab import Op

__all__ = [
    "SEARCH_OPS",
    "Trial",
    "SearchSpace",
    "SteerSearch",
    "check_space",
    "split_prompts",
    "tune_steer",
]

SEARCH_OPS = (
    Op.add.value,
    Op.add_norm.value,
)  # operators whose α is a strength (ablate/set/clamp take a share)


@dataclass(frozen=True)
class SearchSpace:
    """What the search tries, and the KL it may spend (nats per token on neutral text)."""

    layers: tuple[int, ...]
    alphas: tuple[float, ...]  # magnitudes; each is tried with both signs
    positions: tuple[str, ...]
    ops: tuple[str, ...]
    max_kl: float

    def configs(self) -> list[tuple[int, str, str]]:
        return [(layer, op, where) for layer in self.layers for op in self.ops for where in self.positions]


def check_space(space: SearchSpace) -> None:
    """One line for an empty search space, a KL bound that is not positive, or an unknown choice."""
    for name, values in (("--layers", space.layers), ("--alphas", space.alphas), ("--positions", space.positions),
                         ("--ops", space.ops)):  # fmt: skip
        if not values:
            raise ValueprobeError(
                f"tune-steer: {name} is empty, so the search space is empty: give at least one"
            )
    if not (math.isfinite(space.max_kl) and space.max_kl > 0):
        raise ValueprobeError(
            f"--max-kl {space.max_kl} must be a positive KL bound (nats per token), e.g. 0.5"
        )
    if any(not math.isfinite(a) or a <= 0 for a in space.alphas):
        raise ValueprobeError(f"--alphas {list(space.alphas)}: give positive strengths (each is tried as ±α)")
    if bad := [o for o in space.ops if o not in SEARCH_OPS]:
        raise ValueprobeError(
            f"--ops {bad[0]!r}: the search tries {', '.join(SEARCH_OPS)} (strengths, not shares)"
        )
    if bad := [p for p in space.positions if p not in ("all", "prompt", "generated")]:
        raise ValueprobeError(f"--positions {bad[0]!r}: use all, prompt or generated")


def split_prompts(examples: Sequence[Example], *, seed: int = 0) -> tuple[set[str], set[str]]:
    """(validation ids, test ids): items (``meta.pair``, else the id) shuffled by ``seed``, halved."""
    items = sorted({str(ex.meta.get("pair", ex.id)) for ex in examples})
    random.Random(f"tune-steer:{seed}").shuffle(items)
    val = set(items[: (len(items) + 1) // 2])
    if len(items) < 2:
        raise ValueprobeError(
            "tune-steer needs at least two prompts (items) to choose on one half and test on the other"
        )
    return ({ex.id for ex in examples if str(ex.meta.get("pair", ex.id)) in val},
            {ex.id for ex in examples if str(ex.meta.get("pair", ex.id)) not in val})  # fmt: skip


@dataclass(frozen=True)
class Trial:
    """One setting: its KL, its move toward the target on each half, and the random directions'
    best move on validation at no more KL (their front there)."""

    layer: int
    op: str
    positions: str
    alpha: float
    kl: float
    val_effect: float
    random_front: float
    test_effect: float
    test_ci: tuple[float, float]

    @property
    def name(self) -> str:
        return f"layer {self.layer}, {self.op}, {self.positions}, α {self.alpha:g}"


@dataclass(frozen=True)
class SteerSearch(Record):
    """Every candidate, the one chosen (None when none is within the KL bound), and its test front."""

    target: Goal
    space: SearchSpace
    unit: str
    n_val: int
    n_test: int
    candidates: tuple[Trial, ...]
    chosen: Trial | None
    test_front: Front | None

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        # derived, written for the file's readers and not read back
        useful = (
            None
            if self.test_front is None or self.chosen is None
            else self.chosen.alpha in self.test_front.useful
        )
        return {**d, "useful_on_test": useful}

    def table(self) -> tuple[list[str], list[list[object]]]:
        headers = [
            "layer",
            "op",
            "positions",
            "α",
            "KL",
            "within bound",
            "move (val)",
            "random front (val)",
            "move (test)",
            "test 95% CI",
            "chosen",
        ]
        rows: list[list[object]] = [
            [c.layer, c.op, c.positions, f"{c.alpha:g}", c.kl, "yes" if c.kl <= self.space.max_kl else "no", c.val_effect,
             c.random_front, c.test_effect, f"[{c.test_ci[0]:+.3f}, {c.test_ci[1]:+.3f}]", "<-" if c == self.chosen else ""]
            for c in self.candidates
        ]  # fmt: skip
        return headers, rows


def choose(candidates: Sequence[Trial], max_kl: float) -> Trial | None:
    """The candidate with the largest validation move among those at KL ≤ ``max_kl`` (None: none is)."""
    within = [c for c in candidates if c.kl <= max_kl and math.isfinite(c.val_effect)]
    return max(within, key=lambda c: c.val_effect) if within else None


def _moves(rows: Sequence[SweepRow], ids: set[str], kl: SideMetric, target: Goal) -> Front:
    return effect_front([r for r in rows if r.prompt_id in ids], kl, target)


def _item_moves(rows: Sequence[SweepRow], ids: set[str], target: Goal, alpha: float) -> np.ndarray:
    """Per test item: sign × (its mean at α − its mean at 0) along the axis (items seen at both)."""

    def counts(r: SweepRow) -> bool:
        on_subset = target.subset == "all" or r.group == target.subset
        return r.direction == AXIS and r.condition == "none" and r.prompt_id in ids and on_subset

    per: dict[tuple[str, float], list[float]] = {}
    for r in rows:
        v = r.metrics.get(target.metric)
        if counts(r) and v is not None and r.alpha in (0.0, alpha):
            per.setdefault((r.prompt_id, r.alpha), []).append(float(v))
    items = sorted({p for p, _ in per})
    return np.array([target.sign * (np.mean(per[(p, alpha)]) - np.mean(per[(p, 0.0)]))
                     for p in items if (p, alpha) in per and (p, 0.0) in per])  # fmt: skip


def _config(
    lm: LoadedModel,
    examples: Sequence[Example],
    texts: Sequence[Example],
    out: Path,
    base: SweepSettings,
    config: tuple[int, str, str],
    alphas: tuple[float, ...],
    batch_size: int,
    progress: bool,
) -> tuple[list[SweepRow], SideMetric]:
    """One (layer, op, positions): its sweep's rows and the KL of every direction at every α."""  # fmt: skip
    layer, op, where = config
    spec = replace(base.spec, layers=[layer], op=Operator(Op(op)), positions=cast(Where, where))
    settings = replace(base, spec=spec, alphas=alphas)
    folder = out / "configs" / f"layer{layer}-{op}-{where}"
    run_sweep(lm, examples, folder, settings, batch_size=batch_size, n_boot=0, progress=progress)
    kl, _ = text_side_effects(lm, settings, texts, progress=progress)
    return read_rows(folder / GENERATIONS), kl


def tune_steer(
    lm: LoadedModel,
    examples: Sequence[Example],
    base: SweepSettings,
    space: SearchSpace,
    target: Goal,
    *,
    out: Path,
    neutral: Path,
    batch_size: int = 32,
    progress: bool = True,
) -> SteerSearch:
    """Search ``space`` (see the module doc); ``base`` gives everything else a sweep needs, its spec
    whole (each setting replaces its layers, operator and positions, and keeps the rest: site, unit,
    window, condition, read layer)."""
    check_space(space)
    val, test = split_prompts(examples, seed=base.seed)
    alphas = tuple(sorted({0.0, *space.alphas, *(-a for a in space.alphas)}))
    texts = read_jsonl(neutral)
    candidates, fronts = [], {}
    for config in space.configs():
        rows, kl = _config(lm, examples, texts, out, base, config, alphas, batch_size, progress)
        on_val, on_test = _moves(rows, val, kl, target), _moves(rows, test, kl, target)
        fronts[config] = on_test
        test_by = {p.alpha: p.effect for p in on_test.axis}
        for p in on_val.axis:
            if p.alpha == 0:
                continue
            moves = _item_moves(rows, test, target, p.alpha)
            candidates.append(Trial(*config, p.alpha, p.kl, p.effect, envelope(on_val.random, p.kl),
                                        test_by.get(p.alpha, math.nan), mean_ci(moves)))  # fmt: skip
    chosen = choose(candidates, space.max_kl)
    front = None if chosen is None else fronts[(chosen.layer, chosen.op, chosen.positions)]
    return SteerSearch(
        target, space, base.spec.unit.value, len(val), len(test), tuple(candidates), chosen, front
    )
