"""Live value trace: the σ-score of every token of a prompt (and of a steered continuation).

    valueprobe trace --probe probes/smollm2-135m-value --prompt "Is 91 prime?" --generate 40 --alpha 2 --out runs/trace

writes ``trace.html`` (tokens coloured by value, then a line plot; plotly.js inlined) and
``trace.csv`` (one row per token). From Python:

    >>> tr = value_trace(lm, axis, "Is 91 prime?", generate_tokens=40, alpha=2.0)   # or a SteeringSpec
    >>> write_trace(tr, "runs/trace")

At the steered layer the value is read *before* the addition, so the plot shows what the model
carries on its own, with α beside it; read layers (``--read-layers``) see the steering upstream.
"""

from __future__ import annotations

import csv
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, write_html
from valueprobe.steering.decode.generation import Prompt, Trace, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import Specified

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["read_points_figure", "trace_csv", "trace_html", "value_trace", "write_trace"]


def value_trace(
    lm: LoadedModel,
    spec: Specified,
    prompt: Prompt,
    *,
    generate_tokens: int = 0,
    alpha: float = 0.0,
    read_layers: Sequence[int] = (),
) -> Trace:
    """Per-token σ-scores of ``prompt`` and, with ``generate_tokens > 0``, of a greedy continuation
    steered by ``alpha`` (0: unsteered) as ``spec`` says (default the axis's best layer, in σ).

    Args:
        lm: the model; spec: what to steer and where the value is read (its first steered
            layer), `valueprobe.steering.hook.spec.SteeringSpec` or an axis.
        prompt: text, or a chat list rendered with the chat template.
        generate_tokens: new tokens to generate (0: the prompt alone).
        alpha: the steering strength, in the spec's unit.
        read_layers: more layers to read.
    """
    if generate_tokens < 0:
        raise ValueprobeError(f"generate must be >= 1 new tokens (or omitted), got {generate_tokens}")
    (g,) = generate(
        lm,
        spec,
        [prompt],
        alphas=[alpha],
        decoding=Decoding(greedy=True, max_new_tokens=max(1, generate_tokens)),
        trace=True,
        read_layers=read_layers,
        progress=False,
    )
    assert g.trace is not None
    tr = g.trace
    if generate_tokens == 0:  # the one token generated to run the prompt pass: drop it
        n = tr.n_prompt
        tr = Trace(
            tokens=tr.tokens[:n],
            n_prompt=n,
            values={k: v[:n] for k, v in tr.values.items()},
            alpha=tr.alpha[:n],
            steered=tr.steered,
        )
    return tr


def read_points_figure(tr: Trace) -> go.Figure:
    """Value (σ) per token for each read point, and α on a second axis; the prompt shaded.

    The `valueprobe trace` page's figure: every read point at once. The report's (and
    ``vp.trace_figure``) is `valueprobe.report.effects.trace_figure`, one point with its sinks.
    """
    fig = go.Figure()
    x = list(range(len(tr.tokens)))
    for name, values in tr.values.items():
        label = f"{name} (before steering)" if name == tr.steered else name
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[_none(v) for v in values],
                mode="lines+markers",
                name=label,
                text=list(tr.tokens),
                hovertemplate="%{text!r}<br>%{y:.2f} σ",
            )
        )
    if any(a != 0 for a in tr.alpha if not math.isnan(a)):
        fig.add_trace(
            go.Scatter(x=x, y=[_none(a) for a in tr.alpha], name="α", yaxis="y2", line={"dash": "dot"})
        )
    if tr.n_prompt < len(tr.tokens):
        fig.add_vrect(
            x0=-0.5,
            x1=tr.n_prompt - 0.5,
            fillcolor="grey",
            opacity=0.1,
            line_width=0,
            annotation_text="prompt",
        )
    fig.update_layout(
        title="value trace",
        xaxis_title="token",
        yaxis_title="score (σ)",
        yaxis2={"title": "α", "overlaying": "y", "side": "right"},
        template="plotly_white",
    )
    return fig


def _none(v: float) -> float | None:
    return None if math.isnan(v) else v


def _colour(v: float, scale: float) -> str:
    """Blue for value up, red for value down, white at zero (the trace's own scale)."""
    if math.isnan(v):
        return "#eeeeee"
    t = max(-1.0, min(1.0, v / scale)) if scale > 0 else 0.0
    fade = int(255 * (1 - abs(t)))
    return f"rgb({fade},{fade},255)" if t > 0 else f"rgb(255,{fade},{fade})"


def trace_html(tr: Trace, fig: go.Figure | None = None) -> str:
    """A self-contained page: tokens coloured by the steered point's value, then the figure."""
    values = tr.values[tr.steered]
    finite = [abs(v) for v in values if not math.isnan(v)]
    scale = max(finite) if finite else 1.0
    spans = []
    for i, (tok, v) in enumerate(zip(tr.tokens, values, strict=True)):
        title = f"token {i}: {'nan' if math.isnan(v) else f'{v:+.2f} σ'}, α {tr.alpha[i]:g}"
        cls = "p" if i < tr.n_prompt else "g"
        spans.append(
            f'<span class="{cls}" style="background:{_colour(v, scale)}" title="{html.escape(title)}">'
            f"{html.escape(tok)}</span>"
        )
    plot = (fig or read_points_figure(tr)).to_html(include_plotlyjs=True, full_html=False)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>value trace</title><style>"
        "body{font-family:sans-serif;margin:2em} .tok{white-space:pre-wrap;font-family:monospace;"
        "line-height:1.8} .g{border-bottom:2px solid #333}</style></head><body>"
        f"<h2>value trace at {html.escape(tr.steered)}</h2>"
        f"<p>colour: score before steering, ±{scale:.2f} σ full scale (blue up, red down); "
        "generated tokens underlined; hover for values.</p>"
        f"<div class='tok'>{''.join(spans)}</div>{plot}</body></html>"
    )


def trace_csv(tr: Trace) -> str:
    """One row per token: index, part (prompt/generated), token, α, then one column per read point."""
    buf = io.StringIO()
    w = csv.writer(buf)
    names = list(tr.values)
    w.writerow(["index", "part", "token", "alpha", *names])
    for i, tok in enumerate(tr.tokens):
        part = "prompt" if i < tr.n_prompt else "generated"
        w.writerow([i, part, tok, tr.alpha[i], *[tr.values[n][i] for n in names]])
    return buf.getvalue()


def write_trace(tr: Trace, out: str | Path) -> dict[str, Path]:
    """Write ``trace.html`` and ``trace.csv`` into ``out`` (each atomically)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "csv": atomic_write_text(out / "trace.csv", trace_csv(tr)),
        "html": write_html(trace_html(tr), out / "trace.html"),
    }
