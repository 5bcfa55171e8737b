"""What ``valueprobe steer`` adds for judging steering: prompt conditions and a steering spec file.

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl \\
        --conditions toward,away,reworded --out runs/steer-open      # the prompting baseline beside steering
    valueprobe steer --spec runs/tune/spec.json --prompts data/steer_open.jsonl --out runs/steer-chosen

Both are resolved here, before any model loads: ``--conditions`` against the conditions file
(`valueprobe.steering.prompting`), ``--spec`` into the options it names (`valueprobe.steering.spec_file`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NamedTuple

import typer

from valueprobe.cli.app import console
from valueprobe.datasets.io import Example, read_jsonl, sha256_file
from valueprobe.errors import ValueprobeError
from valueprobe.steering.prompting import conditions_path, parse_conditions, read_conditions
from valueprobe.steering.spec_file import SpecFile
from valueprobe.vocab import HookSite, Op, Unit

__all__ = [
    "AUTO",
    "Conditions",
    "ConditionsFileOpt",
    "ConditionsOpt",
    "PositionsOpt",
    "SpecOpt",
    "SteerOptions",
]

AUTO = "auto"
ConditionsOpt = Annotated[
    str,
    typer.Option(
        help="prompt conditions run beside the plain prompt: toward, away (system prompts asking for the"
        " behaviour and its opposite), reworded (a second wording); auto: toward,away where the conditions"
        " file states them; none: the plain prompt only"
    ),
]
ConditionsFileOpt = Annotated[
    Path | None,
    typer.Option(help="where the conditions are stated (default: steer_conditions.jsonl beside --prompts)"),
]
PositionsOpt = Annotated[str, typer.Option(help="steer all | prompt | generated positions")]
SpecOpt = Annotated[
    Path | None,
    typer.Option(help="a steering spec (valueprobe tune-steer's spec.json): its probe, layer, site, unit, op,"
                 " positions; α 0 and its alpha unless --alphas"),
]  # fmt: skip


@dataclass(frozen=True)
class Conditions:
    """The prompt conditions a sweep runs, the file that states them and its sha256."""

    names: tuple[str, ...] = ()
    file: str | None = None
    sha256: str | None = None


def resolve_conditions(text: str, file: Path | None, prompts: Path, examples: list[Example]) -> Conditions:
    """``--conditions`` checked against the file that states them (one line when one is not stated)
    and against the prompts (chats only).

    ``auto`` takes ``toward`` and ``away`` where the file states them for this prompt set, and
    nothing (with a note) where it does not.
    """
    path = conditions_path(prompts) if file is None else file
    if text.strip().lower() == AUTO:
        stated = set()
        if path.is_file():
            stated = {
                ex.meta.get("condition") for ex in read_jsonl(path) if ex.meta.get("set") == prompts.stem
            }
        names = tuple(c for c in ("toward", "away") if c in stated)
        if not names:
            console.print(
                f"note: no prompt conditions stated for {prompts.stem} in {path}: the plain prompt only"
            )
            return Conditions()
    else:
        names = parse_conditions(text)
        if not names:
            return Conditions()
    read_conditions(path, prompts.stem, names)  # each names a prompt: one line otherwise
    chosen = Conditions(names, str(path), sha256_file(path))
    check_prompt_set(examples, chosen)
    return chosen


def _given(ctx: typer.Context, name: str) -> bool:
    # typer vendors its own click, so its ParameterSource is compared by name
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


class SteerOptions(NamedTuple):
    """The options of ``steer`` a steering spec sets, as the command received them."""

    probe: Path | None
    layer: int | None
    site: HookSite | None
    unit: Unit
    op: Op
    lo: float | None
    hi: float | None
    target: float | None
    positions: str
    alphas: str


def apply_spec(ctx: typer.Context, spec_path: Path, options: SteerOptions) -> SteerOptions:
    """``options`` with the spec's values in their place; an option given on the command line that
    the spec sets otherwise is one line. ``alphas`` becomes ``0,α`` (off and the chosen strength)
    unless given."""
    spec = SpecFile.read(spec_path)
    site = None if spec.site is None else HookSite(spec.site)
    chosen = SteerOptions(
        Path(spec.probe), spec.layer, site, Unit(spec.unit), Op(spec.op), spec.lo, spec.hi, spec.target,
        spec.positions, options.alphas if _given(ctx, "alphas") else f"0,{spec.alpha:g}",
    )  # fmt: skip
    for name, given, value in zip(SteerOptions._fields[:-1], options, chosen, strict=False):
        if _given(ctx, name) and given != value:
            raise ValueprobeError(
                f"--{name.replace('_', '-')} {given} disagrees with --spec {spec_path} ({name} {value}):"
                " give one of them"
            )
    return chosen


def check_prompt_set(examples: list[Example], conditions: Conditions) -> None:
    """Conditions apply to chats: refuse plain-text prompts with a system prompt, in one line."""
    if conditions.names and any(ex.messages is None for ex in examples):
        raise ValueprobeError(
            "--conditions put a system prompt or a second wording on chat prompts: these prompts are plain"
            " text; give a chat JSONL (messages) or --conditions none"
        )
