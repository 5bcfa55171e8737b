"""Report figures of what the axis does, drawn from result records: the value trace of a
generation, steering dose-response, and the shift after tuning.

    from valueprobe.report.effects import shift_layers_figure
    shift_layers_figure(ShiftResult.from_dict(json.load(open("runs/shift/shift.json"))))

- trace: a `valueprobe.report.sections.TracedText` (a generation's text and its `Trace`);
- steer: a `valueprobe.steering.dose.SteerSweep` (its effects' curves and slopes);
- shift: a `valueprobe.tune.shift_records.ShiftResult` (records, groups, layers, pairs).
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.report.sections import TracedText
from valueprobe.report.style import LAYOUT, PALETTE, band
from valueprobe.steering.dose import SteerSweep
from valueprobe.tune.shift_records import ShiftResult

__all__ = [
    "dose_response_figure",
    "shift_distribution_figure",
    "shift_layers_figure",
    "trace_figure",
    "trace_series",
    "trace_tokens_html",
]


def trace_series(traced: TracedText) -> tuple[str, list[str], np.ndarray]:
    """(where it was read, tokens, σ-score per token); the steered point's values, else the first point's."""
    t = traced.trace
    where = t.steered if t.steered in t.values else next(iter(t.values))
    return where, [str(tok) for tok in t.tokens], np.array(t.values[where], dtype=float)


def trace_figure(traced: TracedText) -> go.Figure:
    """The value (σ units) at each token of one generation; the prompt/generation boundary marked."""
    where, tokens, score = trace_series(traced)
    x = np.arange(len(score))
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=score,
            mode="lines+markers",
            marker={"size": 4},
            name="value (σ)",
            hovertext=[repr(t) for t in tokens],
            hoverinfo="text+y",
        )
    )
    for y in (-1.0, 1.0):
        fig.add_hline(y=y, line_dash="dot", line_color="#999")
    if traced.trace.n_prompt:
        fig.add_vline(x=traced.trace.n_prompt - 0.5, line_dash="dash", annotation_text="generation starts")
    fig.update_layout(title=f"value trace at {where}", xaxis_title="token", yaxis_title="score (σ)", **LAYOUT)
    return fig


def trace_tokens_html(traced: TracedText) -> str:
    """The trace's tokens as HTML spans coloured by value: red above the mean, blue below, ±2 σ saturates."""
    spans = []
    for tok, s in zip(*trace_series(traced)[1:], strict=True):
        a = 0.0 if not np.isfinite(s) else min(abs(float(s)) / 2.0, 1.0) * 0.75
        rgb = "215,48,39" if s > 0 else "69,117,180"
        spans.append(
            f'<span style="background: rgba({rgb},{a:.2f})" title="{float(s):+.2f} σ">{html.escape(str(tok))}</span>'
        )
    return '<div class="tokens">' + "".join(spans) + "</div>"


def dose_response_figure(sweep: SteerSweep) -> go.Figure:
    """One panel per (metric, prompt subset) of a sweep: the axis with its 95% CI over prompts, the
    other axis, and the central 95% of random directions as a grey band (the null)."""
    effects = sweep.effects
    cols = min(3, max(len(effects), 1))
    rows = (len(effects) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{e.metric} ({e.subset})" for e in effects])
    for i, e in enumerate(effects):
        r, c, first = i // cols + 1, i % cols + 1, i == 0
        curves = e.curves
        if "null" in curves:
            n = curves["null"]
            fig.add_trace(
                go.Scatter(
                    x=[*n.alphas, *n.alphas[::-1]],
                    y=[*n.hi, *n.lo[::-1]],
                    fill="toself",
                    fillcolor="rgba(150,150,150,0.3)",
                    line={"width": 0},
                    legendgroup="null",
                    name="random directions (95%)",
                    showlegend=first,
                ),
                row=r,
                col=c,
            )
        if "other" in curves:
            o = curves["other"]
            fig.add_trace(
                go.Scatter(
                    x=list(o.alphas),
                    y=list(o.means),
                    mode="lines+markers",
                    line={"color": "#e69f00"},
                    name=e.other_name or "other axis",
                    legendgroup="other",
                    showlegend=first,
                ),
                row=r,
                col=c,
            )
        a = curves["axis"]
        band(fig, a.alphas, a.lo, a.hi, PALETTE[0], row=r, col=c)
        fig.add_trace(
            go.Scatter(
                x=list(a.alphas),
                y=list(a.means),
                mode="lines+markers",
                line={"color": PALETTE[0]},
                name="axis (95% CI)",
                legendgroup="axis",
                showlegend=first,
            ),
            row=r,
            col=c,
        )
    fig.update_xaxes(title_text=f"α ({sweep.unit})")
    fig.update_layout(title="steering dose-response: axis vs random directions", height=330 * rows, **LAYOUT)
    return fig


def shift_distribution_figure(res: ShiftResult) -> go.Figure:
    """Per-group score distributions of base and tuned on the base axis."""
    by_group: dict[str, dict[str, list[float]]] = {}
    for r in res.records:
        g = by_group.setdefault(str(r["group"]), {"base": [], "tuned": []})
        g["base"].append(r["base"])
        g["tuned"].append(r["tuned"])
    fig = go.Figure()
    for side, which, color in (("negative", "base", "#7f7f7f"), ("positive", "tuned", PALETTE[1])):
        xs = [g for g, v in by_group.items() for _ in v[which]]
        ys = [y for v in by_group.values() for y in v[which]]
        fig.add_trace(
            go.Violin(
                x=xs,
                y=ys,
                side=side,
                name=which,
                line_color=color,
                meanline_visible=True,
                points=False,
                scalemode="width",
            )
        )
    for gs in res.groups:  # the random-direction null at the headline layer, as a grey bar
        lo, hi = gs.null_range
        if np.isfinite(lo) and np.isfinite(hi):
            fig.add_trace(
                go.Scatter(
                    x=[gs.group] * 2,
                    y=[gs.base_mean + lo, gs.base_mean + hi],
                    mode="lines",
                    line={"color": "#bbb", "width": 8},
                    name="null: random directions",
                    showlegend=gs is res.groups[0],
                    opacity=0.6,
                )
            )
    fig.update_layout(
        title=f"scores at layer {res.layer}: base (left) vs tuned (right)",
        yaxis_title="score (σ of the base axis)",
        violinmode="overlay",
        **LAYOUT,
    )
    return fig


def shift_layers_figure(res: ShiftResult) -> go.Figure:
    """Cohen's d between groups at every layer, base (dashed) and tuned (solid): where tuning moved them."""
    layers = list(res.layers)
    fig = go.Figure()
    for i, p in enumerate(res.pairs):
        color = PALETTE[i % len(PALETTE)]
        for which, ys, dash in (("base", p.d_base, "dash"), ("tuned", p.d_tuned, None)):
            fig.add_trace(
                go.Scatter(
                    x=layers,
                    y=list(ys),
                    mode="lines+markers",
                    line={"color": color, "dash": dash},
                    name=f"{p.a} vs {p.b}: {which}",
                )
            )
    if not res.pairs:
        for i, (group, ys) in enumerate(res.shift_by_layer.items()):
            fig.add_trace(
                go.Scatter(
                    x=layers,
                    y=list(ys),
                    mode="lines+markers",
                    name=f"{group}: shift (σ)",
                    line={"color": PALETTE[i % len(PALETTE)]},
                )
            )
    fig.add_hline(y=0, line_color="#999")
    fig.add_vline(x=res.layer, line_dash="dot", annotation_text=f"axis layer {res.layer}")
    fig.update_layout(
        title="separation by layer before (dashed) and after (solid) tuning",
        xaxis_title="layer",
        yaxis_title="Cohen's d" if res.pairs else "shift (σ)",
        **LAYOUT,
    )
    return fig
