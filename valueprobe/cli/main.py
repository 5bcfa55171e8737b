"""The ``valueprobe`` command line: thin wrappers, each calling one library function.

    valueprobe demo
    valueprobe datasets build --family all --out data --seed 0
    valueprobe capture --model smollm2-135m --data icrl --layers all --positions spans --out runs/icrl
    valueprobe fit --store runs/icrl --method span_diff --out runs/my-axis
    valueprobe score --probe smollm2-135m-value --model smollm2-135m --data code --out runs/score-code
    valueprobe report --from runs/demo

``--probe`` takes a shipped axis's name or a folder, ``--data``/``--prompts`` a shipped dataset's
name or a JSONL path (`valueprobe.probe.registry`, `valueprobe.datasets.shipped`).

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
    attribute,
    audit,
    caa,
    calibrate,
    capture_fit,
    evals,
    guide,
    interop,
    merge,
    replicate_guide,
    serve,
    steer,
    trace,
    tune,
    tune_steer,
)
from valueprobe.cli.app import (
    DeviceOpt,
    ModelOpt,
    app,
    console,
    datasets_app,
    table,
)
from valueprobe.cli.boundary import check_at_least, run_app
from valueprobe.datasets import build
from valueprobe.files import PACKAGE_DIR, check_output_dir, check_output_file
from valueprobe.probe.registry import resolve_axis_name


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option(help="output folder (rerun to reuse finished stages)")] = Path(
        "runs/demo"
    ),
    model: ModelOpt = "smollm2-135m",
    quick: Annotated[
        bool, typer.Option(help="smaller sets and 3 splits: about 80 s on 2 quiet cores")
    ] = False,
    seed: int = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """The main job: datasets, capture, fit with controls (two constructions), transfer, a live trace, report."""
    from valueprobe.model.load import (  # loads the library: when the command runs (cli/app.py)
        check_device,
        check_model_folder,
    )
    from valueprobe.replicate.demo import run_demo

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
def datasets_build_command(
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


# --- report ---


def _results_folder(text: str | Path) -> Path:
    """``--from``: a folder, or a shipped axis by name (`valueprobe.probe.registry`)."""
    return resolve_axis_name(str(text))


@app.command("report")
def report_command(
    from_: Annotated[
        Path,
        typer.Option(
            "--from",
            parser=_results_folder,
            metavar="FOLDER|NAME",
            help="folder with results.json (valueprobe demo), a probe folder, or a shipped axis's name",
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="HTML file to write (default: FROM/report.html; runs/NAME/report.html for a shipped axis)"
        ),
    ] = None,
) -> None:
    """Rebuild one self-contained HTML report (plotly inlined, opens offline) from saved results."""
    from valueprobe.report.page import (  # loads the library: when the command runs (cli/app.py)
        SECTIONS,
        load_results,
        write_report,
    )

    shipped = from_.resolve().is_relative_to(PACKAGE_DIR)  # never write into the installed package
    target = check_output_file(out or (Path("runs") / from_.name if shipped else from_) / "report.html")
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
