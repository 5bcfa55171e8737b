"""What defines a steering sweep: ``settings.json`` of ``valueprobe steer --out``, and the
``settings`` of its summary (`valueprobe.steering.experiment.dose.SteerSweep`).

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_confidence.jsonl --out runs/steer

    >>> SweepSettings.from_dict(json.load(open("runs/steer/settings.json"))).alphas

What is steered is one `valueprobe.steering.hook.spec.SteeringSpec` (``spec``); the rest is the
sweep: its strengths, prompts, decoding and controls. ``settings.json`` keeps the flat layout it
has always had (``probe``, ``unit``, ``layer``, then the operator's keys), so a sweep written
before the spec existed resumes as the same sweep; a spec field at its default is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from valueprobe.errors import ValueprobeError
from valueprobe.files import record_from_dict
from valueprobe.probe.units import AlphaUnits
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["DEFAULT_METRICS", "SweepSettings"]

DEFAULT_METRICS = ("length", "degenerate")  # metrics of a prompt file with no entry in SET_METRICS


@dataclass(frozen=True)
class SweepSettings:
    """What defines a sweep; recorded in ``settings.json`` so a resumed run is the same sweep.

    ``spec`` names its probe (``spec.probe``: the folder, as given) and steers one axis; the sweep
    steers each of its directions (the axis, the other axis, random ones) with it.
    """

    spec: SteeringSpec
    probe_fingerprint: str
    model: str
    prompts: str
    prompts_sha256: str
    alphas: tuple[float, ...]
    samples: int = 1
    max_new_tokens: int = 48
    controls: int = 8
    seed: int = 0
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0  # written to settings.json only when below 1 (a sweep of before keeps its bytes)
    other_probe: str | None = None
    chunk_prompts: int = 8
    metrics: tuple[str, ...] = DEFAULT_METRICS
    limit: int | None = None  # only the first ``limit`` prompts of the file
    engine: str = "hf"  # what generated the rows: hf (the hooks route) or vllm
    # Prompt conditions run beside the plain prompt (`valueprobe.steering.experiment.prompting`), as
    # stated in ``conditions_file`` (its sha256 too: a changed prompt is another sweep).
    conditions: tuple[str, ...] = ()
    conditions_file: str | None = None
    conditions_sha256: str | None = None
    # α in both units (σ of the axis's reference, % of the layer's mean norm), what σ was measured
    # over, and whether a push past 100% of the norm was allowed (``--allow-large``)
    alpha_units: tuple[AlphaUnits, ...] = ()
    sigma_reference: str | None = None
    allow_large: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.spec.probe, str):
            raise ValueprobeError("a sweep steers one probe: give its spec one probe folder")
        if self.spec.direction is not None:
            raise ValueprobeError(
                "a sweep steers its own directions (the axis, the controls): leave the spec's out"
            )

    @property
    def probe(self) -> str:
        """The probe folder, as given."""
        return str(self.spec.probe)

    def decoding(self, seed: int) -> Decoding:
        """How the rows of one block are drawn (``seed``: the block's)."""
        return Decoding(
            max_new_tokens=self.max_new_tokens,
            samples=self.samples,
            seed=seed,
            greedy=self.greedy,
            temperature=self.temperature,
            top_p=self.top_p,
        )

    def to_dict(self) -> dict:
        """The JSON of ``settings.json``, flat and in the order it always had: the spec's fields at
        their defaults are left out (``op``, ``site``...), so a sweep written before they existed
        is the same sweep as such a sweep now."""
        spec = self.spec.to_dict()
        rest = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: the spec holds tensors
        rest |= {"alphas": list(self.alphas), "metrics": list(self.metrics)}
        layers = spec["layers"]
        out = {"probe": spec["probe"]} | {k: rest[k] for k in _BEFORE_UNIT} | {"unit": spec["unit"]}
        out |= {k: rest[k] for k in _BEFORE_LAYER} | {"layer": layers[0] if _one(layers) else layers}
        out |= {k: rest[k] for k in _AFTER_LAYER}
        out |= {key: spec[key] for key, default in _SPEC_DEFAULTS.items() if spec[key] != default}
        out |= {key: rest[key] for key, default in _RARE_DEFAULTS.items() if rest[key] != default}
        if "conditions" in out:
            out["conditions"] = list(self.conditions)
        if "alpha_units" in out:
            out["alpha_units"] = [u.to_dict() for u in self.alpha_units]
        return out

    def units_text(self) -> str:
        """``α in σ = % of the norm`` for each strength, for tables and figures ("" when unknown)."""
        return ", ".join(str(u) for u in self.alpha_units)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SweepSettings:
        """The record again from its ``to_dict()`` (or the JSON of it); the probe is not read."""
        layer = d.get("layer")
        spec = {key: d.get(key, default) for key, default in _SPEC_DEFAULTS.items()}
        spec |= {"probe": d["probe"], "unit": d.get("unit", "sigma"), "layers": layer}
        rest = {k: v for k, v in d.items() if k in _RECORD_FIELDS}
        return record_from_dict(cls, {**rest, "spec": spec})


def _one(layers: Any) -> bool:
    return isinstance(layers, list) and len(layers) == 1


# settings.json's key order, around the spec's two keys that were always written (unit, layer)
_BEFORE_UNIT = ("probe_fingerprint", "model", "prompts", "prompts_sha256", "alphas")
_BEFORE_LAYER = ("samples", "max_new_tokens", "controls", "seed", "greedy", "temperature", "other_probe")
_AFTER_LAYER = ("chunk_prompts", "metrics", "limit")
# the spec's keys written only away from their defaults (op and its bounds, site: the order of old
# files; then the phase, condition and read layer the spec added)
_SPEC_DEFAULTS: dict[str, Any] = {
    "op": "add",
    "lo": None,
    "hi": None,
    "target": None,
    "site": None,
    "positions": "all",
    "window": None,
    "condition": None,
    "read_layer": None,
}
# the record's own keys written only away from their defaults, after the spec's (in this order)
_RARE_DEFAULTS: dict[str, Any] = {
    "engine": "hf",
    "top_p": 1.0,
    "conditions": (),
    "conditions_file": None,
    "conditions_sha256": None,
    "alpha_units": (),
    "sigma_reference": None,
    "allow_large": False,
}
_RECORD_FIELDS = {f.name for f in fields(SweepSettings)} - {"spec"}
