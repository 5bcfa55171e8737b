"""``valueprobe trace``: the per-token value trace of a prompt and of a steered continuation.

    valueprobe trace --probe probes/smollm2-135m-value --prompt "Is 91 prime?" --generate 40 --alpha 2 --out runs/trace

Registers itself on the app of :mod:`valueprobe.cli.app`; :mod:`valueprobe.cli.main` imports it.
Options, the probe, its layer and its statistics are checked before the model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from valueprobe.cli.app import (
    DeviceMapOpt,
    DeviceOpt,
    LayersPathOpt,
    LoadOptions,
    ModelDtypeOpt,
    ModelOpt,
    OffloadFolderOpt,
    TrustOpt,
    app,
    console,
    probe_option,
    table,
)
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.handle import check_unit
from valueprobe.steering.trace import value_trace, write_trace
from valueprobe.vocab import ModelDtype, Unit, parse_layers

__all__ = ["trace_cmd"]


@app.command("trace")
def trace_cmd(
    probe: Annotated[Path, probe_option("the axis read and steered")],
    prompt: Annotated[str, typer.Option(help="the text to read (sent as a user turn with --chat)")],
    out: Annotated[Path, typer.Option(help="output folder: trace.html, trace.csv")],
    model: ModelOpt = "smollm2-135m",
    generate: Annotated[int | None, typer.Option(help="also generate this many tokens (greedy)")] = None,
    alpha: Annotated[float, typer.Option(help="steering strength while generating (0: none)")] = 0.0,
    unit: Annotated[Unit, typer.Option(help="unit of --alpha")] = Unit.sigma,
    layer: Annotated[
        int | None, typer.Option(help="steered and read layer; default the probe's best")
    ] = None,
    read_layers: Annotated[str, typer.Option(help="more layers to read, e.g. '10,20' (resid_post)")] = "",
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the chat template")] = True,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    model_dtype: ModelDtypeOpt = ModelDtype.float32,
    offload_folder: OffloadFolderOpt = None,
) -> None:
    """Per-token value trace of a prompt (and a steered continuation): coloured tokens + line plot."""
    how = LoadOptions(device, device_map, model_dtype, offload_folder, layers_path, trust_remote_code)
    if not prompt.strip():
        raise ValueprobeError("--prompt is empty: give the text to trace")
    if generate is not None and generate < 1:
        raise ValueprobeError(f"--generate {generate}: give a number of new tokens >= 1, or leave it out")
    check_output_dir(out, holds="trace")
    how.check()
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads
    chosen = axis.best_layer if layer is None else layer
    check_unit(axis, chosen, unit)
    lm = how.load(model)
    axis.check(lm)
    reads = parse_layers(read_layers, n_layers=lm.n_layers) if read_layers.strip() else []
    text = (
        [{"role": "user", "content": prompt}]
        if chat and getattr(lm.tokenizer, "chat_template", None)
        else prompt
    )
    tr = value_trace(
        lm, axis, text, generate_tokens=generate or 0, alpha=alpha, unit=unit, layer=chosen, read_layers=reads
    )
    files = write_trace(tr, out)
    steered = tr.values[tr.steered]
    gen = [v for v in steered[tr.n_prompt :] if v == v]
    table(
        f"trace: {probe.name} at {tr.steered}",
        ["tokens", "prompt mean σ", "generated mean σ", "alpha"],
        [
            [
                len(tr.tokens),
                sum(steered[: tr.n_prompt]) / max(1, tr.n_prompt),
                (sum(gen) / len(gen)) if gen else "-",
                f"{alpha:g} {unit.value}",
            ]
        ],
    )
    console.print("wrote " + ", ".join(str(p) for p in files.values()))
