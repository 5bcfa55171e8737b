"""Report figures of what the axis does, drawn from result records: the value trace of a
generation, steering dose-response, and the shift after tuning.

    from valueprobe.report.effects import shift_layers_figure
    shift_layers_figure(ShiftResult.from_dict(json.load(open("runs/shift/shift.json"))))

- trace: a `valueprobe.report.sections.TracedText` (a generation's text and its `Trace`);
- steer: a `valueprobe.steering.experiment.dose.SteerSweep` (its effects' curves and slopes);
- shift: a `valueprobe.tune.shift_records.ShiftResult` (records, groups, layers, pairs).
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.report.sections import TracedText
from valueprobe.report.style import LAYOUT, PALETTE, band
from valueprobe.steering.decode.generation import Trace
from valueprobe.steering.experiment.dose import AXIS, Curve, Effect, SteerSweep
from valueprobe.tune.shift_records import GroupShift, ShiftResult

__all__ = [
    "data_sigma_per_base_sigma",
    "dose_response_figure",
    "shift_distribution_figure",
    "shift_layers_figure",
    "shift_text",
    "sink_positions",
    "trace_figure",
    "trace_series",
    "trace_tokens_html",
]


def trace_series(traced: TracedText | Trace) -> tuple[str, list[str], np.ndarray]:
    """(where it was read, tokens, σ-score per token); the steered point's values, else the first point's."""
    t = traced.trace if isinstance(traced, TracedText) else traced
    where = t.steered if t.steered in t.values else next(iter(t.values))
    return where, [str(tok) for tok in t.tokens], np.array(t.values[where], dtype=float)


def sink_positions(score: np.ndarray, *, factor: float = 10.0) -> np.ndarray:
    """Positions whose score is far off the rest of the trace: attention sinks, drawn off scale.

    The first token of a chat (``<|im_start|>``) is an attention sink: its residual norm is tens
    of times the others', so it reads about +30 σ on the axis and would flatten the rest of the
    line. The rule is decided from the data, with no fixed position: a position is a sink when
    its distance from the trace's median exceeds ``factor`` times the robust spread of the trace
    (1.4826 × the median absolute deviation, the σ of a normal sample), and that spread is
    floored at 1 σ of the reference set so that a nearly flat trace marks nothing ordinary.

    Args:
        score: σ-scores per token ``[T]``; NaN (positions not read) is never a sink.
        factor: how many robust spreads away a sink lies.

    Returns:
        a boolean mask ``[T]``.

    >>> sink_positions(np.array([33.0, 0.2, -0.5, 0.9, 0.1])).tolist()
    [True, False, False, False, False]
    """
    score = np.asarray(score, dtype=float)
    finite = np.isfinite(score)
    if finite.sum() < 3:
        return np.zeros(score.shape, dtype=bool)
    mid = float(np.median(score[finite]))
    spread = max(1.4826 * float(np.median(np.abs(score[finite] - mid))), 1.0)
    with np.errstate(invalid="ignore"):
        return finite & (np.abs(score - mid) > factor * spread)


def _trace_range(score: np.ndarray, sinks: np.ndarray) -> tuple[float, float]:
    """The y-range of the trace: every position but the sinks, and the ±1 σ lines, with a margin."""
    kept = score[np.isfinite(score) & ~sinks]
    lo = min(float(kept.min()) if kept.size else 0.0, -1.0)
    hi = max(float(kept.max()) if kept.size else 0.0, 1.0)
    pad = 0.08 * (hi - lo)
    return lo - pad, hi + pad


def trace_figure(traced: TracedText | Trace) -> go.Figure:
    """The value (σ units) at each token of one generation; the prompt/generation boundary marked.

    Attention sinks (:func:`sink_positions`) are left out of the line and of the y-range, and
    drawn as a triangle at the edge of the plot, labelled with their token and value. Takes the
    report's section or a generation's own trace:

    >>> (gen,) = vp.generate(lm, axis, [prompt], alphas=[0.0], trace=True)
    >>> vp.trace_figure(gen.trace).show()
    """
    where, tokens, score = trace_series(traced)
    x = np.arange(len(score))
    sinks = sink_positions(score)
    lo, hi = _trace_range(score, sinks)
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=np.where(sinks, np.nan, score),
            mode="lines+markers",
            marker={"size": 4},
            name="value (σ)",
            hovertext=[repr(t) for t in tokens],
            hoverinfo="text+y",
        )
    )
    for i in np.flatnonzero(sinks):
        up = score[i] > 0
        label = f"{tokens[i]!r}: attention sink, {score[i]:+.0f}σ, off scale"
        fig.add_trace(
            go.Scatter(
                x=[int(i)],
                y=[hi if up else lo],
                mode="markers",
                marker={"symbol": "triangle-up" if up else "triangle-down", "size": 11, "color": "#d62728"},
                name="attention sink (off scale)",
                hovertext=[label],
                hoverinfo="text",
                cliponaxis=False,
                showlegend=False,
            )
        )
        fig.add_annotation(
            x=int(i), y=hi if up else lo, text=label, showarrow=False, xanchor="left",
            yanchor="top" if up else "bottom", xshift=8, font={"size": 10, "color": "#d62728"},
        )  # fmt: skip
    for y in (-1.0, 1.0):
        fig.add_hline(y=y, line_dash="dot", line_color="#999")
    n_prompt = (traced.trace if isinstance(traced, TracedText) else traced).n_prompt
    if n_prompt:
        fig.add_vline(x=n_prompt - 0.5, line_dash="dash", annotation_text="generation starts")
    fig.update_layout(
        title=f"value trace at {where}",
        xaxis_title="token",
        yaxis_title="score (σ)",
        showlegend=False,
        **LAYOUT,
    )
    fig.update_yaxes(range=[lo, hi])
    return fig


def trace_tokens_html(traced: TracedText) -> str:
    """The trace's tokens as HTML spans coloured by value: red above the mean, blue below, ±2 σ saturates."""
    _, tokens, score = trace_series(traced)
    spans = []
    for tok, s, sink in zip(tokens, score, sink_positions(score), strict=True):
        a = 0.0 if not np.isfinite(s) else min(abs(float(s)) / 2.0, 1.0) * 0.75
        rgb = "215,48,39" if s > 0 else "69,117,180"
        note = " (attention sink)" if sink else ""
        spans.append(
            f'<span style="background: rgba({rgb},{a:.2f})" title="{float(s):+.2f} σ{note}">{html.escape(str(tok))}</span>'
        )
    return '<div class="tokens">' + "".join(spans) + "</div>"


# prompt condition -> its colour in the dose-response figure (the plain prompt is PALETTE[0])
CONDITION_COLORS = {"toward": "#2ca02c", "away": "#d62728", "reworded": "#9467bd"}


def _null_band(fig: go.Figure, n: Curve, *, r: int, c: int, name: str, color: str, show: bool) -> None:
    fig.add_trace(
        go.Scatter(
            x=[*n.alphas, *n.alphas[::-1]],
            y=[*n.hi, *n.lo[::-1]],
            fill="toself",
            fillcolor=color,
            line={"width": 0},
            legendgroup=name,
            name=name,
            showlegend=show,
        ),
        row=r,
        col=c,
    )


def _axis_curve(fig: go.Figure, a: Curve, *, r: int, c: int, name: str, color: str, show: bool) -> None:
    band(fig, a.alphas, a.lo, a.hi, color, row=r, col=c)
    fig.add_trace(
        go.Scatter(
            x=list(a.alphas),
            y=list(a.means),
            mode="lines+markers",
            line={"color": color},
            name=name,
            legendgroup=name,
            showlegend=show,
        ),
        row=r,
        col=c,
    )


def _prompted_curves(fig: go.Figure, sweep: SteerSweep, e: Effect, *, r: int, c: int, first: bool) -> None:
    """The same effect under each prompt condition: the axis (95% CI) and that condition's random
    null, in the condition's colour; at α = 0 the curve is prompting alone."""
    for k, (name, effects) in enumerate(sweep.prompted.items()):
        match = next((p for p in effects if (p.metric, p.subset) == (e.metric, e.subset)), None)
        if match is None:
            continue
        color = CONDITION_COLORS.get(name, PALETTE[(k + 3) % len(PALETTE)])
        if "null" in match.curves:
            faint = "rgba(150,150,150,0.12)"
            _null_band(fig, match.curves["null"], r=r, c=c, name=f"random, {name}", color=faint, show=first)
        _axis_curve(fig, match.curves[AXIS], r=r, c=c, name=f"axis, {name}", color=color, show=first)


def dose_response_figure(sweep: SteerSweep) -> go.Figure:
    """One panel per (metric, prompt subset) of a sweep: the axis with its 95% CI over prompts, the
    other axis, and the central 95% of random directions as a grey band (the null). With prompt
    conditions (`SteerSweep.prompted`), the same under each: steering, prompting (a condition's
    curve at α = 0) and prompting with steering, side by side."""
    effects = sweep.effects
    cols = min(3, max(len(effects), 1))
    rows = (len(effects) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{e.metric} ({e.subset})" for e in effects])
    for i, e in enumerate(effects):
        r, c, first = i // cols + 1, i % cols + 1, i == 0
        curves = e.curves
        if "null" in curves:
            grey = "rgba(150,150,150,0.3)"
            _null_band(fig, curves["null"], r=r, c=c, name="random directions (95%)", color=grey, show=first)
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
        _axis_curve(fig, curves[AXIS], r=r, c=c, name="axis (95% CI)", color=PALETTE[0], show=first)
        _prompted_curves(fig, sweep, e, r=r, c=c, first=first)
    fig.update_xaxes(title_text=f"α ({sweep.unit})")
    title = "steering dose-response: axis vs random directions"
    if sweep.prompted:
        title += f"; prompt conditions {', '.join(sweep.prompted)} (at α = 0: prompting alone)"
    fig.update_layout(title=title, height=330 * rows, **LAYOUT)
    return fig


def data_sigma_per_base_sigma(res: ShiftResult) -> float | None:
    """How many data σ make one base σ at the headline layer of a shift.

    Two units meet in a shift: *base σ*, the spread of the axis's projection over its reference
    set (the unit of every score and of ``shift``), and *data σ*, its spread over these examples in
    the base model (the unit of ``shift_data_sigma`` and of the random-direction null, each random
    direction being measured in its own spread over the same examples): `ShiftResult.data_sigma_per_base_sigma`.
    """
    return res.data_sigma_per_base_sigma()


def shift_text(res: ShiftResult, g: GroupShift) -> str:
    """One group's shift in data σ, its 95% CI and the random-direction null, as the report and the
    demo's summary both state it (one unit, one wording).

    >>> shift_text(res, res.groups[0])
    '-0.100 data σ (95% CI [-0.200, +0.000]) vs random-direction null [-0.200, +0.300] (40th pct)'
    """
    factor = data_sigma_per_base_sigma(res)
    ci = (
        f" (95% CI [{g.ci[0] * factor:+.3f}, {g.ci[1] * factor:+.3f}])"
        if factor is not None and np.isfinite(g.ci).all()
        else ""
    )
    lo, hi = g.null_range
    null = f"[{lo:+.3f}, {hi:+.3f}]" if np.isfinite(lo) and np.isfinite(hi) else "n/a"
    return f"{g.shift_data_sigma:+.3f} data σ{ci} vs random-direction null {null} ({g.null_percentile:.0f}th pct)"


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
    factor = data_sigma_per_base_sigma(res)
    for gs in res.groups:  # the random-direction null at the headline layer, as a grey bar
        lo, hi = gs.null_range
        if np.isfinite(lo) and np.isfinite(hi) and factor:
            fig.add_trace(
                go.Scatter(  # the null is in data σ; the violins are in base σ
                    x=[gs.group] * 2,
                    y=[gs.base_mean + lo / factor, gs.base_mean + hi / factor],
                    mode="lines",
                    line={"color": "#bbb", "width": 8},
                    name="null: random directions",
                    showlegend=gs is res.groups[0],
                    opacity=0.6,
                )
            )
    fig.update_layout(
        title=f"scores at layer {res.layer}: base (left) vs tuned (right)",
        yaxis_title="score (base σ)",
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
