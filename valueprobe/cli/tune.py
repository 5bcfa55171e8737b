"""The tuning commands: ``valueprobe tune dpo|sft``, ``valueprobe shift`` and ``valueprobe replicate dpo-words|safety``.

    valueprobe tune dpo --data data/preference_words.jsonl --group preference_words/dolphin --out runs/tune/dolphin
    valueprobe replicate dpo-words --k 6 --avoid 2 --out probes/dpo-words-smollm2-135m
    valueprobe replicate safety --out probes/safety-smollm2-135m

Registers itself on the app of :mod:`valueprobe.cli.app`; :mod:`valueprobe.cli.main` imports it.
Options are checked before any model loads; the work is one library call each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple, TypeVar

import typer

from valueprobe.activations.manifest import DatasetInfo
from valueprobe.cli.app import (
    SHIPPED_DATA,
    ForceOpt,
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
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, sha256_file
from valueprobe.probe.registry import probe_path
from valueprobe.tune.pairs import data_record, read_pairs
from valueprobe.vocab import LayerSelection, Positions, ShardSpec, TuneMethod

if TYPE_CHECKING:
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.tune.shift import ShiftResult, ShiftSettings

__all__ = [
    "replicate_dpo_words_command",
    "replicate_safety_command",
    "shift_command",
    "tune_command",
]

R = TypeVar("R")


def _print(title: str, headers: list[str], rows: list[list[object]]) -> None:
    table(title, headers, rows)
    console.print()


def _say(text: str) -> None:
    console.print(text)


TuneSteps = Annotated[int, typer.Option(help="stop after this many steps (-1: run the epochs)")]


@dataclass(frozen=True)
class TrainOptions(OptionGroup):
    """How ``tune`` trains (`TuneSettings`, as options)."""

    panel = "Training"

    lora: Annotated[
        bool, typer.Option("--lora/--full", help="LoRA adapter (r 16, α 32) or full fine-tuning")
    ] = True
    beta: Annotated[float, typer.Option(help="DPO β (sigmoid loss); SFT ignores it")] = 0.1
    epochs: float = 1.0
    seed: int = 0
    lr: float = 3e-4
    batch_size: int = 8
    max_steps: TuneSteps = -1


@app.command("tune")
@grouped
def tune_command(
    method: Annotated[
        TuneMethod,
        typer.Argument(help="dpo: TRL's DPOTrainer (sigmoid loss) | sft: SFTTrainer on prompt + chosen"),
    ],
    data: Annotated[Path, data_option("pairs: prompt/chosen/rejected rows, or preference_* dataset rows")],
    out: Annotated[Path, typer.Option(help="checkpoint folder (written as OUT.partial, renamed when done)")],
    model: ModelOpt = "smollm2-135m",
    training: TrainOptions = TrainOptions(),
    group: Annotated[
        str | None, typer.Option(help="train on these groups only: 'preference_words/dolphin,...'")
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="train on rows with this meta.split only, e.g. train")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out")] = False,
) -> None:
    """Fine-tune with TRL and a LoRA adapter: tune dpo, or tune sft (loss on the completion only).
    Rerun the same command to resume an interrupted run."""
    from valueprobe.tune.train import (  # loads the library: when the command runs (cli/app.py)
        TuneSettings,
        check_out,
        train,
    )

    check_out(out, overwrite=overwrite)
    groups = [g.strip() for g in group.split(",") if g.strip()] if group else None
    t = training
    settings = TuneSettings(
        method=method,
        lora=t.lora,
        beta=t.beta,
        epochs=t.epochs,
        seed=t.seed,
        learning_rate=t.lr,
        batch_size=t.batch_size,
        max_steps=t.max_steps,
    )
    settings.check()  # before the pairs are read and before any model loads
    pairs = read_pairs(data, groups=groups, split=split)
    res = train(
        model,
        pairs,
        out,
        settings=settings,
        overwrite=overwrite,
        data=data_record(data, groups=groups, split=split),
    )
    headers, rows = res.table()
    _print(f"tune {method} -> {out}", headers, rows)
    _say(f"wrote {out}/ (load it with valueprobe.load({str(out)!r}))")


ShippedAxes = Annotated[
    str, typer.Option(help="shipped axes or probe folders, comma separated (each read at its best layer)")
]
SHIPPED = "smollm2-135m-value,smollm2-135m-reward-history"


def _axes(spec: str) -> dict[str, ValueAxis]:
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)

    paths = [probe_path(p.strip()) for p in spec.split(",") if p.strip()]
    return {p.name: ValueAxis.load(p) for p in paths}


class _Inputs(NamedTuple):
    """What every tuning replication takes from its command line."""

    model: str
    probes: str
    data: Path
    runs: Path
    epochs: float
    lr: float
    max_steps: int


def _replicate(run: Callable[..., R], inputs: _Inputs, **options: object) -> R:
    """Check the training settings, load the probes and the model, then run one replication."""
    from valueprobe.model.load import load  # loads the library: when the command runs (cli/app.py)
    from valueprobe.tune.train import TuneSettings

    settings = TuneSettings(epochs=inputs.epochs, learning_rate=inputs.lr, max_steps=inputs.max_steps)
    settings.check()
    axes = _axes(inputs.probes)
    return run(
        load(inputs.model),
        axes=axes,
        data_dir=inputs.data,
        runs_dir=inputs.runs,
        settings=settings,
        progress=_say,
        **options,
    )


@replicate_app.command("dpo-words")
def replicate_dpo_words_command(
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-dpo-words"),
    model: ModelOpt = "smollm2-135m",
    probes: ShippedAxes = SHIPPED,
    data: Annotated[Path, data_dir_option("folder with preference_words*.jsonl")] = SHIPPED_DATA,
    runs: Annotated[Path, typer.Option(help="where the tuned checkpoints go (reused on rerun)")] = Path(
        "runs/dpo-words-smollm2-135m"
    ),
    k: Annotated[int, typer.Option(help="prefer-word models")] = 6,
    avoid: Annotated[int, typer.Option(help="avoid-word models")] = 2,
    n_random: Annotated[int, typer.Option(help="random directions in the null")] = 32,
    epochs: float = 1.0,
    lr: float = 3e-4,
    max_steps: TuneSteps = -1,
    seed: int = 0,
) -> None:
    """DPO k models toward one word and `avoid` away from one; the axis ranking, control words and null."""
    from valueprobe.replicate.dpo_words import (  # loads the library: when the command runs (cli/app.py)
        replicate_dpo_words as run_dpo_words,
    )
    from valueprobe.replicate.dpo_words import write_words_report as write_words

    if k < 1 or avoid < 0 or k + avoid > 12 or n_random < 1:
        raise ValueprobeError(
            f"need 1 <= k, 0 <= avoid, k + avoid <= 12 target words and --n-random >= 1 (got {k}, {avoid})"
        )
    report = _replicate(
        run_dpo_words,
        _Inputs(model, probes, data, runs, epochs, lr, max_steps),
        k=k,
        avoid=avoid,
        n_random=n_random,
        seed=seed,
    )
    headers, rows = report.table()
    _print(f"DPO word preference ({k} prefer, {avoid} avoid models)", headers, rows)
    _say("wrote " + ", ".join(str(p) for p in write_words(report, out)))


@replicate_app.command("safety")
def replicate_safety_command(
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-safety"),
    model: ModelOpt = "smollm2-135m",
    probes: ShippedAxes = SHIPPED,
    data: Annotated[
        Path, data_dir_option("folder with preference_safety, refusal, sensitive JSONL")
    ] = SHIPPED_DATA,
    runs: Annotated[Path, typer.Option(help="where the tuned checkpoint goes (reused on rerun)")] = Path(
        "runs/safety-smollm2-135m"
    ),
    n_random: Annotated[int, typer.Option(help="random directions in the null")] = 32,
    per_group: Annotated[int | None, typer.Option(help="read at most this many prompts per group")] = None,
    epochs: float = 1.0,
    lr: float = 3e-4,
    max_steps: TuneSteps = -1,
    seed: int = 0,
) -> None:
    """DPO toward refusing harmful and answering benign; refusal rate and the shift of four prompt groups."""
    from valueprobe.replicate.safety import (  # loads the library: when the command runs (cli/app.py)
        replicate_safety as run_safety,
    )
    from valueprobe.replicate.safety import write_safety_report as write_safety

    if n_random < 1 or (per_group is not None and per_group < 2):
        raise ValueprobeError("--n-random must be >= 1 and --per-group >= 2")
    report = _replicate(
        run_safety,
        _Inputs(model, probes, data, runs, epochs, lr, max_steps),
        n_random=n_random,
        per_group=per_group,
        seed=seed,
    )
    headers, rows = report.table()
    _print("safety DPO: refusal and shift", headers, rows)
    _say("wrote " + ", ".join(str(p) for p in write_safety(report, out)))


# --- shift ---


@dataclass(frozen=True)
class ShiftOptions(OptionGroup):
    """How ``shift`` compares the models (`ShiftSettings`, as options)."""

    panel = "Shift"

    by: Annotated[str, typer.Option(help="group examples by: group | label | meta.KEY")] = "group"
    targeted: Annotated[str, typer.Option(help="comma-separated groups the tuning aimed at")] = ""
    layers: Annotated[
        LayerSelection | None,
        typer.Option(
            parser=LayerSelection.parse,
            metavar="SPEC",
            help="layers of the by-layer curves (default: the axis's)",
        ),
    ] = None
    layer: Annotated[int | None, typer.Option(help="headline layer (default: the probe's best)")] = None
    tokens: Annotated[Positions, typer.Option(help="tokens averaged per example")] = Positions.mean
    contrast: Annotated[bool, typer.Option(help="Cohen's d by label inside each group, before and after")] = (
        False
    )
    refit: Annotated[bool, typer.Option(help="refit diff-of-means axes on both models; cos per layer")] = (
        False
    )
    n_random: Annotated[int, typer.Option(help="random unit directions in the null")] = 32
    bootstrap: int = 1000
    seed: int = 0
    batch_size: int = 8

    def settings(self) -> ShiftSettings:
        """The library's settings, every number checked."""
        from valueprobe.tune.shift import (
            ShiftSettings,  # loads the library: when the command runs (cli/app.py)
        )

        check_at_least("--n-random", self.n_random, 1)
        check_at_least("--bootstrap", self.bootstrap, 0)
        check_at_least("--batch-size", self.batch_size, 1)
        return ShiftSettings(
            by=self.by,
            layers=self.layers,
            layer=self.layer,
            tokens=str(self.tokens),
            targeted=tuple(t.strip() for t in self.targeted.split(",") if t.strip()),
            contrast=self.contrast,
            n_random=self.n_random,
            refit=self.refit,
            n_boot=self.bootstrap,
            seed=self.seed,
            batch_size=self.batch_size,
        )


@app.command("shift")
@grouped
def shift_command(
    probe: Annotated[Path, probe_option("the base model's axis")],
    base: Annotated[str, typer.Option(help="base model: alias, folder, .gguf or hub id")],
    tuned: Annotated[str, typer.Option(help="tuned descendant: checkpoint folder (adapter or merged)")],
    data: Annotated[Path, data_option("the examples; their groups are compared")],
    out: Annotated[Path, typer.Option(help="new folder: shift.json, examples.csv, shift.html")],
    comparing: ShiftOptions = ShiftOptions(),
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
    force: ForceOpt = False,
    load: LoadOptions = LoadOptions(),
    shard: ShardOpt = None,
) -> None:
    """How tuning moved the axis: per-group shift in σ with CIs against random-direction and untargeted nulls."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.tune.shift import check_groups, group_by, shift
    from valueprobe.tune.shift_parts import SHIFT_PARTS

    if out.exists() and not overwrite:
        raise ValueprobeError(f"output folder {out} already exists: pass --overwrite or choose another --out")
    check_output_dir(out, holds="shift")
    settings = comparing.settings()
    how = load.check()
    examples = group_by(read_jsonl(data), settings.by)
    axis = ValueAxis.load(probe)
    check_groups(examples, targeted=settings.targeted, contrast=settings.contrast, refit=settings.refit)

    work = _shift_work(axis, base, tuned, data, examples, settings, how=how, force=force)
    if run_sharded(out, shard, how.device, work, SHIFT_PARTS):
        return
    base_lm, tuned_lm = how.load(base), how.load(tuned)
    res = shift(axis, base_lm, tuned_lm, examples, settings, force=force)
    print_shift(res, out, overwrite=overwrite, title=f"shift: {tuned} vs {base} on {probe.name}")


def _shift_work(
    axis: ValueAxis,
    base: str,
    tuned: str,
    data: Path,
    examples: list,
    settings: ShiftSettings,
    *,
    how: LoadOptions,
    force: bool,
) -> Callable[[Path, ShardSpec, str], None]:
    """One shard of a shift (both models loaded on ``on``) into its part folder."""
    from valueprobe.tune.shift_parts import (
        shift_part,  # loads the library: when the command runs (cli/app.py)
    )

    def work(part_out: Path, part: ShardSpec, on: str) -> None:
        base_lm, tuned_lm = (how.load(m, device=on) for m in (base, tuned))
        info = DatasetInfo(str(data), sha256_file(data), len(examples))
        shift_part(
            axis,
            base_lm,
            tuned_lm,
            examples,
            part_out,
            shard=part,
            dataset=info,
            settings=settings,
            force=force,
        )
        console.print(f"wrote {part_out}/shift-part.json, reads.safetensors (shard {part})")

    return work


def print_shift(res: ShiftResult, out: Path, *, overwrite: bool, title: str) -> None:
    """Write a shift's files (figure included) and print its table."""
    from valueprobe.report.plots import shift_figure  # loads the library: when the command runs (cli/app.py)

    res.write(out, overwrite=overwrite, figure=shift_figure(res))
    headers, rows = res.table()
    table(f"{title}, layer {res.layer} (σ of the base reference)", headers, rows)
    console.print(f"wrote {out}/shift.json, examples.csv, shift.html")
