"""``valueprobe calibrate``: an axis's μ, σ and mean residual norm over the neutral reference.

    valueprobe calibrate --probe runs/my-old-axis --out runs/my-old-axis      # rewrites it in place
    valueprobe calibrate --probe runs/diff --out runs/diff --model smollm2-135m

(`valueprobe.probe.calibrate`). ``fit`` calibrates the axis it writes; this command is for a probe
written before the neutral reference, an axis made by arithmetic, or another reference text.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import ForceOpt, LoadOptions, app, console, data_option, probe_option, table
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import grouped
from valueprobe.files import check_output_dir
from valueprobe.probe.reference import NEUTRAL_TEXT
from valueprobe.vocab import Unit

if TYPE_CHECKING:
    from valueprobe.probe.axis import ValueAxis

__all__ = ["calibrate_command", "print_units"]


def print_units(axis: ValueAxis) -> None:
    """What α = 1 means on ``axis`` at its best layer, in both units, and over what σ was measured."""
    from valueprobe.probe.units import alpha_units  # loads the library: when the command runs (cli/app.py)

    layer = axis.best_layer
    if not axis.calibrated(layer):
        return
    console.print(
        f"σ at layer {layer}: {axis.sigma_at(layer):.4g} = {alpha_units(axis, 1, layer=layer, unit=Unit.sigma).norm:.2f}%"
        f" of the mean residual norm ({axis.unit_size(layer, Unit.norm) * 100:.4g}); measured over {axis.sigma_reference}"
    )


@app.command("calibrate")
@grouped
def calibrate_command(
    probe: Annotated[Path, probe_option("the axis to calibrate")],
    out: Annotated[Path, typer.Option(help="probe folder to write (the probe's own folder rewrites it)")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="the model σ is measured on; default the probe's own")
    ] = None,
    reference: Annotated[
        Path, data_option("plain-text paragraphs σ is measured over (default: the one every axis shares)")
    ] = Path(NEUTRAL_TEXT),
    batch_size: int = 8,
    force: ForceOpt = False,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Measure an axis's μ, σ and mean residual norm over the neutral reference (the statistics it
    had are kept in probe.json as ``formerly``)."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.probe.calibrate import calibrate, reference_examples
    from valueprobe.probe.units import alpha_units

    check_output_dir(out, holds="probe")
    check_at_least("--batch-size", batch_size, 1)
    how = load.check()
    axis = ValueAxis.load(probe)
    reference_examples(reference)  # a missing or chat-formatted reference fails before the load
    lm = how.load(model or axis.model_id)
    new = calibrate(axis, lm, reference=reference, batch_size=batch_size, force=force)
    new.save(out)
    layer = new.best_layer
    rows = [
        [label, f"{a.sigma_at(layer):.4g}", f"{a.unit_size(layer, Unit.norm) * 100:.4g}",
         f"{alpha_units(a, 1, layer=layer, unit=Unit.sigma).norm:.2f}%", str(a.sigma_reference)]
        for label, a in (("before", axis), ("after", new)) if a.calibrated(layer)
    ]  # fmt: skip
    table(
        f"calibrate -> {out} (layer {layer})",
        ["", "σ", "mean norm", "1σ in % of the norm", "reference"],
        rows,
    )
