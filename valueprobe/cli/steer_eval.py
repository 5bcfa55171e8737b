"""Printing and drawing what `valueprobe replicate steer` and `valueprobe steer` judge their sweeps by.

    valueprobe replicate steer --out probes/steering-eval-smollm2-135m    # evaluation.json -> tables, figures
    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl --side-effects --out runs/s

The records come from `valueprobe.replicate.steer_eval` (replicate) and `valueprobe.steering`
(one sweep); the figures from `valueprobe.report.steering_eval`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from valueprobe.cli.app import table, write_figure
from valueprobe.datasets.answers import read_tasks
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import jsonable, write_json
from valueprobe.steering.experiment.prompting import conditions_path, read_target

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel
    from valueprobe.steering.experiment.dose import SteerSweep

__all__ = ["judge_sweep", "print_evaluation", "side_effect_folder"]


def print_evaluation(path: Path, out: Path) -> str:
    """Print the tables of ``evaluation.json`` at ``path`` and draw its figures into ``out``; the
    files written, as a suffix for the command's last line ("" when there is no evaluation)."""
    from valueprobe.replicate.steer_eval import (  # loads the library: when the command runs (cli/app.py)
        SteerEvaluation,
        reliability_table,
    )
    from valueprobe.report.steering_eval import (
        baseline_figure,
        front_figure,
        reliability_figure,
        side_effects_figure,
    )
    from valueprobe.steering.experiment.baseline import baseline_table

    if not path.is_file():
        return ""
    ev = SteerEvaluation.from_dict(json.loads(path.read_text(encoding="utf-8")))
    for name, b in ev.benches.items():
        table(f"{name}: steering, prompting and both (target {b.target.metric}, sign {b.target.sign:+d})",
              *baseline_table(b.baseline, unit=ev.unit))  # fmt: skip
    table("side effects: axis vs random directions", *ev.side.table())
    table("per-item reliability", *reliability_table(ev.benches))
    fronts = [(n, b.front) for n, b in ev.benches.items() if b.front is not None]
    for name, f in fronts:
        table(
            f"{name}: effect against KL (useful α: {', '.join(f'{a:g}' for a in f.useful) or 'none'})",
            *f.table(),
        )
    rows = [r for b in ev.benches.values() for r in b.baseline if r.sign is not None]
    write_figure(baseline_figure(rows, unit=ev.unit), out / "baseline.html")
    write_figure(front_figure([f for _, f in fronts], titles=[n for n, _ in fronts]), out / "front.html")
    rels = [(n, b.reliability) for n, b in ev.benches.items() if b.reliability is not None]
    write_figure(
        reliability_figure([r for _, r in rels], titles=[n for n, _ in rels]), out / "reliability.html"
    )
    write_figure(side_effects_figure(ev.side), out / "side_effects.html")
    return ", evaluation.json, baseline.html, front.html, reliability.html, side_effects.html"


NEUTRAL = "neutral_text.jsonl"


def side_effect_folder(prompts: Path) -> Path:
    """The folder holding the neutral corpus and the task files side effects read: the prompts'
    own (``data/``); one line, before any model loads, when one of them is not there."""
    from valueprobe.replicate.steer_eval import TASKS  # loads the library: when the command runs (cli/app.py)

    folder = prompts.parent
    for name in (NEUTRAL, *(f for f, _, _, _ in TASKS.values())):
        if not (folder / name).is_file():
            raise ValueprobeError(
                f"--side-effects reads {folder / name}, which does not exist: keep the prompts beside data/'s"
                " neutral_text.jsonl and task files, or build them with `valueprobe datasets build`"
            )
    return folder


def judge_sweep(lm: LoadedModel, result: SteerSweep, out: Path, *, side_effects: bool) -> None:
    """What ``steer`` prints beside its dose table: steering against asking and per-item reliability
    for the set's stated target, and with ``side_effects`` the side effects and the effect-vs-KL front
    (``side_effects.json``, ``side_effects.html``, ``front.html``)."""
    from valueprobe.replicate.steer_eval import (  # loads the library: when the command runs (cli/app.py)
        TASKS,
        BenchEval,
        reliability_table,
    )
    from valueprobe.report.steering_eval import front_figure, side_effects_figure
    from valueprobe.steering.experiment.baseline import baseline_table, prompt_baseline
    from valueprobe.steering.experiment.front import effect_front
    from valueprobe.steering.experiment.reliability import item_reliability
    from valueprobe.steering.experiment.side_effects import measure_side_effects
    from valueprobe.steering.experiment.sweep import GENERATIONS, read_rows

    settings = result.settings
    if settings is None:
        return
    prompts = Path(settings.prompts)
    target = read_target(Path(settings.conditions_file or conditions_path(prompts)), prompts.stem)
    if result.prompted:
        table(
            "steering, prompting and both", *baseline_table(prompt_baseline(result, target), unit=result.unit)
        )
    if target is None:
        return
    rows = read_rows(out / GENERATIONS)
    rel = item_reliability(rows, target)
    table("per-item reliability", *reliability_table({prompts.stem: BenchEval(target, (), rel, None)}))
    if not side_effects:
        return
    measured = replace(settings, alphas=tuple(sorted({0.0, *settings.alphas})))
    tasks = {
        k: [t for t in read_tasks(prompts.parent / f) if g is None or t.group == g][:n]
        for k, (f, g, n, _) in TASKS.items()
    }
    side = measure_side_effects(lm, measured, texts=read_jsonl(prompts.parent / "neutral_text.jsonl"), tasks=tasks,
                                max_new_tokens={k: v[3] for k, v in TASKS.items()})  # fmt: skip
    write_json(out / "side_effects.json", jsonable(side.to_dict()), allow_nan=False)
    table("side effects: axis vs random directions", *side.table())
    front = effect_front(rows, side.metric("kl"), target)
    table(
        f"effect against KL (useful α: {', '.join(f'{a:g}' for a in front.useful) or 'none'})", *front.table()
    )
    write_figure(side_effects_figure(side), out / "side_effects.html")
    write_figure(front_figure([front], titles=[f"{target.metric} ({target.subset})"]), out / "front.html")
