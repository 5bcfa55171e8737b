"""Report figures of what the axis does, drawn from saved result JSON: the value trace of a
generation, steering dose-response, and the shift after tuning.

    from valueprobe.report.effects import shift_layers_figure
    shift_layers_figure(json.load(open("runs/shift/shift.json")))

Expected keys:

- trace: ``Trace.to_dict()`` of :mod:`valueprobe.steering.generation` (``tokens``, ``n_prompt``, ``values``
  {point: [T] σ-scores}, ``steered``), or simply ``layer``, ``tokens`` [T], ``score`` [T];
- steer: ``SteerSweep.to_dict()`` of :mod:`valueprobe.steering.dose` (``unit``, ``effects`` with ``curves``
  {``axis``, ``other``, ``null``: {``alpha``, ``mean``, ``lo``, ``hi``}} and slopes);
- shift: ``ShiftResult.to_dict()`` of :mod:`valueprobe.tune.shift` (``records``, ``groups``, ``layers``,
  ``pairs``, ``shift_by_layer``, ``layer``).
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.report.figures import LAYOUT, PALETTE, band
from valueprobe.steering.generation import Trace

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


def trace_series(d: dict) -> tuple[str, list[str], np.ndarray]:
    """(where it was read, tokens, σ-score per token) from either trace form; null scores become NaN."""
    if "values" in d:
        where = d.get("steered") or next(iter(d["values"]))
        raw = d["values"][where]
    else:
        where, raw = f"layer {d.get('layer', '?')}", d["score"]
    return (
        where,
        [str(t) for t in d["tokens"]],
        np.array([np.nan if v is None else v for v in raw], dtype=float),
    )


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


def trace_figure(trace: Trace | dict) -> go.Figure:
    """The value (σ units) at each token of one generation; the prompt/generation boundary marked.

    Attention sinks (:func:`sink_positions`) are left out of the line and of the y-range, and
    drawn as a triangle at the edge of the plot, labelled with their token and value.

    >>> (gen,) = vp.generate(lm, axis, [prompt], alphas=[0.0], trace=True)
    >>> vp.trace_figure(gen.trace).show()
    """
    d = trace.to_dict() if isinstance(trace, Trace) else trace
    where, tokens, score = trace_series(d)
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
    if d.get("n_prompt"):
        fig.add_vline(x=int(d["n_prompt"]) - 0.5, line_dash="dash", annotation_text="generation starts")
    fig.update_layout(
        title=f"value trace at {where}",
        xaxis_title="token",
        yaxis_title="score (σ)",
        showlegend=False,
        **LAYOUT,
    )
    fig.update_yaxes(range=[lo, hi])
    return fig


def trace_tokens_html(d: dict) -> str:
    """The trace's tokens as HTML spans coloured by value: red above the mean, blue below, ±2 σ saturates."""
    _, tokens, score = trace_series(d)
    spans = []
    for tok, s, sink in zip(tokens, score, sink_positions(score), strict=True):
        a = 0.0 if not np.isfinite(s) else min(abs(float(s)) / 2.0, 1.0) * 0.75
        rgb = "215,48,39" if s > 0 else "69,117,180"
        note = " (attention sink)" if sink else ""
        spans.append(
            f'<span style="background: rgba({rgb},{a:.2f})" title="{float(s):+.2f} σ{note}">{html.escape(str(tok))}</span>'
        )
    return '<div class="tokens">' + "".join(spans) + "</div>"


def dose_response_figure(d: dict) -> go.Figure:
    """One panel per (metric, prompt subset) of ``SteerSweep.to_dict()``: the axis with its 95% CI over
    prompts, the other axis, and the central 95% of random directions as a grey band (the null)."""
    effects = d["effects"]
    cols = min(3, max(len(effects), 1))
    rows = (len(effects) + cols - 1) // cols
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=[f"{e['metric']} ({e['subset']})" for e in effects]
    )
    for i, e in enumerate(effects):
        r, c, first = i // cols + 1, i % cols + 1, i == 0
        curves = e["curves"]
        if "null" in curves:
            n = curves["null"]
            fig.add_trace(
                go.Scatter(
                    x=[*n["alpha"], *n["alpha"][::-1]],
                    y=[*n["hi"], *n["lo"][::-1]],
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
                    x=o["alpha"],
                    y=o["mean"],
                    mode="lines+markers",
                    line={"color": "#e69f00"},
                    name=e.get("other_name") or "other axis",
                    legendgroup="other",
                    showlegend=first,
                ),
                row=r,
                col=c,
            )
        a = curves["axis"]
        band(fig, a["alpha"], a["lo"], a["hi"], PALETTE[0], row=r, col=c)
        fig.add_trace(
            go.Scatter(
                x=a["alpha"],
                y=a["mean"],
                mode="lines+markers",
                line={"color": PALETTE[0]},
                name="axis (95% CI)",
                legendgroup="axis",
                showlegend=first,
            ),
            row=r,
            col=c,
        )
    fig.update_xaxes(title_text=f"α ({d.get('unit', 'sigma')})")
    fig.update_layout(title="steering dose-response: axis vs random directions", height=330 * rows, **LAYOUT)
    return fig


def data_sigma_per_base_sigma(d: dict) -> float | None:
    """How many data σ make one base σ at the headline layer of ``ShiftResult.to_dict()``.

    Two units meet in a shift: *base σ*, the spread of the axis's projection over its reference
    set (the unit of every score and of ``shift``), and *data σ*, its spread over these examples in
    the base model (the unit of ``shift_data_sigma`` and of the random-direction null, each random
    direction being measured in its own spread over the same examples). The ratio is
    ``probe.sigma / probe.sigma_data``; results written before ``sigma_data`` was recorded give it
    as ``shift_data_sigma / shift`` of any group that moved. None when neither is known.
    """
    probe = d.get("probe") or {}
    if probe.get("sigma") and probe.get("sigma_data"):
        return float(probe["sigma"]) / float(probe["sigma_data"])
    for g in d.get("groups", []):
        if g.get("shift") and g.get("shift_data_sigma") is not None:
            return float(g["shift_data_sigma"]) / float(g["shift"])
    return None


def shift_text(d: dict, g: dict) -> str:
    """One group's shift in data σ, its 95% CI and the random-direction null, as the report and the
    demo's summary both state it (one unit, one wording).

    >>> shift_text({"probe": {"sigma": 2.0, "sigma_data": 1.0}},
    ...            {"shift": -0.05, "shift_data_sigma": -0.1, "ci": [-0.1, 0.0],
    ...             "null_range": [-0.2, 0.3], "null_percentile": 40.0})
    '-0.100 data σ (95% CI [-0.200, +0.000]) vs random-direction null [-0.200, +0.300] (40th pct)'
    """
    factor = data_sigma_per_base_sigma(d)
    ci = (
        f" (95% CI [{g['ci'][0] * factor:+.3f}, {g['ci'][1] * factor:+.3f}])"
        if factor is not None and g.get("ci") and None not in g["ci"]
        else ""
    )
    lo, hi = g["null_range"]
    null = "n/a" if lo is None or hi is None else f"[{lo:+.3f}, {hi:+.3f}]"
    return (
        f"{g['shift_data_sigma']:+.3f} data σ{ci} vs random-direction null {null}"
        f" ({g['null_percentile']:.0f}th pct)"
    )


def shift_distribution_figure(d: dict) -> go.Figure:
    """Per-group score distributions of base and tuned on the base axis (``ShiftResult.to_dict()``)."""
    by_group: dict[str, dict[str, list[float]]] = {}
    for r in d["records"]:
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
    factor = data_sigma_per_base_sigma(d)
    for g in d.get("groups", []):  # the random-direction null at the headline layer, as a grey bar
        lo, hi = g["null_range"]
        if lo is not None and hi is not None and factor:
            fig.add_trace(
                go.Scatter(  # the null is in data σ; the violins are in base σ
                    x=[g["group"]] * 2,
                    y=[g["base_mean"] + lo / factor, g["base_mean"] + hi / factor],
                    mode="lines",
                    line={"color": "#bbb", "width": 8},
                    name="null: random directions",
                    showlegend=g is d["groups"][0],
                    opacity=0.6,
                )
            )
    fig.update_layout(
        title=f"scores at layer {d['layer']}: base (left) vs tuned (right)",
        yaxis_title="score (base σ)",
        violinmode="overlay",
        **LAYOUT,
    )
    return fig


def shift_layers_figure(d: dict) -> go.Figure:
    """Cohen's d between groups at every layer, base (dashed) and tuned (solid): where tuning moved them."""
    layers = list(d["layers"])
    fig = go.Figure()
    for i, p in enumerate(d.get("pairs", [])):
        color = PALETTE[i % len(PALETTE)]
        for which, dash in (("d_base", "dash"), ("d_tuned", None)):
            fig.add_trace(
                go.Scatter(
                    x=layers,
                    y=p[which],
                    mode="lines+markers",
                    line={"color": color, "dash": dash},
                    name=f"{p['a']} vs {p['b']}: {which[2:]}",
                )
            )
    if not d.get("pairs"):
        for i, (group, ys) in enumerate(d["shift_by_layer"].items()):
            fig.add_trace(
                go.Scatter(
                    x=layers,
                    y=ys,
                    mode="lines+markers",
                    name=f"{group}: shift (σ)",
                    line={"color": PALETTE[i % len(PALETTE)]},
                )
            )
    fig.add_hline(y=0, line_color="#999")
    fig.add_vline(x=d["layer"], line_dash="dot", annotation_text=f"axis layer {d['layer']}")
    fig.update_layout(
        title="separation by layer before (dashed) and after (solid) tuning",
        xaxis_title="layer",
        yaxis_title="Cohen's d" if d.get("pairs") else "shift (σ)",
        **LAYOUT,
    )
    return fig
