"""Accuracy against tokens spent: what `valueprobe replicate guide` measures, as records the report reads.

    >>> budget = GuideBudget.from_dict(json.load(open("probes/guide-smollm2-135m/results.json"))["sections"]["guide"]["tasks"]["arithmetic"])
    >>> budget.curve("best-of-n by log-prob").points[-1].accuracy
    >>> budget.table()                                      # one row per method and budget

Every method answers the same prompts; a point is its accuracy (a 95% bootstrap CI over prompts)
at the mean number of tokens it sampled per prompt (rolled-back and pruned tokens included). A
best-of-n curve has one point per n (the first n of the same N samples: with common random
numbers they are exactly the samples a run with that n would draw). The random-direction null
is a curve whose accuracy is the mean over directions, with the central 95% of the directions'
accuracies beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from valueprobe.errors import ValueprobeError
from valueprobe.records import Record

__all__ = ["BudgetPoint", "GuideBudget", "GuideReplication", "Kind", "MethodCurve", "Separation", "at_budget"]

Kind = Literal["baseline", "policy", "null", "oracle"]


@dataclass(frozen=True)
class BudgetPoint:
    """One budget: ``n`` samples per prompt, ``tokens`` spent per prompt (mean), accuracy and its CI.

    ``null_range``: for the null, the central 95% of the random directions' accuracies."""

    n: int
    tokens: float
    accuracy: float
    ci: tuple[float, float]
    null_range: tuple[float, float] | None = None


@dataclass(frozen=True)
class MethodCurve:
    """One method's points. ``axis``: the probe folder it reads (None: it reads no axis)."""

    method: str
    kind: Kind
    points: tuple[BudgetPoint, ...]
    axis: str | None = None


@dataclass(frozen=True)
class Separation:
    """How well a reading tells right from wrong samples, over all N × prompts samples (AUROC).

    ``auroc``: the axis's mean σ over the response; ``auroc_logprob``: mean log-probability;
    ``null``: the central 95% of the random directions' AUROCs at the same layer."""

    axis: str
    layer: int
    auroc: float
    auroc_logprob: float
    null: tuple[float, float]
    n_samples: int
    n_right: int


def at_budget(curve: MethodCurve, tokens: float) -> float:
    """The curve's accuracy at ``tokens`` per prompt, linear between its points (NaN outside them)."""
    xs = [p.tokens for p in curve.points]
    if len(xs) < 2 or not xs[0] <= tokens <= xs[-1]:
        return math.nan
    return float(np.interp(tokens, xs, [p.accuracy for p in curve.points]))


@dataclass(frozen=True)
class GuideBudget(Record):
    """One task file's accuracy-against-budget curves for every method, and the separations."""

    task: str
    file: str
    n_prompts: int
    samples: int
    curves: tuple[MethodCurve, ...]
    separations: tuple[Separation, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    def curve(self, method: str) -> MethodCurve:
        for c in self.curves:
            if c.method == method:
                return c
        raise ValueprobeError(
            f"no method {method!r} here; methods: {', '.join(c.method for c in self.curves)}"
        )

    def table(self) -> tuple[list[str], list[list[object]]]:
        """One row per (method, budget): what the markdown summary and the CLI print."""
        headers = ["method", "axis", "n", "tokens / prompt", "accuracy", "95% CI", "null 95% range"]
        rows: list[list[object]] = []
        for c in self.curves:
            for p in c.points:
                null = "" if p.null_range is None else f"[{p.null_range[0]:.3f}, {p.null_range[1]:.3f}]"
                ci = "" if not all(math.isfinite(v) for v in p.ci) else f"[{p.ci[0]:.3f}, {p.ci[1]:.3f}]"
                rows.append([c.method, c.axis or "", p.n, round(p.tokens, 1), p.accuracy, ci, null])
        return headers, rows

    def verdicts(self) -> list[str]:
        """Plain sentences: each axis's best-of-N against log-prob and the null, each policy at its budget
        against best-of-n by log-prob and self-consistency there (linear between their points)."""
        lines = []
        logprob = self.curve("best-of-n by log-prob")
        top = logprob.points[-1]
        for c in self.curves:
            if c.method == "best-of-n by value":
                lines.append(self._against_null(c, top))
            elif c.kind == "policy":
                p = c.points[0]
                same, vote = at_budget(logprob, p.tokens), at_budget(self.curve("self-consistency"), p.tokens)
                if math.isfinite(same):
                    there = f"at that budget best-of-n by log-prob gives {same:.1%} and self-consistency {vote:.1%}"
                else:  # outside the best-of-n budgets: the nearest one, said as such
                    near = min(logprob.points, key=lambda q: abs(q.tokens - p.tokens))
                    there = f"the nearest best-of-n budget ({near.tokens:.0f} tokens, n = {near.n}) gives {near.accuracy:.1%} by log-prob"
                lines.append(
                    f"{self.task}, {c.axis}: {c.method} {p.accuracy:.1%} at {p.tokens:.0f} tokens/prompt; {there}."
                )
        return lines

    def _against_null(self, c: MethodCurve, top: BudgetPoint) -> str:
        mine = c.points[-1]
        null = next(x for x in self.curves if x.kind == "null" and x.axis == c.axis)
        lo, hi = null.points[-1].null_range or (math.nan, math.nan)
        beats = "beats" if mine.accuracy > top.accuracy else "does not beat"
        where = "above" if mine.accuracy > hi else "inside" if mine.accuracy >= lo else "below"
        return (
            f"{self.task}, {c.axis}: best-of-{mine.n} by the axis {mine.accuracy:.1%} {beats} best-of-{top.n}"
            f" by log-prob ({top.accuracy:.1%}) and is {where} the random directions' 95% range"
            f" [{lo:.1%}, {hi:.1%}]."
        )


@dataclass(frozen=True)
class GuideReplication(Record):
    """Every task file's `GuideBudget` by task name, and the probes read (the report's ``guide`` section)."""

    tasks: dict[str, GuideBudget]
    probes: tuple[str, ...]
    model: str
