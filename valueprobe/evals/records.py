"""What `valueprobe eval` records: each (direction, α) scored by the harness, and the run's table.

    >>> result = EvalResult.from_dict(json.load(open("runs/eval-arithmetic/eval.json")))
    >>> headers, rows = result.table()          # per α: the axis, its CI, the random directions' range
    >>> result.write("runs/eval-arithmetic")    # eval.json, eval.csv, eval.html

α is in the run's unit (``unit``); each point also carries it in the other unit (``other_unit``:
σ for a norm run and the reverse, at the first steered layer), since every α is reported in both.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from valueprobe.files import atomic_write_text, jsonable, write_html, write_json
from valueprobe.records import Record
from valueprobe.report.evals import eval_figure
from valueprobe.stats.null import null_range
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX

__all__ = ["EvalPoint", "EvalResult", "EvalSettings"]


@dataclass(frozen=True)
class EvalSettings(Record):
    """What a run asked for (the identity every part of a sharded run shares)."""

    harness: str
    task: str
    alphas: tuple[float, ...]
    random_directions: int = 8
    limit: int | None = None
    seed: int = 0
    batch_size: int = 16


@dataclass(frozen=True)
class EvalPoint(Record):
    """One direction at one strength, scored: ``direction`` is ``axis`` or ``random-K``; α = 0 is
    the unsteered model, run once (``axis``) for every direction."""

    direction: str
    alpha: float
    alpha_other: float  # the same α in the other unit
    score: float
    stderr: float
    n: int

    def key(self) -> tuple[str, float]:
        return (self.direction, self.alpha)


@dataclass(frozen=True)
class EvalResult(Record):
    """A harness task across strengths along the axis and its random directions."""

    FORMAT: ClassVar[str] = "valueprobe.eval"
    FORMAT_VERSION: ClassVar[int] = 1

    model: str
    fingerprint: str
    spec: dict[str, Any]
    unit: str
    other_unit: str
    metric: str
    settings: EvalSettings
    points: tuple[EvalPoint, ...]

    def at(self, direction: str, alpha: float) -> EvalPoint | None:
        """The point of ``direction`` at ``alpha`` (α = 0: the shared unsteered point)."""
        name = AXIS if alpha == 0 else direction
        return next((p for p in self.points if p.key() == (name, alpha)), None)

    def table(self) -> tuple[list[str], list[list[object]]]:
        """Per α: the axis's score with its 95% CI, the random directions' central 95% and whether
        the axis lies outside it."""
        headers = [
            f"α ({self.unit})",
            f"α ({self.other_unit})",
            self.metric,
            "95% CI",
            "random 95% range",
            "random n",
            "axis outside",
        ]
        rows: list[list[object]] = []
        for a in sorted({p.alpha for p in self.points}):
            p = self.at(AXIS, a)
            if p is None:
                continue
            null = [q.score for q in self.points if q.alpha == a and q.direction.startswith(RANDOM_PREFIX)]
            lo, hi = null_range(null) if null else (math.nan, math.nan)
            outside = "-" if a == 0 or not null else ("yes" if p.score < lo or p.score > hi else "no")
            ci = f"[{p.score - 1.96 * p.stderr:.3f}, {p.score + 1.96 * p.stderr:.3f}]"
            spread = "-" if not null else f"[{lo:.3f}, {hi:.3f}]"
            rows.append([f"{a:g}", f"{p.alpha_other:.4g}", p.score, ci, spread, len(null), outside])
        return headers, rows

    def csv(self) -> str:
        """Every point as CSV: direction, α in both units, score, standard error, n."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(
            ["direction", f"alpha_{self.unit}", f"alpha_{self.other_unit}", self.metric, "stderr", "n"]
        )
        for p in self.points:
            w.writerow([p.direction, repr(p.alpha), repr(p.alpha_other), repr(p.score), repr(p.stderr), p.n])
        return out.getvalue()

    def figure(self):  # noqa: ANN201 - a plotly Figure
        s = self.settings
        title = f"{s.task} through {s.harness}: {self.metric} against α, axis vs random directions"
        return eval_figure(self.points, metric=self.metric, unit=self.unit, title=title)

    def write(self, out: str | Path) -> Path:
        """``eval.json`` (this record), ``eval.csv`` (every point) and ``eval.html`` (the figure)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "eval.csv", self.csv())
        write_html(self.figure(), out / "eval.html")
        write_json(out / "eval.json", jsonable(self.to_dict()), allow_nan=False)
        return out
