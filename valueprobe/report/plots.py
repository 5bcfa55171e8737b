"""Plotly figures for the layer sweep, the transfer matrix and a checkpoint shift.

from valueprobe.report.plots import sweep_figure, transfer_heatmap
sweep_figure(report.sweep).write_html("runs/fit/sweep.html")
transfer_heatmap(report.transfer).write_html("runs/fit/transfer.html")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.probe.layer_sweep import SweepResult
from valueprobe.probe.transfer import TransferResult
from valueprobe.tune.shift_records import ShiftResult


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


def cosine_heatmap(
    cosine: np.ndarray | Sequence[Sequence[float]],
    layers: Sequence[int],
    *,
    title: str = "cos(v_layer_i, v_layer_j)",
) -> go.Figure:
    """Cosine similarity between per-layer directions, on a fixed [-1, 1] diverging scale."""
    labels = [str(x) for x in layers]
    fig = go.Figure(
        go.Heatmap(
            z=cosine,
            x=labels,
            y=labels,
            zmin=-1,
            zmax=1,
            colorscale="RdBu",
            reversescale=True,
            colorbar={"title": "cos"},
        )
    )
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="layer", template="plotly_white")
    return fig


def layer_cosine_figure(sweep: SweepResult) -> go.Figure:
    """Cosine similarity between the directions fitted at different layers."""
    return cosine_heatmap(sweep.cosine, sweep.layers)


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


def shift_figure(res: ShiftResult) -> go.Figure:
    """Score distributions before/after per group, and d-by-layer curves (base dashed, tuned solid)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.55, 0.45],
        subplot_titles=(
            f"scores at layer {res.layer} (base σ)",
            "separation by layer (Cohen's d)" if res.pairs else "mean shift by layer (σ)",
        ),
    )
    for g in res.groups:
        rows = [r for r in res.records if r["group"] == g.group]
        for model, side in (("base", "negative"), ("tuned", "positive")):
            fig.add_trace(
                go.Violin(
                    x=[g.group] * len(rows),
                    y=[r[model] for r in rows],
                    side=side,
                    name=model,
                    legendgroup=model,
                    showlegend=g is res.groups[0],
                    line_color="#888" if model == "base" else "#d62728",
                    meanline_visible=True,
                    points=False,
                ),
                row=1,
                col=1,
            )
    if res.pairs:
        for p in res.pairs:
            for model, dash in (("base", "dash"), ("tuned", "solid")):
                d = p.d_base if model == "base" else p.d_tuned
                fig.add_trace(
                    go.Scatter(
                        x=list(res.layers),
                        y=list(d),
                        mode="lines+markers",
                        line_dash=dash,
                        name=f"{p.a} vs {p.b} ({model})",
                    ),
                    row=1,
                    col=2,
                )
    else:
        for name, ys in res.shift_by_layer.items():
            fig.add_trace(
                go.Scatter(x=list(res.layers), y=list(ys), mode="lines+markers", name=name), row=1, col=2
            )
    fig.update_layout(
        violinmode="overlay",
        template="plotly_white",
        height=480,
        title=f"{res.tuned_id} vs {res.base_id} on {res.probe.model_id} axis",
    )
    fig.update_xaxes(title_text="layer", row=1, col=2)
    return fig
