"""Plotly figures drawn from saved result JSON (the ``.to_dict()`` forms), for the report.

    from valueprobe.report_figures import sweep_figure_from_dict
    sweep_figure_from_dict(json.load(open("probes/smollm2-135m-value/probe.json"))["metrics"]["sweep"])

:mod:`valueprobe.plots` draws from live results (per-split arrays); these draw from what was
saved, so ``valueprobe report`` can rebuild every figure without a model or a store.
Expected keys (beyond the sweep/transfer ``to_dict`` forms):

- trace: ``Trace.to_dict()`` of :mod:`valueprobe.generation` (``tokens``, ``n_prompt``, ``values``
  {point: [T] σ-scores}, ``steered``), or simply ``layer``, ``tokens`` [T], ``score`` [T];
- steer: ``SteerSweep.to_dict()`` of :mod:`valueprobe.dose` (``unit``, ``effects`` with ``curves``
  {``axis``, ``other``, ``null``: {``alpha``, ``mean``, ``lo``, ``hi``}} and slopes);
- shift: ``ShiftResult.to_dict()`` of :mod:`valueprobe.shift` (``records``, ``groups``, ``layers``,
  ``pairs``, ``shift_by_layer``, ``layer``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = [
    "cosine_figure",
    "dose_response_figure",
    "logit_lens_figure",
    "matched_control_figure",
    "shift_distribution_figure",
    "shift_layers_figure",
    "sweep_figure_from_dict",
    "trace_figure",
    "trace_series",
    "trace_tokens_html",
    "transfer_figure",
]

_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "title_font_size": 13}
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def _band(
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
        ("test AUROC", "test_auroc", _PALETTE[0], None),
        ("val AUROC", "val_auroc", _PALETTE[0], "dot"),
        ("control: shuffled labels", "shuffled_auroc", "#7f7f7f", "dash"),
        ("control: random direction", "random_auroc", "#bcbd22", "dash"),
    ]
    for name, key, color, dash in series:
        mean = np.array([by[str(layer)][key]["mean"] for layer in layers])
        sd = np.array([by[str(layer)][key]["sd"] for layer in layers])
        if dash is None:
            _band(fig, layers, mean - sd, mean + sd, color, f"{name} ± sd", legend=True)
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
                    line={"dash": "dashdot", "color": _PALETTE[(i + 2) % len(_PALETTE)]},
                )
            )
    fig.add_vline(x=d["best_layer"], line_dash="dot", annotation_text=f"chosen layer {d['best_layer']}")
    fig.update_layout(
        xaxis_title="layer",
        yaxis_title="AUROC (held-out groups)",
        yaxis_range=[0.0, 1.02],
        title=f"{d.get('method', '')}: held-out AUROC by layer",
        **_LAYOUT,
    )
    return fig


def cosine_figure(d: dict) -> go.Figure:
    """Inter-layer cosine heatmap from ``SweepResult.to_dict()`` (``cosine``, ``cosine_layers``)."""
    labels = [str(x) for x in d["cosine_layers"]]
    fig = go.Figure(
        go.Heatmap(
            z=d["cosine"],
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
        title="cos(v_i, v_j) between layers", xaxis_title="layer", yaxis_title="layer", **_LAYOUT
    )
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
        **_LAYOUT,
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
            marker_color=_PALETTE[0],
            error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        )
    )
    fig.add_vline(x=0.5, line_dash="dash", annotation_text="chance")
    fig.update_layout(
        title=f"matched control at layer {d['layer']}",
        xaxis_title="AUROC [95% CI]",
        xaxis_range=[0, 1.02],
        **_LAYOUT,
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
        **_LAYOUT,
    )
    return fig


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


def trace_figure(d: dict) -> go.Figure:
    """The value (σ units) at each token of one generation; the prompt/generation boundary marked."""
    where, tokens, score = trace_series(d)
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
    if d.get("n_prompt"):
        fig.add_vline(x=int(d["n_prompt"]) - 0.5, line_dash="dash", annotation_text="generation starts")
    fig.update_layout(
        title=f"value trace at {where}", xaxis_title="token", yaxis_title="score (σ)", **_LAYOUT
    )
    return fig


def trace_tokens_html(d: dict) -> str:
    """The trace's tokens as HTML spans coloured by value: red above the mean, blue below, ±2 σ saturates."""
    spans = []
    for tok, s in zip(*trace_series(d)[1:], strict=True):
        a = 0.0 if not np.isfinite(s) else min(abs(float(s)) / 2.0, 1.0) * 0.75
        rgb = "215,48,39" if s > 0 else "69,117,180"
        spans.append(
            f'<span style="background: rgba({rgb},{a:.2f})" title="{float(s):+.2f} σ">{html.escape(str(tok))}</span>'
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
        _band(fig, a["alpha"], a["lo"], a["hi"], _PALETTE[0], row=r, col=c)
        fig.add_trace(
            go.Scatter(
                x=a["alpha"],
                y=a["mean"],
                mode="lines+markers",
                line={"color": _PALETTE[0]},
                name="axis (95% CI)",
                legendgroup="axis",
                showlegend=first,
            ),
            row=r,
            col=c,
        )
    fig.update_xaxes(title_text=f"α ({d.get('unit', 'sigma')})")
    fig.update_layout(title="steering dose-response: axis vs random directions", height=330 * rows, **_LAYOUT)
    return fig


def shift_distribution_figure(d: dict) -> go.Figure:
    """Per-group score distributions of base and tuned on the base axis (``ShiftResult.to_dict()``)."""
    by_group: dict[str, dict[str, list[float]]] = {}
    for r in d["records"]:
        g = by_group.setdefault(str(r["group"]), {"base": [], "tuned": []})
        g["base"].append(r["base"])
        g["tuned"].append(r["tuned"])
    fig = go.Figure()
    for side, which, color in (("negative", "base", "#7f7f7f"), ("positive", "tuned", _PALETTE[1])):
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
    for g in d.get("groups", []):  # the random-direction null at the headline layer, as a grey bar
        lo, hi = g["null_range"]
        if lo is not None and hi is not None:
            fig.add_trace(
                go.Scatter(
                    x=[g["group"]] * 2,
                    y=[g["base_mean"] + lo, g["base_mean"] + hi],
                    mode="lines",
                    line={"color": "#bbb", "width": 8},
                    name="null: random directions",
                    showlegend=g is d["groups"][0],
                    opacity=0.6,
                )
            )
    fig.update_layout(
        title=f"scores at layer {d['layer']}: base (left) vs tuned (right)",
        yaxis_title="score (σ of the base axis)",
        violinmode="overlay",
        **_LAYOUT,
    )
    return fig


def shift_layers_figure(d: dict) -> go.Figure:
    """Cohen's d between groups at every layer, base (dashed) and tuned (solid): where tuning moved them."""
    layers = list(d["layers"])
    fig = go.Figure()
    for i, p in enumerate(d.get("pairs", [])):
        color = _PALETTE[i % len(_PALETTE)]
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
                    line={"color": _PALETTE[i % len(_PALETTE)]},
                )
            )
    fig.add_hline(y=0, line_color="#999")
    fig.add_vline(x=d["layer"], line_dash="dot", annotation_text=f"axis layer {d['layer']}")
    fig.update_layout(
        title="separation by layer before (dashed) and after (solid) tuning",
        xaxis_title="layer",
        yaxis_title="Cohen's d" if d.get("pairs") else "shift (σ)",
        **_LAYOUT,
    )
    return fig
