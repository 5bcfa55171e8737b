"""Plotly figures for the layer sweep, the transfer matrix and a checkpoint shift.

    from valueprobe.report.plots import sweep_figure, transfer_heatmap
    sweep_figure(report.sweep).write_html("runs/fit/sweep.html")
    transfer_heatmap(report.transfer).write_html("runs/fit/transfer.html")

Each takes the live result or its saved record (``LayerSweepSummary``, ``TransferSummary``: what
``to_dict`` writes, read back by ``from_dict``), so the report draws the same figure from disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.probe.layer_sweep import LayerSweepResult, LayerSweepSummary
from valueprobe.probe.transfer import TransferResult, TransferSummary
from valueprobe.report.style import LAYOUT, PALETTE, band
from valueprobe.tune.shift_records import ShiftResult


def sweep_figure(sweep: LayerSweepResult | LayerSweepSummary) -> go.Figure:
    """Held-out AUROC by layer: test mean with an sd band over splits, val, the controls, the chosen layer.

    Draws a live sweep and a saved one (``LayerSweepSummary.from_dict`` of ``probe.json``
    ``metrics.sweep``) the same way: the report uses this function too.
    """
    s = sweep.record() if isinstance(sweep, LayerSweepResult) else sweep
    layers = list(s.layers)
    fig = go.Figure()
    series = [
        ("test AUROC", "test_auroc", PALETTE[0], None),
        ("val AUROC", "val_auroc", PALETTE[0], "dot"),
        ("control: shuffled labels", "shuffled_auroc", "#7f7f7f", "dash"),
        ("control: random direction", "random_auroc", "#bcbd22", "dash"),
    ]
    for name, key, color, dash in series:
        mean = np.array([getattr(s.by_layer[layer], key).mean for layer in layers])
        sd = np.array([getattr(s.by_layer[layer], key).sd for layer in layers])
        if dash is None:
            band(fig, layers, mean - sd, mean + sd, color, f"{name} ± sd", legend=True)
        fig.add_trace(
            go.Scatter(x=layers, y=mean, name=name, mode="lines+markers", line={"dash": dash, "color": color})
        )
    for i, (name, ms) in enumerate(sorted(s.controls.items())):
        if name == "embed" or name.startswith("position:"):
            fig.add_trace(
                go.Scatter(
                    x=[layers[0], layers[-1]],
                    y=[ms.mean] * 2,
                    mode="lines",
                    name=f"control: {name}",
                    line={"dash": "dashdot", "color": PALETTE[(i + 2) % len(PALETTE)]},
                )
            )
    fig.add_vline(x=s.best_layer, line_dash="dot", annotation_text=f"chosen layer {s.best_layer}")
    fig.update_layout(
        xaxis_title="layer",
        yaxis_title="AUROC (held-out groups)",
        yaxis_range=[0.0, 1.02],
        title=f"{s.method}: held-out AUROC by layer",
        **LAYOUT,
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


def layer_cosine_figure(sweep: LayerSweepResult | LayerSweepSummary) -> go.Figure:
    """Cosine similarity between the directions fitted at different layers (live or saved sweep)."""
    s = sweep.record() if isinstance(sweep, LayerSweepResult) else sweep
    fig = cosine_heatmap(s.cosine, s.cosine_layers, title="cos(v_i, v_j) between layers")
    fig.update_layout(**LAYOUT)
    return fig


def transfer_heatmap(
    result: TransferResult | TransferSummary,
    *,
    metric: Literal["auroc", "cohens_d", "cosine", "margin"] = "auroc",
) -> go.Figure:
    """Heatmap of the transfer matrix (rows: fitted on, columns: evaluated on), cells annotated.

    AUROC cells also show the margin over the strongest control. Draws a live matrix and a saved
    one (``TransferSummary.from_dict``) the same way: the report uses this function too.
    """
    r = result.record() if isinstance(result, TransferResult) else result
    z = np.array(getattr(r, metric), dtype=float)
    names = list(r.families)
    zrange = {"auroc": (0.0, 1.0), "cosine": (-1.0, 1.0), "margin": (-0.5, 0.5)}.get(metric)
    mid = {"auroc": 0.5}.get(metric, 0.0)
    margin = np.array(r.margin, dtype=float) if metric == "auroc" else np.full_like(z, np.nan)
    text = [
        [
            ("" if not np.isfinite(v) else f"{v:.2f}") + ("" if not np.isfinite(m) else f"<br>({m:+.2f})")
            for v, m in zip(row, mrow, strict=True)
        ]
        for row, mrow in zip(z, margin, strict=True)
    ]
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
    extra = " (margin over strongest control)" if metric == "auroc" else ""
    fig.update_layout(
        title=f"Transfer at layer {r.layer}: {metric}{extra} (diagonal: held-out groups)",
        xaxis_title="evaluated on",
        yaxis_title="fitted on",
        yaxis_autorange="reversed",
        **LAYOUT,
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
