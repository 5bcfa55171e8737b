"""Accuracy against tokens spent for guided decoding and its baselines (`valueprobe replicate guide`).

    from valueprobe.report.budget import budget_figure
    budget_figure(GuideReplication.from_dict(results["sections"]["guide"]).tasks["arithmetic"]).show()

One panel per task: a line per best-of-n method over n (one sample, log-probability,
self-consistency, each axis, the oracle), the random directions' mean with their central 95% as a
band, and a marker per policy run (greedy, prune, rollback) at the tokens it spent.
"""

from __future__ import annotations

import plotly.graph_objects as go

from valueprobe.guided.budget import GuideBudget, GuideReplication, MethodCurve
from valueprobe.report.style import LAYOUT, PALETTE, band

__all__ = ["budget_caption", "budget_figure"]

_GREY = "#7f7f7f"


def _label(c: MethodCurve) -> str:
    return c.method if c.axis is None else f"{c.method} ({c.axis})"


def _errors(c: MethodCurve) -> dict:
    return {
        "type": "data",
        "symmetric": False,
        "array": [p.ci[1] - p.accuracy for p in c.points],
        "arrayminus": [p.accuracy - p.ci[0] for p in c.points],
        "thickness": 1,
    }


def budget_figure(budget: GuideBudget) -> go.Figure:
    """Accuracy (95% CI over prompts) against mean tokens spent per prompt, every method of one task."""
    fig = go.Figure()
    colors = iter(PALETTE * 3)
    for c in budget.curves:
        x = [p.tokens for p in c.points]
        y = [p.accuracy for p in c.points]
        if c.kind == "null":
            lo = [p.null_range[0] if p.null_range else p.accuracy for p in c.points]
            hi = [p.null_range[1] if p.null_range else p.accuracy for p in c.points]
            band(fig, x, lo, hi, _GREY, f"random directions 95% ({c.axis})", legend=True)
            fig.add_trace(
                go.Scatter(
                    x=x, y=y, mode="lines+markers", name=_label(c), line={"color": _GREY, "dash": "dot"}
                )
            )
            continue
        color = next(colors)
        mode = "lines+markers" if len(c.points) > 1 else "markers"
        marker = {
            "color": color,
            "size": 10 if len(c.points) == 1 else 6,
            "symbol": "diamond" if c.kind == "policy" and len(c.points) == 1 else "circle",
        }
        line = {"color": color, "dash": "dash" if c.kind == "oracle" else "solid"}
        text = [f"n = {p.n}" for p in c.points]
        fig.add_trace(
            go.Scatter(
                x=x, y=y, mode=mode, name=_label(c), marker=marker, line=line, text=text, error_y=_errors(c)
            )
        )
    fig.update_layout(
        **LAYOUT,
        title=f"{budget.task}: accuracy against tokens spent ({budget.n_prompts} prompts, N = {budget.samples})",
        xaxis_title="tokens sampled per prompt (mean)",
        yaxis_title="accuracy",
        yaxis_range=[0, 1],
    )
    return fig


def budget_caption(results: GuideReplication) -> str:
    return (
        "Accuracy of each method against the tokens it sampled per prompt; best-of-n methods are drawn over"
        " n (the first n of the same N samples, common random numbers), each policy run is one marker. The grey"
        " band is the central 95% of best-of-n by random directions at the axis's layer (the null). "
        + " ".join(line for b in results.tasks.values() for line in b.verdicts())
    )
