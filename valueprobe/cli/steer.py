"""The steering sweep commands of the ``valueprobe`` CLI (registered on the app of `valueprobe.cli.app`).

    valueprobe steer --probe probes/smollm2-135m-value --model smollm2-135m \\
        --prompts data/steer_code.jsonl --alphas -2,-1,0,1,2 --samples 2 --random-directions 8 --out runs/steer-code
    valueprobe steer --engine vllm ...     # the same sweep and files through vLLM (the [vllm] extra)
    valueprobe replicate steer --out probes/steering-smollm2-135m

Both check every argument (strengths, probe, layer, unit statistics, prompts file, output folder)
before loading the model, and both resume: rerun the same command after an interruption.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import (
    SHIPPED_DATA,
    AllowLargeOpt,
    ControlsOpt,
    ForceOpt,
    LoadOptions,
    ModelOpt,
    RandomDirectionsOpt,
    ShardOpt,
    app,
    console,
    data_dir_option,
    data_option,
    probe_option,
    refuse_renamed,
    renamed,
    replicate_app,
    run_sharded,
    table,
    write_figure,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.cli.spec import DecodingOptions, SpecOptions
from valueprobe.cli.steer_eval import judge_sweep, print_evaluation, side_effect_folder
from valueprobe.cli.steer_options import AUTO, ConditionsFileOpt, ConditionsOpt, resolve_conditions
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, sha256_file
from valueprobe.steering.experiment.behaviour import METRICS
from valueprobe.steering.experiment.prompting import parse_conditions
from valueprobe.vocab import ShardSpec, Unit

if TYPE_CHECKING:
    from valueprobe.replicate.steer import ReplicateSteer, ReplicateSteerSettings
    from valueprobe.steering.decode.generation import Generation
    from valueprobe.steering.experiment.dose import SteerSweep
    from valueprobe.steering.experiment.sweep import SweepSettings
    from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["print_sweep", "replicate_steer_command", "steer_command"]


def _read_prompts(path: Path, limit: int | None):
    if not path.is_file():
        raise ValueprobeError(
            f"--prompts {path} does not exist: give a dataset JSONL (e.g. data/steer_code.jsonl)"
        )
    examples = read_jsonl(path)
    if not examples:
        raise ValueprobeError(f"--prompts {path} is empty: give a file with at least one prompt")
    if limit is not None and limit < 1:
        raise ValueprobeError(f"--limit {limit} must be at least 1")
    return examples[:limit] if limit else examples


def _check_numbers(out: Path, *, batch_size: int, bootstrap: int, limit: int | None) -> None:
    """``--out`` (a folder it can write) and the numeric options `check_settings` does not see,
    refused before any work."""
    check_output_dir(out, holds="steering sweep")
    check_at_least("--batch-size", batch_size, 1)
    check_at_least("--bootstrap", bootstrap, 0)
    check_at_least("--limit", limit, 1)


def parse_alphas(text: str) -> tuple[float, ...]:
    """``"-2,-1,0,1,2"`` -> the strengths, checked finite and non-empty.

    >>> parse_alphas("-50, -25, 0, 25, 50")
    (-50.0, -25.0, 0.0, 25.0, 50.0)
    """
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueprobeError(f"--alphas {text!r} is empty: give strengths like -2,-1,0,1,2")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueprobeError(f"--alphas {text!r} does not parse: give numbers separated by commas") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueprobeError(f"--alphas {text!r} holds a non-finite strength: give finite numbers")
    if len(set(values)) < 2:
        raise ValueprobeError(f"--alphas {text!r} needs at least two different strengths for a slope")
    return values


EngineOpt = Annotated[
    str, typer.Option(help="hf (transformers hooks) or vllm (the vllm extra: one request per row)")
]


@dataclass(frozen=True)
class SweepOptions(OptionGroup):
    """What a sweep steers beside the spec: its strengths and samples, its controls, its prompts
    and metrics, its chunks and bootstrap (an option group, `valueprobe.cli.groups`)."""

    panel = "Sweep"

    alphas: Annotated[str, typer.Option(help="strengths, comma separated")] = "-2,-1,0,1,2"
    samples: Annotated[int, typer.Option(help="samples per (prompt, α, direction)")] = 1
    random_directions: RandomDirectionsOpt = 8
    controls: ControlsOpt = None
    other_probe: Annotated[Path | None, probe_option("another axis, steered as a control")] = None
    metrics: Annotated[str | None, typer.Option(help="comma list; default by prompt set")] = None
    limit: Annotated[int | None, typer.Option(help="only the first N prompts")] = None
    chunk_prompts: Annotated[int, typer.Option(help="prompts per resumable chunk")] = 8
    bootstrap: int = 1000
    conditions: ConditionsOpt = AUTO
    conditions_file: ConditionsFileOpt = None
    side_effects: Annotated[
        bool, typer.Option(help="KL, perplexity, task accuracy; the effect-vs-KL front")
    ] = False
    allow_large: AllowLargeOpt = False


@app.command("steer")
@grouped
def steer_command(
    ctx: typer.Context,
    prompts: Annotated[Path, data_option("prompts, e.g. steer_code")],
    out: Annotated[Path, typer.Option(help="output folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    steering: SpecOptions = SpecOptions(),
    sweep: SweepOptions = SweepOptions(),
    decoding: DecodingOptions = DecodingOptions(),
    batch_size: int = 32,
    force: ForceOpt = False,
    load: LoadOptions = LoadOptions(),
    shard: ShardOpt = None,
    engine: EngineOpt = "hf",
) -> None:
    """Steer generations along an axis at several strengths, with random directions as the null and
    prompting (a system prompt asking for the behaviour, or its opposite) as the baseline."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.steering.experiment.sweep import SweepSettings, check_settings, run_sweep
    from valueprobe.steering.experiment.sweep_parts import SWEEP_PARTS, run_sweep_part
    from valueprobe.steering.hook.strength import check_strengths, spec_units

    n_random = renamed(
        ctx, "--random-directions", sweep.random_directions, old="--controls", old_value=sweep.controls
    )
    spec = steering.to_spec()
    _check_engine(engine, spec=spec, shard=shard, device_map=load.device_map)
    how = load.check()
    decoding.check()
    _check_numbers(out, batch_size=batch_size, bootstrap=sweep.bootstrap, limit=sweep.limit)
    alphas = parse_alphas(sweep.alphas)
    spec = spec.check()
    axis = spec.first_axis()
    check_strengths(spec, alphas, allow_large=sweep.allow_large)
    other = ValueAxis.load(sweep.other_probe) if sweep.other_probe is not None else None
    examples = _read_prompts(prompts, sweep.limit)
    prompting = resolve_conditions(sweep.conditions, sweep.conditions_file, prompts, examples)
    if sweep.side_effects:
        side_effect_folder(prompts)  # the files side effects read, checked before the model loads
    settings = SweepSettings(
        spec=spec,
        probe_fingerprint=axis.fingerprint,
        model=model,
        prompts=str(prompts),
        prompts_sha256=sha256_file(prompts),
        alphas=alphas,
        samples=sweep.samples,
        max_new_tokens=decoding.max_new_tokens,
        controls=n_random,
        seed=decoding.seed,
        greedy=decoding.greedy,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        other_probe=None if sweep.other_probe is None else str(sweep.other_probe),
        chunk_prompts=sweep.chunk_prompts,
        metrics=_metrics(sweep.metrics, prompts, examples),
        limit=sweep.limit,
        engine=engine,
        conditions=prompting.names,
        conditions_file=prompting.file,
        conditions_sha256=prompting.sha256,
        alpha_units=spec_units(spec, alphas),
        sigma_reference=str(axis.sigma_reference),
        allow_large=sweep.allow_large,
    )
    part = partial(run_sweep_part, other=other, batch_size=batch_size, n_boot=sweep.bootstrap, force=force)
    # bound, not called: the settings (and so α) reach _sweep_part only in a sharded run
    work = partial(_sweep_part, settings, examples, model, how, part)
    if run_sharded(out, shard, how.device, work, SWEEP_PARTS):
        return
    check_settings(settings, out, examples)
    lm = how.load(model)
    run = partial(run_sweep, other=other, batch_size=batch_size, n_boot=sweep.bootstrap, force=force)
    result = run(lm, examples, out, settings, generator=_generator(engine, model, decoding.seed, how))
    print_sweep(result, out, f"steer {Path(settings.probe).name} on {prompts.name}")
    judge_sweep(lm, result, out, side_effects=sweep.side_effects)


def _sweep_part(
    settings: SweepSettings,
    examples: list,
    model: str,
    how: LoadOptions,
    run: Callable[..., int],
    part_out: Path,
    part: ShardSpec,
    on: str,
) -> None:
    """One shard's sweep (``run``: `run_sweep_part` with the command's options) into its part folder
    (`run_sharded` calls it with the part's folder, shard and device)."""
    from valueprobe.steering.experiment.sweep import (
        check_settings,  # loads the library: when the command runs (cli/app.py)
    )
    from valueprobe.steering.experiment.sweep_parts import check_part_out

    check_settings(settings, part_out, examples, part=True)
    check_part_out(part_out, part)
    n_rows = run(how.load(model, device=on), examples, part_out, settings, shard=part)
    console.print(f"wrote {part_out}/generations.jsonl ({n_rows} rows) and part.json (shard {part})")


def print_sweep(result: SteerSweep, out: Path, title: str) -> None:
    """Write the dose figure next to a sweep's files and print its table."""
    from valueprobe.report.effects import (
        dose_response_figure,  # loads the library: when the command runs (cli/app.py)
    )

    write_figure(dose_response_figure(result), out / "dose.html")
    n_random = 0 if result.settings is None else result.settings.controls
    table(f"{title} ({result.n_rows} outputs, {n_random} random directions)", *result.table())
    units = "" if result.settings is None else result.settings.units_text()
    if units:
        console.print(f"α: {units}")
    console.print(f"wrote {out}/generations.jsonl, metrics.json, metrics.csv, dose.html")


def _check_engine(
    engine: str, *, spec: SteeringSpec, shard: ShardSpec | None, device_map: str | None
) -> None:
    """``--engine``, and what the vLLM engine steers (add, on the residual stream), before any load."""
    from valueprobe.steering.hook.additive import (  # loads the library: when the command runs (cli/app.py)
        VLLM,
        check_additive,
    )
    from valueprobe.vllm.generate import INSTALL

    if engine not in ("hf", "vllm"):
        raise ValueprobeError(f"unknown --engine {engine!r}: use hf or vllm")
    if engine == "vllm":
        if shard is not None:
            raise ValueprobeError("--engine vllm batches the whole sweep itself: leave out --shard")
        if device_map is not None:
            raise ValueprobeError("--engine vllm places the model itself: leave out --device-map")
        if importlib.util.find_spec("vllm") is None:
            raise ValueprobeError(f"--engine vllm needs vLLM, which is not installed: {INSTALL}")
        check_additive(spec, VLLM)


def _generator(engine: str, model: str, seed: int, how: LoadOptions) -> Callable[..., list[Generation]]:
    """What generates the sweep's rows: the HF route, or one vLLM request per row, in the dtype the
    HF side loads (it scores the rows)."""
    from valueprobe.steering.decode.generation import (
        generate,  # loads the library: when the command runs (cli/app.py)
    )
    from valueprobe.vllm.generate import VllmGenerator, open_llm

    if engine == "hf":
        return generate
    return VllmGenerator(open_llm(model, seed=seed, dtype=how.dtype.value))


def _metrics(metrics: str | None, prompts: Path, examples: list) -> tuple[str, ...]:
    """``--metrics``, checked against the known ones; default by prompt set."""
    from valueprobe.steering.experiment.sweep import (
        metrics_for,  # loads the library: when the command runs (cli/app.py)
    )

    chosen = (
        tuple(m.strip() for m in metrics.split(",") if m.strip())
        if metrics
        else metrics_for(prompts, examples)
    )
    unknown = [m for m in chosen if m not in METRICS and m != "p_yes"]
    if unknown:
        raise ValueprobeError(
            f"--metrics: unknown {unknown[0]!r}; choose from {', '.join([*METRICS, 'p_yes'])}"
        )
    return chosen


def _check_outputs(out: Path, runs: Path) -> None:
    """``--out`` and ``--runs`` of `replicate steer`, folders it can write, before the model loads."""
    check_output_dir(out, holds="steering results")
    check_output_dir(runs, holds="steering sweeps", option="--runs")


def _check_tokens(tokens: float) -> None:
    if not (math.isfinite(tokens) and tokens > 0):
        raise ValueprobeError(
            f"--token-scale {tokens} must be a positive scale of each benchmark's max new tokens"
        )


RowsOpt = Annotated[
    str,
    typer.Option(
        help="add (steer along each direction) and/or ablate (remove it): a row left out keeps its results"
    ),
]


@dataclass(frozen=True)
class ReplicateSteerOptions(OptionGroup):
    """What ``replicate steer`` runs (`valueprobe.replicate.steer.ReplicateSteerSettings`, as options)."""

    panel = "Benchmarks"

    probe: Annotated[Path, probe_option("the axis steered")] = Path("smollm2-135m-value")
    other_probe: Annotated[Path, probe_option("the other axis (a control)")] = Path(
        "smollm2-135m-reward-history"
    )
    data: Annotated[Path, data_dir_option("folder with steer_*.jsonl")] = SHIPPED_DATA
    runs: Annotated[Path, typer.Option(help="where the resumable sweeps go")] = Path(
        "runs/steer-smollm2-135m"
    )
    n_prompts: Annotated[int, typer.Option(help="prompts (rows) per benchmark")] = 12
    prompts: Annotated[str | None, typer.Option("--prompts", hidden=True)] = None  # --n-prompts's old name
    alphas: Annotated[str, typer.Option(help="strengths, comma separated")] = "-30,-15,0,15,30"
    unit: Annotated[Unit, typer.Option(help="sigma | norm | raw")] = Unit.norm
    samples: int = 1
    random_directions: RandomDirectionsOpt = 8
    controls: ControlsOpt = None
    token_scale: Annotated[float, typer.Option(help="scale every benchmark's max new tokens")] = 1.0
    tokens: Annotated[str | None, typer.Option("--tokens", hidden=True)] = None  # --token-scale's old name
    seed: int = 0
    rows: RowsOpt = "add,ablate"
    benchmarks: Annotated[
        str, typer.Option(help="all, or a comma list of confidence, backtracking, code, refusal, length")
    ] = "all"
    conditions: ConditionsOpt = "toward,away,reworded"

    def settings(self, ctx: typer.Context) -> ReplicateSteerSettings:
        """The library's settings, every option checked (one line) before the model loads."""
        from valueprobe.replicate.steer import (  # loads the library: when the command runs (cli/app.py)
            ReplicateSteerSettings,
            parse_benchmarks,
            parse_rows,
        )

        n_random = renamed(
            ctx, "--random-directions", self.random_directions, old="--controls", old_value=self.controls
        )
        refuse_renamed("--prompts", self.prompts, "--n-prompts", "the number of prompts per benchmark")
        if self.tokens is not None:
            raise ValueprobeError(
                f"--tokens is now --token-scale (the scale of each benchmark's max new tokens; --tokens"
                f" chooses tokens in score): give --token-scale {self.tokens}"
            )
        check_at_least("--n-prompts", self.n_prompts, 1)
        _check_tokens(self.token_scale)
        return ReplicateSteerSettings(
            probe=self.probe,
            other_probe=self.other_probe,
            data_dir=self.data,
            runs_dir=self.runs,
            prompts=self.n_prompts,
            alphas=parse_alphas(self.alphas),
            unit=self.unit.value,
            samples=self.samples,
            controls=n_random,
            seed=self.seed,
            tokens=self.token_scale,
            rows=parse_rows(self.rows),
            benchmarks=parse_benchmarks(self.benchmarks),
            conditions=parse_conditions(self.conditions),
        )


@replicate_app.command("steer")
@grouped
def replicate_steer_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-steer"),
    model: ModelOpt = "smollm2-135m",
    run: ReplicateSteerOptions = ReplicateSteerOptions(),
    batch_size: int = 32,
    load: LoadOptions = LoadOptions(),
    shard: ShardOpt = None,
    evaluate: Annotated[
        bool, typer.Option(help="side effects, effect-vs-KL front, per-item reliability")
    ] = True,
) -> None:
    """The paper's steering benchmarks (confidence, backtracking, code) plus refusal and length; and the axis ablated."""
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.replicate.steer import plan, replicate_steer
    from valueprobe.steering.experiment.sweep import check_settings

    settings = run.settings(ctx)
    how = load.check()
    check_at_least("--batch-size", batch_size, 1)
    _check_outputs(out, settings.runs_dir)
    axis, other = ValueAxis.load(settings.probe), ValueAxis.load(settings.other_probe)
    for sweep in plan(settings, axis=axis, model=model):  # every check before the model loads
        check_settings(sweep.settings, sweep.folder, _read_prompts(sweep.prompts, settings.prompts))
    lm = how.load(model)
    report = replicate_steer(
        lm, settings, axis=axis, other=other, out=out, batch_size=batch_size, shard=shard, evaluate=evaluate
    )
    if shard is not None:
        return console.print(
            f"wrote shard {shard} of each sweep under {settings.runs_dir}/: rerun without --shard to merge"
        )
    print_replicate_steer(report, out, settings)


def print_replicate_steer(report: ReplicateSteer, out: Path, settings: ReplicateSteerSettings) -> None:
    """Write ``replicate steer``'s figures and print its tables."""
    from valueprobe.report.effects import (
        dose_response_figure,  # loads the library: when the command runs (cli/app.py)
    )

    probe, other_probe = settings.probe.name, settings.other_probe.name
    if report.sweeps:
        write_figure(dose_response_figure(report.combined()), out / "dose.html")
        table(
            f"replicate steer: {probe} vs {other_probe} and {settings.controls} random directions",
            *report.table(),
        )
    if report.ablations:
        table(
            f"replicate steer, ablated: {probe} vs {settings.controls} random directions",
            *report.ablation_table(),
        )
    judged = print_evaluation(out / "evaluation.json", out) if report.sweeps else ""
    console.print(
        f"wrote {out}/results.json, summary.md{', dose.html' if report.sweeps else ''}{judged} (sweeps in {settings.runs_dir}/)"
    )
