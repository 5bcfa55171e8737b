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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import plotly.graph_objects as go
import typer
from rich.console import Console
from rich.table import Table

from valueprobe.axis import ValueAxis
from valueprobe.boundary import check_at_least, check_layer_spec, run_app
from valueprobe.cli_trace import trace_cmd
from valueprobe.cli_tune import replicate_dpo_words, replicate_safety, tune_app
from valueprobe.datasets import build
from valueprobe.datasets.io import read_jsonl, regroup, sha256_file
from valueprobe.demo import run_demo
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_text, check_output_dir, check_output_file
from valueprobe.fit import fit_probe
from valueprobe.models import check_device, load
from valueprobe.plots import sweep_figure, transfer_heatmap
from valueprobe.probe import Method
from valueprobe.readout import score_dataset
from valueprobe.replicate import replicate_axis as run_replicate
from valueprobe.shift import group_by, shift
from valueprobe.store import ActivationStore, capture_to_store, check_store_out
from valueprobe.vocab import (
    Backend,
    ChatTemplate,
    Dtype,
    PaddingSide,
    Positions,
    Site,
    Target,
    Tokens,
    layer_ranges,
)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find, read and steer the value axis of language models.")  # fmt: skip
datasets_app = typer.Typer(no_args_is_help=True, help="Build the contrast datasets.")
app.add_typer(datasets_app, name="datasets")
replicate_app = typer.Typer(no_args_is_help=True, help="Rebuild the paper's results on a model.")
app.add_typer(replicate_app, name="replicate")
app.add_typer(tune_app, name="tune")
app.command("trace")(trace_cmd)
replicate_app.command("dpo-words")(replicate_dpo_words)
replicate_app.command("safety")(replicate_safety)
# Piped output (CI logs, files) gets a width that fits the transfer table instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)

LayersPathOpt = Annotated[str | None, typer.Option(help="dotted path of the decoder blocks, if not detected")]
TrustOpt = Annotated[bool, typer.Option(help="run the model repository's own code: only if you trust it")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")]
ForceOpt = Annotated[
    bool,
    typer.Option(help="read a probe of another architecture (d_model still checked); other weights warn"),
]
ChatTemplateOpt = Annotated[
    ChatTemplate,
    typer.Option(
        help="model: the tokenizer's chat template | plain: a 'User: ...\\nAssistant: ...' transcript"
    ),
]
AllowPartialOpt = Annotated[
    bool, typer.Option(help="read a store whose capture did not finish (its row count is printed)")
]
ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="alias (smollm2-135m), model folder, .gguf, or hub id")
]


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print one summary table."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r])
    console.print(t)


def write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=2, default=float) + "\n")


def _load_model(
    model: str, *, layers_path: str | None = None, trust_remote_code: bool = False, device: str = "cpu"
):

    return load(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)


# --- demo ---


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
    result = run_demo(out=out, model=model, quick=quick, seed=seed, device=device, console=console)
    verb = f"ran {len(result.ran)} stages, reused {len(result.reused)}"
    console.print(
        f"\n[bold]report: {result.report}[/bold]  ({verb}; results: {result.results}, probe: {result.probe})"
    )
    for line in result.summary:
        console.print(f"  {line}")


# --- capture commands ---


@app.command()
def capture(
    data: Annotated[
        Path, typer.Option(help="dataset JSONL, one example per line (format: valueprobe/datasets/io.py)")
    ],
    out: Annotated[Path, typer.Option(help="store folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    layers: Annotated[str, typer.Option(help="'all', '0:10', '-1', '3,5,-2'")] = "all",
    positions: Annotated[Positions, typer.Option(help="which tokens make a row")] = Positions.last,
    site: Annotated[
        Site, typer.Option(help="block output (resid_post) or input (resid_pre)")
    ] = Site.resid_post,
    batch_size: int = 8,
    examples_per_shard: int = 256,
    checkpoint_seconds: Annotated[
        float,
        typer.Option(help="also end a shard after this many seconds, so a kill loses at most that much"),
    ] = 60.0,
    dtype: Annotated[Dtype, typer.Option(help="stored dtype")] = Dtype.float16,
    padding_side: Annotated[
        PaddingSide, typer.Option(help="side of the batch that is padded")
    ] = PaddingSide.right,
    max_length: Annotated[
        int | None, typer.Option(help="truncate longer texts to this many tokens (with a warning)")
    ] = None,
    chat_template: ChatTemplateOpt = ChatTemplate.model,
    span_labels: Annotated[
        str | None, typer.Option(help="with span positions, keep only these span labels: 'pre,post'")
    ] = None,
    group_by: Annotated[
        str | None,
        typer.Option(help="take row groups from meta, e.g. meta.pair (held-out splits keep pairs whole)"),
    ] = None,
    backend: Annotated[Backend, typer.Option(help="route into the model")] = Backend.hooks,
    remote: Annotated[
        bool, typer.Option(help="nnsight only: run on NDIF (needs an NDIF key and network)")
    ] = False,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Capture residual-stream activations of a dataset into a sharded store."""

    check_store_out(out)
    check_layer_spec("--layers", layers)
    check_at_least("--batch-size", batch_size, 1)
    check_at_least("--examples-per-shard", examples_per_shard, 1)
    check_at_least("--max-length", max_length, 1)
    check_at_least("--checkpoint-seconds", checkpoint_seconds, 1)
    check_device(device)
    if remote and backend != "nnsight":
        raise ValueprobeError("--remote runs on NDIF through nnsight: add --backend nnsight")
    examples = read_jsonl(data)
    regroup(examples, group_by)  # a --group-by that links nothing fails here, before the model loads
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    store = capture_to_store(
        lm, examples, out, layers=layers, site=site, positions=positions, batch_size=batch_size,
        examples_per_shard=examples_per_shard, dtype=dtype, padding_side=padding_side,
        max_length=max_length, dataset_path=str(data), dataset_sha256=sha256_file(data),
        span_labels=[x.strip() for x in span_labels.split(",")] if span_labels else None, group_by=group_by,
        backend=backend, remote=remote, checkpoint_seconds=checkpoint_seconds,
        chat_template=chat_template,
    )  # fmt: skip
    rows, m = store.rows(), store.manifest
    table(
        f"capture -> {out}",
        ["model", "fingerprint", "layers", "site", "positions", "examples", "rows", "shards", "dtype"],
        [[m.model_id, m.fingerprint, layer_ranges(m.layers), m.site, m.positions, len(set(rows.example_id)),
          m.n_rows, len(m.shards), m.dtype]],
    )  # fmt: skip


# --- datasets commands ---


@datasets_app.command("build")
def datasets_build(
    out: Annotated[Path, typer.Option(help="output folder, e.g. data")],
    family: Annotated[
        str,
        typer.Option(help="icrl | code | backtracking | confidence | refusal | preference | steering | all"),
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


# --- fit and score commands ---


@app.command()
def fit(
    store: Annotated[
        list[Path], typer.Option(help="activation store; repeat for several families (transfer matrix)")
    ],
    out: Annotated[Path, typer.Option(help="probe folder, e.g. probes/my-axis")],
    method: Annotated[Method, typer.Option(help="how the direction is fitted")] = Method.diff_means,
    layers: Annotated[str | None, typer.Option(help="layers to sweep: 'all', '10:20', '-4:', '::2'")] = None,
    splits: Annotated[int, typer.Option(help="repeated grouped train/val/test splits")] = 5,
    train_groups: Annotated[int | None, typer.Option(help="groups to train on per split (paper: 35)")] = None,
    seed: int = 0,
    transfer: Annotated[bool, typer.Option(help="with 2+ stores, the family transfer matrix")] = True,
    target: Annotated[
        Target, typer.Option(help="auto: pre/post spans if present, else labels")
    ] = Target.auto,
    share_groups: Annotated[
        bool,
        typer.Option(help="stores hold the same groups (e.g. ICRL and its control): hold a group out in all"),
    ] = False,
    allow_partial: AllowPartialOpt = False,
) -> None:
    """Fit the value axis: layer sweep on held-out groups, controls, transfer matrix; save the probe."""

    check_output_dir(out, holds="probe")
    check_layer_spec("--layers", layers)
    check_at_least("--splits", splits, 1)
    check_at_least("--train-groups", train_groups, 1)
    stores = [ActivationStore.open(s, allow_partial=allow_partial) for s in store]
    report = fit_probe(
        stores, method=method, layers=layers, n_splits=splits,
        train_groups=train_groups, seed=seed, transfer=transfer, target=target,
        share_groups=share_groups,
    )  # fmt: skip
    report.axis.save(out)
    headers, rows = report.sweep.table()
    table(f"layer sweep ({method}, held-out groups, {splits} splits)", headers, rows)
    write_html(sweep_figure(report.sweep), out / "sweep.html")
    if report.transfer is not None:
        headers, rows = report.transfer.table()
        table(f"transfer matrix at layer {report.transfer.layer}", headers, rows)
        write_html(transfer_heatmap(report.transfer), out / "transfer.html")
    console.print(report.summary())
    console.print(f"wrote {out}/axis.safetensors, probe.json, sweep.html")


@app.command()
def score(
    probe: Annotated[Path, typer.Option(help="probe folder (probes/NAME)")],
    data: Annotated[Path, typer.Option(help="dataset JSONL")],
    out: Annotated[Path, typer.Option(help="output folder: scores.csv, summary.json")],
    model: ModelOpt = "smollm2-135m",
    layer: Annotated[int | None, typer.Option(help="default: the probe's best layer")] = None,
    tokens: Annotated[Tokens, typer.Option(help="tokens that make up s")] = Tokens.all,
    batch_size: int = 8,
    bootstrap: int = 1000,
    seed: int = 0,
    null: Annotated[int, typer.Option(help="random unit directions at the same layer and tokens (≥ 32)")] = 0,
    force: ForceOpt = False,
    max_length: Annotated[
        int | None, typer.Option(help="truncate longer texts to this many tokens (with a warning)")
    ] = None,
    chat_template: ChatTemplateOpt = ChatTemplate.model,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Score a dataset on a probe: per-example val(s) and σ-score, per-group AUROC and Cohen's d."""

    check_output_dir(out, holds="scores")
    check_at_least("--batch-size", batch_size, 1)
    check_at_least("--bootstrap", bootstrap, 0)
    check_at_least("--null", null, 0)
    check_at_least("--max-length", max_length, 1)
    check_device(device)
    examples = read_jsonl(data)
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads; score_dataset checks the match
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    res = score_dataset(
        axis, lm, examples, layer=layer, tokens=tokens, batch_size=batch_size,
        bootstrap=bootstrap, seed=seed, null=null, force=force, max_length=max_length,
        chat_template=chat_template,
    )  # fmt: skip
    files = res.write(out)
    headers, rows = res.table()
    table(f"score: {probe.name} layer {res.layer} on {data.name}", headers, rows)
    console.print("wrote " + ", ".join(str(p) for p in files.values()))


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
        str | None, typer.Option(help="layers of the by-layer curves (default: the axis's)")
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
    check_layer_spec("--layers", layers)
    check_at_least("--n-random", n_random, 1)
    check_at_least("--bootstrap", bootstrap, 0)
    check_at_least("--batch-size", batch_size, 1)
    check_device(device)
    examples = group_by(read_jsonl(data), by)
    axis = ValueAxis.load(probe)
    base_lm = _load_model(base, trust_remote_code=trust_remote_code, device=device)
    tuned_lm = _load_model(tuned, trust_remote_code=trust_remote_code, device=device)
    res = shift(
        axis, base_lm, tuned_lm, examples, layers=layers, layer=layer, tokens=tokens,
        targeted=[t.strip() for t in targeted.split(",") if t.strip()], contrast=contrast, n_random=n_random,
        refit=refit, n_boot=bootstrap, seed=seed, batch_size=batch_size, force=force,
    )  # fmt: skip
    res.write(out, overwrite=overwrite)
    headers, rows = res.table()
    table(
        f"shift: {tuned} vs {base} on {probe.name}, layer {res.layer} (σ of the base reference)",
        headers,
        rows,
    )
    console.print(f"wrote {out}/shift.json, examples.csv, shift.html")


@replicate_app.command("axis")
def replicate_axis(
    out: Annotated[Path, typer.Option(help="probe folder to write")] = Path("probes/smollm2-135m-value"),
    model: ModelOpt = "smollm2-135m",
    data: Annotated[Path, typer.Option(help="folder with the committed datasets")] = Path("data"),
    runs: Annotated[Path, typer.Option(help="where the activation stores go (resumable)")] = Path(
        "runs/axis-smollm2-135m"
    ),
    splits: int = 5,
    train_groups: Annotated[int, typer.Option(help="training rules per split (paper: 35)")] = 35,
    seed: int = 0,
    batch_size: int = 8,
    history_out: Annotated[
        Path | None, typer.Option(help="also fit the matched-control (reward history) axis and save it here")
    ] = None,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Capture every family, fit the axis on ICRL (paper's method), transfer matrix, matched control."""

    check_output_dir(out, holds="probe")
    check_output_dir(runs, holds="runs", option="--runs")
    if history_out is not None:
        check_output_dir(history_out, holds="probe", option="--history-out")
    check_at_least("--splits", splits, 1)
    check_at_least("--train-groups", train_groups, 1)
    check_at_least("--batch-size", batch_size, 1)
    check_device(device)
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    report = run_replicate(lm, data_dir=data, runs_dir=runs, out=out, n_splits=splits, train_groups=train_groups,
                           seed=seed, batch_size=batch_size, history_out=history_out)  # fmt: skip
    headers, rows = report.sweep.table()
    table("ICRL layer sweep (span_diff, held-out rules)", headers, rows)
    assert report.transfer is not None
    headers, rows = report.transfer.table()
    table(f"transfer matrix at layer {report.transfer.layer} (diff_means)", headers, rows)
    control = report.axis.metrics["icrl_matched_control"]
    table(
        f"ICRL matched control at layer {control['layer']}",
        ["contrast", "AUROC", "95% CI", "Cohen's d"],
        [[k, v["auroc"], f"[{v['auroc_ci'][0]:.3f}, {v['auroc_ci'][1]:.3f}]", v["cohens_d"]]
         for k, v in control.items() if isinstance(v, dict)],
    )  # fmt: skip
    lens = report.axis.metrics["logit_lens"]
    console.print("logit lens, promoted:   " + " ".join(repr(t) for t, _ in lens["promoted"][:12]))
    console.print("logit lens, suppressed: " + " ".join(repr(t) for t, _ in lens["suppressed"][:12]))
    write_html(sweep_figure(report.sweep), runs / "sweep.html")
    write_html(transfer_heatmap(report.transfer), runs / "transfer.html")
    console.print(report.summary())
    if history_out is not None:
        history = ValueAxis.load(history_out)
        sweep = history.metrics["sweep"]
        table(
            f"reward-history axis (main vs control, identical text) at layer {history.best_layer}: held-out-rule"
            f" AUROC {sweep['heldout_auroc']['mean']:.3f}, margin {sweep['margin']:+.3f}; scored without refitting on",
            ["family", "AUROC", "95% CI", "Cohen's d", "embed AUROC"],
            [[k, v["auroc"], f"[{v['auroc_ci'][0]:.3f}, {v['auroc_ci'][1]:.3f}]", v["cohens_d"], v.get("embed_auroc")]
             for k, v in history.metrics["evaluated_on"].items()],
        )  # fmt: skip
    console.print(f"wrote {out}/ (axis.safetensors, probe.json) and {runs}/sweep.html, transfer.html")


# --- report ---


@app.command()
def report(
    from_: Annotated[
        Path, typer.Option("--from", help="folder with results.json (valueprobe demo) or a probe folder")
    ],
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: FROM/report.html)")] = None,
) -> None:
    """Rebuild one self-contained HTML report (plotly inlined, opens offline) from saved results."""
    from valueprobe.report import SECTIONS, load_results, write_report

    target = check_output_file(out or from_ / "report.html")
    results = load_results(from_)
    path = write_report(results, target)
    present = {s.key for s in SECTIONS if s.key in results["sections"]}
    table(
        f"report -> {path}",
        ["section", "in report"],
        [[key, "yes" if key in present else "absent"] for key in dict.fromkeys(s.key for s in SECTIONS)],
    )


def write_html(fig: go.Figure, path: Path) -> None:
    """One self-contained HTML file (plotly.js inlined: opening it reaches no other host)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.write_html(str(tmp), include_plotlyjs=True, full_html=True))


def main(argv: list[str] | None = None) -> None:
    """Entry point: the app under the one error boundary (:func:`valueprobe.boundary.run_app`)."""
    run_app(app, argv)


# The steering commands live in their own module, which uses this module's app and helpers: a real
# import cycle, so the import comes last, once everything it needs is defined.
from valueprobe import cli_steer  # noqa: E402, F401

if __name__ == "__main__":
    # `python -m valueprobe.cli` runs this file as __main__, a second copy of the module: run the
    # imported one, whose app holds every command.
    from valueprobe.cli import main as _main

    _main()
