"""``valueprobe export`` / ``valueprobe import``: steering vectors for repeng, llama.cpp and steering-vectors.

    valueprobe export --probe probes/smollm2-135m-value --to gguf-control-vector --layers 18:23 --out value.gguf
    valueprobe export --probe probes/smollm2-135m-value --to steering-vectors --out value.safetensors
    valueprobe import value.gguf --model smollm2-135m --out probes/imported-value

The conventions (layer index, sign, scale, positions) are in `valueprobe.steering.interop`. Both
commands check their arguments and output path before the model loads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from valueprobe.cli.app import ForceOpt, ModelOpt, app, console, probe_option, table
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, check_output_file
from valueprobe.model.load import check_model_folder, load
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.interop import (
    FORMATS,
    check_format,
    control_vector,
    import_axis,
    read_control_vector,
    write_control_vector,
)
from valueprobe.vocab import LayerSelection, Site, Unit

__all__ = ["export_command", "import_command"]

# what the other tool calls its strength, per format
_STRENGTH = {
    "repeng": "ControlModel.set_control(vector, coeff)",
    "gguf-control-vector": "llama.cpp --control-vector-scaled FILE s",
    "steering-vectors": "SteeringVector.apply(model, multiplier=s)",
}


@app.command("export")
def export_command(
    probe: Annotated[Path, probe_option("the axis exported")],
    to: Annotated[str, typer.Option(help=f"{' | '.join(FORMATS)}")],
    out: Annotated[Path, typer.Option(help="file to write (.gguf, or .safetensors for steering-vectors)")],
    model: ModelOpt = "smollm2-135m",
    layers: Annotated[
        LayerSelection | None,
        typer.Option(parser=LayerSelection.parse, metavar="SPEC", help="default: the probe's best layer"),
    ] = None,
    site: Annotated[Site | None, typer.Option(help="default: the probe's own site")] = None,
    unit: Annotated[Unit, typer.Option(help="sigma | norm (% of mean residual norm) | raw")] = Unit.sigma,
    alpha: Annotated[float, typer.Option(help="strength baked into the file, in --unit")] = 1.0,
    force: ForceOpt = False,
) -> None:
    """Write the axis as another tool's steering vector: its strength s then equals valueprobe's α = s·alpha."""
    check_format(to)
    if not math.isfinite(alpha):
        raise ValueprobeError(f"--alpha {alpha} must be a finite number")
    axis = ValueAxis.load(probe)
    check_output_file(out)
    check_model_folder(model)
    lm = load(model)
    axis.check(lm, force=force)
    cv = control_vector(lm, axis, alpha=alpha, layers=layers, site=site, unit=unit)
    write_control_vector(cv, out, to=to)
    rows = [(f"direction.{b}", float(cv.vectors[b].norm())) for b in cv.layers]
    table(
        f"export {probe.name} → {to} ({cv.model_hint}, α = {alpha:g} {unit.value})", ["tensor", "norm"], rows
    )
    console.print(f"wrote {out}: its strength s ({_STRENGTH[to]}) is valueprobe steer α = s·{alpha:g}")


@app.command("import")
def import_command(
    path: Annotated[Path, typer.Argument(help="a GGUF control vector (repeng's or llama.cpp's)")],
    out: Annotated[Path, typer.Option(help="probe folder to write (probes/NAME)")],
    model: ModelOpt = "smollm2-135m",
    force: Annotated[
        bool, typer.Option(help="read a vector made for another architecture (the width is still checked)")
    ] = False,
) -> None:
    """Read a GGUF control vector into a probe folder (resid_post, unit directions, σ uncalibrated)."""
    cv = read_control_vector(path)
    check_output_dir(out, holds="probe")
    check_model_folder(model)
    lm = load(model)
    axis = import_axis(lm, cv, force=force, source=str(path))
    axis.save(out)
    norms = axis.metrics["control_vector"]["norms"]
    rows = [(f"direction.{layer}", f"resid_post[{layer}]", norms[str(layer)]) for layer in axis.layers]
    table(f"import {path.name}", ["tensor", "steers", "norm"], rows)
    layers = ",".join(map(str, axis.layers))
    how = (
        f"--unit raw --layers {layers} --alphas s adds what the file adds at strength s"
        if max(norms.values()) <= min(norms.values()) * (1 + 1e-5)  # one norm: it is the axis's scale
        else f"--unit raw --layers {layers} adds α·v̂ per layer (the file's norms differ by layer: above)"
    )
    console.print(
        f"wrote {out} ({cv.model_hint}, σ uncalibrated: calibrate it on a store for σ-scores); {how}"
    )
