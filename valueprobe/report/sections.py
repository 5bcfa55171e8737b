"""The records a report section reads: one per ``results.json`` section, each from its JSON by ``from_dict``.

    valueprobe report --from runs/demo

    >>> sections, unreadable = read_sections(json.load(open("runs/demo/results.json"))["sections"])
    >>> sections["sweep"].best_layer, sections["steer"].sweep.effects[0].axis.slope

Most sections are a result record as its command saves it (`LayerSweepSummary`, `TransferSummary`,
`MatchedControl`, `LogitLens`). The demo adds a line or two to three of them; those are the
records here, and their ``to_dict`` writes the JSON the demo always wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from valueprobe.attribute.records import Attribution
from valueprobe.audit.records import Audit
from valueprobe.errors import ValueprobeError
from valueprobe.guided.budget import GuideReplication
from valueprobe.probe.contrast import MatchedControl
from valueprobe.probe.layer_sweep import LayerSweepSummary
from valueprobe.probe.transfer import TransferSummary
from valueprobe.read.readout import LogitLens
from valueprobe.records import Record
from valueprobe.steering.decode.generation import Trace
from valueprobe.steering.experiment.caa_result import CaaReplication
from valueprobe.steering.experiment.dose import SteerSweep
from valueprobe.tune.shift_records import ShiftResult

__all__ = ["READERS", "ShiftSection", "SteerSection", "TracedText", "read_sections"]


@dataclass(frozen=True)
class TracedText(Record):
    """One generation and its per-token value trace (the demo's ``trace`` section: one object)."""

    INLINE = ("trace",)

    text: str
    trace: Trace


@dataclass(frozen=True)
class SteerSection(Record):
    """A steering sweep and the demo's one-line headline of it (one object: the sweep's keys, then
    ``headline`` if there is one)."""

    INLINE = ("sweep",)
    OMIT = {"headline": None}

    sweep: SteerSweep
    headline: str | None = None


@dataclass(frozen=True)
class ShiftSection(Record):
    """A shift, what was tuned for it (target word, pairs, steps, checkpoint), and its headline (one
    object: the shift's keys, then ``tune`` and ``headline`` where given)."""

    INLINE = ("result",)
    OMIT = {"tune": None, "headline": None}

    result: ShiftResult
    tune: dict[str, Any] | None = None
    headline: str | None = None


# Section key -> the record its JSON reads as. "history" is a second sweep.
READERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "sweep": LayerSweepSummary.from_dict,
    "history": LayerSweepSummary.from_dict,
    "transfer": TransferSummary.from_dict,
    "matched_control": MatchedControl.from_dict,
    "logit_lens": LogitLens.from_dict,
    "trace": TracedText.from_dict,
    "steer": SteerSection.from_dict,
    "shift": ShiftSection.from_dict,
    "guide": GuideReplication.from_dict,
    "audit": Audit.from_dict,
    "attribution": Attribution.from_dict,
    "attribution_patch": Attribution.from_dict,
    "attribution_position": Attribution.from_dict,
    "caa": CaaReplication.from_dict,
}


def read_sections(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each known section of ``raw`` as its record, and why any present one could not be read.

    Unknown keys are ignored; an empty or non-object section counts as absent.
    """
    sections: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for key, read in READERS.items():
        d = raw.get(key)
        if not isinstance(d, Mapping) or not d:
            continue
        try:
            sections[key] = read(d)
        except (ValueprobeError, KeyError, TypeError, ValueError, IndexError) as exc:
            unreadable[key] = str(exc) if isinstance(exc, ValueprobeError) else repr(exc)
    return sections, unreadable
