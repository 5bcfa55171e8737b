"""Plotly figures for the layer sweep and the transfer matrix.

from valueprobe.plots import sweep_figure, transfer_heatmap
sweep_figure(report.sweep).write_html("runs/fit/sweep.html")
transfer_heatmap(report.transfer).write_html("runs/fit/transfer.html")
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import plotly.graph_objects as go

from valueprobe.sweep import SweepResult
from valueprobe.transfer import TransferResult


def sweep_figure(sweep: SweepResult) -> go.Figure:
    """Held-out AUROC by layer (mean ± sd over splits) with the four controls and the chosen layer."""
    layers = list(sweep.layers)
    fig = go.Figure()

    def band(name: str, a: np.ndarray, dash: str | None = None) -> None:
        mean, sd = a.mean(axis=1), a.std(axis=1, ddof=1) if a.shape[1] > 1 else np.zeros(len(a))
        fig.add_trace(
            go.Scatter(
                x=layers,
                y=mean,
                name=name,
                mode="lines+markers",
                line={"dash": dash},
                error_y={"type": "data", "array": sd, "visible": True},
            )
        )

    band("test AUROC", sweep.test_auroc)
    band("val AUROC", sweep.val_auroc, "dot")
    band("control: shuffled labels", sweep.shuffled_auroc, "dash")
    band("control: random direction", sweep.random_auroc, "dash")
    for name, a in sweep.controls().items():
        if name == "embed" or name.startswith("position:"):
            fig.add_hline(
                y=float(np.mean(a)),
                line_dash="dashdot",
                annotation_text=f"control: {name}",
                annotation_position="bottom right",
            )
    fig.add_vline(x=sweep.best_layer, line_dash="dot", annotation_text=f"best (val) {sweep.best_layer}")
    fig.update_layout(
        title=f"Value axis by layer ({sweep.method}); {sweep.summary()}",
        xaxis_title="layer",
        yaxis_title="AUROC (held-out groups)",
        yaxis_range=[0.0, 1.02],
        template="plotly_white",
        title_font_size=12,
    )
    return fig


def layer_cosine_figure(sweep: SweepResult) -> go.Figure:
    """Cosine similarity between the directions fitted at different layers."""
    labels = [str(x) for x in sweep.layers]
    fig = go.Figure(
        go.Heatmap(
            z=sweep.cosine,
            x=labels,
            y=labels,
            zmin=-1,
            zmax=1,
            colorscale="RdBu",
            reversescale=True,
            colorbar={"title": "cos"},
        )
    )
    fig.update_layout(
        title="cos(v_layer_i, v_layer_j)", xaxis_title="layer", yaxis_title="layer", template="plotly_white"
    )
    return fig


def transfer_heatmap(
    result: TransferResult,
    *,
    metric: Literal["auroc", "cohens_d", "cosine", "margin"] = "auroc",
) -> go.Figure:
    """Heatmap of the transfer matrix (rows: fitted on, columns: evaluated on), cells annotated."""
    z = getattr(result, metric)
    names = list(result.families)
    zrange = {"auroc": (0.0, 1.0), "cosine": (-1.0, 1.0), "margin": (-0.5, 0.5)}.get(metric)
    mid = {"auroc": 0.5}.get(metric, 0.0)
    text = [[("" if not np.isfinite(v) else f"{v:.2f}") for v in row] for row in z]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=names,
            text=text,
            texttemplate="%{text}",
            colorscale="RdBu",
            reversescale=True,
            zmid=mid,
            zmin=None if zrange is None else zrange[0],
            zmax=None if zrange is None else zrange[1],
            colorbar={"title": metric},
        )
    )
    fig.update_layout(
        title=f"Transfer at layer {result.layer}: {metric} (diagonal: held-out groups)",
        xaxis_title="evaluated on",
        yaxis_title="fitted on",
        yaxis_autorange="reversed",
        template="plotly_white",
    )
    return fig
