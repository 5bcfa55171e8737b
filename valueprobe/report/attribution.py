"""Figures of where value comes from (`valueprobe.attribute.records.Attribution`), and attribution.html.

    valueprobe attribute --probe probes/smollm2-135m-reward-history --data data/icrl_pairs.jsonl --out runs/attr
    valueprobe report --from runs/attr            # the "Which components write value?" section

    >>> heads_figure(res); mlp_figure(res); resid_figure(res); ablation_figure(res)

Direct attribution draws each head's gap between classes (σ of the axis) as a layers × heads
heatmap, the MLPs (with the embedding and output biases) as bars with their 95% CI and the
random-direction null; patching draws the denoising effect instead, and the residual cells as a
layer × position heatmap aligned at the first differing token and at the end. The ablation figure
puts the top-k's drop among the random sets' drops.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from valueprobe.attribute.records import Attribution, DirectTerm, PatchTerm
from valueprobe.files import write_html
from valueprobe.report.style import LAYOUT, PALETTE

__all__ = [
    "ablation_figure",
    "attribution_caption",
    "attribution_figures",
    "heads_figure",
    "mlp_figure",
    "resid_figure",
    "write_attribution_html",
]


def _what(res: Attribution) -> str:
    return "gap between classes (σ)" if res.terms else "denoising effect on the read (Δσ)"


def heads_figure(res: Attribution) -> go.Figure:
    """Layers × heads heatmap of each head's score (direct: class gap; patching: denoising effect)."""
    heads = [c for c in res.components if c.kind == "head"]
    n_layers, n_heads = max(c.layer for c in heads) + 1, max(c.head for c in heads) + 1
    z = np.full((n_layers, n_heads), np.nan)
    for c in heads:
        z[c.layer, c.head] = c.score
    lim = float(np.nanmax(np.abs(z))) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z, x=[f"H{h}" for h in range(n_heads)], y=list(range(n_layers)), colorscale="RdBu_r",
            zmin=-lim, zmax=lim, colorbar={"title": "σ"}, hovertemplate="L%{y} %{x}: %{z:+.3f}<extra></extra>",
        )
    )  # fmt: skip
    fig.update_layout(
        title=f"heads: {_what(res)}, axis at layer {res.layer}",
        xaxis_title="head",
        yaxis_title="layer",
        **LAYOUT,
    )
    return fig


def mlp_figure(res: Attribution) -> go.Figure:
    """Per-layer bars of the MLPs (and the embedding and output biases) with 95% CIs; direct
    attribution adds each term's random-direction null as a grey range."""
    terms = [c for c in res.components if c.kind in ("embed", "mlp", "attn_bias")]
    fig = go.Figure()
    for kind, color in (("embed", PALETTE[2]), ("mlp", PALETTE[0]), ("attn_bias", PALETTE[4])):
        sel = [c for c in terms if c.kind == kind]
        if not sel:
            continue
        x = [c.layer for c in sel]
        y = [c.score for c in sel]
        ci = [c.gap_ci if isinstance(c, DirectTerm) else c.denoise_ci for c in sel]
        fig.add_trace(
            go.Bar(
                x=x, y=y, name=kind, marker_color=color, hovertext=[c.name for c in sel],
                error_y={"type": "data", "symmetric": False, "array": [hi - v for v, (_, hi) in zip(y, ci, strict=True)],
                         "arrayminus": [v - lo for v, (lo, _) in zip(y, ci, strict=True)]},
            )
        )  # fmt: skip
    nulls = [c for c in terms if isinstance(c, DirectTerm) and c.kind == "mlp"]
    if nulls:
        fig.add_trace(
            go.Scatter(
                x=[c.layer for c in nulls] * 2, y=[c.null[0] for c in nulls] + [c.null[1] for c in nulls],
                mode="markers", marker={"symbol": "line-ew-open", "size": 14, "color": "grey"},
                name="random directions (95%)",
            )
        )  # fmt: skip
    fig.update_layout(
        title=f"MLPs, embedding and biases: {_what(res)}", xaxis_title="layer (embedding: -1)", yaxis_title="σ",
        barmode="group", **LAYOUT,
    )  # fmt: skip
    return fig


def resid_figure(res: Attribution) -> go.Figure | None:
    """Layer × position heatmaps of patching one residual cell (denoising, Δ read σ), mean over
    pairs, in each view: after the first differing token, around the read, before the end."""
    g = res.grid
    if g is None or not g.layers:
        return None
    views = g.views
    widths = [max(len(v.tokens), 1) for v in views]
    fig = make_subplots(
        rows=1, cols=len(views), subplot_titles=[f"aligned at the {v.anchor}" for v in views],
        column_widths=[w / sum(widths) for w in widths], horizontal_spacing=0.04,
    )  # fmt: skip
    both = np.array([x for v in views for row in v.denoise for x in row], dtype=np.float64)
    lim = float(np.nanmax(np.abs(both))) if np.isfinite(both).any() else 1.0
    for col, v in enumerate(views, start=1):
        labels = [f"{v.offset + i:+d} {t}" for i, t in enumerate(v.tokens)]
        fig.add_trace(
            go.Heatmap(
                z=np.asarray(v.denoise, dtype=np.float64), x=labels, y=[str(layer) for layer in g.layers],
                colorscale="RdBu_r", zmin=-lim, zmax=lim, showscale=col == len(views), colorbar={"title": "Δσ"},
                hovertemplate="layer %{y}, %{x}: %{z:+.3f}<extra></extra>",
            ),
            row=1, col=col,
        )  # fmt: skip
    fig.update_layout(
        title="residual stream: denoising one cell (Δ read σ), mean over pairs", height=460, **LAYOUT
    )
    fig.update_yaxes(title_text="layer", row=1, col=1)
    return fig


def ablation_figure(res: Attribution) -> go.Figure | None:
    """Each measure's drop when the top-k are mean-ablated (red) among the random sets' drops (grey)."""
    ab = res.ablation
    if ab is None:
        return None
    fig = make_subplots(rows=1, cols=len(ab.metrics), subplot_titles=[m.name for m in ab.metrics])
    for col, m in enumerate(ab.metrics, start=1):
        sign = 1.0 if m.none >= (0.5 if m.name == "AUROC" else 0.0) else -1.0
        drops = [sign * (m.none - v) for v in m.null]
        rng = np.random.default_rng(col)  # jitter only: where a grey point sits sideways means nothing
        fig.add_trace(
            go.Scatter(x=list(rng.uniform(-0.3, 0.3, len(drops))), y=drops, mode="markers",
                       marker={"color": "grey", "size": 6}, name=f"{ab.n_draws} random sets", showlegend=col == 1),
            row=1, col=col,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(x=[0], y=[m.drop], mode="markers", marker={"color": PALETTE[1], "size": 14, "symbol": "diamond"},
                       name=f"top {ab.k}", showlegend=col == 1),
            row=1, col=col,
        )  # fmt: skip
        if math.isfinite(m.null_drops[1]):
            fig.add_hline(y=m.null_drops[1], line_dash="dot", line_color="grey", row=1, col=col)
        fig.update_xaxes(showticklabels=False, row=1, col=col)
    fig.update_layout(
        title=f"mean-ablating the top {ab.k} vs {ab.n_draws} random sets of the same kinds: drop in separation",
        **LAYOUT,
    )
    return fig


def attribution_figures(res: Attribution) -> list[go.Figure]:
    """Every figure the result has (the report section draws these)."""
    figs = [heads_figure(res), mlp_figure(res), resid_figure(res), ablation_figure(res)]
    return [f for f in figs if f is not None]


def _top_text(res: Attribution, k: int = 5) -> str:
    parts = []
    for c in res.ranked()[:k]:
        if isinstance(c, DirectTerm):
            parts.append(f"{c.name} {c.gap:+.3f}σ{'' if c.beyond_null else ' (inside its null)'}")
        elif isinstance(c, PatchTerm):
            parts.append(f"{c.name} {c.denoise:+.3f}σ")
    return "; ".join(parts)


def attribution_caption(res: Attribution) -> str:
    """What the figures show, with the numbers that matter."""
    lo, hi = res.axis_gap_ci
    text = (
        f"{res.method} on {', '.join(Path(d).name for d in res.data)} ({res.n_units} units, read: {res.read}): the axis at"
        f" layer {res.layer} separates the classes by {res.axis_gap:+.3f}σ [{lo:+.3f}, {hi:+.3f}] (AUROC"
        f" {res.axis_auroc:.3f}{', within pairs' if res.paired else ''}). Largest components: {_top_text(res)}."
    )
    if res.terms and math.isfinite(res.position_share()):
        text += (
            f" Terms that track token position (|r| >= 0.5 within a text) write {res.position_share():.0%} of the"
            " summed |gap|."
        )
    if res.terms:
        beyond = sum(t.beyond_null for t in res.terms)
        text += f" {beyond} of {len(res.terms)} terms leave their random-direction null; the terms sum to h·v̂ within {res.closure or 0:.1e}σ."
    if res.baselines is not None:
        b = res.baselines
        text += (
            f" Baselines: clean read {b.clean_read:+.3f}σ, corrupt {b.corrupt_read:+.3f}σ;"
            f" yes-no clean {b.clean_behaviour:+.3f}, corrupt {b.corrupt_behaviour:+.3f}."
        )
    if res.ablation is not None:
        ab = res.ablation
        verdicts = [
            f"{m.name}: {m.none:.3f} -> {m.top:.3f} ({'beyond' if m.necessary else 'inside'} the random sets)"
            for m in ab.metrics
        ]
        text += f" Ablating the top {ab.k} on {ab.n_units} held-out units: " + "; ".join(verdicts) + "."
    if res.agreement is not None:
        a = res.agreement
        text += (
            f" Attribution patching on the same {a.n_pairs} pairs agrees with it at Spearman {a.spearman_components:+.2f}"
            f" (heads and MLPs) and {a.spearman_cells:+.2f} (residual cells), top-{a.k} overlap {a.top_k_overlap:.2f}"
        )
        wrong = [f"misses {', '.join(a.missed)}"] if a.missed else []
        wrong += [f"gives the other sign to {', '.join(a.sign_flips)}"] if a.sign_flips else []
        text += (
            f"; where they disagree, the estimate {' and '.join(wrong)}."
            if wrong
            else "; it misses none of the top components."
        )
    return text + "".join(f" {n}" for n in res.notes)


def write_attribution_html(res: Attribution, path: str | Path) -> Path:
    """attribution.html: the figures and caption, plotly.js inlined once (opens offline)."""
    figs = "".join(
        f.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig{i}", default_height=440)
        for i, f in enumerate(attribution_figures(res))
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>attribution</title>'
        f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
        f"<body style='font-family: system-ui, sans-serif; max-width: 1100px; margin: 1.5em auto'>"
        f"<h1>Which components write value? {html.escape(res.model_id)}</h1>{figs}<p>{html.escape(attribution_caption(res))}</p></body></html>"
    )
    return write_html(page, path)
