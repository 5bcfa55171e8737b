"""``valueprobe attribute``: which components write the axis, and which carry it (direct, patch, attrib-patch).

    valueprobe attribute --probe probes/smollm2-135m-reward-history --data data/icrl_pairs.jsonl \\
        --positions spans --span-labels post --method direct --ablate-top 8 --out runs/attr-direct
    valueprobe attribute --probe probes/smollm2-135m-reward-history --data data/icrl_pairs.jsonl \\
        --positions spans --span-labels post --method patch --resid-layers ::4 --limit 4 --out runs/attr-patch

Writes attribution.json, components.csv and attribution.html into OUT; a rerun of the same command
resumes after the last finished item (Ctrl-C exits 130 and keeps them); ``--shard I/N`` writes a
part that ``valueprobe merge`` joins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from valueprobe.activations.manifest import DatasetInfo
from valueprobe.attribute.records import Attribution
from valueprobe.cli.app import (
    SHIPPED_DATA,
    ChatTemplateOpt,
    DeviceMapOpt,
    DeviceOpt,
    ForceOpt,
    LoadOptions,
    ModelDtypeOpt,
    ModelOpt,
    OffloadFolderOpt,
    ShardOpt,
    app,
    console,
    data_dir_option,
    data_option,
    probe_option,
    replicate_app,
    run_sharded,
    table,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, sha256_file
from valueprobe.vocab import ChatTemplate, ModelDtype, Positions, ShardSpec, Target

if TYPE_CHECKING:
    from valueprobe.attribute.run import AttributeSettings

MethodOpt = Annotated[
    str,
    typer.Option(help="direct: split h_L·v̂ into heads, MLPs, embedding | patch: exact activation patching of"
                 " matched pairs | attrib-patch: its gradient estimate (one forward and backward per pair)"),
]  # fmt: skip
BehaviourOpt = Annotated[
    str,
    typer.Option(
        help="yes-no: read the yes/no logit difference at the last token | none | auto: where meta.behaviour says"
    ),
]


ProbeOpt = Annotated[Path, probe_option("the axis attributed")]
DataOpt = Annotated[
    list[Path], data_option("dataset (repeat for several): a contrast, or matched pairs (icrl_pairs)")
]
OutOpt = Annotated[
    Path, typer.Option(help="output folder: attribution.json, components.csv, attribution.html")
]
SpanLabelsOpt = Annotated[
    str | None, typer.Option(help="with span positions: keep these labels (comma list)")
]
ResidLayersOpt = Annotated[
    str, typer.Option(help="layers whose residual cells patching moves (a layer spec over 0..L, or none)")
]
AblateTopOpt = Annotated[int | None, typer.Option(help="mean-ablate the top k components on held-out groups")]
RandomOpt = Annotated[
    int,
    typer.Option("--random", help="random directions: the null of each direct term (and --draws' default)"),
]
DrawsOpt = Annotated[
    int | None, typer.Option(help="random sets of components the ablation is set against (default --random)")
]
SteerSigmaOpt = Annotated[
    float, typer.Option(help="α (σ) of the steering whose effect the ablation measures")
]


def print_attribution(res: Attribution, out: Path) -> None:
    """Write attribution.html beside the JSON and print the table."""
    from valueprobe.report.attribution import (
        write_attribution_html,  # loads the library: when the command runs (cli/app.py)
    )

    write_attribution_html(res, out / "attribution.html")
    headers, rows = res.table()
    title = f"{res.method}: axis at layer {res.layer}, gap {res.axis_gap:+.3f}σ (AUROC {res.axis_auroc:.3f}), {res.n_units} units"
    table(title, headers, rows)
    if res.ablation is not None:
        ab = res.ablation
        table(
            f"ablating the top {ab.k} ({', '.join(ab.components)}) on {ab.n_units} held-out units, vs {ab.n_draws} random sets",
            ["measure", "nothing ablated", "top-k ablated", "drop", "random drops (95%)", "necessary"],
            [[m.name, f"{m.none:+.3f}", f"{m.top:+.3f}", f"{m.drop:+.3f}", f"[{m.null_drops[0]:+.3f}, {m.null_drops[1]:+.3f}]",
              "yes" if m.necessary else "no"] for m in ab.metrics],
        )  # fmt: skip
    console.print(f"wrote {out}/attribution.json, components.csv, attribution.html")


def _data(paths: Sequence[Path]) -> tuple[list[Example], tuple[DatasetInfo, ...]]:
    examples: list[Example] = []
    infos = []
    for path in paths:
        rows = read_jsonl(path)
        examples += rows
        infos.append(DatasetInfo(str(path), sha256_file(path), len(rows)))
    return examples, tuple(infos)


def _check(
    out: Path,
    settings: AttributeSettings,
    ablate_top: int | None,
    draws: int | None,
    shard: ShardSpec | None,
    steer_sigma: float,
) -> None:
    from valueprobe.attribute.folder import (
        check_run_out,  # loads the library: when the command runs (cli/app.py)
    )

    check_run_out(out)
    settings.check()
    check_at_least("--ablate-top", ablate_top, 1)
    check_at_least("--draws", draws, 1)
    check_at_least("--bootstrap", settings.bootstrap, 0)
    if steer_sigma <= 0:
        raise ValueprobeError(f"--steer-sigma {steer_sigma} must be > 0")
    if ablate_top is not None and shard is not None:
        raise ValueprobeError(
            "--ablate-top ranks every item, so it does not run in a part: merge the parts, then rerun this"
            " command without --shard on the merged folder (only the ablation runs)"
        )


@dataclass(frozen=True)
class AttributionOptions(OptionGroup):
    """What ``valueprobe attribute`` computes: the method, the rows read, the null and the ablation
    (an option group, `valueprobe.cli.groups.grouped`)."""

    panel = "Attribution"

    method: MethodOpt = "direct"
    layer: Annotated[int | None, typer.Option(help="read layer; default the probe's best")] = None
    positions: Annotated[Positions, typer.Option(help="token rows the axis is read on")] = Positions.last
    span_labels: SpanLabelsOpt = None
    target: Annotated[Target, typer.Option(help="the classes: span (post vs pre), label, auto")] = Target.auto
    behaviour: BehaviourOpt = "auto"
    resid_layers: ResidLayersOpt = "all"
    ablate_top: AblateTopOpt = None
    random: RandomOpt = 32
    draws: DrawsOpt = None
    steer_sigma: SteerSigmaOpt = 2.0
    limit: Annotated[int | None, typer.Option(help="the first N examples (direct) or pairs (patching)")] = (
        None
    )
    batch_size: Annotated[int, typer.Option(help="examples per forward")] = 8
    bootstrap: Annotated[int, typer.Option(help="bootstrap resamples of each class difference")] = 1000
    seed: Annotated[int, typer.Option(help="seed of the random directions, sets and resamples")] = 0
    max_length: Annotated[int | None, typer.Option(help="truncate longer texts (with a warning)")] = None
    chat_template: ChatTemplateOpt = ChatTemplate.model

    def settings(self) -> AttributeSettings:
        """The run's settings record (its identity on disk)."""
        from valueprobe.attribute.run import (  # loads the library: when the command runs (cli/app.py)
            AttributeSettings,
            Behaviour,
            Method,
        )

        labels = (
            tuple(x.strip() for x in self.span_labels.split(",") if x.strip()) if self.span_labels else None
        )
        if self.behaviour not in ("auto", "yes-no", "none"):
            raise ValueprobeError(f"unknown --behaviour {self.behaviour!r}: use auto, yes-no or none")
        return AttributeSettings(
            method=cast(Method, self.method), layer=self.layer, positions=self.positions, span_labels=labels,
            target=self.target, behaviour=cast(Behaviour, self.behaviour), resid_layers=self.resid_layers,
            n_random=self.random, seed=self.seed, batch_size=self.batch_size, bootstrap=self.bootstrap,
            max_length=self.max_length, chat_template=self.chat_template, limit=self.limit,
        )  # fmt: skip


@app.command("attribute")
@grouped
def attribute_command(
    probe: ProbeOpt,
    data: DataOpt,
    out: OutOpt,
    model: ModelOpt = "smollm2-135m",
    force: ForceOpt = False,
    shard: ShardOpt = None,
    attribution: AttributionOptions = AttributionOptions(),
    load: LoadOptions = LoadOptions(),
) -> None:
    """Where value comes from: split the axis reading into heads and MLPs, patch matched pairs, ablate."""
    from valueprobe.attribute.parts import ATTRIBUTION_PARTS  # loads the library: when the command runs
    from valueprobe.attribute.run import Provenance, run_attribution
    from valueprobe.probe.axis import ValueAxis

    how, opts = load, attribution
    settings = opts.settings()
    ablate_top, draws, steer_sigma, device = opts.ablate_top, opts.draws, opts.steer_sigma, load.device
    _check(out, settings, ablate_top, draws, shard, steer_sigma)
    how.check()
    examples, infos = _data(data)
    ValueAxis.load(probe)  # a bad probe fails before the model loads
    source = Provenance(str(probe), sha256_file(probe / "axis.safetensors"), infos)

    def run(part_out: Path, part: ShardSpec | None, on: str) -> Attribution | None:
        lm = how.load(model, device=on)
        checked = ValueAxis.load(probe, lm=lm, force=force)
        return run_attribution(
            lm, checked, examples, part_out, settings, source=source, shard=part, ablate_top=ablate_top,
            n_draws=draws, steer_sigma=steer_sigma, announce=console.print,
        )  # fmt: skip

    def part(part_out: Path, piece: ShardSpec, on: str) -> None:
        run(part_out, piece, on)
        console.print(f"wrote {part_out} (shard {piece}): `valueprobe merge` joins the parts")

    if run_sharded(out, shard, device, part, ATTRIBUTION_PARTS):
        return
    res = run(out, None, device)
    assert res is not None
    print_attribution(res, out)


@replicate_app.command("attribute")
def replicate_attribute_command(
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-attribute"),
    work: Annotated[Path, typer.Option(help="where the runs resume from")] = Path(
        "runs/attribution-smollm2-135m"
    ),
    model: ModelOpt = "smollm2-135m",
    data: Annotated[Path, data_dir_option("folder with icrl_pairs.jsonl")] = SHIPPED_DATA,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    model_dtype: ModelDtypeOpt = ModelDtype.float32,
    offload_folder: OffloadFolderOpt = None,
) -> None:
    """Where value comes from on both shipped axes: direct attribution with ablation, patching, agreement."""
    from valueprobe.attribute.folder import (
        check_run_out,  # loads the library: when the command runs (cli/app.py)
    )
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.replicate.attribute import JOBS, PAIRS, replicate_attribute

    how = LoadOptions(device, device_map, model_dtype, offload_folder).check()
    check_output_dir(out, holds="attribution results")
    pairs = data / PAIRS
    if not pairs.is_file():
        raise ValueprobeError(
            f"{pairs} does not exist: build it with valueprobe datasets build --family icrl_pairs"
        )
    read_jsonl(pairs)
    for job in JOBS:
        ValueAxis.load(job.probe)  # a missing probe fails before the model loads
        check_run_out(work / job.name)
    results = replicate_attribute(how.load(model), out, work=work, data_dir=data, announce=console.print)
    table(
        f"replicate attribute -> {out}",
        ["job", "method", "axis gap σ", "AUROC", "top components"],
        [
            [name, r.method, f"{r.axis_gap:+.3f}", f"{r.axis_auroc:.3f}", ", ".join(r.top(4))]
            for name, r in results.items()
        ],
    )
    console.print(f"wrote {out}/results.json, summary.md and each job's attribution.json, components.csv")
