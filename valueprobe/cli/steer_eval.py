"""Printing and drawing what `valueprobe replicate steer` and `valueprobe steer` judge their sweeps by.

    valueprobe replicate steer --out probes/steering-eval-smollm2-135m    # evaluation.json -> tables, figures

The records come from `valueprobe.replicate.steer_eval` (replicate) and `valueprobe.steering`
(one sweep); the figures from `valueprobe.report.steering_eval`.
"""

from __future__ import annotations

import json
from pathlib import Path

from valueprobe.cli.app import table, write_html
from valueprobe.replicate.steer_eval import SteerEvaluation, reliability_table
from valueprobe.report.steering_eval import (
    baseline_figure,
    front_figure,
    reliability_figure,
    side_effects_figure,
)
from valueprobe.steering.baseline import baseline_table

__all__ = ["print_evaluation"]


def print_evaluation(path: Path, out: Path) -> str:
    """Print the tables of ``evaluation.json`` at ``path`` and draw its figures into ``out``; the
    files written, as a suffix for the command's last line ("" when there is no evaluation)."""
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
    write_html(baseline_figure(rows, unit=ev.unit), out / "baseline.html")
    write_html(front_figure([f for _, f in fronts], titles=[n for n, _ in fronts]), out / "front.html")
    rels = [(n, b.reliability) for n, b in ev.benches.items() if b.reliability is not None]
    write_html(
        reliability_figure([r for _, r in rels], titles=[n for n, _ in rels]), out / "reliability.html"
    )
    write_html(side_effects_figure(ev.side), out / "side_effects.html")
    return ", evaluation.json, baseline.html, front.html, reliability.html, side_effects.html"
