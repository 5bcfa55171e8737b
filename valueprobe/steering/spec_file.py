"""A steering spec file: the settings `valueprobe tune-steer` chose, which `valueprobe steer --spec` reads.

    valueprobe tune-steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl --max-kl 0.1 --out runs/tune
    valueprobe steer --spec runs/tune/spec.json --prompts data/steer_open.jsonl --out runs/steer-chosen

    >>> spec = SpecFile.read("runs/tune/spec.json")
    >>> spec.probe, spec.layer, spec.alpha

Its keys are named as ``steer``'s options (``probe``, ``layer``, ``site``, ``unit``, ``op`` with
``lo``/``hi``/``target``, ``positions``, ``alpha``), so the file reads as the command line that
would steer the same way; ``format_version`` and the provenance (``chosen_by``) ride along. It is
plain JSON (no pickle), written whole or not at all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable
from valueprobe.steering.handle import WHERE
from valueprobe.vocab import HookSite, Op, Unit, choice

__all__ = ["FORMAT", "FORMAT_VERSION", "SpecFile"]

FORMAT = "valueprobe.steer.spec"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SpecFile:
    """One steering setting, keyed as ``valueprobe steer``'s options; α is the one strength chosen."""

    probe: str
    layer: int
    alpha: float
    unit: str = "sigma"
    site: str | None = None  # None: the axis's own site
    op: str = "add"
    lo: float | None = None
    hi: float | None = None
    target: float | None = None
    positions: str = "all"
    chosen_by: dict[str, Any] = field(default_factory=dict, compare=False)  # how tune-steer chose it

    def __post_init__(self) -> None:
        choice(Unit, self.unit, what="spec unit")
        choice(Op, self.op, what="spec op")
        if self.site is not None:
            choice(HookSite, self.site, what="spec site")
        if self.positions not in WHERE:
            raise ValueprobeError(f"spec positions {self.positions!r}: use one of {', '.join(WHERE)}")
        if not math.isfinite(self.alpha):
            raise ValueprobeError(f"spec alpha {self.alpha} is not finite")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **jsonable(asdict(self))}

    def write(self, path: str | Path) -> Path:
        """Write the spec as JSON (a temporary file, then a rename)."""
        return atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "spec") -> SpecFile:
        """The spec from its JSON; one line naming ``where`` for another format, version or a bad key."""
        if d.get("format") != FORMAT or d.get("format_version") != FORMAT_VERSION:
            raise ValueprobeError(
                f"{where} is not a valueprobe steering spec (format {d.get('format')!r}, version"
                f" {d.get('format_version')!r}; expected {FORMAT!r} version {FORMAT_VERSION}): write one"
                " with `valueprobe tune-steer`"
            )
        try:
            return cls(
                probe=str(d["probe"]),
                layer=int(d["layer"]),
                alpha=float(d["alpha"]),
                unit=str(d.get("unit", "sigma")),
                site=None if d.get("site") is None else str(d["site"]),
                op=str(d.get("op", "add")),
                lo=None if d.get("lo") is None else float(d["lo"]),
                hi=None if d.get("hi") is None else float(d["hi"]),
                target=None if d.get("target") is None else float(d["target"]),
                positions=str(d.get("positions", "all")),
                chosen_by=dict(d.get("chosen_by") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueprobeError(f"{where}: a key is missing or unreadable ({exc})") from None

    @classmethod
    def read(cls, path: str | Path) -> SpecFile:
        """The spec at ``path``; one line for a missing, unreadable or other file."""
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueprobeError(
                f"--spec {path} does not exist: write one with `valueprobe tune-steer`"
            ) from None
        except (OSError, ValueError) as exc:
            raise ValueprobeError(f"--spec {path} does not read as JSON ({exc})") from None
        if not isinstance(d, dict):
            raise ValueprobeError(
                f"--spec {path} holds no JSON object: write one with `valueprobe tune-steer`"
            )
        return cls.from_dict(d, where=f"--spec {path}")
