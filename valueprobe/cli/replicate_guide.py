"""``valueprobe replicate guide``: guided decoding against its baselines on the checkable tasks.

    valueprobe replicate guide --tasks arithmetic --n-prompts 24 --samples 8 --out probes/guide-smollm2-135m

Checks the probes, the task files (an answer that does not parse: one line naming file:line),
the sizes and the output folder before the model loads (`valueprobe.replicate.guide`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import (
    SHIPPED_DATA,
    LoadOptions,
    ModelOpt,
    console,
    data_dir_option,
    refuse_renamed,
    replicate_app,
    table,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.datasets.answers import read_tasks
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.guided.policy import Policy, Prune, Rollback, as_policy
from valueprobe.probe.registry import probe_path

if TYPE_CHECKING:
    from valueprobe.replicate.guide import GuideRun

__all__ = ["replicate_guide_command"]


def _task_files(data: Path, tasks: str) -> dict[str, Path]:
    from valueprobe.replicate.guide import TASK_FILES  # loads the library: when the command runs (cli/app.py)

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names or any(n not in TASK_FILES for n in names):
        raise ValueprobeError(f"--tasks {tasks!r}: give a comma list of {', '.join(TASK_FILES)}")
    files = {n: data / TASK_FILES[n] for n in names}
    for path in files.values():
        if not path.is_file():
            raise ValueprobeError(
                f"{path} does not exist: build it with valueprobe datasets build --family tasks"
            )
        read_tasks(path)  # an answer that does not parse stops here, naming file:line
    return files


@dataclass(frozen=True)
class GuideRunOptions(OptionGroup):
    """What ``replicate guide`` samples and how (`GuideRun`, as options)."""

    panel = "Sampling and policies"

    n_prompts: Annotated[int, typer.Option(help="prompts per task, spread over its groups")] = 24
    prompts: Annotated[str | None, typer.Option("--prompts", hidden=True)] = None  # --n-prompts's old name
    samples: Annotated[int, typer.Option(help="N: samples per prompt")] = 8
    temperature: float = 0.8
    max_new_tokens: int = 128
    random_directions: Annotated[int, typer.Option(help="random directions per axis (the null)")] = 16
    every: Annotated[int, typer.Option(help="prune: tokens between checkpoints")] = 16
    quantile: Annotated[
        float, typer.Option(help="prune: drop rows below this quantile of their siblings")
    ] = 0.5
    tau: Annotated[float, typer.Option(help="rollback: σ drop of the EMA that rolls back")] = 1.0
    alphas: Annotated[
        str, typer.Option(help="rollback: comma list of steering strengths (σ), one run each")
    ] = "0,2"
    seed: int = 0

    def run(self, batch_size: int) -> GuideRun:
        """The library's run, every option checked (the policies too) before the model loads."""
        from valueprobe.replicate.guide import (
            GuideRun,  # loads the library: when the command runs (cli/app.py)
        )

        refuse_renamed("--prompts", self.prompts, "--n-prompts", "the number of prompts per task")
        for name, value in (
            ("--n-prompts", self.n_prompts),
            ("--samples", self.samples),
            ("--max-new-tokens", self.max_new_tokens),
        ):
            check_at_least(name, value, 1)
        check_at_least("--random-directions", self.random_directions, 1)
        try:
            rollback_alphas = tuple(float(a) for a in self.alphas.split(",") if a.strip())
        except ValueError:
            raise ValueprobeError(
                f"--alphas {self.alphas!r}: give a comma list of numbers, e.g. 0,2"
            ) from None
        prune = Prune(n=self.samples, every=self.every, quantile=self.quantile)
        rollbacks = tuple(Rollback(n=1, k=8, tau=self.tau, alpha=a) for a in rollback_alphas)
        policies: list[Policy] = [prune, *rollbacks]
        for policy in policies:
            as_policy(policy)  # checked before the model loads: a quantile outside (0, 1), τ not a number...
        return GuideRun(
            self.n_prompts, self.samples, self.temperature, self.max_new_tokens, self.random_directions,
            self.seed, batch_size, prune, rollbacks,
        )  # fmt: skip


@replicate_app.command("guide")
@grouped
def replicate_guide_command(
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-guide"),
    model: ModelOpt = "smollm2-135m",
    probes: Annotated[
        str,
        typer.Option(help="comma list of shipped axes or probe folders; the first is read while generating"),
    ] = "smollm2-135m-value,smollm2-135m-reward-history",
    data: Annotated[Path, data_dir_option("folder with task_*.jsonl")] = SHIPPED_DATA,
    tasks: Annotated[str, typer.Option(help="comma list of arithmetic, code")] = "arithmetic",
    sampling: GuideRunOptions = GuideRunOptions(),
    timeout: Annotated[float, typer.Option(help="code tasks: seconds before an answer is killed")] = 5.0,
    batch_size: int = 32,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Accuracy against tokens spent: greedy, one sample, best-of-N by the axis, by log-prob, by random
    directions, self-consistency, the oracle, and the prune and rollback policies, for each axis."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.replicate.guide import replicate_guide

    run = sampling.run(batch_size)
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueprobeError(f"--timeout {timeout} must be a positive number of seconds")
    paths = [probe_path(p.strip()) for p in probes.split(",") if p.strip()]
    if not paths:
        raise ValueprobeError("--probes: give at least one probe folder")
    axes = {p.name: ValueAxis.load(p) for p in paths}
    files = _task_files(data, tasks)
    check_output_dir(out, holds="guided-decoding results")
    how = load.check()
    lm = how.load(model)
    axes = {name: ValueAxis.load(p, lm=lm) for name, p in zip(axes, paths, strict=True)}
    results = replicate_guide(lm, axes=axes, task_files=files, out=out, run=run, timeout_s=timeout)
    for budget in results.tasks.values():
        table(
            f"replicate guide: {budget.task}, {budget.n_prompts} prompts, N = {budget.samples}",
            *budget.table(),
        )
        for line in budget.verdicts():
            console.print(line)
    console.print(f"wrote {out}/results.json, summary.md, budget.html and samples-*.jsonl")
