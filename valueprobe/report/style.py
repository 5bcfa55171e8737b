"""The report's look, shared by every figure: layout, palette, and a filled band.

from valueprobe.report.style import LAYOUT, PALETTE, band
fig.update_layout(**LAYOUT)
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

__all__ = ["LAYOUT", "PALETTE", "band"]

LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "title_font_size": 13}
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def band(
    fig: go.Figure,
    x: Sequence,
    lo: Sequence,
    hi: Sequence,
    color: str,
    name: str | None = None,
    *,
    legend: bool = False,
    row: int | None = None,
    col: int | None = None,
) -> None:
    """A filled band between lo and hi (drawn as one closed polygon), in subplot (row, col) if given."""
    x = list(x)
    polygon = go.Scatter(
        x=x + x[::-1],
        y=list(hi) + list(lo)[::-1],
        fill="toself",
        fillcolor=color,
        opacity=0.18,
        line={"width": 0},
        hoverinfo="skip",
        name=name,
        showlegend=legend,
    )
    fig.add_trace(polygon, row=row, col=col)
