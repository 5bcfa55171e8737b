"""The figure of a harness run across strengths (`valueprobe eval`): the task's score against α for
the axis, beside the random directions of the same norm.

    from valueprobe.report.evals import eval_figure
    fig = eval_figure(result.points, metric="exact_match", unit="norm", title="arithmetic (lm-eval)")

It reads any points with a direction, α, score and standard error (`valueprobe.evals.records`'s
`EvalPoint`), since that record lives above this layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import plotly.graph_objects as go

from valueprobe.report.style import LAYOUT, PALETTE, band
from valueprobe.stats.null import null_range
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX

__all__ = ["ScorePoint", "eval_figure"]


class ScorePoint(Protocol):
    """One direction at one strength, scored."""

    @property
    def direction(self) -> str: ...

    @property
    def alpha(self) -> float: ...

    @property
    def score(self) -> float: ...

    @property
    def stderr(self) -> float: ...


def eval_figure(points: Sequence[ScorePoint], *, metric: str, unit: str, title: str) -> go.Figure:
    """Score against α: the axis with ±1.96 standard errors, each random direction as a faint line,
    and their central 95% as a grey band. α = 0 (no steering) is shared by every direction."""
    alphas = sorted({p.alpha for p in points})
    base = [p for p in points if p.alpha == 0]

    def curve(name: str) -> list[ScorePoint]:
        return sorted(
            base + [p for p in points if p.direction == name and p.alpha != 0], key=lambda p: p.alpha
        )

    fig = go.Figure()
    randoms = sorted({p.direction for p in points if p.direction.startswith(RANDOM_PREFIX)})
    if randoms:
        by_alpha = {
            a: [p.score for p in points if p.alpha == a and (a == 0 or p.direction != AXIS)] for a in alphas
        }
        ranges = [null_range(by_alpha[a]) for a in alphas]
        band(
            fig,
            x=alphas,
            lo=[lo for lo, _ in ranges],
            hi=[hi for _, hi in ranges],
            color="#999999",
            name=f"{len(randoms)} random directions (95%)",
            legend=True,
        )
        for k, name in enumerate(randoms):
            c = curve(name)
            line = go.Scatter(
                x=[p.alpha for p in c],
                y=[p.score for p in c],
                mode="lines+markers",
                line={"color": "#999999", "width": 1},
                marker={"size": 4},
                opacity=0.6,
                name="random directions",
                legendgroup="random",
                showlegend=k == 0,
            )
            fig.add_trace(line)
    axis = curve(AXIS)
    fig.add_trace(
        go.Scatter(
            x=[p.alpha for p in axis],
            y=[p.score for p in axis],
            mode="lines+markers",
            error_y={"type": "data", "array": [1.96 * p.stderr for p in axis], "visible": True},
            line={"color": PALETTE[0], "width": 3},
            name="axis (±1.96 s.e.)",
        )
    )
    fig.update_xaxes(title_text=f"α ({unit})")
    fig.update_yaxes(title_text=metric)
    fig.update_layout(title=title, height=420, **LAYOUT)
    return fig
