"""``valueprobe trace``: the per-token value trace of a prompt and of a steered continuation.

    valueprobe trace --probe probes/smollm2-135m-value --prompt "Is 91 prime?" --generate 40 --alpha 2 --out runs/trace

Registers itself on the app of :mod:`valueprobe.cli.app`; :mod:`valueprobe.cli.main` imports it.
Options, the probe, its layer and its statistics are checked before the model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from valueprobe.cli.app import AllowLargeOpt, LoadOptions, ModelOpt, app, console, table
from valueprobe.cli.groups import grouped
from valueprobe.cli.spec import SpecOptions
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.vocab import VALUE_AT, parse_layers

__all__ = ["trace_command"]


@app.command("trace")
@grouped
def trace_command(
    prompt: Annotated[
        str, typer.Option(help="the text to read: a user turn through the chat template (--raw: as is)")
    ],
    out: Annotated[Path, typer.Option(help="output folder: trace.html, trace.csv")],
    model: ModelOpt = "smollm2-135m",
    generate: Annotated[int | None, typer.Option(help="also generate this many tokens (greedy)")] = None,
    alpha: Annotated[float, typer.Option(help="steering strength while generating (0: none)")] = 0.0,
    read_layers: Annotated[str, typer.Option(help="more layers to read, e.g. '10,20' (resid_post)")] = "",
    raw: Annotated[
        bool, typer.Option("--raw", help="read the prompt as is, without the chat template")
    ] = False,
    value_at: Annotated[
        str, typer.Option(help="read the steered layer 'after' the addition (as serve does) or 'before' it")
    ] = "after",
    steering: SpecOptions = SpecOptions(),
    allow_large: AllowLargeOpt = False,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Per-token value trace of a prompt (and a steered continuation): coloured tokens + line plot."""
    from valueprobe.steering.experiment.trace import (  # loads the library: when the command runs (cli/app.py)
        value_trace,
        write_trace,
    )
    from valueprobe.steering.hook.strength import check_strengths, spec_units

    if not prompt.strip():
        raise ValueprobeError("--prompt is empty: give the text to trace")
    if generate is not None and generate < 1:
        raise ValueprobeError(f"--generate {generate}: give a number of new tokens >= 1, or leave it out")
    if value_at not in VALUE_AT:
        raise ValueprobeError(f"--value-at {value_at!r}: use one of {', '.join(VALUE_AT)}")
    check_output_dir(out, holds="trace")
    how = load.check()
    spec = steering.to_spec().check()  # a bad probe, layer or unit fails before the model loads
    check_strengths(spec, [alpha], allow_large=allow_large, option="--alpha")
    both = spec_units(spec, [alpha])
    lm = how.load(model)
    spec.first_axis().check(lm)
    reads = parse_layers(read_layers, n_layers=lm.n_layers) if read_layers.strip() else []
    tr = value_trace(
        lm,
        spec,
        prompt,
        generate_tokens=generate or 0,
        alpha=alpha,
        read_layers=reads,
        chat=not raw,
        value_at="before" if value_at == "before" else "after",
    )
    files = write_trace(tr, out)
    steered = tr.values[tr.steered]
    gen = [v for v in steered[tr.n_prompt :] if v == v]
    probe = Path(str(spec.probe)).name
    table(
        f"trace: {probe} at {tr.read}",
        ["tokens", "prompt mean σ", "generated mean σ", "alpha"],
        [
            [
                len(tr.tokens),
                sum(steered[: tr.n_prompt]) / max(1, tr.n_prompt),
                (sum(gen) / len(gen)) if gen else "-",
                f"{alpha:g} {spec.unit.value}" + (f" = {both[0]}" if both and alpha else ""),
            ]
        ],
    )
    console.print("wrote " + ", ".join(str(p) for p in files.values()))
