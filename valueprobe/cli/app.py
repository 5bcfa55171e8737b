"""The typer app, its command groups and the helpers every command module shares.

Command modules (``cli_capture_fit``, ``cli_steer``, ``cli_trace``, ``cli_tune``) import this module and
register their commands on its app; ``valueprobe.cli.main`` imports them all and runs the app. Imports point
one way: nothing here imports a command module.

**Fast start.** ``valueprobe --help`` and every ``valueprobe VERB --help`` import every command
module, so a command module imports at its top only what declaring its options needs: typer, the
option groups, the enums of `valueprobe.vocab`, the shipped names. The library (torch,
transformers, plotly, the capture stack) is imported inside the command, when it runs
(``benchmarks/cli_start.py`` times it; ``tests/test_layout.py`` checks that no help loads torch).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from valueprobe.cli.groups import OptionGroup
from valueprobe.datasets import shipped
from valueprobe.errors import ValueprobeError
from valueprobe.files import write_html
from valueprobe.probe.registry import resolve_axis_name, shipped_axes
from valueprobe.version import __version__
from valueprobe.vocab import ChatTemplate, ModelDtype, ShardSpec

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from valueprobe.model.load import LoadedModel
    from valueprobe.sharded import PartKind

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find, read and steer the value axis of language models.",
)
datasets_app = typer.Typer(no_args_is_help=True, help="Build the contrast datasets.")
app.add_typer(datasets_app, name="datasets")


def _print_version(value: bool) -> None:
    if value:
        print(f"valueprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Find, read and steer the value axis of language models."""


replicate_app = typer.Typer(no_args_is_help=True, help="Rebuild the paper's results on a model.")
app.add_typer(replicate_app, name="replicate")
# Piped output (CI logs, files) gets a width that fits the transfer table instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)

LayersPathOpt = Annotated[str | None, typer.Option(help="dotted path of the decoder blocks, if not detected")]
TrustOpt = Annotated[bool, typer.Option(help="run the model repository's own code: only if you trust it")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")]
DeviceMapOpt = Annotated[
    str | None,
    typer.Option(
        help="auto: spread the model over the GPUs, then CPU, then disk (accelerate); replaces --device"
    ),
]
ModelDtypeOpt = Annotated[
    ModelDtype,
    typer.Option(
        "--model-dtype",
        help="dtype the model's weights load and run in; auto: the checkpoint's own (config.json)."
        " Reads (cos, σ) and steering vectors stay float32",
    ),
]
OffloadFolderOpt = Annotated[
    Path | None,
    typer.Option(help="with --device-map: folder for the blocks that fit neither GPU nor CPU memory"),
]
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
LimitOpt = Annotated[int | None, typer.Option(help="only the first N examples of the dataset")]
AllowLargeOpt = Annotated[
    bool,
    typer.Option(
        help="run strengths past 100% of the layer's mean residual norm (refused otherwise); recorded in the output"
    ),
]
AllowPartialOpt = Annotated[
    bool, typer.Option(help="read a store whose capture did not finish (its row count is printed)")
]

ShardOpt = Annotated[
    ShardSpec | None,
    typer.Option(
        parser=ShardSpec.parse,
        metavar="I/N",
        help="run shard I of N (0-based; contiguous blocks of the dataset) and write a part;"
        " `valueprobe merge` joins the N parts. Under torchrun: RANK/WORLD_SIZE",
    ),
]


def probe_option(help: str) -> Any:
    """A ``--probe``-like option: a shipped axis by name (`valueprobe.probe.registry`) or a probe folder."""
    names = ", ".join(shipped_axes())
    return typer.Option(
        parser=_probe, metavar="NAME|FOLDER", help=f"{help}: a shipped axis ({names}) or a folder"
    )


def data_option(help: str) -> Any:
    """A dataset option: a shipped dataset by name (`valueprobe.datasets.shipped`, e.g. ``code``) or a JSONL path."""
    return typer.Option(
        parser=_dataset, metavar="NAME|JSONL", help=f"{help}: a shipped dataset's name or a path"
    )


# On the command line every value is text as typed (a default given as a Path too): a name is a
# name, ``./NAME`` the folder here. A probe is only resolved here; `ValueAxis.load` says what is
# wrong with a missing one (listing the shipped names) when the command reads it, after its
# checks; `read_jsonl` does the same for a dataset.
def _probe(text: str | Path) -> Path:
    return resolve_axis_name(str(text))


def _dataset(text: str | Path) -> Path:
    return shipped.resolve_dataset_name(str(text))


def data_dir_option(help: str) -> Any:
    """A folder of datasets, by default the shipped ones (`valueprobe.datasets.shipped.DATA_DIR`)."""
    return typer.Option(help=f"{help} (default: the shipped datasets)", show_default=False)


# What a folder of datasets defaults to: the package's own copy of data/, readable from any folder.
SHIPPED_DATA = shipped.DATA_DIR

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="alias (smollm2-135m), model folder, .gguf, or hub id")
]
RandomDirectionsOpt = Annotated[
    int, typer.Option("--random-directions", help="random unit directions steered as the null")
]
# `--random-directions` was `--controls` (a word the probe baselines also use): the old spelling
# still works, and stays out of --help.
ControlsOpt = Annotated[int | None, typer.Option("--controls", hidden=True)]


@dataclass(frozen=True)
class LoadOptions(OptionGroup):
    """How a command loads its model: ``--device``, ``--device-map``, ``--model-dtype``,
    ``--offload-folder``, ``--layers-path``, ``--trust-remote-code`` (an option group, `grouped`).

    >>> how = LoadOptions(device_map="auto", model_dtype=ModelDtype.bfloat16).check()  # before any work
    >>> lm = how.load("Qwen/Qwen3-8B")   # valueprobe.model.load.load with these options
    """

    panel = "Loading the model"

    device: DeviceOpt = "cpu"
    device_map: DeviceMapOpt = None
    model_dtype: ModelDtypeOpt = ModelDtype.float32
    offload_folder: OffloadFolderOpt = None
    layers_path: LayersPathOpt = None
    trust_remote_code: TrustOpt = False

    @property
    def dtype(self) -> ModelDtype:
        """The dtype the weights load and run in (``--model-dtype``)."""
        return self.model_dtype

    def check(self) -> LoadOptions:
        """Refuse, in one line and before anything loads, options that cannot go together; returns
        these options. (That the device runs the dtype, and that accelerate can split the model,
        `load` checks itself.)"""
        from valueprobe.model.load import check_device  # torch: loaded when a command runs (module doc)

        check_device(self.device)
        if self.offload_folder is not None and self.device_map is None:
            raise ValueprobeError(
                "--offload-folder holds the blocks --device-map puts on disk: add --device-map auto, or drop it"
            )
        ranked = ShardSpec.from_env()
        if self.device_map is not None and ranked is not None:
            raise ValueprobeError(
                f"--device-map under torchrun ({ranked.count} ranks): each rank would spread the whole model"
                " over every GPU; run one process with --device-map, or torchrun with --device cuda"
            )
        return self

    def load(self, spec: str, *, device: str | None = None) -> LoadedModel:
        """The model ``spec`` loaded as these options say; ``device`` (a torchrun rank's GPU, see
        :func:`run_sharded`) replaces ``--device``."""
        from valueprobe.model.load import load  # torch: loaded when a command runs (module doc)

        return load(
            spec,
            dtype=self.model_dtype.value,
            device=self.device if device is None else device,
            device_map=self.device_map,
            offload_folder=None if self.offload_folder is None else str(self.offload_folder),
            trust_remote_code=self.trust_remote_code,
            layers_path=self.layers_path,
        )


def renamed(ctx: typer.Context, name: str, value: int, *, old: str, old_value: int | None) -> int:
    """The value of option ``name``, or of its hidden old spelling ``old`` when only that was given.

    Both given with different values is bad input (one clear line, exit 2).
    """
    if old_value is None:
        return value
    # typer vendors its own click, so its ParameterSource is compared by name, not to click's enum
    source = ctx.get_parameter_source(name.lstrip("-").replace("-", "_"))
    given = source is not None and source.name == "COMMANDLINE"
    if given and value != old_value:
        raise ValueprobeError(
            f"{name} {value} and {old} {old_value} disagree: give {name} only ({old} is its old name)"
        )
    return old_value


def refuse_renamed(old: str, value: object, new: str, meaning: str) -> None:
    """An option's old spelling, given: one line naming the new one (no silent alias).

    >>> refuse_renamed("--prompts", "24", "--n-prompts", "prompts per task")
    """
    if value is not None:
        raise ValueprobeError(
            f"{old} is now {new} ({meaning}; {old} names a dataset in every other command): give {new} {value}"
        )


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print one summary table."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r])
    console.print(t)


def write_figure(fig: go.Figure, path: Path) -> Path:
    """One self-contained HTML file in a folder made if missing (`valueprobe.files.write_html`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_html(fig, path)


# The modules that declare a kind of part (`valueprobe.sharded.declare`). Command modules load the
# library only when their command runs, so ``valueprobe merge`` imports these to know every kind by
# its marker. A module that calls ``declare`` belongs in this tuple.
PART_MODULES = (
    "valueprobe.activations.parts",
    "valueprobe.read.score_parts",
    "valueprobe.steering.experiment.sweep_parts",
    "valueprobe.tune.shift_parts",
    "valueprobe.attribute.parts",
    "valueprobe.evals.parts",
)


def declare_kinds() -> None:
    """Import every module of `PART_MODULES`, declaring its kind of part (once per process)."""
    for module in PART_MODULES:
        importlib.import_module(module)


def print_merged(out: Path, parts: Sequence[Path], kind: PartKind[Any, Any] | None = None) -> None:
    """Merge the parts of a sharded run into ``out`` (`valueprobe.sharded.merge`; ``kind`` default
    the one the first part's marker names), write its page (`valueprobe.report.views`) and print
    its table."""
    from valueprobe.report.views import write_view  # loads the library: when the command runs
    from valueprobe.sharded import kind_of, merge

    declare_kinds()
    result = merge(out, parts, kind)
    kind = kind or kind_of(Path(parts[0]))
    assert kind is not None  # merge found it
    write_view(result, out)
    table(f"{kind.command} (merged)", *result.table())


def run_sharded(
    out: Path,
    shard: ShardSpec | None,
    device: str,
    work: Callable[[Path, ShardSpec, str], object],
    kind: PartKind[Any, Any],
) -> bool:
    """A part of a sharded job of ``kind``, if this is one; True when it was.

    With ``--shard I/N``: ``work(out, shard, device)`` writes the part. Under torchrun (RANK and
    WORLD_SIZE > 1, no ``--shard``): ``work`` writes this rank's part (OUT.parts/part-R-of-N) on
    its own GPU, the ranks meet, and rank 0 merges them (`print_merged`,
    `valueprobe.sharded.run_ranks`). Otherwise False: the caller runs the whole job. Naming its
    ``kind`` here, the command that writes the parts has declared it before anyone merges them.
    """
    from valueprobe.sharded import rank_device, run_ranks  # torch: loaded when a command runs

    ranked = ShardSpec.from_env() if shard is None else None
    if ranked is not None:
        merged = functools.partial(print_merged, kind=kind)
        run_ranks(out, ranked, lambda part: work(part, ranked, rank_device(device)), merged)
        return True
    if shard is not None:
        work(out, shard, device)
        return True
    return False
