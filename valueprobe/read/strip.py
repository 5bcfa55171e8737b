"""Tokens coloured by value: the strip a notebook shows for `valueprobe.read.values.Values`.

    >>> vp.values(lm, axis, "Is 7 prime?")       # in a notebook: the strip below, hover for numbers
    >>> token_strip(values.tokens, values.sigma, title="resid_post[20], after the addition")

One diverging scale in σ, the same everywhere (the notebook, the workbench page, ``valueprobe
trace``): white at 0, blue for value up, red for value down, full colour at ±`SCALE` σ (beyond it
the colour stays full). The workbench's ``workbench.js`` draws with the same `colour` (its browser
test holds the two equal). Every string is escaped: a token is text, never markup.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

__all__ = ["SCALE", "colour", "token_strip"]

SCALE = 3.0  # σ at which the colour is full
_UP = (33, 102, 172)  # value up: blue (ColorBrewer RdBu's end)
_DOWN = (178, 24, 43)  # value down: red


def _round(x: float) -> int:
    return math.floor(x + 0.5)  # JavaScript's Math.round, so the page and Python agree on every channel


def colour(value: float) -> str:
    """The background of a token whose value is ``value`` σ (``rgb(r, g, b)``; grey for NaN)."""
    if not math.isfinite(value):
        return "rgb(221, 221, 221)"
    t = max(-1.0, min(1.0, value / SCALE))
    end = _UP if t >= 0 else _DOWN
    r, g, b = (_round(255 + abs(t) * (c - 255)) for c in end)
    return f"rgb({r}, {g}, {b})"


def _ink(value: float) -> str:
    return "#fff" if math.isfinite(value) and abs(value) > 0.6 * SCALE else "#111"


def token_strip(
    tokens: Sequence[str],
    values: Sequence[float],
    *,
    title: str = "",
    details: Sequence[str] | None = None,
) -> str:
    """An HTML fragment: each token a span coloured by its value, with ``data-value`` and a hover
    title (``details[i]``, else the value); a caption and the scale's legend above it."""
    spans = []
    for i, (tok, v) in enumerate(zip(tokens, values, strict=True)):
        hover = details[i] if details is not None else (f"{v:+.3f} σ" if math.isfinite(v) else "no value")
        spans.append(
            f'<span class="vp-tok" data-index="{i}" data-value="{v!r}" title="{html.escape(hover)}" '
            f'style="background:{colour(v)};color:{_ink(v)};white-space:pre-wrap;'
            f'font-family:monospace;padding:1px 0">{html.escape(tok)}</span>'
        )
    legend = "".join(
        f'<span style="background:{colour(x)};padding:0 6px;font-family:monospace">{x:+g}</span>'
        for x in (-SCALE, -SCALE / 2, 0.0, SCALE / 2, SCALE)
    )
    caption = f"<div style='font-size:90%;color:#444'>{html.escape(title)} &nbsp; σ: {legend}</div>"
    return f"<div class='vp-strip'>{caption}<div style='line-height:1.9'>{''.join(spans)}</div></div>"
