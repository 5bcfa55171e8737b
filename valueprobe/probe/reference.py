"""The one neutral reference an axis's μ and σ are measured over, and its record.

    >>> axis = vp.calibrate(axis, lm)                  # valueprobe.probe.calibrate
    >>> axis.sigma_reference.standard                  # True: 1σ is a comparable push on every axis
    >>> str(axis.sigma_reference)
    'neutral_text (sha256 5ad3…, 2461 tokens): plain text, no chat template; every token but position 0 (the attention sink)'

σ is the spread of the projection h·v̂ over ordinary text, the same text for every axis, so that
α = 1σ is a comparable push on every axis. It is not the spread of the contrast an axis was fitted
on: that spread mixes the signal and its confounds (position, wording) into the unit, and made 2σ
55% of the residual norm on one shipped axis and 9% on the other. The reference is the shipped
``neutral_text`` dataset (48 plain paragraphs, `valueprobe.datasets.conditions.neutral_text`), read
as plain text, every token but position 0: the first position is the attention sink, whose
residual is tens of times larger than any other's and would swamp the spread. ``python benchmarks/sigma_reference.py`` prints how stable σ is on it (its two halves, a
bootstrap over paragraphs, and another genre of text).

An axis whose statistics come from anywhere else (its fitting set, as ``fit`` wrote them before
this reference, a user's own text) says so in one line when it is loaded; its α in σ is read in
those units, never silently rescaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from valueprobe.records import Record

__all__ = ["NEUTRAL_RULE", "NEUTRAL_TEXT", "SigmaReference"]

NEUTRAL_TEXT = "neutral_text"  # the shipped dataset (valueprobe.datasets.shipped) every axis is calibrated on
NEUTRAL_RULE = "plain text, no chat template; every token but position 0 (the attention sink)"


@dataclass(frozen=True)
class SigmaReference(Record):
    """What an axis's μ and σ were measured over (``sigma_reference`` in probe.json).

    ``name`` is the dataset (``neutral_text``) or, for statistics from elsewhere, a description
    ("fitting set: 882 rows of icrl, both classes pooled"); ``rule`` which of its tokens count;
    ``sha256`` the dataset file's; ``n_tokens`` how many tokens were read on the axis's model.
    """

    name: str
    rule: str = ""
    sha256: str = ""
    n_tokens: int = 0

    @property
    def standard(self) -> bool:
        """Measured over the one neutral reference every axis shares (α in σ is comparable)."""
        return self.name == NEUTRAL_TEXT and self.rule == NEUTRAL_RULE

    def __str__(self) -> str:
        if not self.rule:
            return self.name
        return f"{self.name} (sha256 {self.sha256[:12]}…, {self.n_tokens} tokens): {self.rule}"

    @classmethod
    def read(cls, value: Any) -> SigmaReference:
        """From probe.json: a record, or the text files written before the reference name."""
        if isinstance(value, dict):
            return cls.from_dict(value)
        return cls(name=str(value or "unrecorded"))
