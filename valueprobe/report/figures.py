"""Plotly figures drawn from saved result JSON (the ``.to_dict()`` forms), for the report: where
the axis is (sweep, cosine, transfer, matched control, logit lens). What it does when read,
steered and tuned (trace, dose-response, shift) is drawn by :mod:`valueprobe.report.effects`.

    from valueprobe.report.figures import sweep_figure_from_dict
    sweep_figure_from_dict(json.load(open("probes/smollm2-135m-value/probe.json"))["metrics"]["sweep"])

:mod:`valueprobe.report.plots` draws from live results (per-split arrays); these draw from what was
saved, so ``valueprobe report`` can rebuild every figure without a model or a store.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from valueprobe.report.plots import cosine_heatmap

__all__ = [
    "LAYOUT",
    "PALETTE",
    "band",
    "cosine_figure",
    "logit_lens_figure",
    "matched_control_figure",
    "sweep_figure_from_dict",
    "transfer_figure",
]

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
    band = go.Scatter(
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
    fig.add_trace(band, row=row, col=col)


def sweep_figure_from_dict(d: dict) -> go.Figure:
    """AUROC by layer from ``SweepResult.to_dict()``: test mean with an sd band, val, and the controls."""
    by = d["by_layer"]
    layers = sorted(int(k) for k in by if k.lstrip("-").isdigit())
    fig = go.Figure()
    series = [
        ("test AUROC", "test_auroc", PALETTE[0], None),
        ("val AUROC", "val_auroc", PALETTE[0], "dot"),
        ("control: shuffled labels", "shuffled_auroc", "#7f7f7f", "dash"),
        ("control: random direction", "random_auroc", "#bcbd22", "dash"),
    ]
    for name, key, color, dash in series:
        mean = np.array([by[str(layer)][key]["mean"] for layer in layers])
        sd = np.array([by[str(layer)][key]["sd"] for layer in layers])
        if dash is None:
            band(fig, layers, mean - sd, mean + sd, color, f"{name} ± sd", legend=True)
        fig.add_trace(
            go.Scatter(x=layers, y=mean, name=name, mode="lines+markers", line={"dash": dash, "color": color})
        )
    for i, (name, ms) in enumerate(sorted(d.get("controls", {}).items())):
        if name == "embed" or name.startswith("position:"):
            fig.add_trace(
                go.Scatter(
                    x=[layers[0], layers[-1]],
                    y=[ms["mean"]] * 2,
                    mode="lines",
                    name=f"control: {name}",
                    line={"dash": "dashdot", "color": PALETTE[(i + 2) % len(PALETTE)]},
                )
            )
    fig.add_vline(x=d["best_layer"], line_dash="dot", annotation_text=f"chosen layer {d['best_layer']}")
    fig.update_layout(
        xaxis_title="layer",
        yaxis_title="AUROC (held-out groups)",
        yaxis_range=[0.0, 1.02],
        title=f"{d.get('method', '')}: held-out AUROC by layer",
        **LAYOUT,
    )
    return fig


def cosine_figure(d: dict) -> go.Figure:
    """Inter-layer cosine heatmap from ``SweepResult.to_dict()`` (``cosine``, ``cosine_layers``)."""
    fig = cosine_heatmap(d["cosine"], d["cosine_layers"], title="cos(v_i, v_j) between layers")
    fig.update_layout(**LAYOUT)
    return fig


def transfer_figure(d: dict) -> go.Figure:
    """Transfer AUROC heatmap from ``TransferResult.to_dict()``, cells annotated with AUROC and margin."""
    names = list(d["families"])
    z = np.array(d["auroc"], dtype=float)
    margin = np.array(d.get("margin", np.full_like(z, np.nan)), dtype=float)
    text = [
        [
            f"{v:.2f}" + ("" if not np.isfinite(m) else f"<br>({m:+.2f})")
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
            zmid=0.5,
            zmin=0,
            zmax=1,
            colorbar={"title": "AUROC"},
        )
    )
    fig.update_layout(
        title=f"transfer at layer {d['layer']}: AUROC (margin over strongest control)",
        xaxis_title="evaluated on",
        yaxis_title="fitted on",
        yaxis_autorange="reversed",
        **LAYOUT,
    )
    return fig


def matched_control_figure(d: dict) -> go.Figure:
    """AUROC with bootstrap CIs of each matched-control contrast (``replicate.matched_control``)."""
    names = [k for k, v in d.items() if isinstance(v, dict) and "auroc" in v]
    auc = [d[k]["auroc"] for k in names]
    lo = [d[k]["auroc"] - d[k]["auroc_ci"][0] for k in names]
    hi = [d[k]["auroc_ci"][1] - d[k]["auroc"] for k in names]
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
        title=f"matched control at layer {d['layer']}",
        xaxis_title="AUROC [95% CI]",
        xaxis_range=[0, 1.02],
        **LAYOUT,
    )
    return fig


def logit_lens_figure(d: dict, *, k: int = 15) -> go.Figure:
    """Top promoted and suppressed tokens of the axis, as a diverging bar chart."""
    promoted, suppressed = d["promoted"][:k], d["suppressed"][:k]
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
        title=f"logit lens at layer {d['layer']}",
        xaxis_title="logit change (suppressed < 0 < promoted)",
        yaxis={"showticklabels": False},
        height=520,
        **LAYOUT,
    )
    return fig
