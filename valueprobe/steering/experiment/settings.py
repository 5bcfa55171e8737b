"""What defines a steering sweep: ``settings.json`` of ``valueprobe steer --out``, and the
``settings`` of its summary (`valueprobe.steering.experiment.dose.SteerSweep`).

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_confidence.jsonl --out runs/steer

    >>> SweepSettings.from_dict(json.load(open("runs/steer/settings.json"))).alphas
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from valueprobe.files import record_from_dict
from valueprobe.steering.hook.operators import Operator
from valueprobe.vocab import Op, choice

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
    op: str = "add"  # the operator (`valueprobe.steering.hook.operators`) and its settings in σ
    lo: float | None = None
    hi: float | None = None
    target: float | None = None
    site: str | None = None  # resid_pre, resid_post, attn_out or mlp_out; None: the axis's own site
    engine: str = "hf"  # what generated the rows: hf (the hooks route) or vllm

    def to_dict(self) -> dict:
        """The JSON of ``settings.json``: operator, site and engine keys at their defaults are left
        out, so a sweep written before they existed (no ``op``: add, at the axis's site, on the HF
        route) is the same sweep as such a sweep now."""
        out = {**asdict(self), "alphas": list(self.alphas), "metrics": list(self.metrics)}
        for key in _OP_KEYS:
            if out[key] == _OP_DEFAULTS[key]:
                del out[key]
        return out

    def operator(self) -> Operator:
        """The sweep's `Operator` (checks its settings: one clear line on a bad bound)."""
        return Operator(
            choice(Op, self.op, what="operator (--op)"), lo=self.lo, hi=self.hi, target=self.target
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SweepSettings:
        """The record again from its ``to_dict()`` (or the JSON of it)."""
        return record_from_dict(cls, d)


_OP_KEYS = ("op", "lo", "hi", "target", "site", "engine")
_OP_DEFAULTS = {f.name: f.default for f in fields(SweepSettings) if f.name in _OP_KEYS}
