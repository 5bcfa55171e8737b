"""``valueprobe eval``: a task of an evaluation harness (lm-eval or Inspect) under steering, across α,
beside random directions of the same norm.

    valueprobe eval --harness lm-eval --task arithmetic --probe smollm2-135m-value --unit norm \\
        --alphas -30,0,30 --random-directions 8 --limit 40 --out runs/eval-arithmetic
    valueprobe eval --harness inspect --task corrigible_ab --spec runs/spec.json --alphas -1,0,1 --out runs/e
    valueprobe eval ... --shard 0/2 --out runs/e.part0;  valueprobe merge runs/e runs/e.part0 runs/e.part1

Needs the ``[evals]`` extra. Every check is made before the model loads: the task is a shipped one
(the hub is unreachable; `valueprobe.evals.tasks`), the harness is known, |α| is within the
server's cap (unless ``--allow-large``), the output folder is usable; then, before any harness
starts, the probe must fit the model (as ``steer`` refuses one).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import (
    ForceOpt,
    LoadOptions,
    ModelOpt,
    RandomDirectionsOpt,
    ShardOpt,
    app,
    console,
    run_sharded,
    table,
)
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.cli.spec import SpecOptions
from valueprobe.cli.steer import parse_alphas
from valueprobe.errors import ValueprobeError
from valueprobe.evals.tasks import shipped_task
from valueprobe.files import atomic_write_text, check_output_dir, markdown_table
from valueprobe.probe.registry import portable_name
from valueprobe.vocab import ShardSpec

if TYPE_CHECKING:
    from valueprobe.evals.records import EvalResult, EvalSettings
    from valueprobe.model.load import LoadedModel

__all__ = ["EvalOptions", "eval_command"]


def _command(
    settings: EvalSettings, steering: SpecOptions, *, model: str, out: Path, allow_large: bool
) -> str:
    """The command that makes this run, as its summary states it (a shipped probe by its name)."""
    s = settings
    words = ["valueprobe eval", f"--harness {s.harness}", f"--task {s.task}", f"--model {model}"]
    default = SpecOptions()
    for f in fields(SpecOptions):
        value = getattr(steering, f.name)
        if value is None or value == getattr(default, f.name):
            continue
        text = portable_name(value) if f.name == "probe" else getattr(value, "value", value)
        words.append(
            f"--{'spec' if f.name == 'spec_file' else f.name.replace('_', '-')} {shlex.quote(str(text))}"
        )
    words.append(f"--alphas={','.join(f'{a:g}' for a in s.alphas)}")
    words.append(f"--random-directions {s.random_directions}")
    if s.limit is not None:
        words.append(f"--limit {s.limit}")
    words += [f"--batch-size {s.batch_size}", f"--seed {s.seed}"]
    if allow_large:
        words.append("--allow-large")
    words.append(f"--out {shlex.quote(str(out))}")
    return " ".join(words)


def _print(result: EvalResult, out: Path) -> None:
    headers, rows = result.table()
    s = result.settings
    table(f"{s.task} through {s.harness} ({result.metric}) -> {out}", headers, rows)


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class EvalOptions(OptionGroup):
    """How much of the task a run scores and against what null: ``--random-directions``,
    ``--seed`` (of those directions), ``--limit``, ``--batch-size`` (an option group,
    `valueprobe.cli.groups`); with the harness, the task and the strengths they are the run's
    `EvalSettings`."""

    panel = "Evaluation"

    random_directions: RandomDirectionsOpt = 8
    seed: Annotated[int, typer.Option(help="seed of the random directions")] = 0
    limit: Annotated[int | None, typer.Option(help="the first N items of the task (default: all)")] = None
    batch_size: Annotated[
        int, typer.Option(help="rows per batch (lm-eval) / samples in flight (Inspect)")
    ] = 16

    def settings(self, *, harness: str, task: str, alphas: str) -> EvalSettings:
        """The run's settings, each option checked (one line naming the one that cannot run)."""
        from valueprobe.evals.harness import (
            check_harness,  # loads the library: when the command runs (cli/app.py)
        )
        from valueprobe.evals.records import EvalSettings

        settings = EvalSettings(
            harness=check_harness(harness),
            task=shipped_task(task).name,
            alphas=parse_alphas(alphas),
            random_directions=self.random_directions,
            limit=self.limit,
            seed=self.seed,
            batch_size=self.batch_size,
        )
        for option, value, least in (
            ("--random-directions", self.random_directions, 0),
            ("--limit", self.limit, 1),
            ("--batch-size", self.batch_size, 1),
        ):
            if value is not None and value < least:
                raise ValueprobeError(f"{option} {value}: give a whole number >= {least}")
        return settings


@app.command("eval")
@grouped
def eval_command(
    harness: Annotated[str, typer.Option(help="lm-eval | inspect")],
    task: Annotated[str, typer.Option(help="a shipped task: arithmetic | corrigible_ab")],
    alphas: Annotated[str, typer.Option(help="strengths in --unit, e.g. -30,0,30 (0: the unsteered model)")],
    out: Annotated[Path, typer.Option(help="folder for eval.json, eval.csv, eval.html")],
    model: ModelOpt = "smollm2-135m",
    run: EvalOptions = EvalOptions(),
    allow_large: Annotated[bool, typer.Option(help="allow |α| past the server's cap")] = False,
    shard: ShardOpt = None,
    force: ForceOpt = False,
    loading: LoadOptions = LoadOptions(),
    steering: SpecOptions = SpecOptions(),
) -> None:
    """Run a shipped harness task under steering across α, with random directions as the null."""
    from valueprobe.evals.parts import EVAL_PARTS, PART  # loads the library: when the command runs
    from valueprobe.evals.run import eval_part, run_eval
    from valueprobe.evals.steering import check_alphas, check_fit
    from valueprobe.model.load import check_model_folder

    settings = run.settings(harness=harness, task=task, alphas=alphas)
    spec = steering.to_spec().check()
    how = loading.check()
    check_output_dir(out, holds="eval")
    check_model_folder(model)

    def ready(device: str | None = None) -> LoadedModel:
        lm = how.load(model, device=device)
        check_fit(lm, spec, force=force)
        check_alphas(spec, list(settings.alphas), n_layers=lm.n_layers, allow_large=allow_large)
        return lm

    def work(part: Path, shard_spec: ShardSpec, device: str) -> object:
        lm = ready(device)
        done = eval_part(lm, spec, settings, out=part, shard=shard_spec)
        console.print(f"wrote part {shard_spec} ({len(done.points)} settings) to {part / PART}")
        return done

    if run_sharded(out, shard, how.device, work, EVAL_PARTS):
        return
    result = run_eval(ready(), spec, settings, out=out)
    command = _command(settings, steering, model=model, out=out, allow_large=allow_large)
    md = [
        f"# {settings.task} through {settings.harness}: {result.metric} against α",
        "",
        *markdown_table(*result.table(), cell=_cell),
        "",
        "Made by:",
        "",
        "```",
        command,
        "```",
    ]
    atomic_write_text(out / "summary.md", "\n".join(md) + "\n")
    _print(result, out)
