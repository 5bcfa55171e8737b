"""The ``valueprobe`` command line: thin wrappers, each calling one library function.

    valueprobe demo
    valueprobe datasets build --family all --out data --seed 0
    valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl
    valueprobe fit --store runs/icrl --method span_diff --out probes/smollm2-135m-value
    valueprobe score --probe probes/smollm2-135m-value --model smollm2-135m --data data/code.jsonl --out runs/score-code

Every command prints a short summary table and writes JSON/CSV next to any HTML. Bad input ends
in one line on stderr (``error: ...``) and exit status 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_text
from valueprobe.vocab import Unit, parse_layers

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
    from valueprobe.demo import run_demo
    from valueprobe.plots import sweep_figure

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
    dtype: Annotated[str, typer.Option(help="stored dtype: float16 | float32")] = "float16",
    padding_side: Annotated[str, typer.Option(help="right | left")] = "right",
    max_length: int | None = None,
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
    from valueprobe.datasets.io import read_jsonl, sha256_file
    from valueprobe.store import capture_to_store

    _choice("positions", positions, ("last", "mean", "all", "spans", "span_tokens"))
    _choice("site", site, ("resid_post", "resid_pre"))
    _choice("backend", backend, ("hooks", "nnsight", "tlens"))
    _choice("padding-side", padding_side, ("right", "left"))
    examples = read_jsonl(data)
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    store = capture_to_store(
        lm, examples, out, layers=layers, site=site, positions=positions, batch_size=batch_size,  # type: ignore[arg-type]
        examples_per_shard=examples_per_shard, dtype=dtype, padding_side=padding_side,  # type: ignore[arg-type]
        max_length=max_length, dataset_path=str(data), dataset_sha256=sha256_file(data),
        span_labels=[x.strip() for x in span_labels.split(",")] if span_labels else None, group_by=group_by,
        backend=backend, remote=remote,  # type: ignore[arg-type]
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
        str, typer.Option(help="icrl | code | backtracking | confidence | refusal | preference | all")
    ] = "all",
    seed: int = 0,
    n: Annotated[
        int | None, typer.Option(help="size: conversations / functions / problems / pairs per family")
    ] = None,
) -> None:
    """Generate the contrast datasets deterministically (same seed, same bytes)."""
    from valueprobe.datasets import build

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
) -> None:
    """Fit the value axis: layer sweep on held-out groups, controls, transfer matrix; save the probe."""
    from valueprobe.plots import sweep_figure, transfer_heatmap
    from valueprobe.probe import METHODS
    from valueprobe.sweep import fit_probe

    _choice("method", method, tuple(METHODS))
    _choice("target", target, ("auto", "span", "label"))
    report = fit_probe(
        [str(s) for s in store], method=method, layers=layers, n_splits=splits,  # type: ignore[arg-type]
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
    force: Annotated[
        bool, typer.Option(help="skip the fingerprint check (d_model is still checked)")
    ] = False,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Score a dataset on a probe: per-example val(s) and σ-score, per-group AUROC and Cohen's d."""
    from valueprobe.axis import ValueAxis
    from valueprobe.datasets.io import read_jsonl
    from valueprobe.readout import score_dataset

    _choice("tokens", tokens, ("all", "span_tokens", "last"))
    examples = read_jsonl(data)
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads; score_dataset checks the match
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    res = score_dataset(
        axis, lm, examples, layer=layer, tokens=tokens, batch_size=batch_size,  # type: ignore[arg-type]
        bootstrap=bootstrap, seed=seed, force=force,
    )  # fmt: skip
    files = res.write(out)
    headers, rows = res.table()
    table(f"score: {probe.name} layer {res.layer} on {data.name}", headers, rows)
    console.print("wrote " + ", ".join(str(p) for p in files.values()))


@app.command("trace")
def trace_cmd(
    probe: Annotated[Path, typer.Option(help="probe folder (probes/NAME)")],
    prompt: Annotated[str, typer.Option(help="the text to read (sent as a user turn with --chat)")],
    out: Annotated[Path, typer.Option(help="output folder: trace.html, trace.csv")],
    model: ModelOpt = "smollm2-135m",
    generate: Annotated[int | None, typer.Option(help="also generate this many tokens (greedy)")] = None,
    alpha: Annotated[float, typer.Option(help="steering strength while generating (0: none)")] = 0.0,
    unit: Annotated[str, typer.Option(help="unit of --alpha: sigma | norm | raw")] = "sigma",
    layer: Annotated[
        int | None, typer.Option(help="steered and read layer; default the probe's best")
    ] = None,
    read_layers: Annotated[str, typer.Option(help="more layers to read, e.g. '10,20' (resid_post)")] = "",
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the chat template")] = True,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Per-token value trace of a prompt (and a steered continuation): coloured tokens + line plot."""
    from valueprobe.axis import ValueAxis
    from valueprobe.livetrace import value_trace, write_trace
    from valueprobe.steer import check_unit

    if not prompt.strip():
        raise ValueprobeError("--prompt is empty: give the text to trace")
    if generate is not None and generate < 1:
        raise ValueprobeError(f"--generate {generate}: give a number of new tokens >= 1, or leave it out")
    _choice("unit", unit, tuple(u.value for u in Unit))
    if out.exists() and not out.is_dir():
        raise ValueprobeError(f"--out {out} is a file: give a folder")
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads
    chosen = axis.best_layer if layer is None else layer
    check_unit(axis, chosen, Unit(unit))
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    axis.check(lm)
    reads = parse_layers(read_layers, n_layers=lm.n_layers) if read_layers.strip() else []
    text = (
        [{"role": "user", "content": prompt}]
        if chat and getattr(lm.tokenizer, "chat_template", None)
        else prompt
    )
    tr = value_trace(lm, axis, text, generate_tokens=generate or 0, alpha=alpha, unit=unit, layer=chosen,
                     read_layers=reads)  # fmt: skip
    files = write_trace(tr, out)
    steered = tr.values[tr.steered]
    gen = [v for v in steered[tr.n_prompt :] if v == v]
    table(f"trace: {probe.name} at {tr.steered}", ["tokens", "prompt mean σ", "generated mean σ", "alpha"],
          [[len(tr.tokens), sum(steered[: tr.n_prompt]) / max(1, tr.n_prompt),
            (sum(gen) / len(gen)) if gen else "-", f"{alpha:g} {unit}"]])  # fmt: skip
    console.print("wrote " + ", ".join(str(p) for p in files.values()))


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


def _layers_str(layers: list[int]) -> str:
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueprobeError(f"--{name} {value!r} is not one of: {', '.join(allowed)}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning a ValueprobeError into one line and exit 2."""
    try:
        app(args=argv, standalone_mode=False)
    except ValueprobeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume where supported", file=sys.stderr)
        raise SystemExit(130) from None
    except typer.Exit as exc:  # --help and friends
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except typer.TyperException as exc:  # usage errors: unknown command, missing or bad option
        msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        print(f"error: {msg} (see valueprobe --help)", file=sys.stderr)
        raise SystemExit(2) from None
