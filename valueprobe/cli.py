"""The ``valueprobe`` command line: thin wrappers, each calling one library function.

    valueprobe demo
    valueprobe datasets build --family all --out data --seed 0
    valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl
    valueprobe fit --store runs/icrl --method span_diff --out probes/smollm2-135m-value
    valueprobe score --probe probes/smollm2-135m-value --model smollm2-135m --data data/code.jsonl --out runs/score-code

Every command prints a short summary table and writes JSON/CSV next to any HTML. Every command
checks its output path and parameters before it loads a model or reads data. Any failure ends in
one line on stderr (``error: ...``): exit status 2 for bad input (including unreadable or corrupt
files), 130 for Ctrl-C, 1 for an internal error (the line names a log file with the traceback).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from safetensors import SafetensorError
from typer._click.exceptions import NoArgsIsHelpError  # typer vendors click; no public name for it

from valueprobe.capture import CHAT_TEMPLATES
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_text, check_output_dir
from valueprobe.models import check_device
from valueprobe.vocab import Positions, parse_layers

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find, read and steer the value axis of language models.")  # fmt: skip
datasets_app = typer.Typer(no_args_is_help=True, help="Build the contrast datasets.")
app.add_typer(datasets_app, name="datasets")
replicate_app = typer.Typer(no_args_is_help=True, help="Rebuild the paper's results on a model.")
app.add_typer(replicate_app, name="replicate")
# Piped output (CI logs, files) gets a width that fits the transfer table instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)

LayersPathOpt = Annotated[str | None, typer.Option(help="dotted path of the decoder blocks, if not detected")]
TrustOpt = Annotated[bool, typer.Option(help="run the model repository's own code: only if you trust it")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")]
ChatTemplateOpt = Annotated[
    str,
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
    from valueprobe.models import load  # imported late: `valueprobe --help` stays fast

    return load(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)


# --- demo ---


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("runs/demo"),
    model: ModelOpt = "smollm2-135m",
    n: Annotated[int, typer.Option(help="ICRL conversations to generate and capture")] = 96,
    seed: int = 0,
    splits: int = 5,
) -> None:
    """The main job: offline model, ICRL data, capture, fit the value axis, held-out-rule sweep with controls."""
    from valueprobe.demo import MIN_N, run_demo
    from valueprobe.plots import sweep_figure

    check_output_dir(out, holds="demo")
    check_at_least("--n", n, MIN_N, " (a held-out split needs a train, a validation and a test rule)")
    check_at_least("--splits", splits, 1)
    report = run_demo(out=out, model=model, n=n, seed=seed, splits=splits)
    headers, rows = report.sweep.table()
    table(
        f"value axis on {model}: ICRL layer sweep (span_diff, held-out rules, {splits} splits)", headers, rows
    )
    write_json(out / "summary.json", {"summary": report.summary(), "sweep": report.sweep.to_dict()})
    write_html(sweep_figure(report.sweep), out / "sweep.html")
    console.print(report.summary())
    console.print(f"wrote {out}/summary.json, {out}/sweep.html, {out}/probe/")


# --- capture commands ---


@app.command()
def capture(
    data: Annotated[Path, typer.Option(help="dataset JSONL (see DESIGN.md)")],
    out: Annotated[Path, typer.Option(help="store folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    layers: Annotated[str, typer.Option(help="'all', '0:10', '-1', '3,5,-2'")] = "all",
    positions: Annotated[str, typer.Option(help="last | mean | all | spans | span_tokens")] = "last",
    site: Annotated[str, typer.Option(help="resid_post | resid_pre")] = "resid_post",
    batch_size: int = 8,
    examples_per_shard: int = 256,
    checkpoint_seconds: Annotated[
        float,
        typer.Option(help="also end a shard after this many seconds, so a kill loses at most that much"),
    ] = 60.0,
    dtype: Annotated[str, typer.Option(help="stored dtype: float16 | float32")] = "float16",
    padding_side: Annotated[str, typer.Option(help="right | left")] = "right",
    max_length: Annotated[
        int | None, typer.Option(help="truncate longer texts to this many tokens (with a warning)")
    ] = None,
    chat_template: ChatTemplateOpt = "model",
    span_labels: Annotated[
        str | None, typer.Option(help="with span positions, keep only these span labels: 'pre,post'")
    ] = None,
    group_by: Annotated[
        str | None,
        typer.Option(help="take row groups from meta, e.g. meta.pair (held-out splits keep pairs whole)"),
    ] = None,
    backend: Annotated[str, typer.Option(help="hooks | nnsight | tlens")] = "hooks",
    remote: Annotated[
        bool, typer.Option(help="nnsight only: run on NDIF (needs an NDIF key and network)")
    ] = False,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Capture residual-stream activations of a dataset into a sharded store."""
    from valueprobe.capture import regroup
    from valueprobe.datasets.io import read_jsonl, sha256_file
    from valueprobe.store import capture_to_store, check_store_out

    check_store_out(out)
    _choice("positions", positions, ("last", "mean", "all", "spans", "span_tokens"))
    _choice("site", site, ("resid_post", "resid_pre"))
    _choice("backend", backend, ("hooks", "nnsight", "tlens"))
    _choice("padding-side", padding_side, ("right", "left"))
    _choice("dtype", dtype, ("float16", "float32"))
    _choice("chat-template", chat_template, CHAT_TEMPLATES)
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
        lm, examples, out, layers=layers, site=site, positions=positions, batch_size=batch_size,  # type: ignore[arg-type]
        examples_per_shard=examples_per_shard, dtype=dtype, padding_side=padding_side,  # type: ignore[arg-type]
        max_length=max_length, dataset_path=str(data), dataset_sha256=sha256_file(data),
        span_labels=[x.strip() for x in span_labels.split(",")] if span_labels else None, group_by=group_by,
        backend=backend, remote=remote, checkpoint_seconds=checkpoint_seconds,  # type: ignore[arg-type]
        chat_template=chat_template,  # type: ignore[arg-type]
    )  # fmt: skip
    rows = store.rows()
    table(
        f"capture -> {out}",
        ["model", "fingerprint", "layers", "site", "positions", "examples", "rows", "shards", "dtype"],
        [[store.model_id, store.fingerprint, _layers_str(store.layers), store.site, store.positions,
          len(set(rows.example_id)), store.n_rows, len(store.manifest["shards"]), store.manifest["dtype"]]],
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
    from valueprobe.datasets import build

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
    method: Annotated[
        str, typer.Option(help="span_diff | diff_means | lda | logistic | paired_pca")
    ] = "diff_means",
    layers: Annotated[str | None, typer.Option(help="layers to sweep: 'all', '10:20', '-4:'")] = None,
    splits: Annotated[int, typer.Option(help="repeated grouped train/val/test splits")] = 5,
    train_groups: Annotated[int | None, typer.Option(help="groups to train on per split (paper: 35)")] = None,
    seed: int = 0,
    transfer: Annotated[bool, typer.Option(help="with 2+ stores, the family transfer matrix")] = True,
    target: Annotated[
        str, typer.Option(help="auto (pre/post spans if present, else labels) | span | label")
    ] = "auto",
    share_groups: Annotated[
        bool,
        typer.Option(help="stores hold the same groups (e.g. ICRL and its control): hold a group out in all"),
    ] = False,
    allow_partial: AllowPartialOpt = False,
) -> None:
    """Fit the value axis: layer sweep on held-out groups, controls, transfer matrix; save the probe."""
    from valueprobe.plots import sweep_figure, transfer_heatmap
    from valueprobe.probe import METHODS
    from valueprobe.sweep import fit_probe

    check_output_dir(out, holds="probe")
    _choice("method", method, tuple(METHODS))
    _choice("target", target, ("auto", "span", "label"))
    check_layer_spec("--layers", layers)
    check_at_least("--splits", splits, 1)
    check_at_least("--train-groups", train_groups, 1)
    stores = [open_store(s, allow_partial=allow_partial) for s in store]
    report = fit_probe(
        stores, method=method, layers=layers, n_splits=splits,  # type: ignore[arg-type]
        train_groups=train_groups, seed=seed, transfer=transfer, target=target,  # type: ignore[arg-type]
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
    tokens: Annotated[str, typer.Option(help="tokens read: all | span_tokens | last")] = "all",
    batch_size: int = 8,
    bootstrap: int = 1000,
    seed: int = 0,
    null: Annotated[
        int, typer.Option(help="random unit directions read at the same layer and tokens (≥ 32): the null")
    ] = 0,
    force: Annotated[
        bool,
        typer.Option(
            help="read a probe of another architecture (d_model still checked); other weights only warn"
        ),
    ] = False,
    max_length: Annotated[
        int | None, typer.Option(help="truncate longer texts to this many tokens (with a warning)")
    ] = None,
    chat_template: ChatTemplateOpt = "model",
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Score a dataset on a probe: per-example val(s) and σ-score, per-group AUROC and Cohen's d."""
    from valueprobe.axis import ValueAxis
    from valueprobe.datasets.io import read_jsonl
    from valueprobe.readout import score_dataset

    check_output_dir(out, holds="scores")
    _choice("tokens", tokens, ("all", "span_tokens", "last"))
    _choice("chat-template", chat_template, CHAT_TEMPLATES)
    check_at_least("--batch-size", batch_size, 1)
    check_at_least("--bootstrap", bootstrap, 0)
    check_at_least("--null", null, 0)
    check_at_least("--max-length", max_length, 1)
    check_device(device)
    examples = read_jsonl(data)
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads; score_dataset checks the match
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    res = score_dataset(
        axis, lm, examples, layer=layer, tokens=tokens, batch_size=batch_size,  # type: ignore[arg-type]
        bootstrap=bootstrap, seed=seed, null=null, force=force, max_length=max_length,
        chat_template=chat_template,  # type: ignore[arg-type]
    )  # fmt: skip
    files = res.write(out)
    headers, rows = res.table()
    table(f"score: {probe.name} layer {res.layer} on {data.name}", headers, rows)
    console.print("wrote " + ", ".join(str(p) for p in files.values()))


@app.command("shift")
def shift_cmd(
    probe: Annotated[Path, typer.Option(help="probe folder of the base model (probes/NAME)")],
    base: Annotated[str, typer.Option(help="base model: alias, folder, .gguf or hub id")],
    tuned: Annotated[
        str, typer.Option(help="tuned descendant: folder (merged or adapter over base) or hub id")
    ],
    data: Annotated[Path, typer.Option(help="dataset JSONL; its groups are compared")],
    out: Annotated[Path, typer.Option(help="new output folder: shift.json, examples.csv, shift.html")],
    by: Annotated[str, typer.Option(help="group examples by: group | label | meta.KEY")] = "group",
    targeted: Annotated[str, typer.Option(help="comma-separated groups the tuning aimed at")] = "",
    layers: Annotated[
        str | None, typer.Option(help="layers for the by-layer curves (default: the axis's)")
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
    force: Annotated[
        bool, typer.Option(help="read a probe of another architecture (d_model still checked)")
    ] = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """How tuning moved the axis: per-group shift in σ with CIs against random-direction and untargeted nulls."""
    from valueprobe.axis import ValueAxis
    from valueprobe.datasets.io import read_jsonl
    from valueprobe.shift import group_by, shift

    if out.exists() and not overwrite:
        raise ValueprobeError(f"output folder {out} already exists: pass --overwrite or choose another --out")
    check_output_dir(out, holds="shift")
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
    from valueprobe.plots import sweep_figure, transfer_heatmap
    from valueprobe.replicate import replicate_axis as run

    check_output_dir(out, holds="probe")
    check_output_dir(runs, holds="runs", option="--runs")
    if history_out is not None:
        check_output_dir(history_out, holds="probe", option="--history-out")
    check_at_least("--splits", splits, 1)
    check_at_least("--train-groups", train_groups, 1)
    check_at_least("--batch-size", batch_size, 1)
    check_device(device)
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    report = run(lm, data_dir=data, runs_dir=runs, out=out, n_splits=splits, train_groups=train_groups,
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
        from valueprobe.axis import ValueAxis

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


def write_html(fig, path: Path) -> None:
    """One self-contained HTML file (plotly.js inlined: opening it reaches no other host)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.write_html(str(tmp), include_plotlyjs=True, full_html=True))


def check_at_least(option: str, value: int | float | None, minimum: int | float, why: str = "") -> None:
    """A numeric option below its minimum is refused before any work (``--splits 0`` gave a NaN probe)."""
    if value is not None and value < minimum:
        raise ValueprobeError(f"{option} {value} is too small: it must be >= {minimum}{why}")


def check_layer_spec(option: str, spec: str | None) -> None:
    """Catch a malformed layer spec before the model loads; the range is checked against the model later."""
    if spec is not None:
        try:
            parse_layers(spec, n_layers=1 << 20)
        except ValueprobeError:
            raise ValueprobeError(
                f"{option} {spec!r} is not a layer spec: use 'all', '0:10', '-1' or '3,5,-2'"
            ) from None


def open_store(path: Path, *, allow_partial: bool = False):
    """Open and verify a store; a partial one only with ``--allow-partial``, and then say how partial."""
    from valueprobe.store import ActivationStore

    store = ActivationStore.open(path, allow_partial=allow_partial)
    if not store.complete:
        n = (store.manifest.get("dataset") or {}).get("n_examples")
        logging.getLogger("valueprobe").warning(
            f"{path} is a partial store: using its {store.n_rows} rows ({store.n_examples_done} of {n} examples)"
        )
    return store


def _layers_str(layers: list[int]) -> str:
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueprobeError(f"--{name} {value!r} is not one of: {', '.join(allowed)}")


def main(argv: list[str] | None = None) -> None:
    """Entry point and the one error boundary: every failure ends in one line on stderr.

    Exit status: 0 done; 2 bad input (ValueprobeError, a file that cannot be read or written,
    corrupt JSON or safetensors, a usage error); 130 interrupted (Ctrl-C); 1 an internal error,
    whose traceback goes to a log file named in the line.
    """
    # The command runs under our own context, not typer's standalone wrapper: that one turns
    # Ctrl-C into a *returned* 130 (easy to lose, and lost before), and usage errors into boxes.
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    _log_warnings_as_lines()
    try:
        with command.make_context("valueprobe", args) as ctx:
            command.invoke(ctx)
    except KeyboardInterrupt:
        _fail(EXIT_INTERRUPTED, "interrupted; finished files are kept (rerun `capture` to resume it)")
    except typer.Exit as exc:  # --help and friends
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        _fail(EXIT_INTERRUPTED, "aborted")
    except (
        NoArgsIsHelpError
    ) as exc:  # bare `valueprobe` / `valueprobe datasets`: the help, as click prints it
        print(exc.ctx.get_help() if exc.ctx else exc.format_message(), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except typer.TyperException as exc:  # unknown command, missing or bad option
        _fail(EXIT_BAD_INPUT, f"{exc.format_message()} (see valueprobe --help)")
    except Exception as exc:  # noqa: BLE001 -- the boundary: everything becomes one line
        code, line = describe_error(exc)
        if code == EXIT_INTERNAL:
            line += f"; the traceback is in {_write_traceback(exc)}: please report it"
        _fail(code, line)


EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130


def describe_error(exc: BaseException) -> tuple[int, str]:
    """(exit status, one line) for an exception reaching the CLI boundary."""
    if isinstance(exc, ValueprobeError):
        return EXIT_BAD_INPUT, _one_line(str(exc))
    if isinstance(exc, SafetensorError):
        return (
            EXIT_BAD_INPUT,
            f"unreadable safetensors file ({_one_line(str(exc))}): it is truncated or corrupt; write it again",
        )
    if isinstance(exc, json.JSONDecodeError):
        return (
            EXIT_BAD_INPUT,
            f"invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): fix or rewrite the file",
        )
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return EXIT_BAD_INPUT, "no space left on device: free space and rerun"
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or _one_line(str(exc)) or type(exc).__name__
        return EXIT_BAD_INPUT, f"{where}{what}; check the path, its permissions and the network"
    return EXIT_INTERNAL, f"internal error ({type(exc).__name__}: {_one_line(str(exc))[:300]})"


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _fail(code: int, line: str) -> NoReturn:
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(code)


def _write_traceback(exc: BaseException) -> Path:
    """Save the traceback of an internal error; the CLI prints only its path."""
    folder = Path(os.environ.get("VALUEPROBE_LOG_DIR") or Path(tempfile.gettempdir()) / "valueprobe-logs")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(
        "valueprobe " + " ".join(sys.argv[1:]) + "\n\n" + "".join(traceback.format_exception(exc))
    )
    return path


def _log_warnings_as_lines() -> None:
    """Library warnings (``logging.getLogger("valueprobe")``) print as one ``warning: ...`` line each."""
    log = logging.getLogger("valueprobe")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


if __name__ == "__main__":
    main()
