"""CLI commands that capture activations, fit and score a probe, and rebuild the paper's axis.

valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl
valueprobe fit --store runs/icrl --method span_diff --out probes/smollm2-135m-value
valueprobe score --probe probes/smollm2-135m-value --model smollm2-135m --data data/code.jsonl --out runs/score
valueprobe replicate axis --out probes/smollm2-135m-value
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.activations.manifest import DatasetInfo
from valueprobe.cli.app import (
    SHIPPED_DATA,
    AllowPartialOpt,
    ChatTemplateOpt,
    ForceOpt,
    LimitOpt,
    LoadOptions,
    ModelOpt,
    ShardOpt,
    app,
    console,
    data_dir_option,
    data_option,
    probe_option,
    replicate_app,
    run_sharded,
    table,
    write_figure,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.calibrate import print_units
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.datasets.io import read_jsonl, regroup
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, sha256_file
from valueprobe.probe.fitters import Method
from valueprobe.vocab import (
    ALL_LAYERS,
    ChatTemplate,
    Dtype,
    LayerSelection,
    PaddingSide,
    Positions,
    RouteName,
    ShardSpec,
    Site,
    Target,
    Tokens,
)

if TYPE_CHECKING:
    from valueprobe.activations.capture import CaptureSettings
    from valueprobe.activations.store import ActivationStore
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.read.readout import ScoreSettings

CheckpointSecondsOpt = Annotated[
    float, typer.Option(help="also end a shard after this many seconds, so a kill loses at most that much")
]
GroupByOpt = Annotated[
    str | None,
    typer.Option(help="take row groups from meta, e.g. meta.pair (held-out splits keep pairs whole)"),
]


def print_store(out: Path, store: ActivationStore) -> None:
    """The one-row summary of a captured store."""
    table(f"capture -> {out}", *store.table())


@dataclass(frozen=True)
class CaptureOptions(OptionGroup):
    """What ``capture`` reads and how it runs and checkpoints (`CaptureSettings`, as options)."""

    panel = "Capture"

    layers: Annotated[
        LayerSelection,
        typer.Option(parser=LayerSelection.parse, metavar="SPEC", help="'all', '0:10', '-1', '3,5,-2'"),
    ] = ALL_LAYERS
    positions: Annotated[Positions, typer.Option(help="which tokens make a row")] = Positions.last
    site: Annotated[Site, typer.Option(help="block output (resid_post) or input (resid_pre)")] = (
        Site.resid_post
    )
    batch_size: int = 8
    examples_per_shard: int = 256
    checkpoint_seconds: CheckpointSecondsOpt = 60.0
    dtype: Annotated[
        Dtype, typer.Option(help="dtype the activations are stored in (the model's is --model-dtype)")
    ] = Dtype.float16
    padding_side: Annotated[PaddingSide, typer.Option(help="side of the batch that is padded")] = (
        PaddingSide.right
    )
    max_length: Annotated[
        int | None, typer.Option(help="truncate longer texts to this many tokens (with a warning)")
    ] = None
    chat_template: ChatTemplateOpt = ChatTemplate.model
    span_labels: Annotated[
        str | None, typer.Option(help="with span positions, keep only these span labels: 'pre,post'")
    ] = None
    group_by: GroupByOpt = None
    limit: LimitOpt = None
    route: Annotated[RouteName, typer.Option(help="route into the model: hooks | nnsight | tlens")] = (
        RouteName.hooks
    )
    backend: Annotated[RouteName | None, typer.Option("--backend", hidden=True)] = None  # --route's old name
    remote: Annotated[
        bool, typer.Option(help="nnsight only: run on NDIF (needs an NDIF key and network)")
    ] = False

    def settings(self) -> CaptureSettings:
        """The library's settings (a store keeps the embedding output too), every size checked."""
        from valueprobe.activations.capture import (
            CaptureSettings,  # loads the library: when the command runs (cli/app.py)
        )

        sizes = (self.batch_size, self.examples_per_shard, self.max_length, self.checkpoint_seconds)
        for option, value in zip(
            ("--batch-size", "--examples-per-shard", "--max-length", "--checkpoint-seconds"),
            sizes,
            strict=True,
        ):
            check_at_least(option, value, 1)
        route = self.route
        if self.backend is not None:
            if route not in (RouteName.hooks, self.backend):
                raise ValueprobeError(
                    f"--route {route.value} and --backend {self.backend.value} disagree: give --route only"
                )
            route = self.backend
        if self.remote and route != "nnsight":
            raise ValueprobeError("--remote runs on NDIF through nnsight: add --route nnsight")
        return CaptureSettings(
            layers=self.layers,
            site=self.site,
            positions=self.positions,
            include_embed=True,
            max_length=self.max_length,
            span_labels=[x.strip() for x in self.span_labels.split(",")] if self.span_labels else None,
            group_by=self.group_by,
            chat_template=self.chat_template,
            batch_size=self.batch_size,
            padding_side=self.padding_side,
            route=route,
            remote=self.remote,
        )


@app.command("capture")
@grouped
def capture_command(
    data: Annotated[Path, data_option("dataset, one example per line (format: valueprobe/datasets/io.py)")],
    out: Annotated[Path, typer.Option(help="store folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    run: CaptureOptions = CaptureOptions(),
    shard: ShardOpt = None,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Capture residual-stream activations of a dataset into a sharded store (torchrun: one part a rank)."""
    from valueprobe.activations.parts import STORE_PARTS  # loads the library: when the command runs
    from valueprobe.activations.store import capture_to_store, check_store_out
    from valueprobe.model.load import check_device

    # checked before the ranks meet: every rank refuses the same options alike
    how = load.check()
    options = run

    def work(store_out: Path, part: ShardSpec | None, device: str) -> None:
        check_store_out(store_out)
        settings = options.settings()
        check_device(device)
        check_at_least("--limit", options.limit, 1)
        examples = read_jsonl(data)[: options.limit]
        regroup(examples, settings.group_by)  # a --group-by linking nothing fails before the load
        lm = how.load(model, device=device)
        store = capture_to_store(
            lm,
            examples,
            store_out,
            settings,
            examples_per_shard=options.examples_per_shard,
            dtype=options.dtype,
            dataset_path=str(data),
            dataset_sha256=sha256_file(data),
            checkpoint_seconds=options.checkpoint_seconds,
            shard=part,
            progress=part is None or part.index == 0,
        )
        if store_out == out:  # not a torchrun rank's part: rank 0 prints the merged store
            print_store(store_out, store)

    if not run_sharded(out, shard, how.device, work, STORE_PARTS):
        work(out, None, how.device)


@dataclass(frozen=True)
class FitOptions(OptionGroup):
    """How ``fit`` sweeps layers and splits groups (the arguments of `fit_probe`, as options)."""

    panel = "Fit"

    method: Annotated[Method, typer.Option(help="how the direction is fitted")] = Method.diff_means
    layers: Annotated[
        LayerSelection | None,
        typer.Option(
            parser=LayerSelection.parse, metavar="SPEC", help="layers to sweep: 'all', '10:20', '-4:', '::2'"
        ),
    ] = None
    splits: Annotated[int, typer.Option(help="repeated grouped train/val/test splits")] = 5
    train_groups: Annotated[int | None, typer.Option(help="groups to train on per split (paper: 35)")] = None
    seed: int = 0
    transfer: Annotated[bool, typer.Option(help="with 2+ stores, the family transfer matrix")] = True
    target: Annotated[Target, typer.Option(help="auto: pre/post spans if present, else labels")] = Target.auto
    share_groups: Annotated[
        bool,
        typer.Option(help="stores hold the same groups (e.g. ICRL and its control): hold a group out in all"),
    ] = False

    def check(self) -> FitOptions:
        """The counts checked before any store is read; returns these options."""
        check_at_least("--splits", self.splits, 1)
        check_at_least("--train-groups", self.train_groups, 1)
        return self


CalibrateOpt = Annotated[
    bool,
    typer.Option(
        help="measure μ, σ and the mean norm over the neutral reference on the model (loads it);"
        " --no-calibrate keeps the fitting set's, and the probe says so when loaded"
    ),
]
StoresModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="the model σ is measured on; default the stores' own")
]


@app.command("fit")
@grouped
def fit_command(
    store: Annotated[
        list[Path], typer.Option(help="activation store; repeat for several families (transfer matrix)")
    ],
    out: Annotated[Path, typer.Option(help="probe folder, e.g. probes/my-axis")],
    fitting: FitOptions = FitOptions(),
    allow_partial: AllowPartialOpt = False,
    calibrate: CalibrateOpt = True,
    model: StoresModelOpt = None,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Fit the value axis: layer sweep on held-out groups, controls, transfer matrix; σ over the
    neutral reference; save the probe."""
    from valueprobe.activations.store import (
        ActivationStore,  # loads the library: when the command runs (cli/app.py)
    )
    from valueprobe.probe.fit import fit_probe
    from valueprobe.report.plots import sweep_figure, transfer_heatmap

    check_output_dir(out, holds="probe")
    how, f = load.check(), fitting.check()
    stores = [ActivationStore.open(s, allow_partial=allow_partial) for s in store]
    lm = how.load(model or stores[0].manifest.model_id) if calibrate else None
    report = fit_probe(
        stores,
        method=f.method,
        layers=f.layers,
        n_splits=f.splits,
        train_groups=f.train_groups,
        seed=f.seed,
        transfer=f.transfer,
        target=f.target,
        share_groups=f.share_groups,
        lm=lm,
    )
    report.axis.save(out)
    headers, rows = report.sweep.table()
    table(f"layer sweep ({f.method}, held-out groups, {f.splits} splits)", headers, rows)
    write_figure(sweep_figure(report.sweep), out / "sweep.html")
    if report.transfer is not None:
        headers, rows = report.transfer.table()
        table(f"transfer matrix at layer {report.transfer.layer}", headers, rows)
        write_figure(transfer_heatmap(report.transfer), out / "transfer.html")
    console.print(report.summary())
    print_units(report.axis)
    console.print(f"wrote {out}/axis.safetensors, probe.json, sweep.html")


@dataclass(frozen=True)
class ScoreOptions(OptionGroup):
    """How ``score`` reads the dataset (`ScoreSettings`, as options)."""

    panel = "Score"

    layer: Annotated[int | None, typer.Option(help="default: the probe's best layer")] = None
    tokens: Annotated[
        Tokens | None,
        typer.Option(
            help="tokens that make up s; default: as the probe's figure on a shipped family was read, else all"
        ),
    ] = None
    batch_size: int = 8
    bootstrap: int = 1000
    seed: int = 0
    null: Annotated[int, typer.Option(help="random unit directions at the same layer and tokens (≥ 32)")] = 0
    force: ForceOpt = False
    max_length: Annotated[
        int | None, typer.Option(help="truncate longer texts to this many tokens (with a warning)")
    ] = None
    chat_template: ChatTemplateOpt = ChatTemplate.model
    limit: LimitOpt = None

    def settings(self) -> ScoreSettings:
        """The library's settings, every number checked."""
        from valueprobe.read.readout import (
            ScoreSettings,  # loads the library: when the command runs (cli/app.py)
        )

        for option, value, least in (
            ("--batch-size", self.batch_size, 1),
            ("--bootstrap", self.bootstrap, 0),
            ("--null", self.null, 0),
            ("--max-length", self.max_length, 1),
            ("--limit", self.limit, 1),
        ):
            check_at_least(option, value, least)
        given = {f.name: getattr(self, f.name) for f in fields(ScoreSettings)}
        return ScoreSettings(**given | {"tokens": self.tokens or Tokens.all})


@app.command("score")
@grouped
def score_command(
    probe: Annotated[Path, probe_option("the axis read")],
    data: Annotated[Path, data_option("the examples scored")],
    out: Annotated[Path, typer.Option(help="output folder: scores.csv, summary.json")],
    model: ModelOpt = "smollm2-135m",
    reading: ScoreOptions = ScoreOptions(),
    shard: ShardOpt = None,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Score a dataset on a probe: per-example val(s) and σ-score, per-group AUROC and Cohen's d."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.probe.readings import family_reading
    from valueprobe.read.readout import score_dataset
    from valueprobe.read.score_parts import SCORE_PARTS, score_part

    check_output_dir(out, holds="scores")
    settings = reading.settings()
    how = load.check()
    examples = read_jsonl(data)[: reading.limit]
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads; score_dataset checks the match
    recorded = family_reading(axis, data)
    how_read = f"tokens: {settings.tokens.value}"
    if reading.tokens is None and recorded is not None:
        settings = replace(settings, tokens=recorded.tokens)
        how_read = (
            f"tokens: {recorded.tokens.value}, as {probe.name}'s {recorded.family} figure was read"
            f" ({recorded.note}; --tokens all reads every token)"
        )

    def work(part_out: Path, part: ShardSpec, on: str) -> None:
        lm = how.load(model, device=on)
        info = DatasetInfo(str(data), sha256_file(data), len(examples))
        score_part(axis, lm, examples, shard=part, dataset=info, settings=settings).write(part_out)
        console.print(
            f"wrote {part_out}/scores.csv, part.json (shard {part}): `valueprobe merge` joins the parts"
        )

    if run_sharded(out, shard, how.device, work, SCORE_PARTS):
        return
    lm = how.load(model)
    res = score_dataset(axis, lm, examples, settings)
    files = res.write(out)
    headers, rows = res.table()
    table(f"score: {probe.name} layer {res.layer} on {data.name}; {how_read}", headers, rows)
    console.print("wrote " + ", ".join(str(p) for p in files.values()))


@replicate_app.command("axis")
@grouped
def replicate_axis_command(
    out: Annotated[Path, typer.Option(help="probe folder to write")] = Path("runs/replicate-axis"),
    model: ModelOpt = "smollm2-135m",
    data: Annotated[Path, data_dir_option("folder with the contrast datasets")] = SHIPPED_DATA,
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
    load: LoadOptions = LoadOptions(),
) -> None:
    """Capture every family, fit the axis on ICRL (paper's method), transfer matrix, matched control."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.replicate.axis import replicate_axis as run_replicate
    from valueprobe.report.plots import sweep_figure, transfer_heatmap

    how = load

    check_output_dir(out, holds="probe")
    check_output_dir(runs, holds="runs", option="--runs")
    if history_out is not None:
        check_output_dir(history_out, holds="probe", option="--history-out")
    check_at_least("--splits", splits, 1)
    check_at_least("--train-groups", train_groups, 1)
    check_at_least("--batch-size", batch_size, 1)
    how.check()
    lm = how.load(model)
    report = run_replicate(
        lm,
        data_dir=data,
        runs_dir=runs,
        out=out,
        n_splits=splits,
        train_groups=train_groups,
        seed=seed,
        batch_size=batch_size,
        history_out=history_out,
    )
    headers, rows = report.sweep.table()
    table("ICRL layer sweep (span_diff, held-out rules)", headers, rows)
    assert report.transfer is not None
    headers, rows = report.transfer.table()
    table(f"transfer matrix at layer {report.transfer.layer} (diff_means)", headers, rows)
    control = report.axis.metrics["icrl_matched_control"]
    table(
        f"ICRL matched control at layer {control['layer']}",
        ["contrast", "AUROC", "95% CI", "Cohen's d"],
        [
            [k, v["auroc"], f"[{v['auroc_ci'][0]:.3f}, {v['auroc_ci'][1]:.3f}]", v["cohens_d"]]
            for k, v in control.items()
            if isinstance(v, dict)
        ],
    )
    lens = report.axis.metrics["logit_lens"]
    console.print("logit lens, promoted:   " + " ".join(repr(t) for t, _ in lens["promoted"][:12]))
    console.print("logit lens, suppressed: " + " ".join(repr(t) for t, _ in lens["suppressed"][:12]))
    write_figure(sweep_figure(report.sweep), runs / "sweep.html")
    write_figure(transfer_heatmap(report.transfer), runs / "transfer.html")
    console.print(report.summary())
    if history_out is not None:
        _print_history(ValueAxis.load(history_out))
    console.print(f"wrote {out}/ (axis.safetensors, probe.json) and {runs}/sweep.html, transfer.html")


def _print_history(history: ValueAxis) -> None:
    """The reward-history axis's table: its held-out AUROC and each family it was scored on."""
    sweep = history.metrics["sweep"]
    table(
        f"reward-history axis (main vs control, identical text) at layer {history.best_layer}: held-out-rule"
        f" AUROC {sweep['heldout_auroc']['mean']:.3f}, margin {sweep['margin']:+.3f}; scored without refitting on",
        ["family", "AUROC", "95% CI", "Cohen's d", "embed AUROC"],
        [
            [
                k,
                v["auroc"],
                f"[{v['auroc_ci'][0]:.3f}, {v['auroc_ci'][1]:.3f}]",
                v["cohens_d"],
                v.get("embed_auroc"),
            ]
            for k, v in history.metrics["evaluated_on"].items()
        ],
    )
