"""The paper's steering benchmarks on one model, with both shipped axes and random directions.

    valueprobe replicate steer --model smollm2-135m --out probes/steering-smollm2-135m

Five sweeps, one per prompt set in ``data/steer_*.jsonl``, each resumable under ``runs/``:
confidence (yes-rate and P(yes) to "Will this answer be correct?", with the inverted question),
backtracking (self-correction phrases), code verbosity (lines, comments, type hints), refusal, and
length. Each steers the probe's axis at its best layer, the other axis's direction at the same
layer and ``controls`` random unit directions, all with the same vector length per unit of α.
Writes ``results.json``, ``summary.md`` and ``dose.html`` into ``out``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from valueprobe.datasets.io import read_jsonl, sha256_file
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable, markdown_table, record_from_dict
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.dose import SteerSweep
from valueprobe.steering.sweep import SweepSettings, run_sweep

__all__ = ["BENCHMARKS", "Benchmark", "ReplicateSteer", "replicate_steer"]


@dataclass(frozen=True)
class Benchmark:
    """One prompt set, how long its answers need to be, and what is read from them."""

    name: str
    file: str
    max_new_tokens: int
    metrics: tuple[str, ...]
    note: str

    def settings(
        self,
        probe: Path,
        other_probe: Path,
        axis: ValueAxis,
        model: str,
        path: Path,
        alphas: Sequence[float],
        unit: str,
        samples: int,
        controls: int,
        seed: int,
        prompts: int,
        tokens: float,
    ) -> SweepSettings:
        return SweepSettings(
            probe=str(probe),
            probe_fingerprint=axis.fingerprint,
            model=model,
            prompts=str(path),
            prompts_sha256=sha256_file(path),
            alphas=tuple(alphas),
            unit=unit,
            samples=samples,
            max_new_tokens=max(1, math.ceil(self.max_new_tokens * tokens)),
            controls=controls,
            seed=seed,
            other_probe=str(other_probe),
            metrics=self.metrics,
            limit=prompts,
        )


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
class ReplicateSteer:
    """The five sweeps of `replicate_steer`, by benchmark name."""

    sweeps: dict[str, SteerSweep]
    probe: str
    other_probe: str

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

    def to_dict(self) -> dict:
        return {
            "probe": self.probe,
            "other_probe": self.other_probe,
            "sweeps": {k: s.to_dict() for k, s in self.sweeps.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplicateSteer:
        """The sweeps again from ``to_dict()`` or ``results.json``."""
        return record_from_dict(cls, d)

    def markdown(self) -> str:
        first = next(iter(self.sweeps.values()))
        settings = first.settings
        if settings is None or any(s.settings is None for s in self.sweeps.values()):
            raise ValueprobeError("internal: a replicated sweep has no settings to describe")
        headers, rows = self.table()
        lines = [
            "# Steering SmolLM2-135M-Instruct along its value axes",
            "",
            f"Axis steered: `{self.probe}`; control axis: `{self.other_probe}` (its direction at the same layer);"
            f" {settings.controls} random unit directions. Strengths {list(settings.alphas)} in"
            f" `{first.unit}` units, {settings.samples} sample(s), sampling at temperature"
            f" {settings.temperature} with common random numbers; slopes are OLS per {first.step:g}"
            " units of α with 95% bootstrap CIs over prompts; the null range is the central 95% of the"
            " random directions' slopes. Strengths with more than half degenerate outputs are dropped.",
            "",
            *markdown_table(headers, rows, lambda v: f"{v:+.4f}" if isinstance(v, float) else str(v)),
        ]
        lines += [
            "",
            "Sizes: "
            + "; ".join(
                f"{n}: {s.n_rows} outputs, {s.settings.limit} prompts, {s.settings.max_new_tokens} new tokens"
                for n, s in self.sweeps.items()
                if s.settings is not None
            ),
        ]
        return "\n".join(lines) + "\n"


def replicate_steer(
    lm: LoadedModel,
    *,
    axis: ValueAxis,
    other: ValueAxis,
    probe: Path,
    other_probe: Path,
    data_dir: Path,
    runs_dir: Path,
    out: Path,
    prompts: int = 12,
    alphas: Sequence[float] = (-30.0, -15.0, 0.0, 15.0, 30.0),
    unit: str = "norm",
    samples: int = 1,
    controls: int = 8,
    seed: int = 0,
    tokens: float = 1.0,
    batch_size: int = 32,
) -> ReplicateSteer:
    """Run (or resume) every benchmark of :data:`BENCHMARKS` and write the results into ``out``.

    Args:
        prompts: rows per prompt set (confidence and refusal keep their pairs when even).
        tokens: multiplies each benchmark's ``max_new_tokens`` (a smaller run reads shorter answers).
        Others: as in `valueprobe.steering.sweep.SweepSettings`.
    """
    sweeps: dict[str, SteerSweep] = {}
    for bench in BENCHMARKS:
        path = data_dir / bench.file
        examples = read_jsonl(path)[:prompts]
        settings = bench.settings(
            probe,
            other_probe,
            axis,
            lm.model_id,
            path,
            alphas,
            unit,
            samples,
            controls,
            seed,
            prompts,
            tokens,
        )
        sweeps[bench.name] = run_sweep(
            lm, axis, examples, runs_dir / bench.name, settings, other=other, batch_size=batch_size
        )
        # Written after every benchmark, so a stopped run still shows what it finished.
        report = ReplicateSteer(sweeps=dict(sweeps), probe=str(probe), other_probe=str(other_probe))
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.json", json.dumps(jsonable(report.to_dict()), indent=2) + "\n")
        atomic_write_text(out / "summary.md", report.markdown())
    return report
