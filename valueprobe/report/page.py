"""One self-contained HTML report, rebuilt from the result JSON a demo or a fit saved.

    valueprobe report --from runs/demo                       # -> runs/demo/report.html
    valueprobe report --from probes/smollm2-135m-value --out axis.html

    from valueprobe.report.page import load_results, write_report
    write_report(load_results("runs/demo"), "runs/demo/report.html")

The report reads ``results.json`` (``valueprobe demo`` writes it: one key per section), a probe
folder's ``probe.json`` (its metrics give the sweep, cosine, transfer and logit-lens sections) or
an attribution folder's ``attribution.json`` (``valueprobe attribute``).
Each section is read into its record first (`Results.from_dict`) and drawn from the record by
the same figure functions a live result uses.
plotly.js is inlined once, so the file opens offline and fetches nothing. A section whose
results are absent is left out with a note saying which command produces it; nothing is faked.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from valueprobe.errors import ValueprobeError
from valueprobe.files import write_html
from valueprobe.probe.contrast import MatchedControl
from valueprobe.probe.layer_sweep import LayerSweepSummary
from valueprobe.probe.transfer import TransferSummary
from valueprobe.read.readout import LogitLens
from valueprobe.report.attribution import attribution_caption, attribution_figures
from valueprobe.report.audit import audit_caption, audit_section
from valueprobe.report.budget import budget_caption, budget_figure
from valueprobe.report.effects import (
    data_sigma_per_base_sigma,
    dose_response_figure,
    shift_distribution_figure,
    shift_layers_figure,
    shift_text,
    sink_positions,
    trace_figure,
    trace_series,
    trace_tokens_html,
)
from valueprobe.report.figures import logit_lens_figure, matched_control_figure
from valueprobe.report.plots import layer_cosine_figure, sweep_figure, transfer_heatmap
from valueprobe.report.sections import ShiftSection, SteerSection, TracedText, read_sections
from valueprobe.report.steering_eval import caa_caption, caa_section
from valueprobe.stats.metrics import MeanSd

__all__ = ["RESULTS_FILE", "SECTIONS", "Results", "Section", "load_results", "render_report", "write_report"]

RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Results:
    """What a report shows: each section as its record (`valueprobe.report.sections.READERS`), the
    summary lines, and why a section is missing or unreadable.

    >>> Results.from_dict(json.load(open("runs/demo/results.json"))).sections["sweep"].best_layer
    """

    sections: dict[str, Any]
    model: str | None = None
    summary: tuple[str, ...] = ()
    missing: dict[str, str] = field(default_factory=dict)  # key -> why the run has no such section
    unreadable: dict[str, str] = field(default_factory=dict)  # key -> why its JSON did not read

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Results:
        """From ``results.json`` (``valueprobe demo``): its sections read as records, unknown keys ignored."""
        sections, unreadable = read_sections(d.get("sections") or {})
        return cls(
            sections=sections,
            model=d.get("model"),
            summary=tuple(str(line) for line in d.get("summary") or ()),
            missing={str(k): str(v) for k, v in (d.get("missing") or {}).items()},
            unreadable=unreadable,
        )


@dataclass(frozen=True)
class Section:
    """One report section: a title, the results key it reads, and how to draw and caption its record."""

    key: str
    title: str
    produced_by: str  # the command that writes this section, shown when it is absent
    draw: Callable[[Any], list[go.Figure | str]]
    caption: Callable[[Any], str]


def _fmt(ms: MeanSd | float | None) -> str:
    if ms is None:
        return "n/a"
    if isinstance(ms, MeanSd):
        return f"{ms.mean:.3f} ± {ms.sd:.3f}"
    return f"{ms:.3f}"


def _sweep_caption(s: LayerSweepSummary) -> str:
    return (
        f"Held-out-group AUROC of the axis fitted at each layer (band: ± sd over {s.n_splits} splits);"
        f" dashed lines are the controls. At layer {s.best_layer} (chosen on validation groups) the held-out"
        f" AUROC is {_fmt(s.heldout_auroc)}; the strongest control, {s.strongest_control}, reaches"
        f" {_fmt(s.controls.get(s.strongest_control))}, a margin of {s.margin:+.3f}. A margin near zero means"
        " the controls explain the separation."
    )


def _cosine_caption(s: LayerSweepSummary) -> str:
    return (
        "Cosine between the directions fitted at each pair of layers (red: same direction, blue: opposite)."
        " A block of red means one axis persists across those layers; the chosen layer is"
        f" {s.best_layer}."
    )


def _transfer_caption(t: TransferSummary) -> str:
    return (
        f"AUROC of an axis fitted on one family (row) and scored on another (column), at layer {t.layer};"
        " the diagonal is held-out groups of the same family. 0.5 is chance; off-diagonal mean"
        f" {_fmt(t.off_diagonal_auroc)}. Each cell's margin over the strongest control is in brackets."
    )


def _history_caption(s: LayerSweepSummary) -> str:
    return (
        "Reward-history construction: the identical final paragraph after a history that rewarded the rule vs"
        " one that never did, rules held out. The text is identical, so the embedding control is 0.5 by"
        " construction. " + _sweep_caption(s)
    )


def _matched_caption(mc: MatchedControl) -> str:
    return (
        f"The pre/post axis at layer {mc.layer} on main and matched-control conversations. If it read value,"
        " main post would sit above control post (identical text); it reaches AUROC"
        f" {_fmt(mc.main_post_vs_control_post.auroc)}, while post vs pre separates the never-rewarded control"
        f" too ({_fmt(mc.post_vs_pre_control.auroc)})."
    )


def _lens_caption(lens: LogitLens) -> str:
    return (
        f"Tokens the axis at layer {lens.layer} promotes (right) and suppresses (left) through the final norm"
        " and the unembedding: what pushing the residual up the axis makes more likely as the next token."
        " Punctuation or end-of-text at the top points to sentence position rather than success."
    )


def _trace_caption(traced: TracedText) -> str:
    where, tokens, score = trace_series(traced)
    sinks = [f"{tokens[i]!r} at token {i} ({score[i]:+.0f} σ)" for i in np.flatnonzero(sink_positions(score))]
    return (
        f"The value read at {where} (σ units) at each token of one generation, and the"
        " tokens coloured by it (red high, blue low). The dotted lines are ±1 σ of the reference set: a"
        " swing inside them is within the spread of ordinary text."
        + (
            f" Off scale (triangle at the edge): {'; '.join(sinks)}, "
            + (
                "an attention sink whose residual norm dwarfs"
                if len(sinks) == 1
                else "attention sinks whose residual norms dwarf"
            )
            + " the rest, left out of the y-range so that the other tokens can be read."
            if sinks
            else ""
        )
    )


def _steer_caption(sec: SteerSection) -> str:
    sweep = sec.sweep
    k = sweep.step
    parts = [
        f"{e.metric} ({e.subset}): slope {e.axis.slope * k:+.3f}, null [{e.null_range[0] * k:+.3f},"
        f" {e.null_range[1] * k:+.3f}]" + (" outside" if e.outside else " inside")
        for e in sweep.effects[:4]
    ]
    return (
        "Behavioural metrics as the steering strength α grows along the axis (mean, 95% CI over prompts), against"
        " the same strengths along random directions (grey: the null) and the other axis. An effect counts only"
        f" where the axis's slope leaves the null range. Slopes per {k:g} {sweep.unit}: "
        + "; ".join(parts)
        + "."
    )


def _shift_caption(sec: ShiftSection) -> str:
    res = sec.result
    factor = data_sigma_per_base_sigma(res)
    moved = [f"{g.group} {shift_text(res, g)}" for g in res.groups]
    return (
        f"Scores on the base model's axis (layer {res.layer}) before and after tuning, same token ids, in base σ"
        " (the axis's spread over its reference set), with the central 95% of random directions as a grey"
        " bar; right: the separation between groups at every layer. Shift per group in data σ (the axis's"
        " spread over these prompts in the base model: the unit in which each random direction is measured"
        + (f"; 1 base σ = {factor:.2f} data σ" if factor else "")
        + "), with its 95% CI over prompts: "
        + "; ".join(moved)
        + "."
    )


SECTIONS: tuple[Section, ...] = (
    Section("sweep", "Where the value axis lives: AUROC by layer (pre/post construction)",
            "`valueprobe demo` or `valueprobe fit`", lambda s: [sweep_figure(s)], _sweep_caption),
    Section("sweep", "Is it one axis? Inter-layer cosine", "`valueprobe demo` or `valueprobe fit`",
            lambda s: [layer_cosine_figure(s)], _cosine_caption),
    Section("history", "A construction with identical text: reward-history axis by layer",
            "`valueprobe demo` or `valueprobe replicate axis --history-out`", lambda s: [sweep_figure(s)],
            _history_caption),
    Section("transfer", "Does it transfer? Fit on one contrast, score on another",
            "`valueprobe demo` or `valueprobe fit` with several --store", lambda t: [transfer_heatmap(t)],
            _transfer_caption),
    Section("matched_control", "Matched control: same text, different history", "`valueprobe demo` or `valueprobe replicate axis`",
            lambda mc: [matched_control_figure(mc)], _matched_caption),
    Section("logit_lens", "What the axis says: logit-lens tokens", "`valueprobe demo` or `valueprobe replicate axis`",
            lambda lens: [logit_lens_figure(lens)], _lens_caption),
    Section("trace", "Reading it live: the value trace of one generation", "`valueprobe demo` or `valueprobe trace`",
            lambda t: [trace_figure(t), trace_tokens_html(t)], _trace_caption),
    Section("steer", "Steering: dose-response against random directions", "`valueprobe demo` or `valueprobe steer`",
            lambda sec: [dose_response_figure(sec.sweep)], _steer_caption),
    Section("shift", "Tuning moves the axis: shift after DPO", "`valueprobe demo` or `valueprobe shift`",
            lambda sec: [shift_distribution_figure(sec.result), shift_layers_figure(sec.result)], _shift_caption),
    Section("guide", "Guided decoding: accuracy against tokens spent", "`valueprobe replicate guide`",
            lambda g: [budget_figure(b) for b in g.tasks.values()], budget_caption),
    Section("attribution", "Which components write value? Reward-history axis, direct attribution and ablation",
            "`valueprobe attribute` or `valueprobe replicate attribute`", attribution_figures, attribution_caption),
    Section("attribution_patch", "Which components carry the history to the read? Activation patching",
            "`valueprobe attribute --method patch` or `valueprobe replicate attribute`", attribution_figures,
            attribution_caption),
    Section("attribution_position", "Which components write the pre/post axis? Position-tracking terms",
            "`valueprobe replicate attribute`", attribution_figures, attribution_caption),
    Section("caa", "Beside the field: CAA's seven behaviours, against random directions and asking",
            "`valueprobe replicate caa`", caa_section, caa_caption),
    Section("audit", "Is it value? The axis against the end of the turn, each test beside its null",
            "`valueprobe audit`", audit_section, audit_caption),
)  # fmt: skip


# a `valueprobe replicate caa` folder's results.json is one CaaReplication, not a sections object
CAA_KEYS = frozenset({"behaviours", "layer", "validation", "controls", "n_test"})


def load_results(folder: str | Path) -> Results:
    """The result sections saved in ``folder``, as records: its ``results.json``, else its ``probe.json`` metrics.

    Raises:
        ValueprobeError: the folder holds neither (one line saying which command writes them).
    """
    folder = Path(folder)
    results, probe, attribution = folder / RESULTS_FILE, folder / "probe.json", folder / "attribution.json"
    audit = folder / "audit.json"
    try:
        if results.is_file():
            data = json.loads(results.read_text())
            if isinstance(data, dict) and "sections" not in data and data.keys() >= CAA_KEYS:
                return Results.from_dict({"model": data.get("model"), "sections": {"caa": data}})
            if not isinstance(data, dict) or not isinstance(data.get("sections"), dict):
                raise ValueprobeError(
                    f"{results} has no 'sections' object: rerun `valueprobe demo --out {folder}`"
                )
            return Results.from_dict(data)
        if probe.is_file():
            meta = json.loads(probe.read_text())
            metrics = dict(meta.get("metrics", {}))
            if "icrl_matched_control" in metrics:  # replicate axis stores it under this name
                metrics["matched_control"] = metrics.pop("icrl_matched_control")
            return Results.from_dict({"model": meta.get("model_id"), "sections": metrics})
        if audit.is_file():  # a `valueprobe audit` folder
            meta = json.loads(audit.read_text())
            return Results.from_dict({"model": meta.get("model_id"), "sections": {"audit": meta}})
        if attribution.is_file():  # a `valueprobe attribute` folder
            meta = json.loads(attribution.read_text())
            return Results.from_dict({"model": meta.get("model_id"), "sections": {"attribution": meta}})
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueprobeError(
            f"{folder}: result file is not valid JSON ({exc}); rerun the command that wrote it"
        ) from None
    raise ValueprobeError(
        f"{folder} has no {RESULTS_FILE}, probe.json, audit.json or attribution.json: run `valueprobe demo --out"
        f" {folder}` (or give a probe, audit or attribution folder)"
    )


def render_report(results: Results, *, title: str | None = None) -> str:
    """The report as one HTML string: plotly.js inlined once, one block per section present."""
    title = title or f"valueprobe report: {results.model or '?'}"
    blocks, absent, n = [], [], 0
    for sec in SECTIONS:
        record = results.sections.get(sec.key)
        if record is None:
            if sec.key in results.unreadable:
                why = f"results unreadable ({results.unreadable[sec.key]})"
            else:
                why = results.missing.get(
                    sec.key, f"no '{sec.key}' results in this folder; {sec.produced_by} writes them"
                )
            absent.append(f"<li><b>{html.escape(sec.title)}</b>: {html.escape(why)}</li>")
            continue
        try:
            parts = sec.draw(record)
            caption = sec.caption(record)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            absent.append(
                f"<li><b>{html.escape(sec.title)}</b>: results unreadable ({html.escape(repr(exc))})</li>"
            )
            continue
        body = []
        for part in parts:
            if isinstance(part, go.Figure):
                n += 1
                body.append(
                    part.to_html(
                        full_html=False,
                        include_plotlyjs=False,
                        div_id=f"fig{n}",
                        default_height=420,
                        config={"displaylogo": False},
                    )
                )
            else:
                body.append(part)
        blocks.append(
            f"<section><h2>{html.escape(sec.title)}</h2>{''.join(body)}"
            f'<p class="caption">{html.escape(caption)}</p></section>'
        )
    if absent:
        blocks.append(
            '<section class="absent"><h2>Not in this run</h2><ul>' + "".join(absent) + "</ul></section>"
        )
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in results.summary)
    return _PAGE.format(
        title=html.escape(title),
        plotlyjs=get_plotlyjs(),
        summary=f"<ul class='summary'>{summary}</ul>" if summary else "",
        body="\n".join(blocks),
    )


def write_report(results: Results, out: str | Path, *, title: str | None = None) -> Path:
    """Render and write the report atomically; returns its path."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueprobeError(
            f"{out}: cannot create its folder ({exc.strerror}); choose a writable --out"
        ) from None
    return write_html(render_report(results, title=title), out)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 1.5em auto; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.1em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }}
.caption {{ color: #444; font-size: 0.92em; max-width: 60em; }}
.summary li {{ font-family: ui-monospace, monospace; font-size: 0.9em; }}
.tokens {{ line-height: 1.9; font-family: ui-monospace, monospace; font-size: 0.9em; white-space: pre-wrap; }}
.tokens span {{ padding: 1px 0; border-radius: 2px; }}
.absent li {{ color: #666; }}
table.effects {{ border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0; }}
table.effects td, table.effects th {{ border: 1px solid #ddd; padding: 3px 6px; text-align: left; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
{summary}
{body}
</body></html>
"""
