"""Figures that judge steering the way the field does: against asking, at a cost, item by item.

    from valueprobe.report.steering_eval import front_figure
    front_figure(Front.from_dict(json.load(open("probes/steering-eval-smollm2-135m/evaluation.json"))["benches"]["length"]["front"]))

- `baseline_figure`: steering, prompting and both, side by side (`valueprobe.steering.experiment.baseline`);
- `front_figure`: the axis's effect against its KL beside the random directions' front
  (`valueprobe.steering.experiment.front`);
- `reliability_figure`: the per-item slopes of the axis beside the random directions'
  (`valueprobe.steering.experiment.reliability`);
- `side_effects_figure`: each side effect against α, the axis with its CI and the random band
  (`valueprobe.steering.experiment.side_effects`);
- `caa_figure`: the CAA behaviours' p(match) against the multiplier beside CAA's 7B figures;
  `caa_section` and `caa_caption` draw and describe a `CaaReplication` in the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.report.effects import CONDITION_COLORS
from valueprobe.report.style import LAYOUT, PALETTE, band
from valueprobe.steering.experiment.baseline import Mean, PromptBaseline
from valueprobe.steering.experiment.caa_result import PUBLISHED, CaaReplication
from valueprobe.steering.experiment.dose import AXIS, SteerSweep
from valueprobe.steering.experiment.front import Front
from valueprobe.steering.experiment.reliability import Reliability
from valueprobe.steering.experiment.side_effects import SideEffects

__all__ = [
    "baseline_figure",
    "caa_caption",
    "caa_figure",
    "caa_section",
    "front_figure",
    "reliability_figure",
    "side_effects_figure",
]

GREY = "rgba(150,150,150,0.45)"


def _point(
    fig: go.Figure, x: str, m: Mean | None, color: str, *, r: int, c: int, name: str, show: bool
) -> None:
    if m is None:
        return
    fig.add_trace(
        go.Scatter(
            x=[x], y=[m.mean], mode="markers", marker={"color": color, "size": 9},
            error_y={"type": "data", "symmetric": False, "array": [m.hi - m.mean], "arrayminus": [m.mean - m.lo]},
            name=name, legendgroup=name, showlegend=show,
        ),
        row=r, col=c,
    )  # fmt: skip


def _null_bar(
    fig: go.Figure, x: str, span: tuple[float, float] | None, *, r: int, c: int, show: bool
) -> None:
    if span is None or not all(math.isfinite(v) for v in span):
        return
    fig.add_trace(
        go.Scatter(x=[x, x], y=list(span), mode="lines", line={"color": GREY, "width": 14},
                   name="random directions (95%)", legendgroup="null", showlegend=show),
        row=r, col=c,
    )  # fmt: skip


def baseline_figure(rows: Sequence[PromptBaseline], *, unit: str, title: str = "") -> go.Figure:
    """One panel per effect: plain, steering at ±α*, prompting toward/away, and both; each a mean with
    its 95% CI, grey bars the random directions' range at the same strength and prompt."""
    cols = min(3, max(len(rows), 1))
    n_rows = (len(rows) + cols - 1) // cols
    names = [f"{b.metric} ({b.subset})" + ("" if b.verdict == "-" else f": {b.verdict}") for b in rows]
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=names)
    for i, b in enumerate(rows):
        r, c, show = i // cols + 1, i % cols + 1, i == 0
        a = f"{b.alpha:g}"
        for x, span in (
            (f"steer +{a}", b.null_up),
            (f"steer −{a}", b.null_down),
            (f"toward +{a}", b.null_toward_up),
            (f"away −{a}", b.null_away_down),
        ):
            _null_bar(fig, x, span, r=r, c=c, show=show and x.startswith("steer +"))
        for x, m, color, name in (
            ("plain", b.plain, "#555555", "plain prompt, α = 0"),
            (f"steer +{a}", b.steer_up, PALETTE[0], "steering"), (f"steer −{a}", b.steer_down, PALETTE[0], "steering"),
            ("toward", b.toward, "#2ca02c", "prompting"), ("away", b.away, "#2ca02c", "prompting"),
            (f"toward +{a}", b.toward_up, "#9467bd", "prompting + steering"),
            (f"away −{a}", b.away_down, "#9467bd", "prompting + steering"),
        ):  # fmt: skip
            _point(
                fig,
                x,
                m,
                color,
                r=r,
                c=c,
                name=name,
                show=show and x in ("plain", f"steer +{a}", "toward", f"toward +{a}"),
            )
    heading = title or "does steering beat asking? steering, prompting and both"
    fig.update_layout(
        title=f"{heading} (α* in {unit}; bars: 95% CI over prompts)", height=360 * n_rows, **LAYOUT
    )
    return fig


def front_figure(fronts: Sequence[Front], *, titles: Sequence[str] = ()) -> go.Figure:
    """One panel per target: the axis's points (α labelled) against KL, the random directions' points
    and their front (the best move at any KL up to x); filled markers are the useful α."""
    cols = min(3, max(len(fronts), 1))
    n_rows = (len(fronts) + cols - 1) // cols
    names = list(titles) or [f"{f.metric} ({f.subset})" for f in fronts]
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=names)
    for i, f in enumerate(fronts):
        r, c, show = i // cols + 1, i % cols + 1, i == 0
        fig.add_trace(go.Scatter(x=[p.kl for p in f.random], y=[p.effect for p in f.random], mode="markers",
                                 marker={"color": GREY, "size": 6}, name="random directions", legendgroup="r",
                                 showlegend=show), row=r, col=c)  # fmt: skip
        steps = f.random_front()
        if steps:
            xs = [x for x, _ in steps] + [f.max_random_kl]
            ys = [y for _, y in steps] + [steps[-1][1]]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"shape": "hv", "color": "#777", "dash": "dash"},
                                     name="random front", legendgroup="f", showlegend=show), row=r, col=c)  # fmt: skip
        useful = set(f.useful)
        fig.add_trace(
            go.Scatter(x=[p.kl for p in f.axis], y=[p.effect for p in f.axis], mode="lines+markers+text",
                       text=[f"{p.alpha:g}" for p in f.axis], textposition="top center",
                       marker={"color": PALETTE[0], "size": 9,
                               "symbol": ["circle" if p.alpha in useful else "circle-open" for p in f.axis]},
                       name="axis (α; filled: useful)", legendgroup="a", showlegend=show),
            row=r, col=c,
        )  # fmt: skip
    fig.update_xaxes(title_text="KL from unsteered (nats/token)")
    fig.update_yaxes(title_text="move toward target")
    fig.update_layout(title="effect against KL: the axis beside the random directions' front",
                      height=360 * n_rows, **LAYOUT)  # fmt: skip
    return fig


def reliability_figure(rels: Sequence[Reliability], *, titles: Sequence[str] = ()) -> go.Figure:
    """One panel per target: the items' slopes along the axis (sign-adjusted, so right is toward the
    target) as a histogram over the random directions' pooled items; the share against in the title."""
    cols = min(3, max(len(rels), 1))
    n_rows = (len(rels) + cols - 1) // cols
    heads = list(titles) or [f"{x.metric} ({x.subset})" for x in rels]
    names = [f"{h}: {x.against:.0%} against (null {x.null_against[0]:.0%}–{x.null_against[1]:.0%})"
             for h, x in zip(heads, rels, strict=True)]  # fmt: skip
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=names)
    for i, x in enumerate(rels):
        r, c, show = i // cols + 1, i % cols + 1, i == 0
        for values, color, name in (
            (x.null_slopes, GREY, "random directions' items"),
            (x.slopes, PALETTE[0], "axis's items"),
        ):
            fig.add_trace(go.Histogram(x=np.array(values) * x.sign, histnorm="probability", marker_color=color,
                                       opacity=0.7, name=name, legendgroup=name, showlegend=show), row=r, col=c)  # fmt: skip
        fig.update_xaxes(zeroline=True, zerolinecolor="#999", zerolinewidth=1, row=r, col=c)
    fig.update_layout(barmode="overlay", title="per-item steerability (slope per unit α, toward the target)",
                      height=330 * n_rows, **LAYOUT)  # fmt: skip
    return fig


def side_effects_figure(side: SideEffects) -> go.Figure:
    """One panel per side effect against α: the axis with its 95% CI, and the random directions' range."""
    ms = side.metrics
    cols = min(3, max(len(ms), 1))
    n_rows = (len(ms) + cols - 1) // cols
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=[m.label for m in ms])
    for i, m in enumerate(ms):
        r, c, show = i // cols + 1, i % cols + 1, i == 0
        nulls = [m.null(j) for j in range(len(m.alphas))]
        if all(math.isfinite(lo) for lo, _ in nulls):
            band(fig, m.alphas, [lo for lo, _ in nulls], [hi for _, hi in nulls], "#999999", "random directions (95%)",
                 legend=show, row=r, col=c)  # fmt: skip
        band(
            fig, m.alphas, [lo for lo, _ in m.axis_ci], [hi for _, hi in m.axis_ci], PALETTE[0], row=r, col=c
        )
        fig.add_trace(go.Scatter(x=list(m.alphas), y=list(m.values[AXIS]), mode="lines+markers",
                                 line={"color": PALETTE[0]}, name="axis (95% CI)", legendgroup="axis",
                                 showlegend=show), row=r, col=c)  # fmt: skip
    fig.update_xaxes(title_text=f"α ({side.unit})")
    fig.update_layout(title=f"side effects of steering at layer {side.layer}: axis vs random directions",
                      height=330 * n_rows, **LAYOUT)  # fmt: skip
    return fig


def caa_figure(
    sweeps: Mapping[str, SteerSweep], published: Mapping[str, Sequence[float]], *, layer: int
) -> go.Figure:
    """One panel per CAA behaviour: p(match) against the multiplier (CAA units) for the vector (95% CI)
    and the random directions (grey band), under each prompt condition, beside CAA's 7B figures."""
    names = list(sweeps)
    cols = min(4, max(len(names), 1))
    n_rows = (len(names) + cols - 1) // cols
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=names)
    for i, b in enumerate(names):
        r, c, show = i // cols + 1, i % cols + 1, i == 0
        sweep = sweeps[b]
        e = sweep.effects[0]
        if "null" in e.curves:
            n = e.curves["null"]
            band(fig, n.alphas, n.lo, n.hi, "#999999", "random directions (95%)", legend=show, row=r, col=c)
        for condition, color in (("none", PALETTE[0]), *CONDITION_COLORS.items()):
            effects = sweep.effects if condition == "none" else sweep.prompted.get(condition, ())
            if not effects:
                continue
            a = effects[0].curves[AXIS]
            name = "CAA vector (95% CI)" if condition == "none" else f"vector, {condition} prompt"
            band(fig, a.alphas, a.lo, a.hi, color, row=r, col=c)
            fig.add_trace(go.Scatter(x=list(a.alphas), y=list(a.means), mode="lines+markers", line={"color": color},
                                     name=name, legendgroup=name, showlegend=show), row=r, col=c)  # fmt: skip
        if b in published:
            fig.add_trace(go.Scatter(x=[-1, 0, 1], y=list(published[b]), mode="markers", name="CAA, Llama-2-7b-chat",
                                     marker={"symbol": "diamond", "color": "#000", "size": 9}, legendgroup="pub",
                                     showlegend=show), row=r, col=c)  # fmt: skip
    fig.update_xaxes(title_text="multiplier (CAA units)")
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(title=f"CAA behaviours at layer {layer}: p(matching answer) against the multiplier",
                      height=330 * n_rows, **LAYOUT)  # fmt: skip
    return fig


def caa_section(rep: CaaReplication) -> list[go.Figure]:
    """The report's CAA block: every behaviour's p(match) against the multiplier, beside CAA's 7B figures."""
    sweeps = {b: r.caa for b, r in rep.behaviours.items()}
    published = {b: PUBLISHED[b][0] for b in sweeps if b in PUBLISHED}
    return [caa_figure(sweeps, published, layer=rep.layer)]


def caa_caption(rep: CaaReplication) -> str:
    """What the CAA block shows, and per behaviour p(match) at −1 / 0 / +1 with the slope against its null."""
    parts = []
    for b, r in rep.behaviours.items():
        e = r.caa.effects[0]
        lo, hi = e.null_range
        means = " / ".join("-" if not np.isfinite(x) else f"{x:.2f}" for x in r.means(r.caa))
        verdict = "outside" if e.outside else "inside"
        parts.append(f"{b} {means} (slope {e.axis.slope:+.3f}, null [{lo:+.3f}, {hi:+.3f}], {verdict})")
    return (
        f"CAA's A/B behaviours ({len(rep.behaviours)} of 7) on {rep.model}: a difference-of-means vector per"
        f" behaviour at layer"
        f" {rep.layer} (chosen on validation items), p(matching answer) on {rep.n_test} held-out items per"
        f" behaviour at multipliers −1 / 0 / +1 in CAA's units (the vector's own length), 95% CI over items,"
        f" beside {rep.controls} random directions of the same length (grey), CAA's own system prompts"
        " asking for the behaviour or its opposite, and CAA's published Llama-2-7b-chat figures (black"
        " diamonds; a 7B model at layer 13, not this model). p(match) at −1 / 0 / +1: "
        + "; ".join(parts)
        + "."
    )
