"""The replication of the value axis on Qwen3-8B (theosech/interp-value-axis, WRITEUP.md), designs 1a,
1b and 1d, rerun on another model in the paper's units.

    valueprobe replicate eot --out probes/replicate-eot-smollm2-135m

The replication argues that the pre/post axis reads how close the assistant is to finishing its
turn. Its designs, as `valueprobe.audit` runs them, on the pre/post axis at the layer of the same
depth as the paper's (layer 21 of Qwen3-8B's 36: ``round(n_layers · 21/36)``), α in % of the mean
residual norm:

* **1a, conflict prefills**: the arm that is low in value but near its end against the arm that is
  high in value but far from it, on identical tails (`valueprobe.audit.two_by_two`'s conflict
  cell): in how many conversations, and how many phrasing × tail cells, the end-near arm reads higher.
* **1b, cut invariance**: the Spearman correlation of the construction contrast with the cut
  fraction, and how much larger the contrast is in failed attempts than at the real cut
  (`valueprobe.audit.cut`).
* **1d, steering**: α from −75 to +75% of the norm; the Spearman correlation of mean answer length
  with α, its fold change end to end, and the stated confidence at each α
  (`valueprobe.audit.dissociation`).

Each figure is written beside the replication's published one (65/65, 18/18, ρ −0.077, +34%,
ρ −0.96, 75-fold, confidence 7.5–8.9). They come from Qwen3-8B, a model 60× larger, with
the replication's own prefills, data and prompts: a different and smaller model here, and the
audit's designs, so the comparison is of direction and size, not a reproduction of numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from scipy.stats import spearmanr

from valueprobe.audit.records import Audit, AuditTest
from valueprobe.audit.run import AuditSettings, run_audit
from valueprobe.files import atomic_write_text, markdown_table, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.records import Record

__all__ = ["ALPHAS", "PUBLISHED", "EotReplication", "paper_layer", "replicate_eot"]

ALPHAS = (-75.0, -50.0, -25.0, 25.0, 50.0, 75.0)  # % of the mean residual norm, beside α = 0
PAPER_DEPTH = (21, 36)  # the paper's layer 21 of Qwen3-8B's 36
# The replication's published figures (WRITEUP.md), Qwen3-8B
PUBLISHED = {
    "conflict_conversations": "65 of 65",
    "conflict_cells": "18 of 18",
    "random_conflict": "+0.0004",
    "cut_spearman": "−0.077",
    "failed_over_real": "+34% (1.34)",
    "length_spearman": "−0.96",
    "length_fold": "75-fold shorter",
    "confidence": "7.5–8.9 of 10",
}


def paper_layer(n_layers: int) -> int:
    """The layer at the paper's depth: 21 of 36 layers, scaled (18 of SmolLM2-135M's 30)."""
    return min(n_layers - 1, round(n_layers * PAPER_DEPTH[0] / PAPER_DEPTH[1]))


@dataclass(frozen=True)
class EotReplication(Record):
    """Designs 1a, 1b, 1d on one model, beside the replication's figures (`PUBLISHED`)."""

    model_id: str
    probe: str
    layer: int
    n_layers: int
    conflict_positive: int
    conflict_n: int
    conflict_cells: str
    conflict_sigma: float
    random_conflict_range: tuple[float, float]
    cut_spearman: float
    failed_over_real: float
    alphas: tuple[float, ...]
    mean_length: tuple[float, ...]
    mean_confidence: tuple[float, ...]
    ended: tuple[float, ...]
    unparsed: str
    audit: Audit

    def length_spearman(self) -> float:
        return float(spearmanr(self.alphas, self.mean_length).statistic)

    def length_fold(self) -> float:
        return self.mean_length[0] / self.mean_length[-1] if self.mean_length[-1] else math.inf

    def table(self) -> tuple[list[str], list[list[str]]]:
        conf = [c for c in self.mean_confidence if math.isfinite(c)]
        rows = [
            ["1a: conflict cell, end-near arm higher (conversations)", f"{self.conflict_positive} of {self.conflict_n}",
             PUBLISHED["conflict_conversations"]],
            ["1a: … phrasing × tail cells", self.conflict_cells, PUBLISHED["conflict_cells"]],
            ["1a: conflict effect, axis (random directions' central 95%)",
             f"{self.conflict_sigma:+.3f}σ (random {self.random_conflict_range[0]:+.3f} to {self.random_conflict_range[1]:+.3f})",
             f"not given (a random direction: {PUBLISHED['random_conflict']})"],
            ["1b: Spearman ρ of the contrast with the cut fraction", f"{self.cut_spearman:+.3f}", PUBLISHED["cut_spearman"]],
            ["1b: failed-attempt contrast / real-cut contrast", f"{self.failed_over_real:.2f}", PUBLISHED["failed_over_real"]],
            ["1d: Spearman ρ of mean length with α (−75 … +75% norm)", f"{self.length_spearman():+.2f}", PUBLISHED["length_spearman"]],
            ["1d: mean length at −75% / at +75%", f"{self.length_fold():.2f}×", PUBLISHED["length_fold"]],
            ["1d: stated confidence across α (where half or more parse)",
             f"{min(conf):.1f}–{max(conf):.1f} of 10" if conf else "unparsed", PUBLISHED["confidence"]],
            ["1d: answers that end on EOS, by α", ", ".join(f"{a:+g}: {e:.0%}" for a, e in zip(self.alphas, self.ended,
             strict=True)), "not given"],
        ]  # fmt: skip
        return ["design", f"{self.model_id}, layer {self.layer} of {self.n_layers} (this run)",
                "Qwen3-8B, layer 21 of 36 (the replication, published)"], rows  # fmt: skip

    def summary_lines(self) -> list[str]:
        return [
            f"# The replication's designs 1a, 1b, 1d on {self.model_id}",
            "",
            f"**A different, smaller model.** The right column is the replication's published figures on Qwen3-8B"
            f" (theosech/interp-value-axis, WRITEUP.md); the middle one is {self.model_id} ({self.n_layers} layers),"
            f" the shipped pre/post axis {self.probe} read at layer {self.layer} (the paper's depth, 21/36), α in %"
            " of the mean residual norm, with `valueprobe audit`'s designs, prefills and prompts. Compare directions"
            " and sizes, not digits.",
            "",
            *markdown_table(*self.table()),
            "",
            f"- 1d, unparsed ratings by α: {self.unparsed}",
            "- 1d, answers that ran to the token cap without ending: "
            + ", ".join(f"{a:+g}: {1 - e:.0%}" for a, e in zip(self.alphas, self.ended, strict=True))
            + " (an answer that never ends measures a breakdown of the text, not its length)",
            f"- Reproduce: `{self.audit.command}`",
        ]


def _effect(test: AuditTest | None, name: str) -> tuple[float, float, int, int]:
    """(estimate, reference, n positive, n) of the effect whose name starts with ``name``."""
    e = next(x for x in (test.effects if test else ()) if x.name.startswith(name))
    return e.estimate, e.reference, e.n_positive, e.n


def _from_audit(audit: Audit, n_layers: int) -> EotReplication:
    a, b, d = audit.test("a"), audit.test("b"), audit.test("d")
    assert a is not None and b is not None and d is not None
    conflict = next(e for e in a.effects if e.name.startswith("conflict"))
    cells = next(n for n in a.notes if "conflict" in n).rsplit("conflict ", 1)[1]
    real, _, _, _ = _effect(b, "contrast at the real cut")
    failed, _, _, _ = _effect(b, "contrast in failed attempts")
    rho, _, _, _ = _effect(b, "Spearman")
    length = next(c for c in d.curves if c.name.endswith("length (tokens): axis"))
    confidence = next(c for c in d.curves if c.name.endswith("(0–10): axis"))
    by_alpha = dict(zip(confidence.x, confidence.y, strict=True))
    ended = next(c for c in d.curves if c.name.startswith("ended on EOS"))
    factor = conflict.estimate / conflict.reference if conflict.reference else 1.0
    return EotReplication(
        model_id=audit.model_id, probe=audit.probe, layer=audit.layer, n_layers=n_layers,
        conflict_positive=conflict.n_positive, conflict_n=conflict.n, conflict_cells=cells,
        conflict_sigma=conflict.estimate,
        random_conflict_range=(conflict.null[0] * factor, conflict.null[1] * factor),
        cut_spearman=rho, failed_over_real=failed / real if real else math.nan, alphas=length.x,
        mean_length=length.y, mean_confidence=tuple(by_alpha.get(x, math.nan) for x in length.x), ended=ended.y,
        unparsed=next(n for n in d.notes if n.startswith("unparsed")).split("axis: ", 1)[1], audit=audit,
    )  # fmt: skip


def replicate_eot(
    lm: LoadedModel,
    axis: ValueAxis,
    out: Path,
    *,
    probe: str,
    settings: AuditSettings | None = None,
    command: str = "",
    console: Console | None = None,
) -> EotReplication:
    """Run tests a, b and d of the audit at the paper's depth and strengths; write results.json and
    summary.md into ``out`` (its stages resume as the audit's do)."""
    layer = paper_layer(lm.n_layers)
    base = settings or AuditSettings()
    s = AuditSettings.from_dict({**base.to_dict(), "tests": "abd", "layer": layer, "alphas": list(ALPHAS),
                                 "n_steer_random": 0})  # fmt: skip
    audit = run_audit(lm, axis, out, s, probe=probe, command=command, console=console)
    result = _from_audit(audit, lm.n_layers)
    write_json(out / "results.json", result.to_dict(), indent=1)
    atomic_write_text(out / "summary.md", "\n".join(result.summary_lines()) + "\n")
    return result
