"""``replicate steer``'s judgement of its sweeps: the prompt baseline, side effects with a null, the
effect-vs-KL front and per-item reliability, for every steering set's stated target.

    valueprobe replicate steer --n-prompts 8 --alphas=-30,0,30 --out probes/steering-eval-smollm2-135m

Writes ``evaluation.json`` (`SteerEvaluation`) beside ``results.json`` (the CLI draws
``baseline.html``, ``front.html``, ``reliability.html`` and ``side_effects.html`` from it); its
markdown is appended to ``summary.md``. The side effects are measured once for the steering every
sweep shares (the first sweep's spec whole, its α, the axis and its random directions); each set's
target metric along every direction is added as a side effect too, off target for the other sets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from valueprobe.datasets.answers import read_tasks
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import jsonable, markdown_table, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.records import Record
from valueprobe.steering.experiment.baseline import PromptBaseline, baseline_table, prompt_baseline
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX, SteerSweep, SweepRow
from valueprobe.steering.experiment.front import Front, direction_means, effect_front
from valueprobe.steering.experiment.prompting import Goal, read_target
from valueprobe.steering.experiment.reliability import Reliability, item_reliability
from valueprobe.steering.experiment.settings import SweepSettings
from valueprobe.steering.experiment.side_effects import SideEffects, SideMetric, measure_side_effects
from valueprobe.steering.experiment.sweep import GENERATIONS, read_rows, sweep_directions

__all__ = ["BenchEval", "SteerEvaluation", "evaluate_steering"]

# Side-effect task budgets: level-1 arithmetic (where the default model answers about half right)
# and code; greedy, so one output per task and α.
TASKS: dict[str, tuple[str, str | None, int, int]] = {
    # kind: (file, group kept (None: all), tasks, max new tokens)
    "arithmetic": ("task_arithmetic.jsonl", "task_arithmetic/level1", 12, 48),
    "code": ("task_code.jsonl", None, 8, 96),
}


@dataclass(frozen=True)
class BenchEval(Record):
    """One steering set's target judged: against asking, at a cost, item by item."""

    target: Goal
    baseline: tuple[PromptBaseline, ...]
    reliability: Reliability | None
    front: Front | None


@dataclass(frozen=True)
class SteerEvaluation(Record):
    """The side effects of the shared setting and each set's `BenchEval`."""

    unit: str
    side: SideEffects
    benches: dict[str, BenchEval]

    def markdown(self) -> list[str]:
        """The summary's sections: asking, side effects, the front, reliability."""
        fmt = _fmt
        lines = ["", "## Does steering beat asking?", "", _BASELINE_NOTE, ""]
        for name, b in self.benches.items():
            headers, rows = baseline_table(b.baseline, unit=self.unit)
            lines += [f"**{name}** (target: {b.target.metric} on {b.target.subset}, sign {b.target.sign:+d})", "",
                      *markdown_table(headers, rows, fmt), ""]  # fmt: skip
        headers, rows = self.side.table()
        lines += ["## What does it break? Side effects against random directions", "", _SIDE_NOTE, "",
                  *markdown_table(headers, rows, fmt), ""]  # fmt: skip
        lines += ["## Effect against KL", "", _FRONT_NOTE, ""]
        for name, b in self.benches.items():
            if b.front is not None:
                headers, rows = b.front.table()
                useful = ", ".join(f"{a:g}" for a in b.front.useful) or "none"
                lines += [f"**{name}**: useful α: {useful}", "", *markdown_table(headers, rows, fmt), ""]
        lines += ["## Does it work on each item? Per-item reliability", "", _RELIABILITY_NOTE, "",
                  *markdown_table(*reliability_table(self.benches), fmt)]  # fmt: skip
        return lines


def _fmt(v: object) -> str:
    return f"{v:+.4f}" if isinstance(v, float) and math.isfinite(v) else str(v)


_BASELINE_NOTE = (
    "Means over prompts with 95% bootstrap CIs, at the largest strength α*: the axis under the plain prompt"
    " (steering), α = 0 under a system prompt asking for the behaviour (toward) or its opposite (away), and"
    " both together; the random directions' central 95% at the same strength and prompt in brackets. The"
    " verdict compares, on the stated target, steering at +α* with prompting toward it: one wins when its CI"
    " lies wholly beyond the other's."
)
_SIDE_NOTE = (
    "KL of the next-token distribution from the unsteered model on neutral text, perplexity on held-out"
    " neutral text, greedy accuracy on the checkable tasks, and each set's target metric (off target for"
    " the others), for the axis (95% CI over paragraphs, tasks or prompts) and the random directions' central 95%."
)
_FRONT_NOTE = (
    "Each α of the axis: its KL and its move toward the target, beside the random directions' front (their best"
    " move at any KL up to it). An α is useful only where the axis leaves that front at a KL the random"
    " directions also reach."
)
_RELIABILITY_NOTE = (
    "Per-item slopes of the target on α along the axis (items: prompts). Against: the share of items moving"
    " opposite to the target's sign, beside the random directions' 95% range of that share. Prompt shift:"
    " the same items reworded (steer_conditions.jsonl); change in mean slope with a paired 95% CI,"
    " the share of items whose slope flips sign and the rank correlation of slopes across wordings."
)


def reliability_table(benches: Mapping[str, BenchEval]) -> tuple[list[str], list[list[object]]]:
    headers = ["set", "target", "items", "with", "against", "random: against", "slope quartiles",
               "reworded − plain [CI]", "sign flips", "rank corr."]  # fmt: skip
    rows: list[list[object]] = []
    for name, b in benches.items():
        x = b.reliability
        if x is None:
            continue
        q = ", ".join(f"{v:+.3g}" for v in x.quantiles[1:4]) if x.quantiles else "-"
        s = x.shift
        rows.append([name, f"{x.metric} ({x.subset})", x.n_items, f"{x.with_:.0%}", f"{x.against:.0%}",
                     f"[{x.null_against[0]:.0%}, {x.null_against[1]:.0%}]", q,
                     "-" if s is None else f"{s.change:+.3g} [{s.change_ci[0]:+.3g}, {s.change_ci[1]:+.3g}]",
                     "-" if s is None else f"{s.sign_flips:.0%}", "-" if s is None else f"{s.rank_correlation:+.2f}"])  # fmt: skip
    return headers, rows


def _target_metric(
    name: str, rows: Sequence[SweepRow], sweep: SteerSweep, target: Goal, alphas: tuple[float, ...]
) -> SideMetric:
    """A set's target metric along every direction, as a side effect (off target for the other sets)."""
    means = direction_means(rows, target.metric, target.subset)
    effect = next((e for e in sweep.effects if (e.metric, e.subset) == (target.metric, target.subset)), None)
    values = {
        d: tuple(by.get(a, float("nan")) for a in alphas)
        for d, by in means.items()
        if d == AXIS or d.startswith(RANDOM_PREFIX)
    }
    ci = []
    for a in alphas:
        c = None if effect is None else effect.curves[AXIS]
        ci.append(
            (c.lo[c.alphas.index(a)], c.hi[c.alphas.index(a)])
            if c is not None and a in c.alphas
            else (np.nan, np.nan)
        )
    n = len({r.prompt_id for r in rows})
    return SideMetric(f"target_{name}", f"{name}: {target.metric} ({target.subset})", alphas, values, tuple(ci), n)  # fmt: skip


def evaluate_steering(
    lm: LoadedModel,
    sweeps: Mapping[str, SteerSweep],
    folders: Mapping[str, Path],
    *,
    data_dir: Path,
    out: Path,
    batch_size: int = 32,
    progress: bool = True,
    task_sizes: Mapping[str, tuple[str, str | None, int, int]] | None = None,
) -> SteerEvaluation:
    """Judge every sweep of ``replicate steer`` (its add row) and write the files of the module doc.

    Args:
        sweeps, folders: by benchmark name, the summarised sweep and its folder (its generations).
        data_dir: where ``steer_conditions.jsonl``, ``neutral_text.jsonl`` and the task files are.
        task_sizes: per task kind, (file, group kept, tasks, max new tokens); default `TASKS`.
    """  # fmt: skip
    first = next(iter(sweeps.values()))
    setting = first.settings  # every sweep shares the steering the side effects are measured at
    assert setting is not None
    side = _measured(out, setting, lm.n_layers) or _measure(
        lm, setting, data_dir, task_sizes or TASKS, batch_size, progress
    )
    benches: dict[str, BenchEval] = {}
    extra: list[SideMetric] = []
    for name, sweep in sweeps.items():
        assert sweep.settings is not None
        target = read_target(data_dir / "steer_conditions.jsonl", Path(sweep.settings.prompts).stem)
        if target is None:
            continue
        rows = read_rows(folders[name] / GENERATIONS)
        extra.append(_target_metric(name, rows, sweep, target, side.alphas))
        benches[name] = BenchEval(target, prompt_baseline(sweep, target), item_reliability(rows, target),
                                  effect_front(rows, side.metric("kl"), target))  # fmt: skip
    result = SteerEvaluation(first.unit, side.with_metrics(extra), benches)
    write_evaluation(result, out)
    return result


def _measured(out: Path, setting: SweepSettings, n_layers: int) -> SideEffects | None:
    """The text and task side effects ``out/evaluation.json`` already holds for this setting (a rerun
    that only re-summarises does not measure them again); None if it holds none or another setting's."""
    path = out / "evaluation.json"
    if not path.is_file():
        return None
    try:
        side = SteerEvaluation.from_dict(json.loads(path.read_text(encoding="utf-8"))).side
    except (OSError, ValueError, ValueprobeError):
        return None
    names = tuple(n for n, _ in sweep_directions(setting, None, n_layers))
    kept = tuple(m for m in side.metrics if not m.name.startswith("target_"))
    spec = setting.spec
    alphas = setting.alphas if 0.0 in setting.alphas else (0.0, *setting.alphas)
    layer = spec.steered_layers(n_layers)[0]
    same = side.layer == layer and side.alphas == alphas and side.unit == spec.unit.value
    if not same or not kept or any(tuple(m.values) != names for m in kept):
        return None
    return SideEffects(side.unit, side.layer, side.alphas, kept)


def _measure(
    lm: LoadedModel,
    setting: SweepSettings,
    data_dir: Path,
    sizes: Mapping[str, tuple[str, str | None, int, int]],
    batch_size: int,
    progress: bool,
) -> SideEffects:
    tasks = {
        kind: [t for t in read_tasks(data_dir / f) if g is None or t.group == g][:n]
        for kind, (f, g, n, _) in sizes.items()
    }
    budgets = {kind: tokens for kind, (_, _, _, tokens) in sizes.items()}
    texts = read_jsonl(data_dir / "neutral_text.jsonl")
    return measure_side_effects(lm, setting, texts=texts, tasks=tasks, max_new_tokens=budgets,
                                batch_size=batch_size, progress=progress)  # fmt: skip


def write_evaluation(result: SteerEvaluation, out: Path) -> None:
    """``evaluation.json`` into ``out`` (the CLI draws the figures from the record)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "evaluation.json", jsonable(result.to_dict()), allow_nan=False)
