"""Report figures of where the axis is that only the report draws: the matched control and the
logit lens. The sweep, the inter-layer cosine and the transfer matrix are drawn by
:mod:`valueprobe.report.plots` (the same function for a live result and a saved one); what the
axis does when read, steered and tuned is drawn by :mod:`valueprobe.report.effects`.

    from valueprobe.report.figures import logit_lens_figure
    logit_lens_figure(LogitLens.from_dict(probe["metrics"]["logit_lens"]))
"""

from __future__ import annotations

import plotly.graph_objects as go

from valueprobe.probe.contrast import MatchedControl
from valueprobe.read.readout import LogitLens
from valueprobe.report.style import LAYOUT, PALETTE

__all__ = ["logit_lens_figure", "matched_control_figure"]


def matched_control_figure(mc: MatchedControl) -> go.Figure:
    """AUROC with bootstrap CIs of each matched-control contrast (``replicate.axis.matched_control``)."""
    contrasts = mc.contrasts()
    names = list(contrasts)
    auc = [c.auroc for c in contrasts.values()]
    lo = [c.auroc - c.auroc_ci[0] for c in contrasts.values()]
    hi = [c.auroc_ci[1] - c.auroc for c in contrasts.values()]
    fig = go.Figure(
        go.Bar(
            x=auc,
            y=names,
            orientation="h",
            marker_color=PALETTE[0],
            error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        )
    )
    fig.add_vline(x=0.5, line_dash="dash", annotation_text="chance")
    fig.update_layout(
        title=f"matched control at layer {mc.layer}",
        xaxis_title="AUROC [95% CI]",
        xaxis_range=[0, 1.02],
        **LAYOUT,
    )
    return fig


def logit_lens_figure(lens: LogitLens, *, k: int = 15) -> go.Figure:
    """Top promoted and suppressed tokens of the axis, as a diverging bar chart."""
    promoted, suppressed = lens.promoted[:k], lens.suppressed[:k]
    tokens = [repr(t) for t, _ in suppressed[::-1]] + [repr(t) for t, _ in promoted[::-1]]
    logits = [-abs(v) for _, v in suppressed[::-1]] + [abs(v) for _, v in promoted[::-1]]
    colors = ["#4575b4"] * len(suppressed) + ["#d73027"] * len(promoted)
    fig = go.Figure(
        go.Bar(
            x=logits,
            y=list(range(len(tokens))),
            orientation="h",
            marker_color=colors,
            text=tokens,
            textposition="outside",
            hovertext=tokens,
            hoverinfo="text+x",
        )
    )
    fig.update_layout(
        title=f"logit lens at layer {lens.layer}",
        xaxis_title="logit change (suppressed < 0 < promoted)",
        yaxis={"showticklabels": False},
        height=520,
        **LAYOUT,
    )
    return fig
