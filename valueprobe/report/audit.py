"""The "Is it value?" section: each audit test's verdict, its effects beside their random null, and
its curve; and the audit's own page, audit.html.

    valueprobe audit --probe smollm2-135m-value --out runs/audit-value      # writes audit.html
    valueprobe report --from runs/audit-value                                # the same section

    from valueprobe.report.audit import audit_figures
    figures = audit_figures(Audit.from_dict(json.load(open("runs/audit-value/audit.json"))), tests="ab")
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from valueprobe.audit.records import Audit, AuditTest, Effect, effect_text
from valueprobe.report.style import LAYOUT, PALETTE, band

__all__ = ["audit_caption", "audit_figures", "audit_section", "curves_figure", "effects_figure", "test_html"]

VERDICT_COLOURS = {"value": "#2ca02c", "the rival": "#d62728", "both": "#ff7f0e", "neither": "#7f7f7f"}


def _ci_in_reference(e: Effect) -> tuple[float, float]:
    """The CI in the null's unit (the estimate's unit scaled as the reference is)."""
    if e.estimate == 0 or not math.isfinite(e.estimate):
        return e.ci
    k = e.reference / e.estimate
    lo, hi = e.ci[0] * k, e.ci[1] * k
    return (min(lo, hi), max(lo, hi))


def effects_figure(test: AuditTest) -> go.Figure:
    """One row per effect: the random directions' central 95% (grey), the axis (dot, 95% CI), no effect (dotted)."""
    effects = test.effects
    fig = make_subplots(rows=len(effects), cols=1, subplot_titles=[f"{e.name} ({e.role})" for e in effects],
                        vertical_spacing=min(0.12, 0.5 / max(len(effects), 1)))  # fmt: skip
    for i, e in enumerate(effects, start=1):
        lo, hi = e.null
        if math.isfinite(lo):
            fig.add_trace(go.Scatter(x=[lo, hi], y=[0, 0], mode="lines", line={"color": "#bbb", "width": 14},
                                     name="random directions (95%)", showlegend=i == 1), row=i, col=1)  # fmt: skip
        clo, chi = _ci_in_reference(e)
        fig.add_trace(
            go.Scatter(x=[e.reference], y=[0], mode="markers", marker={"color": PALETTE[0], "size": 11},
                       error_x={"type": "data", "symmetric": False, "array": [chi - e.reference],
                                "arrayminus": [e.reference - clo]},
                       name="the axis (95% CI)", showlegend=i == 1, hovertext=effect_text(e)),
            row=i, col=1,
        )  # fmt: skip
        fig.add_vline(x=e.neutral, line_dash="dot", line_color="#888", row=i, col=1)
        fig.update_yaxes(visible=False, row=i, col=1)
    fig.update_layout(**LAYOUT, height=120 + 95 * len(effects),
                      title=f"{test.key}. {test.title}: {test.verdict} (x: each effect in its null's unit)")  # fmt: skip
    return fig


def curves_figure(test: AuditTest) -> go.Figure | None:
    """The test's curves (the 2×2 cells, contrast by cut, reading by tokens left, dose-response)."""
    curves = [c for c in test.curves if len(c.x) > 1]
    if not curves:
        return None
    fig = go.Figure()
    for i, c in enumerate(curves):
        colour = PALETTE[i % len(PALETTE)] if "random" not in c.name else "#aaa"
        if c.lo and c.hi:
            band(fig, c.x, c.lo, c.hi, colour)
        fig.add_trace(go.Scatter(x=list(c.x), y=list(c.y), mode="lines+markers", name=c.name,
                                 line={"color": colour}))  # fmt: skip
    for c in test.curves:
        if len(c.x) == 1:  # a marked point (the real cut)
            fig.add_trace(go.Scatter(x=list(c.x), y=list(c.y), mode="markers", name=c.name,
                                     marker={"symbol": "star", "size": 14, "color": PALETTE[1]}))  # fmt: skip
    fig.update_layout(**LAYOUT, height=380, title=f"{test.key}. {test.title}",
                      xaxis_title=curves[0].x_label, yaxis_title=curves[0].y_label)  # fmt: skip
    return fig


def test_html(test: AuditTest) -> str:
    """A test's verdict, design, effects table and notes as HTML."""
    colour = VERDICT_COLOURS.get(test.verdict, "#222")
    rows = "".join(
        f"<tr><td>{html.escape(e.name)}</td><td>{e.role}</td><td>{html.escape(effect_text(e))}</td>"
        f"<td>{'yes' if e.holds else 'no'}</td></tr>"
        for e in test.effects
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in test.notes)
    return (
        f"<h3>{test.key}. {html.escape(test.title)}: <span style='color:{colour}'>{test.verdict}</span></h3>"
        f"<p class='caption'><b>Design.</b> {html.escape(test.design)}</p>"
        f"<p class='caption'><b>Why.</b> {html.escape(test.why)}. <b>Cost.</b> {html.escape(test.cost)},"
        f" {test.seconds:.0f} s.</p>"
        "<table class='effects'><tr><th>effect</th><th>role</th><th>axis [95% CI] (random null)</th>"
        f"<th>holds</th></tr>{rows}</table><ul class='caption'>{notes}</ul>"
    )


def audit_figures(audit: Audit, *, tests: str | None = None) -> list[go.Figure]:
    """Each test's effects beside its null, then its curves (where it has some), for the tests named
    (default: all).

    >>> for fig in vp.audit_figures(res, tests="a"):
    ...     fig.show()
    """
    figures: list[go.Figure] = []
    for test in audit.tests:
        if tests is not None and test.key not in tests:
            continue
        figures.append(effects_figure(test))
        curves = curves_figure(test)
        if curves is not None:
            figures.append(curves)
    return figures


def audit_section(audit: Audit) -> list[go.Figure | str]:
    """The report section's parts: the verdict table, then each test's text, effects and curves."""
    headers, rows = audit.table()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    parts: list[go.Figure | str] = [f"<table class='effects'><tr>{head}</tr>{body}</table>"]
    for test in audit.tests:
        parts += [test_html(test), *audit_figures(audit, tests=test.key)]
    return parts


def audit_caption(audit: Audit) -> str:
    """What the section shows, the axis's units and how chats were rendered."""
    verdicts = ", ".join(f"{t.key} {t.verdict}" for t in audit.tests)
    return (
        f"{audit.probe} at layer {audit.layer} ({audit.site}) on {audit.model_id}: {verdicts}. Effects are in the"
        f" axis's recorded σ ({audit.axis_sigma:.3g}; {audit.sigma_reference}); each is set among"
        f" {audit.n_random} random directions read on the same tokens, every direction in its own σ over the"
        f" neutral reference (neutral_text, {audit.reference_tokens} tokens; the axis's is {audit.reference_sigma:.3g})."
        " A verdict of value needs the value effect's CI to exclude no effect, to lie beyond the null, and to"
        f" stay with the rival held fixed. Chats: {audit.rendering}. Reproduce: {audit.command}"
    )
