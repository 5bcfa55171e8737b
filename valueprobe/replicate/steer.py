"""The paper's steering benchmarks on one model, with both shipped axes and random directions.

    valueprobe replicate steer --model smollm2-135m --out probes/steering-smollm2-135m

Five sweeps, one per prompt set in ``data/steer_*.jsonl``, each resumable under ``runs/``:
confidence (yes-rate and P(yes) to "Will this answer be correct?", with the inverted question),
backtracking (self-correction phrases), code verbosity (lines, comments, type hints), refusal, and
length. Each steers the probe's axis at its best layer, the other axis's direction at the same
layer and ``controls`` random unit directions, all with the same vector length per unit of α.

The ``ablate`` row asks for necessity instead: the same five benchmarks with the axis's direction
removed at its layer (``--op ablate``, h − (h·v̂)v̂ at every position) against ``controls`` random
directions removed the same way, as a sweep over α ∈ {0, 1} (off, on), so its slope is the change
ablation makes. ``--rows ablate`` runs that row alone and keeps the add row already in ``results.json``::

    valueprobe replicate steer --rows ablate --out probes/steering-smollm2-135m

Writes ``results.json``, ``summary.md`` and ``dose.html`` into ``out``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable, markdown_table, sha256_file, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.records import Record
from valueprobe.replicate.steer_eval import evaluate_steering
from valueprobe.sharded import merge, part_dir
from valueprobe.steering.experiment.dose import SteerSweep
from valueprobe.steering.experiment.prompting import conditions_path
from valueprobe.steering.experiment.sweep import SweepSettings, run_sweep
from valueprobe.steering.experiment.sweep_parts import SWEEP_PARTS, run_sweep_part
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Op, ShardSpec, Unit

__all__ = [
    "BENCHMARKS",
    "ROWS",
    "Benchmark",
    "ReplicateSteer",
    "ReplicateSteerSettings",
    "Run",
    "parse_rows",
    "plan",
    "replicate_steer",
]


@dataclass(frozen=True)
class Benchmark:
    """One prompt set, how long its answers need to be, and what is read from them."""

    name: str
    file: str
    max_new_tokens: int
    metrics: tuple[str, ...]
    note: str

    def settings(
        self, run: ReplicateSteerSettings, *, axis: ValueAxis, model: str, row: str
    ) -> SweepSettings:
        """This benchmark's sweep under ``row`` (``add``: the strengths in the unit, the other axis
        and the prompt conditions; ``ablate``: α ∈ {0, 1} in raw units, no other axis, the plain
        prompt)."""
        path = run.data_dir / self.file
        add = row == "add"
        unit = Unit(run.unit) if add else Unit.raw
        base = SteeringSpec(axis, probe=str(run.probe)) if run.spec is None else run.spec
        spec = replace(base, unit=unit, op=Operator(Op(row)))
        conditions = run.conditions if add else ()
        stated = conditions_path(path)  # the prompt conditions, stated beside the prompts
        return SweepSettings(
            spec=spec,
            probe_fingerprint=axis.fingerprint,
            model=model,
            prompts=str(path),
            prompts_sha256=sha256_file(path),
            alphas=tuple(run.alphas if add else ABLATE_ALPHAS),
            samples=run.samples,
            max_new_tokens=max(1, math.ceil(self.max_new_tokens * run.tokens)),
            controls=run.controls,
            seed=run.seed,
            other_probe=str(run.other_probe) if add else None,
            metrics=self.metrics,
            limit=run.prompts,
            conditions=tuple(conditions),
            conditions_file=str(stated) if conditions else None,
            conditions_sha256=sha256_file(stated) if conditions else None,
        )


@dataclass(frozen=True)
class ReplicateSteerSettings:
    """What `replicate_steer` runs: the axes, the data and where the sweeps go, their sizes, and
    which rows and benchmarks.

    Attributes:
        probe, other_probe: the axis steered and the other shipped axis (a control) by folder.
        data_dir: the folder of ``data/steer_*.jsonl``; runs_dir: where the resumable sweeps go.
        prompts: rows per prompt set (confidence and refusal keep their pairs when even).
        alphas, unit, samples, controls, seed: as in `valueprobe.steering.experiment.settings.SweepSettings`.
        tokens: multiplies each benchmark's ``max_new_tokens`` (a smaller run reads shorter answers).
        rows: ``add`` (steering) and/or ``ablate`` (necessity); benchmarks: which of them to run.
        conditions: prompt conditions of the add row (``toward``, ``away``, ``reworded``), stated in
            ``data_dir/steer_conditions.jsonl``: the prompting baseline beside steering.
        spec: the steering every sweep takes whole (layers, site, phase or window, condition, read
            layer), each row setting its own unit and operator; None: ``probe``'s axis at its defaults.
    """

    probe: Path = Path("probes/smollm2-135m-value")
    other_probe: Path = Path("probes/smollm2-135m-reward-history")
    data_dir: Path = Path("data")
    runs_dir: Path = Path("runs/steer-smollm2-135m")
    prompts: int = 12
    alphas: tuple[float, ...] = (-30.0, -15.0, 0.0, 15.0, 30.0)
    unit: str = "norm"
    samples: int = 1
    controls: int = 8
    seed: int = 0
    tokens: float = 1.0
    rows: tuple[str, ...] = ("add", "ablate")
    benchmarks: tuple[str, ...] = ("confidence", "backtracking", "code", "refusal", "length")
    conditions: tuple[str, ...] = ()
    spec: SteeringSpec | None = None


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("confidence", "steer_confidence.jsonl", 4, ("yes", "p_yes"),
              "yes-rate and P(yes) to 'Will this answer be correct?' (direct) and '...incorrect?' (inverted)"),
    Benchmark("backtracking", "steer_backtracking.jsonl", 64, ("backtrack", "length"),
              "share of solutions with a self-correction phrase"),
    Benchmark("code", "steer_code.jsonl", 64, ("code_lines", "code_comments", "code_hints"),
              "lines, # comments and type hints of the parsed function"),
    Benchmark("refusal", "steer_refusal.jsonl", 32, ("refusal",), "refusal phrase near the start"),
    Benchmark("length", "steer_open.jsonl", 64, ("length", "degenerate"), "words, and degenerate outputs"),
)  # fmt: skip


# The rows of `replicate_steer`: "add" steers along each direction (sufficiency), "ablate" removes it (necessity).
ROWS: tuple[str, ...] = ("add", "ablate")
ABLATE_ALPHAS: tuple[float, ...] = (0.0, 1.0)  # off, on: the slope is the change ablation makes


BENCHMARK_NAMES: tuple[str, ...] = tuple(b.name for b in BENCHMARKS)


def parse_benchmarks(text: str) -> tuple[str, ...]:
    """``"all"`` or ``"length,confidence"`` -> benchmark names in `BENCHMARKS` order; one clear line otherwise."""
    if text.strip().lower() == "all":
        return BENCHMARK_NAMES
    given = [b.strip() for b in text.split(",") if b.strip()]
    if not given or any(b not in BENCHMARK_NAMES for b in given):
        raise ValueprobeError(
            f"--benchmarks {text!r}: give 'all' or a comma list of {', '.join(BENCHMARK_NAMES)}"
        )
    return tuple(b for b in BENCHMARK_NAMES if b in given)


def parse_rows(text: str) -> tuple[str, ...]:
    """``"add,ablate"`` -> the rows to run, in `ROWS` order; one clear line for an unknown or empty list."""
    given = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in given if r not in ROWS]
    if unknown or not given:
        raise ValueprobeError(f"--rows {text!r}: give a comma list of {', '.join(ROWS)}")
    return tuple(r for r in ROWS if r in given)


@dataclass(frozen=True)
class Run:
    """One sweep of `replicate_steer`: a benchmark under one row, its prompts, folder and settings."""

    bench: Benchmark
    row: str
    prompts: Path
    folder: Path
    settings: SweepSettings


def plan(run: ReplicateSteerSettings, *, axis: ValueAxis, model: str) -> list[Run]:
    """Every sweep the rows ask for, in order: the CLI checks them all before the model loads.

    The ablate row removes the direction (α = 0 off, 1 on; its unit is ``raw``, as removal has no
    size) and leaves the other axis out: its question is the axis against random directions. The
    add row runs the prompt ``conditions`` (`valueprobe.steering.experiment.prompting`) beside the plain prompt.
    """
    runs = []
    for row in run.rows:
        for bench in (b for b in BENCHMARKS if b.name in run.benchmarks):
            settings = bench.settings(run, axis=axis, model=model, row=row)
            folder = run.runs_dir / (bench.name if row == "add" else f"{bench.name}-{row}")
            runs.append(Run(bench, row, run.data_dir / bench.file, folder, settings))
    return runs


MIN_PROMPTS = 5  # below this a prompt bootstrap cannot say much: the verdict says so instead


def _verdict(n_prompts: int, slope: float, ci: tuple[float, float] | None, outside: bool | None) -> str:
    if not math.isfinite(slope):
        return "no slope (too few valid outputs)"
    if n_prompts < MIN_PROMPTS:
        return f"too few prompts to tell ({n_prompts})"
    excludes_zero = ci is not None and (ci[0] > 0 or ci[1] < 0)
    if outside and excludes_zero:
        return "moved, beyond the random null"
    if excludes_zero:
        return "moved, but within the random null"
    if outside:
        return "outside the null, CI spans 0"
    return "did not move"


@dataclass(frozen=True)
class ReplicateSteer(Record):
    """The sweeps of `replicate_steer` by benchmark name: steering (``sweeps``) and ablation."""

    OMIT = {"ablations": {}}  # a file from before the ablate row reads back to the same bytes

    probe: str
    other_probe: str
    sweeps: dict[str, SteerSweep]
    ablations: dict[str, SteerSweep] = field(default_factory=dict)

    def combined(self) -> SteerSweep:
        """All effects in one record (subsets prefixed by benchmark), for one figure."""
        first = next(iter(self.sweeps.values()))
        effects = tuple(
            replace(e, subset=f"{name}: {e.subset}") for name, s in self.sweeps.items() for e in s.effects
        )
        return SteerSweep(
            unit=first.unit, effects=effects, n_rows=sum(s.n_rows for s in self.sweeps.values())
        )

    def table(self) -> tuple[list[str], list[list[object]]]:
        first = next(iter(self.sweeps.values()))
        k = first.step
        headers = [
            "benchmark",
            "metric",
            "subset",
            "prompts",
            f"value slope /{k:g}",
            "95% CI",
            "null 95% range",
            "value vs null",
            f"reward-history /{k:g}",
            "history vs null",
        ]
        rows: list[list[object]] = []
        for name, s in self.sweeps.items():
            for e in s.effects:
                other = e.other.slope * k if e.other is not None else float("nan")
                other_ci = e.other.ci if e.other is not None else None
                n_other = e.other.n_prompts if e.other is not None else 0
                rows.append(
                    [
                        name,
                        e.metric,
                        e.subset,
                        e.axis.n_prompts,
                        e.axis.slope * k,
                        f"[{e.axis.ci[0] * k:+.4f}, {e.axis.ci[1] * k:+.4f}]",
                        f"[{e.null_range[0] * k:+.4f}, {e.null_range[1] * k:+.4f}]",
                        _verdict(e.axis.n_prompts, e.axis.slope, e.axis.ci, e.outside),
                        other,
                        _verdict(n_other, other, other_ci, e.other_outside),
                    ]
                )
        return headers, rows

    def ablation_table(self) -> tuple[list[str], list[list[object]]]:
        """One row per ablation effect: the change removing the direction makes, against the null."""
        headers = ["benchmark", "metric", "subset", "prompts", "ablated − intact", "95% CI"]
        headers += ["null 95% range (random ablated)", "axis vs null"]
        rows: list[list[object]] = [
            [
                name,
                e.metric,
                e.subset,
                e.axis.n_prompts,
                e.axis.slope,
                f"[{e.axis.ci[0]:+.4f}, {e.axis.ci[1]:+.4f}]",
                f"[{e.null_range[0]:+.4f}, {e.null_range[1]:+.4f}]",
                _verdict(e.axis.n_prompts, e.axis.slope, e.axis.ci, e.outside),
            ]
            for name, s in self.ablations.items()
            for e in s.effects
        ]
        return headers, rows

    def markdown(self) -> str:
        lines = ["# Steering SmolLM2-135M-Instruct along its value axes", ""]
        if self.sweeps:
            lines += self._steer_markdown()
        if self.ablations:
            lines += self._ablate_markdown()
        return "\n".join(lines) + "\n"

    def _steer_markdown(self) -> list[str]:
        first = next(iter(self.sweeps.values()))
        settings = first.settings
        if settings is None or any(s.settings is None for s in self.sweeps.values()):
            raise ValueprobeError("internal: a replicated sweep has no settings to describe")
        headers, rows = self.table()
        return [
            f"Axis steered: `{self.probe}`; control axis: `{self.other_probe}` (its direction at the same layer);"
            f" {settings.controls} random unit directions. Strengths {list(settings.alphas)} in"
            f" `{first.unit}` units, {settings.samples} sample(s), sampling at temperature"
            f" {settings.temperature} with common random numbers; slopes are OLS per {first.step:g}"
            " units of α with 95% bootstrap CIs over prompts; the null range is the central 95% of the"
            " random directions' slopes. Strengths with more than half degenerate outputs are dropped.",
            "",
            *markdown_table(headers, rows, lambda v: f"{v:+.4f}" if isinstance(v, float) else str(v)),
            "",
            "Sizes: " + _sizes(self.sweeps),
        ]

    def _ablate_markdown(self) -> list[str]:
        settings = next(iter(self.ablations.values())).settings
        if settings is None:
            raise ValueprobeError("internal: an ablation sweep has no settings to describe")
        headers, rows = self.ablation_table()
        return [
            "",
            "## Necessity: the axis ablated",
            "",
            f"`--op ablate` removes the direction (h − (h·v̂)v̂ at the axis's layer, every position) of"
            f" `{self.probe}` and, as the null, of each of {settings.controls} random unit directions;"
            " α ∈ {0, 1} (off, on) with common random numbers, so each figure is the mean change ablation"
            " makes, with a 95% bootstrap CI over prompts; the null range is the central 95% of the random"
            " directions' changes.",
            "",
            *markdown_table(headers, rows, lambda v: f"{v:+.4f}" if isinstance(v, float) else str(v)),
            "",
            "Sizes: " + _sizes(self.ablations),
        ]


def _sizes(sweeps: Mapping[str, SteerSweep]) -> str:
    return "; ".join(
        f"{n}: {s.n_rows} outputs, {s.settings.limit} prompts, {s.settings.max_new_tokens} new tokens"
        for n, s in sweeps.items()
        if s.settings is not None
    )


def replicate_steer(
    lm: LoadedModel,
    run: ReplicateSteerSettings,
    *,
    axis: ValueAxis,
    other: ValueAxis,
    out: Path,
    batch_size: int = 32,
    shard: ShardSpec | None = None,
    evaluate: bool = False,
) -> ReplicateSteer:
    """Run (or resume) every benchmark of :data:`BENCHMARKS` for each row and write the results into ``out``.

    With ``shard`` (``--shard I/N``): only that shard's rows of each sweep, into ``RUNS/SWEEP.parts/
    part-I-of-N``, and no results; the same call without ``shard``, once every part is done, merges
    each sweep's parts (`valueprobe.sharded.merge`) and writes the results.

    Args:
        run: what to run (`ReplicateSteerSettings`); a sweep not run keeps what ``out/results.json``
            already holds for it.
        axis, other: the axes of ``run.probe`` and ``run.other_probe``, read.
        evaluate: judge the add row's sweeps run now (`valueprobe.replicate.steer_eval`): side
            effects with a null, the effect-vs-KL front, per-item reliability; into ``evaluation.json``
            and the summary.
    """
    runs = plan(run, axis=axis, model=lm.model_id)
    report = _previous(out, probe=run.probe, other_probe=run.other_probe, runs=runs)
    for sweep_run in runs:
        examples = read_jsonl(sweep_run.prompts)[: run.prompts]
        control = other if sweep_run.row == "add" else None
        parts = sweep_run.folder.parent / f"{sweep_run.folder.name}.parts"
        if shard is not None:  # this shard's rows of every sweep; the run without --shard merges them
            part = part_dir(sweep_run.folder, shard)
            run_sweep_part(
                lm, examples, part, sweep_run.settings, shard=shard, other=control, batch_size=batch_size
            )
            continue
        if (
            not sweep_run.folder.exists() and parts.is_dir()
        ):  # `replicate steer --shard I/N` ran: join the parts
            merge(sweep_run.folder, sorted(parts.iterdir()), SWEEP_PARTS)
        sweep = run_sweep(
            lm, examples, sweep_run.folder, sweep_run.settings, other=control, batch_size=batch_size
        )
        if sweep_run.row == "add":
            report = replace(report, sweeps=_in_order({**report.sweeps, sweep_run.bench.name: sweep}))
        else:
            report = replace(report, ablations=_in_order({**report.ablations, sweep_run.bench.name: sweep}))
        # Written after every benchmark, so a stopped run still shows what it finished.
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", jsonable(report.to_dict()))
        atomic_write_text(out / "summary.md", report.markdown())
    folders = {r.bench.name: r.folder for r in runs if r.row == "add"}
    if evaluate and shard is None and folders:  # the add row run now, judged
        sweeps = {k: v for k, v in report.sweeps.items() if k in folders}
        judged = evaluate_steering(lm, sweeps, folders, data_dir=run.data_dir, out=out, batch_size=batch_size)
        atomic_write_text(out / "summary.md", report.markdown() + "\n".join(judged.markdown()) + "\n")
    return report


def _in_order(sweeps: dict[str, SteerSweep]) -> dict[str, SteerSweep]:
    return {name: sweeps[name] for name in BENCHMARK_NAMES if name in sweeps}


def _previous(out: Path, *, probe: Path, other_probe: Path, runs: Sequence[Run]) -> ReplicateSteer:
    """What ``out/results.json`` holds for the sweeps not run now (a sweep run now starts from nothing)."""
    empty = ReplicateSteer(sweeps={}, probe=str(probe), other_probe=str(other_probe))
    path = out / "results.json"
    if not path.is_file():
        return empty
    old = ReplicateSteer.from_dict(json.loads(path.read_text(encoding="utf-8")))
    again = {(run.row, run.bench.name) for run in runs}
    sweeps = {k: v for k, v in old.sweeps.items() if ("add", k) not in again}
    ablations = {k: v for k, v in old.ablations.items() if ("ablate", k) not in again}
    if (sweeps or ablations) and old.probe != str(probe):
        raise ValueprobeError(f"{path} holds results for {old.probe}, not {probe}: give another --out")
    other = str(other_probe) if any(run.row == "add" for run in runs) or not sweeps else old.other_probe
    return replace(empty, other_probe=other, sweeps=sweeps, ablations=ablations)
