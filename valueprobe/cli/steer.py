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
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from valueprobe.cli.app import (
    SHIPPED_DATA,
    ControlsOpt,
    DeviceMapOpt,
    DeviceOpt,
    ForceOpt,
    LoadOptions,
    ModelDtypeOpt,
    ModelOpt,
    OffloadFolderOpt,
    RandomDirectionsOpt,
    ShardOpt,
    app,
    console,
    data_dir_option,
    data_option,
    probe_option,
    renamed,
    replicate_app,
    run_sharded,
    table,
    write_html,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.datasets.io import read_jsonl, sha256_file
from valueprobe.engines.vllm_generate import INSTALL, VllmGenerator, open_llm
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.probe.axis import ValueAxis
from valueprobe.replicate.steer import parse_benchmarks, parse_rows, plan, replicate_steer
from valueprobe.report.effects import dose_response_figure
from valueprobe.steering.behaviour import METRICS
from valueprobe.steering.dose import SteerSweep
from valueprobe.steering.generation import Generation, generate
from valueprobe.steering.sweep import SweepSettings, check_settings, metrics_for, run_sweep
from valueprobe.steering.sweep_parts import check_part_out, merge_sweeps, run_sweep_part
from valueprobe.vocab import HookSite, ModelDtype, Op, ShardSpec, Unit

__all__ = ["print_merged_sweeps", "print_sweep", "replicate_steer_command", "steer_command"]


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


def _check_numbers(
    out: Path, *, batch_size: int, bootstrap: int, limit: int | None, temperature: float, greedy: bool
) -> None:
    """``--out`` (a folder it can write) and the numeric options `check_settings` does not see,
    refused before any work."""
    check_output_dir(out, holds="steering sweep")
    check_at_least("--batch-size", batch_size, 1)
    check_at_least("--bootstrap", bootstrap, 0)
    check_at_least("--limit", limit, 1)
    if not greedy and not (math.isfinite(temperature) and temperature > 0):
        raise ValueprobeError(f"--temperature {temperature} must be positive (or pass --greedy)")


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


OpOpt = Annotated[
    Op,
    typer.Option(
        help="add | ablate | set | clamp | add-norm (for ablate/set/clamp α is the share: 0 off, 1 on)"
    ),
]
EngineOpt = Annotated[
    str, typer.Option(help="hf (transformers hooks) or vllm (the vllm extra: one request per row)")
]
SiteOpt = Annotated[
    HookSite | None, typer.Option(help="resid_post | resid_pre | attn_out | mlp_out; default the probe's")
]


@app.command("steer")
def steer_command(
    ctx: typer.Context,
    probe: Annotated[Path, probe_option("the axis steered")],
    prompts: Annotated[Path, data_option("prompts, e.g. steer_code")],
    out: Annotated[Path, typer.Option(help="output folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    alphas: Annotated[str, typer.Option(help="strengths, comma separated")] = "-2,-1,0,1,2",
    unit: Annotated[Unit, typer.Option(help="sigma | norm (% of mean residual norm) | raw")] = Unit.sigma,
    samples: Annotated[int, typer.Option(help="samples per (prompt, α, direction)")] = 1,
    max_new_tokens: int = 48,
    random_directions: RandomDirectionsOpt = 8,
    controls: ControlsOpt = None,
    other_probe: Annotated[Path | None, probe_option("another axis, steered as a control")] = None,
    layer: Annotated[int | None, typer.Option(help="default: the probe's best layer")] = None,
    metrics: Annotated[str | None, typer.Option(help="comma list; default by prompt set")] = None,
    limit: Annotated[int | None, typer.Option(help="only the first N prompts")] = None,
    greedy: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    chunk_prompts: Annotated[int, typer.Option(help="prompts per resumable chunk")] = 8,
    batch_size: int = 32,
    bootstrap: int = 1000,
    force: ForceOpt = False,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    model_dtype: ModelDtypeOpt = ModelDtype.float32,
    offload_folder: OffloadFolderOpt = None,
    op: OpOpt = Op.add,
    lo: Annotated[float | None, typer.Option(help="--op clamp: lower bound of the σ-score")] = None,
    hi: Annotated[float | None, typer.Option(help="--op clamp: upper bound of the σ-score")] = None,
    target: Annotated[float | None, typer.Option(help="--op set: the σ-score to set")] = None,
    site: SiteOpt = None,
    shard: ShardOpt = None,
    engine: EngineOpt = "hf",
) -> None:
    """Steer generations along an axis at several strengths, with random directions as the null."""
    n_random = renamed(ctx, "--random-directions", random_directions, old="--controls", old_value=controls)
    _check_engine(engine, op=op, site=site, shard=shard, device_map=device_map)
    how = LoadOptions(device, device_map, model_dtype, offload_folder).check()
    _check_numbers(
        out, batch_size=batch_size, bootstrap=bootstrap, limit=limit, temperature=temperature, greedy=greedy
    )
    axis = ValueAxis.load(probe)
    other = ValueAxis.load(other_probe) if other_probe is not None else None
    examples = _read_prompts(prompts, limit)
    settings = SweepSettings(
        probe=str(probe),
        probe_fingerprint=axis.fingerprint,
        model=model,
        prompts=str(prompts),
        prompts_sha256=sha256_file(prompts),
        alphas=parse_alphas(alphas),
        unit=unit.value,
        samples=samples,
        max_new_tokens=max_new_tokens,
        controls=n_random,
        seed=seed,
        greedy=greedy,
        temperature=temperature,
        other_probe=None if other_probe is None else str(other_probe),
        layer=layer,
        chunk_prompts=chunk_prompts,
        metrics=_metrics(metrics, prompts, examples),
        limit=limit,
        op=op.value,
        lo=lo,
        hi=hi,
        target=target,
        site=None if site is None else site.value,
        engine=engine,
    )
    part = partial(run_sweep_part, other=other, batch_size=batch_size, n_boot=bootstrap, force=force)
    work = _part_work(settings, axis, examples, model, how, part)
    if run_sharded(out, shard, device, work, print_merged_sweeps):
        return
    check_settings(settings, axis, out, examples)
    lm = how.load(model)
    run = partial(run_sweep, other=other, batch_size=batch_size, n_boot=bootstrap, force=force)
    result = run(lm, axis, examples, out, settings, generator=_generator(engine, model, seed, probe, how))
    print_sweep(result, out, f"steer {probe.name} on {prompts.name}")


def _part_work(
    settings: SweepSettings,
    axis: ValueAxis,
    examples: list,
    model: str,
    how: LoadOptions,
    run: Callable[..., int],
) -> Callable[[Path, ShardSpec, str], None]:
    """One shard's sweep (``run``: `run_sweep_part` with the command's options) into its part folder."""

    def work(part_out: Path, part: ShardSpec, on: str) -> None:
        check_settings(settings, axis, part_out, examples, part=True)
        check_part_out(part_out, part)
        n_rows = run(how.load(model, device=on), axis, examples, part_out, settings, shard=part)
        console.print(f"wrote {part_out}/generations.jsonl ({n_rows} rows) and part.json (shard {part})")

    return work


def print_merged_sweeps(out: Path, parts: Sequence[Path]) -> None:
    """Merge the parts of a sharded sweep into ``out``, write its figure and print its table."""
    print_sweep(merge_sweeps(out, parts), out, "steer (merged)")


def print_sweep(result: SteerSweep, out: Path, title: str) -> None:
    """Write the dose figure next to a sweep's files and print its table."""
    write_html(dose_response_figure(result), out / "dose.html")
    n_random = 0 if result.settings is None else result.settings.controls
    table(f"{title} ({result.n_rows} outputs, {n_random} random directions)", *result.table())
    console.print(f"wrote {out}/generations.jsonl, metrics.json, metrics.csv, dose.html")


def _check_engine(
    engine: str, *, op: Op, site: HookSite | None, shard: ShardSpec | None, device_map: str | None
) -> None:
    """``--engine``, and what the vLLM engine steers (add, on the residual stream), before any load."""
    if engine not in ("hf", "vllm"):
        raise ValueprobeError(f"unknown --engine {engine!r}: use hf or vllm")
    if engine == "vllm":
        if shard is not None:
            raise ValueprobeError("--engine vllm batches the whole sweep itself: leave out --shard")
        if device_map is not None:
            raise ValueprobeError("--engine vllm places the model itself: leave out --device-map")
        if importlib.util.find_spec("vllm") is None:
            raise ValueprobeError(f"--engine vllm needs vLLM, which is not installed: {INSTALL}")
        if op != Op.add:
            raise ValueprobeError(f"--engine vllm steers with --op add only, not --op {op.value}")
        if site is not None and site not in (HookSite.resid_post, HookSite.resid_pre):
            raise ValueprobeError(f"--engine vllm steers the residual stream only, not --site {site.value}")


def _generator(
    engine: str, model: str, seed: int, probe: Path, how: LoadOptions
) -> Callable[..., list[Generation]]:
    """What generates the sweep's rows: the HF route, or one vLLM request per row, in the dtype the
    HF side loads (it scores the rows)."""
    if engine == "hf":
        return generate
    return VllmGenerator(open_llm(model, seed=seed, dtype=how.dtype.value), probe)


def _metrics(metrics: str | None, prompts: Path, examples: list) -> tuple[str, ...]:
    """``--metrics``, checked against the known ones; default by prompt set."""
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
            f"--tokens {tokens} must be a positive scale of each benchmark's max new tokens"
        )


RowsOpt = Annotated[
    str,
    typer.Option(
        help="add (steer along each direction) and/or ablate (remove it): a row left out keeps its results"
    ),
]


@replicate_app.command("steer")
def replicate_steer_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-steer"),
    model: ModelOpt = "smollm2-135m",
    probe: Annotated[Path, probe_option("the axis steered")] = Path("smollm2-135m-value"),
    other_probe: Annotated[Path, probe_option("the other axis (a control)")] = Path(
        "smollm2-135m-reward-history"
    ),
    data: Annotated[Path, data_dir_option("folder with steer_*.jsonl")] = SHIPPED_DATA,
    runs: Annotated[Path, typer.Option(help="where the resumable sweeps go")] = Path(
        "runs/steer-smollm2-135m"
    ),
    prompts: Annotated[int, typer.Option(help="prompts (rows) per benchmark")] = 12,
    alphas: Annotated[str, typer.Option(help="strengths, comma separated")] = "-30,-15,0,15,30",
    unit: Annotated[Unit, typer.Option(help="sigma | norm | raw")] = Unit.norm,
    samples: int = 1,
    random_directions: RandomDirectionsOpt = 8,
    controls: ControlsOpt = None,
    tokens: Annotated[float, typer.Option(help="scale every benchmark's max new tokens")] = 1.0,
    seed: int = 0,
    batch_size: int = 32,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    model_dtype: ModelDtypeOpt = ModelDtype.float32,
    offload_folder: OffloadFolderOpt = None,
    rows: RowsOpt = "add,ablate",
    benchmarks: Annotated[
        str, typer.Option(help="all, or a comma list of confidence, backtracking, code, refusal, length")
    ] = "all",
    shard: ShardOpt = None,
) -> None:
    """The paper's steering benchmarks (confidence, backtracking, code) plus refusal and length; and the axis ablated."""
    n_random = renamed(ctx, "--random-directions", random_directions, old="--controls", old_value=controls)
    values = parse_alphas(alphas)
    how = LoadOptions(device, device_map, model_dtype, offload_folder).check()
    check_at_least("--prompts", prompts, 1)
    check_at_least("--batch-size", batch_size, 1)
    _check_tokens(tokens)
    chosen = parse_rows(rows)
    names = parse_benchmarks(benchmarks)
    _check_outputs(out, runs)
    axis, other = ValueAxis.load(probe), ValueAxis.load(other_probe)
    shared: dict[str, Any] = {
        "rows": chosen,
        "probe": probe,
        "other_probe": other_probe,
        "axis": axis,
        "data_dir": data,
        "runs_dir": runs,
        "alphas": values,
        "unit": unit.value,
        "samples": samples,
        "controls": n_random,
        "seed": seed,
        "prompts": prompts,
        "tokens": tokens,
        "benchmarks": names,
    }
    for run in plan(model=model, **shared):  # every check before the model loads
        check_settings(run.settings, axis, run.folder, _read_prompts(run.prompts, prompts))
    lm = how.load(model)
    report = replicate_steer(lm, other=other, out=out, batch_size=batch_size, shard=shard, **shared)
    if shard is not None:
        return console.print(
            f"wrote shard {shard} of each sweep under {runs}/: rerun without --shard to merge"
        )
    if report.sweeps:
        write_html(dose_response_figure(report.combined()), out / "dose.html")
        table(
            f"replicate steer: {probe.name} vs {other_probe.name} and {n_random} random directions",
            *report.table(),
        )
    if report.ablations:
        table(
            f"replicate steer, ablated: {probe.name} vs {n_random} random directions",
            *report.ablation_table(),
        )
    console.print(
        f"wrote {out}/results.json, summary.md{', dose.html' if report.sweeps else ''} (sweeps in {runs}/)"
    )
