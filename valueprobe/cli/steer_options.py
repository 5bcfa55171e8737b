"""What ``valueprobe steer`` adds for judging steering: prompt conditions.

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl \\
        --conditions toward,away,reworded --out runs/steer-open      # the prompting baseline beside steering

``--conditions`` is resolved here, before any model loads, against the conditions file
(`valueprobe.steering.experiment.prompting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from valueprobe.cli.app import console
from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file
from valueprobe.steering.experiment.prompting import conditions_path, parse_conditions, read_conditions

__all__ = [
    "AUTO",
    "Conditions",
    "ConditionsFileOpt",
    "ConditionsOpt",
    "check_prompt_set",
    "resolve_conditions",
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


def check_prompt_set(examples: list[Example], conditions: Conditions) -> None:
    """Conditions apply to chats: refuse plain-text prompts with a system prompt, in one line."""
    if conditions.names and any(ex.messages is None for ex in examples):
        raise ValueprobeError(
            "--conditions put a system prompt or a second wording on chat prompts: these prompts are plain"
            " text; give a chat JSONL (messages) or --conditions none"
        )
