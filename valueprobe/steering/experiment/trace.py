"""Live value trace: the σ-score of every token of a prompt (and of a steered continuation).

    valueprobe trace --probe probes/smollm2-135m-value --prompt "Is 91 prime?" --generate 40 --alpha 2 --out runs/trace

writes ``trace.html`` (tokens coloured by value, then a line plot; plotly.js inlined) and
``trace.csv`` (one row per token). From Python:

    >>> tr = value_trace(lm, axis, "Is 91 prime?", generate_tokens=40, alpha=2.0)   # or a SteeringSpec
    >>> write_trace(tr, "runs/trace")

The prompt is a user turn through the chat template (``--raw``, ``chat=False``: the text as is),
as everywhere (`valueprobe.activations.prompts.prompt_ids`). At the steered layer the value is read
*after* the addition by default, as ``valueprobe serve`` reads it (``value_at="before"``: what the
model carries on its own, with α beside it); read layers (``--read-layers``) see the steering
upstream. Every output names the read point.
"""

from __future__ import annotations

import csv
import html
import io
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from valueprobe.activations.prompts import Prompt
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, write_html
from valueprobe.read.strip import token_strip
from valueprobe.steering.decode.generation import Trace, Tracing, generate
from valueprobe.steering.decode.reading import ValueAt
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
    chat: bool = True,
    value_at: ValueAt = "after",
) -> Trace:
    """Per-token σ-scores of ``prompt`` and, with ``generate_tokens > 0``, of a greedy continuation
    steered by ``alpha`` (0: unsteered) as ``spec`` says (default the axis's best layer, in σ).

    Args:
        lm: the model; spec: what to steer and where the value is read (its first steered
            layer), `valueprobe.steering.hook.spec.SteeringSpec` or an axis.
        prompt: text (a user turn through the chat template; ``chat=False``: as is), a chat list,
            or token ids.
        generate_tokens: new tokens to generate (0: the prompt alone).
        alpha: the steering strength, in the spec's unit.
        read_layers: more layers to read.
        chat: render a string prompt with the chat template.
        value_at: read the steered point ``after`` the addition (the default) or ``before`` it.
    """
    if generate_tokens < 0:
        raise ValueprobeError(f"generate must be >= 1 new tokens (or omitted), got {generate_tokens}")
    (g,) = generate(
        lm,
        spec,
        [prompt],
        alphas=[alpha],
        decoding=Decoding(greedy=True, max_new_tokens=max(1, generate_tokens)),
        trace=Tracing(value_at=value_at, read_layers=tuple(read_layers)),
        progress=False,
        chat=chat,
    )
    assert g.trace is not None
    tr = g.trace
    if generate_tokens == 0:  # the one token generated to run the prompt pass: drop it
        n = tr.n_prompt
        tr = replace(
            tr, tokens=tr.tokens[:n], values={k: v[:n] for k, v in tr.values.items()}, alpha=tr.alpha[:n]
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
        label = _label(tr, name)
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


def _label(tr: Trace, name: str) -> str:
    """A series' name; the read point's says where it is read (``resid_post[20], after the addition``)."""
    if name != tr.steered:
        return name
    return tr.read or f"{name}, before the addition"  # a trace written before the read point was named


def _none(v: float) -> float | None:
    return None if math.isnan(v) else v


def trace_html(tr: Trace, fig: go.Figure | None = None) -> str:
    """A self-contained page: tokens coloured by the read point's value, then the figure."""
    values = tr.values[tr.steered]
    details = [
        f"token {i}: {'no value' if math.isnan(v) else f'{v:+.2f} σ'}, α {tr.alpha[i]:g}"
        + (" (prompt)" if i < tr.n_prompt else "")
        for i, v in enumerate(values)
    ]
    strip = token_strip(tr.tokens, values, title=f"value (σ) at {_label(tr, tr.steered)}", details=details)
    plot = (fig or read_points_figure(tr)).to_html(include_plotlyjs=True, full_html=False)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>value trace</title><style>"
        "body{font-family:sans-serif;margin:2em}</style></head><body>"
        f"<h2>value trace at {html.escape(_label(tr, tr.steered))}</h2>"
        f"<p>{tr.n_prompt} prompt tokens, then {len(tr.tokens) - tr.n_prompt} generated; each token's "
        "value is read at that token (the last generated one is never fed back: no value); hover for values.</p>"
        f"{strip}{plot}</body></html>"
    )


def trace_csv(tr: Trace) -> str:
    """One row per token: index, part (prompt/generated), token, α, then one column per read point."""
    buf = io.StringIO()
    w = csv.writer(buf)
    names = list(tr.values)
    w.writerow(["index", "part", "token", "alpha", *[_label(tr, n) for n in names]])
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
