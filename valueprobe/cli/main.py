"""The ``valueprobe`` command line: thin wrappers, each calling one library function.

    valueprobe demo
    valueprobe datasets build --family all --out data --seed 0
    valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl
    valueprobe fit --store runs/icrl --method span_diff --out probes/smollm2-135m-value
    valueprobe score --probe probes/smollm2-135m-value --model smollm2-135m --data data/code.jsonl --out runs/score-code
    valueprobe report --from runs/demo

Every command prints a short summary table and writes JSON/CSV next to any HTML. Every command
checks its output path and parameters before it loads a model or reads data. Any failure ends in
one line on stderr (``error: ...``): exit status 2 for bad input (including unreadable or corrupt
files), 130 for Ctrl-C, 1 for an internal error (the line names a log file with the traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

# The command modules register their commands on cli_app's app when imported; this module only runs it.
from valueprobe.cli import (  # noqa: F401
    capture_fit,
    guide,
    interop,
    merge,
    replicate_guide,
    serve,
    steer,
    trace,
    tune,
)
from valueprobe.cli.app import (
    DeviceOpt,
    ForceOpt,
    ModelOpt,
    TrustOpt,
    app,
    console,
    datasets_app,
    table,
)
from valueprobe.cli.boundary import check_at_least, run_app
from valueprobe.datasets import build
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, check_output_file
from valueprobe.model.load import check_device, check_model_folder, load
from valueprobe.probe.axis import ValueAxis
from valueprobe.replicate.demo import run_demo
from valueprobe.report.page import SECTIONS, load_results, write_report
from valueprobe.report.plots import shift_figure
from valueprobe.tune.shift import group_by, shift
from valueprobe.vocab import LayerSelection, Positions


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="output folder (rerun to reuse finished stages)")] = Path(
        "runs/demo"
    ),
    model: ModelOpt = "smollm2-135m",
    quick: Annotated[
        bool, typer.Option(help="smaller sets and 3 splits: about 3 minutes on 2 cores")
    ] = False,
    seed: int = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """The main job: datasets, capture, fit with controls (two constructions), transfer, a live trace, report."""

    check_output_dir(out, holds="demo")
    check_device(device)
    check_model_folder(model)
    result = run_demo(out=out, model=model, quick=quick, seed=seed, device=device, console=console)
    verb = f"ran {len(result.ran)} stages, reused {len(result.reused)}"
    console.print(
        f"\n[bold]report: {result.report}[/bold]  ({verb}; results: {result.results}, probe: {result.probe})"
    )
    for line in result.summary:
        console.print(f"  {line}")


# --- datasets commands ---


@datasets_app.command("build")
def datasets_build(
    out: Annotated[Path, typer.Option(help="output folder, e.g. data")],
    family: Annotated[
        str,
        typer.Option(
            help="icrl | code | backtracking | confidence | refusal | preference | steering | tasks | all"
        ),
    ] = "all",
    seed: int = 0,
    n: Annotated[
        int | None, typer.Option(help="size: conversations / functions / problems / pairs per family")
    ] = None,
) -> None:
    """Generate the contrast datasets deterministically (same seed, same bytes)."""

    check_output_dir(out, holds="datasets")
    check_at_least("--n", n, 1)
    files = build(family, out, seed=seed, n=n)
    entries = json.loads((out / "MANIFEST.json").read_text())["files"]
    rows = []
    for path in sorted(Path(p).name for p in files.values()):
        info = entries[path]
        rows.append([path, info["rows"], len(info["groups"]), info["sha256"][:12]])
    table(f"datasets -> {out} (seed {seed})", ["file", "rows", "groups", "sha256"], rows)


# --- shift ---


@app.command("shift")
def shift_cmd(
    probe: Annotated[Path, typer.Option(help="probe folder of the base model (probes/NAME)")],
    base: Annotated[str, typer.Option(help="base model: alias, folder, .gguf or hub id")],
    tuned: Annotated[str, typer.Option(help="tuned descendant: checkpoint folder (adapter or merged)")],
    data: Annotated[Path, typer.Option(help="dataset JSONL; its groups are compared")],
    out: Annotated[Path, typer.Option(help="new folder: shift.json, examples.csv, shift.html")],
    by: Annotated[str, typer.Option(help="group examples by: group | label | meta.KEY")] = "group",
    targeted: Annotated[str, typer.Option(help="comma-separated groups the tuning aimed at")] = "",
    layers: Annotated[
        LayerSelection | None,
        typer.Option(
            parser=LayerSelection.parse,
            metavar="SPEC",
            help="layers of the by-layer curves (default: the axis's)",
        ),
    ] = None,
    layer: Annotated[int | None, typer.Option(help="headline layer (default: the probe's best)")] = None,
    tokens: Annotated[Positions, typer.Option(help="tokens averaged per example")] = Positions.mean,
    contrast: Annotated[
        bool, typer.Option(help="Cohen's d by label inside each group, before and after")
    ] = False,
    refit: Annotated[
        bool, typer.Option(help="refit diff-of-means axes on both models; cos per layer")
    ] = False,
    n_random: Annotated[int, typer.Option(help="random unit directions in the null")] = 32,
    bootstrap: int = 1000,
    seed: int = 0,
    batch_size: int = 8,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
    force: ForceOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """How tuning moved the axis: per-group shift in σ with CIs against random-direction and untargeted nulls."""
    if out.exists() and not overwrite:
        raise ValueprobeError(f"output folder {out} already exists: pass --overwrite or choose another --out")
    check_output_dir(out, holds="shift")
    check_at_least("--n-random", n_random, 1)
    check_at_least("--bootstrap", bootstrap, 0)
    check_at_least("--batch-size", batch_size, 1)
    check_device(device)
    examples = group_by(read_jsonl(data), by)
    axis = ValueAxis.load(probe)
    base_lm = load(base, trust_remote_code=trust_remote_code, device=device)
    tuned_lm = load(tuned, trust_remote_code=trust_remote_code, device=device)
    res = shift(
        axis,
        base_lm,
        tuned_lm,
        examples,
        layers=layers,
        layer=layer,
        tokens=tokens,
        targeted=[t.strip() for t in targeted.split(",") if t.strip()],
        contrast=contrast,
        n_random=n_random,
        refit=refit,
        n_boot=bootstrap,
        seed=seed,
        batch_size=batch_size,
        force=force,
    )
    res.write(out, overwrite=overwrite, figure=shift_figure(res))
    headers, rows = res.table()
    table(
        f"shift: {tuned} vs {base} on {probe.name}, layer {res.layer} (σ of the base reference)",
        headers,
        rows,
    )
    console.print(f"wrote {out}/shift.json, examples.csv, shift.html")


# --- report ---


@app.command()
def report(
    from_: Annotated[
        Path, typer.Option("--from", help="folder with results.json (valueprobe demo) or a probe folder")
    ],
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: FROM/report.html)")] = None,
) -> None:
    """Rebuild one self-contained HTML report (plotly inlined, opens offline) from saved results."""
    target = check_output_file(out or from_ / "report.html")
    results = load_results(from_)
    path = write_report(results, target)
    present = {s.key for s in SECTIONS if s.key in results.sections}
    table(
        f"report -> {path}",
        ["section", "in report"],
        [[key, "yes" if key in present else "absent"] for key in dict.fromkeys(s.key for s in SECTIONS)],
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point: the app under the one error boundary (:func:`valueprobe.cli.boundary.run_app`)."""
    run_app(app, argv)


if __name__ == "__main__":
    main()
