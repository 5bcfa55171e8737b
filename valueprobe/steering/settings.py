"""What defines a steering sweep: ``settings.json`` of ``valueprobe steer --out``, and the
``settings`` of its summary (`valueprobe.steering.dose.SteerSweep`).

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_confidence.jsonl --out runs/steer

    >>> SweepSettings.from_dict(json.load(open("runs/steer/settings.json"))).alphas
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from valueprobe.files import record_from_dict

__all__ = ["DEFAULT_METRICS", "SweepSettings"]

DEFAULT_METRICS = ("length", "degenerate")  # metrics of a prompt file with no entry in SET_METRICS


@dataclass(frozen=True)
class SweepSettings:
    """What defines a sweep; recorded in ``settings.json`` so a resumed run is the same sweep."""

    probe: str
    probe_fingerprint: str
    model: str
    prompts: str
    prompts_sha256: str
    alphas: tuple[float, ...]
    unit: str = "sigma"
    samples: int = 1
    max_new_tokens: int = 48
    controls: int = 8
    seed: int = 0
    greedy: bool = False
    temperature: float = 1.0
    other_probe: str | None = None
    layer: int | None = None
    chunk_prompts: int = 8
    metrics: tuple[str, ...] = DEFAULT_METRICS
    limit: int | None = None  # only the first ``limit`` prompts of the file

    def to_dict(self) -> dict:
        return {**asdict(self), "alphas": list(self.alphas), "metrics": list(self.metrics)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SweepSettings:
        """The record again from its ``to_dict()`` (or the JSON of it)."""
        return record_from_dict(cls, d)
