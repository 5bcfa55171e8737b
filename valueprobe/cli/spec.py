"""The steering spec and the decoding as option groups, shared by ``steer``, ``trace``, ``guide``
and ``serve`` (`valueprobe.cli.groups`).

    valueprobe steer --probe probes/smollm2-135m-value --layers 18,20 --unit norm --positions generated ...
    valueprobe steer --spec runs/tuned/spec.json --prompts data/steer_code.jsonl --out runs/steer-code
    valueprobe serve --spec runs/tuned/spec.json          # the server's steering: each request's defaults

`SpecOptions.to_spec` builds the one `valueprobe.steering.hook.spec.SteeringSpec` a command
steers with: from ``--spec FILE`` (a spec's JSON form, as ``SteeringSpec.save`` writes it), or from
``--probe`` and the options beside it; never from both (one line names the option given twice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from valueprobe.cli.app import probe_option
from valueprobe.cli.groups import OptionGroup
from valueprobe.errors import ValueprobeError
from valueprobe.vocab import HookSite, Op, Unit

if TYPE_CHECKING:
    from valueprobe.steering.decode.sampling import Decoding
    from valueprobe.steering.hook.spec import SteeringSpec, Where

__all__ = ["DecodingOptions", "SpecOptions"]

SpecFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        help="a steering spec JSON file (SteeringSpec.save writes one): replaces --probe and the steering options",
    ),
]
ProbeOpt = Annotated[Path | None, probe_option("the axis steered and read")]
LayersOpt = Annotated[
    str | None,
    typer.Option(
        "--layers",
        "--layer",
        metavar="SPEC",
        help="steered layer(s): 20, '18,20', '18:22'; default the probe's best",
    ),
]
SiteOpt = Annotated[
    HookSite | None, typer.Option(help="resid_post | resid_pre | attn_out | mlp_out; default the probe's")
]
UnitOpt = Annotated[Unit, typer.Option(help="unit of α: sigma | norm (% of mean residual norm) | raw")]
OpOpt = Annotated[
    Op,
    typer.Option(
        help="add | ablate | set | clamp | add-norm (for ablate/set/clamp α is the share: 0 off, 1 on)"
    ),
]
PositionsOpt = Annotated[str, typer.Option(help="steer all | prompt | generated tokens")]
WindowOpt = Annotated[str | None, typer.Option(metavar="A:B", help="steer only generated tokens A <= i < B")]
ReadLayerOpt = Annotated[int | None, typer.Option(help="layer values are read at; default the steered layer")]
# guide's name for --layers before the spec group: still read, kept out of --help
SteerLayerOpt = Annotated[int | None, typer.Option("--steer-layer", hidden=True)]


@dataclass(frozen=True)
class SpecOptions(OptionGroup):
    """The steering spec's options: ``--spec FILE``, or ``--probe`` with ``--layers``, ``--site``,
    ``--unit``, ``--op`` (``--lo``, ``--hi``, ``--target``), ``--positions``, ``--window``,
    ``--read-layer``. A condition or a control direction comes in a spec file only."""

    panel = "Steering spec"

    spec_file: SpecFileOpt = None
    probe: ProbeOpt = None
    layers: LayersOpt = None
    site: SiteOpt = None
    unit: UnitOpt = Unit.sigma
    op: OpOpt = Op.add
    lo: Annotated[float | None, typer.Option(help="--op clamp: lower bound of the σ-score")] = None
    hi: Annotated[float | None, typer.Option(help="--op clamp: upper bound of the σ-score")] = None
    target: Annotated[float | None, typer.Option(help="--op set: the σ-score to set")] = None
    positions: PositionsOpt = "all"
    window: WindowOpt = None
    read_layer: ReadLayerOpt = None
    steer_layer: SteerLayerOpt = None

    def to_spec(self) -> SteeringSpec:
        """The spec these options say (its probe is read on first use: ``spec.check()``)."""
        from valueprobe.steering.hook.operators import (
            Operator,  # loads the library: when the command runs (cli/app.py)
        )
        from valueprobe.steering.hook.spec import SteeringSpec

        given = self._given()
        if self.spec_file is not None:
            if given:
                raise ValueprobeError(
                    f"--spec {self.spec_file} says the steering: leave out --{given[0].replace('_', '-')}"
                )
            spec = SteeringSpec.load(self.spec_file)
            if self.probe is not None and spec.probe != str(self.probe):
                raise ValueprobeError(
                    f"--probe {self.probe} is not the probe of --spec {self.spec_file} ({spec.probe}): give one of them"
                )
            return spec
        if self.probe is None:
            raise ValueprobeError(
                "--probe: give a shipped axis by name or a probe folder (probes/NAME), or --spec FILE"
            )
        if self.steer_layer is not None and self.layers is not None:
            raise ValueprobeError("--steer-layer is the old name of --layers: give --layers only")
        layers = str(self.steer_layer) if self.steer_layer is not None else self.layers
        return SteeringSpec(
            probe=str(self.probe),
            layers=layers,
            site=self.site,
            unit=self.unit,
            op=Operator(self.op, lo=self.lo, hi=self.hi, target=self.target),
            positions=_positions(self.positions),
            window=_window(self.window),
            read_layer=self.read_layer,
        )

    def _given(self) -> list[str]:
        """The steering options set away from their defaults (besides ``--spec`` and ``--probe``)."""
        default = SpecOptions()
        return [
            f.name
            for f in fields(self)
            if f.name not in ("spec_file", "probe") and getattr(self, f.name) != getattr(default, f.name)
        ]


def _positions(text: str) -> Where:
    from valueprobe.steering.hook.spec import (  # loads the library: when the command runs (cli/app.py)
        WHERE,
        Where,
    )

    if text not in WHERE:
        raise ValueprobeError(f"--positions {text!r}: use one of {', '.join(WHERE)}")
    return cast(Where, text)


def _window(text: str | None) -> tuple[int, int] | None:
    """``"A:B"`` -> (A, B), or one line."""
    if text is None:
        return None
    a, colon, b = text.partition(":")
    if not (colon and a.strip().isdigit() and b.strip().isdigit()):
        raise ValueprobeError(f"--window {text!r} is not A:B (whole generated-token indices, e.g. 0:8)")
    return int(a), int(b)


@dataclass(frozen=True)
class DecodingOptions(OptionGroup):
    """How tokens are drawn: ``--max-new-tokens``, ``--greedy``, ``--temperature``, ``--top-p``, ``--seed``."""

    panel = "Decoding"

    max_new_tokens: Annotated[int, typer.Option(help="new tokens at most per row")] = 48
    greedy: Annotated[bool, typer.Option(help="argmax decoding instead of sampling")] = False
    temperature: Annotated[float, typer.Option(help="sampling temperature (> 0)")] = 1.0
    top_p: Annotated[float, typer.Option(help="nucleus sampling: keep the tokens reaching this mass")] = 1.0
    seed: Annotated[int, typer.Option(help="base seed: common random numbers per (prompt, sample)")] = 0

    def check(self) -> DecodingOptions:
        """Refuse, in one line, lengths and sampling settings that cannot run; returns these options."""
        if self.max_new_tokens < 1:
            raise ValueprobeError(f"--max-new-tokens {self.max_new_tokens} must be at least 1")
        if not self.greedy and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueprobeError(f"--temperature {self.temperature} must be positive (or pass --greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueprobeError(f"--top-p {self.top_p} must be in (0, 1]")
        return self

    def decoding(self, *, samples: int = 1) -> Decoding:
        """The library's `Decoding` with these options."""
        from valueprobe.steering.decode.sampling import (
            Decoding,  # loads the library: when the command runs (cli/app.py)
        )

        return Decoding(
            max_new_tokens=self.max_new_tokens,
            samples=samples,
            seed=self.seed,
            greedy=self.greedy,
            temperature=self.temperature,
            top_p=self.top_p,
        )
