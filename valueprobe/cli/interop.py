"""``valueprobe export`` / ``valueprobe import``: steering vectors for repeng, llama.cpp and steering-vectors.

    valueprobe export --probe probes/smollm2-135m-value --to gguf-control-vector --layers 18:23 --out value.gguf
    valueprobe export --probe probes/smollm2-135m-value --to steering-vectors --out value.safetensors
    valueprobe export --probe smollm2-135m-value --to lm-eval --unit norm --alpha 15 --layer 20 --out steer.pt
    valueprobe import value.gguf --model smollm2-135m --out probes/imported-value

The conventions (layer index, sign, scale, positions) are in `valueprobe.steering.hook.interop`, and
for lm-evaluation-harness's steer config (``--to lm-eval``: ``lm_eval --model steered``) in
`valueprobe.evals.lm_eval_steer`. Both commands check their arguments and output path before the model loads. ``export`` takes the
steering spec's options (`valueprobe.cli.spec.SpecOptions`), so ``--spec FILE`` exports a spec.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import ForceOpt, ModelOpt, app, console, table
from valueprobe.cli.groups import grouped
from valueprobe.cli.spec import SpecOptions
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, check_output_file

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel
    from valueprobe.steering.hook.spec import SteeringSpec

# the formats of `valueprobe.steering.hook.interop.FORMATS`, named here so --help needs no torch
FORMAT_NAMES = ("repeng", "gguf-control-vector", "steering-vectors")
LM_EVAL = "lm-eval"  # lm-eval's steer config, beside the control-vector formats

__all__ = ["export_command", "import_command"]

# what the other tool calls its strength, per format
_STRENGTH = {
    "repeng": "ControlModel.set_control(vector, coeff)",
    "gguf-control-vector": "llama.cpp --control-vector-scaled FILE s",
    "steering-vectors": "SteeringVector.apply(model, multiplier=s)",
}


@app.command("export")
@grouped
def export_command(
    to: Annotated[str, typer.Option(help=" | ".join([*FORMAT_NAMES, LM_EVAL]))],
    out: Annotated[
        Path, typer.Option(help="file to write (.gguf; .safetensors for steering-vectors; .pt for lm-eval)")
    ],
    model: ModelOpt = "smollm2-135m",
    alpha: Annotated[float, typer.Option(help="strength baked into the file, in --unit")] = 1.0,
    force: ForceOpt = False,
    steering: SpecOptions = SpecOptions(),
) -> None:
    """Write the axis as another tool's steering vector: its strength s then equals valueprobe's α = s·alpha."""
    from valueprobe.evals.lm_eval_steer import check_expressible, check_steer_path
    from valueprobe.model.load import (  # loads the library: when the command runs (cli/app.py)
        check_model_folder,
        load,
    )
    from valueprobe.steering.hook.interop import check_format, control_vector, write_control_vector

    if to == LM_EVAL:
        check_steer_path(out)
    else:
        check_format(to)
    if not math.isfinite(alpha):
        raise ValueprobeError(f"--alpha {alpha} must be a finite number")
    spec = steering.to_spec().check()
    if to == LM_EVAL:
        check_expressible(spec, alpha=alpha)
    check_output_file(out)
    check_model_folder(model)
    lm = load(model)
    spec.first_axis().check(lm, force=force)
    if to == LM_EVAL:
        _export_lm_eval(lm, spec, alpha, out)
        return
    cv = control_vector(lm, spec, alpha=alpha)
    write_control_vector(cv, out, to=to)
    rows = [(f"direction.{b}", float(cv.vectors[b].norm())) for b in cv.layers]
    probe = Path(str(spec.probe)).name
    table(
        f"export {probe} → {to} ({cv.model_hint}, α = {alpha:g} {spec.unit.value})", ["tensor", "norm"], rows
    )
    console.print(f"wrote {out}: its strength s ({_STRENGTH[to]}) is valueprobe steer α = s·{alpha:g}")


def _export_lm_eval(lm: LoadedModel, spec: SteeringSpec, alpha: float, out: Path) -> None:
    from valueprobe.evals.lm_eval_steer import steer_config, write_steer_config

    config = steer_config(lm, spec, alpha=alpha)
    write_steer_config(config, out)
    rows = [
        (name, e["action"], float(e["steering_vector"].norm()), e["steering_coefficient"])
        for name, e in config.items()
    ]
    title = f"export {Path(str(spec.probe)).name} → lm-eval ({spec.op.describe()}, α = {alpha:g} {spec.unit.value})"
    table(title, ["hook point", "action", "vector norm", "coefficient"], rows)
    console.print(
        f"wrote {out}: lm_eval --model steered --model_args pretrained=MODEL,steer_path={out}"
        " (an add's coefficient is valueprobe's α)"
    )


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
    from valueprobe.model.load import (  # loads the library: when the command runs (cli/app.py)
        check_model_folder,
        load,
    )
    from valueprobe.steering.hook.interop import import_axis, read_control_vector

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
