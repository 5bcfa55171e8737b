"""How an axis's headline figures were read: the tokens each shipped family was scored on.

    valueprobe score --probe smollm2-135m-reward-history --data refusal    # reads the last token, as its figure was

    >>> family_reading(axis, dataset_path("refusal"))
    FamilyReading(family='refusal', tokens=<Tokens.last: 'last'>, note='the assistant-start token')

`probe.json` records, under ``metrics.families``, how ``replicate axis`` captured each contrast
family (`valueprobe.replicate.axis.FAMILIES`: its file, its positions, a note). `score` reads a
shipped family the same way by default, so the command printed beside a figure gives that figure;
``--tokens`` reads it another way. A file of the same name with other bytes is not that family.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from valueprobe.datasets.shipped import shipped_datasets
from valueprobe.files import sha256_file
from valueprobe.probe.axis import ValueAxis
from valueprobe.vocab import Positions, Tokens

__all__ = ["FamilyReading", "family_reading"]

# a capture's positions -> the tokens a score reads for the same figure
_TOKENS = {Positions.last: Tokens.last, Positions.mean: Tokens.all, Positions.spans: Tokens.span_tokens}


@dataclass(frozen=True)
class FamilyReading:
    """The tokens a shipped family's figure was read on, and what they are."""

    family: str
    tokens: Tokens
    note: str


def family_reading(axis: ValueAxis, data: str | Path) -> FamilyReading | None:
    """How ``axis``'s figure on the dataset ``data`` was read, when ``data`` is a shipped family the
    axis records (same file name, same bytes as the shipped copy); else None."""
    path = Path(data)
    for family, spec in axis.metrics.get("families", {}).items():
        shipped = shipped_datasets().get(Path(spec.get("file", "")).stem)
        if spec.get("file") != path.name or shipped is None or not path.is_file():
            continue
        if path.resolve() == shipped.resolve() or sha256_file(path) == sha256_file(shipped):
            positions = Positions(spec["positions"])
            return FamilyReading(family, _TOKENS.get(positions, Tokens.all), spec.get("note", ""))
    return None
