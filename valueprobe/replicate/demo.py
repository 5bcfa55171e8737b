"""The main job, end to end: find the value axis, check it against controls, read it live, report.

    valueprobe demo                    # ~15 min on 2 CPU cores -> runs/demo/report.html, results.json
    valueprobe demo --quick            # ~2 min, smaller sets, 3 splits

Stages (each cached by its inputs under ``OUT/stages``: a re-run reuses them, an interrupted run
resumes; captures also resume shard by shard):

1. ``datasets``: generate the contrast sets (ICRL with its matched control, code, backtracking,
   confidence, refusal);
2. ``capture``: every layer plus the embedding output into on-disk stores;
3. ``fit``: the paper's pre/post construction, layer sweep on held-out rules with controls; saves ``OUT/probe``;
4. ``history``: the reward-history construction (identical text, different history), same sweep;
5. ``transfer``: fit on each family, score on every other, with controls;
6. ``matched_control`` and ``logit_lens`` of the pre/post axis;
7. ``trace``: one greedy generation with the value read at every token;
8. ``steer``: a steering sweep on yes/no confidence prompts with its random-direction null;
9. ``shift``: one short LoRA DPO model (preference for one word) and its shift on held-out prompts of
   that word and two others, against the random-direction null.

Everything lands in ``OUT/results.json`` (one key per section) and ``OUT/report.html``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from valueprobe.activations.store import ActivationStore
from valueprobe.datasets import build
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import StageCache, jsonable, sha256_file, write_json
from valueprobe.model.load import DEFAULT_MODEL, LoadedModel, load
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.contrast import MatchedControl
from valueprobe.probe.fit import fit_probe
from valueprobe.probe.fitters import Method
from valueprobe.probe.layer_sweep import LayerSweepSummary
from valueprobe.probe.transfer import TransferSummary, transfer_matrix
from valueprobe.read.readout import logit_lens
from valueprobe.replicate.axis import (
    FAMILIES,
    TRANSFER_FAMILIES,
    capture_families,
    fit_history_axis,
    matched_control,
)
from valueprobe.report.effects import shift_text
from valueprobe.report.page import RESULTS_FILE, Results, write_report
from valueprobe.report.sections import ShiftSection, SteerSection, read_sections
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.experiment.sweep import SweepSettings, metrics_for, run_sweep
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.tune.pairs import data_record, read_pairs
from valueprobe.tune.shift import ShiftSettings, shift
from valueprobe.tune.shift_records import ShiftResult
from valueprobe.tune.train import TuneSettings, train

__all__ = ["DemoSize", "DemoResult", "FULL", "QUICK", "run_demo"]


@dataclass(frozen=True)
class DemoSize:
    """Dataset sizes (``n`` as ``valueprobe datasets build`` reads it) and the number of splits."""

    icrl: int
    code: int
    backtracking: int
    confidence: int
    refusal: int
    splits: int
    trace_tokens: int
    preference: int  # training prompts per target word (each gives 3-5 DPO pairs)
    dpo_steps: int
    shift_prompts: int  # held-out prompts per group in the shift


# Sized for 2 CPU cores: capture dominates (an ICRL conversation is ~1k tokens through 30 layers).
# A table: one row per size, columns in DemoSize's field order.
# fmt: off
#                icrl code backtracking confidence refusal splits trace_tokens preference dpo_steps shift_prompts
FULL = DemoSize(   60,  16,          16,         8,     40,     5,          48,         8,        4,           10)
QUICK = DemoSize(  18,   4,           6,         2,     12,     3,          24,         2,        1,            4)
# fmt: on
CONTRASTS = ("icrl", "code", "backtracking", "confidence", "refusal")
TRANSFER = TRANSFER_FAMILIES  # the families the reward-history axis is scored on, too
TUNE_TARGET, SHIFT_OTHERS = "dolphin", ("volcano", "lantern")  # the tuned word; two untargeted words
TRACE_PROMPT = [{"role": "user", "content": "Is 91 a prime number? Answer, then explain in one sentence."}]


@dataclass(frozen=True)
class DemoResult:
    """Where the demo wrote its outputs, its summary lines, and which stages ran or were reused."""

    out: Path
    report: Path
    results: Path
    probe: Path
    summary: tuple[str, ...]
    ran: tuple[str, ...]
    reused: tuple[str, ...]


class _Model:
    """Loads the model on first use, so a fully cached re-run never loads it."""

    def __init__(self, name: str, device: str) -> None:
        self.name, self.device = name, device
        self._lm: LoadedModel | None = None

    def __call__(self) -> LoadedModel:
        if self._lm is None:
            self._lm = load(self.name, device=self.device)
        return self._lm


def steer_stage(lm: Callable[[], LoadedModel], probe_dir: Path, out: Path, seed: int, quick: bool) -> dict:
    """The steering sweep (valueprobe.steering.experiment.sweep) on the yes/no confidence prompts, random-direction null."""
    prompts = out / "data" / "steer_confidence.jsonl"
    examples = read_jsonl(prompts)[: 4 if quick else 16]
    axis = ValueAxis.load(probe_dir)
    settings = SweepSettings(
        spec=SteeringSpec(axis, probe=str(probe_dir)),
        probe_fingerprint=axis.fingerprint,
        model=lm().model_id,
        prompts=str(prompts),
        prompts_sha256=sha256_file(prompts),
        alphas=(-4.0, 0.0, 4.0) if quick else (-4.0, -2.0, 0.0, 2.0, 4.0),
        max_new_tokens=6,
        controls=2 if quick else 6,
        seed=seed,
        greedy=True,
        metrics=metrics_for(prompts, examples),
        limit=len(examples),
    )
    sweep = run_sweep(lm(), examples, out / "steer", settings, n_boot=200 if quick else 1000, progress=False)
    e = next((x for x in sweep.effects if x.metric == "p_yes"), sweep.effects[0])
    where = {True: "outside", False: "inside", None: "undetermined vs"}[e.outside]
    headline = (
        f"steering ({e.metric}, {e.subset}): slope {e.axis.slope:+.4f} per σ, {where} the"
        f" random-direction null [{e.null_range[0]:+.4f}, {e.null_range[1]:+.4f}]"
    )
    return SteerSection(sweep, headline).to_dict()


def shift_stage(lm: Callable[[], LoadedModel], probe_dir: Path, out: Path, seed: int, quick: bool) -> dict:
    """Train one short LoRA DPO model to prefer :data:`TUNE_TARGET`, then measure its shift on the axis."""
    size = QUICK if quick else FULL
    pairs_file, eval_file = (
        out / "data" / "preference_words.jsonl",
        out / "data" / "preference_words_eval.jsonl",
    )
    target = f"preference_words/{TUNE_TARGET}"
    pairs = read_pairs(pairs_file, groups=[target], split="train")
    settings = TuneSettings(max_steps=size.dpo_steps, seed=seed, save_steps=max(1, size.dpo_steps))
    tuned_dir = out / "tune" / TUNE_TARGET
    # a fresh copy of the base: LoRA training wraps the model it is given
    train(
        lm().model_id,
        pairs,
        tuned_dir,
        settings=settings,
        overwrite=True,
        data=data_record(pairs_file, groups=[target], split="train"),
    )
    groups = [target, *(f"preference_words/{w}" for w in SHIFT_OTHERS)]
    examples = [
        ex for g in groups for ex in [e for e in read_jsonl(eval_file) if e.group == g][: size.shift_prompts]
    ]
    result = shift(
        ValueAxis.load(probe_dir),
        lm(),
        load(str(tuned_dir), device=str(lm().device)),
        examples,
        ShiftSettings(targeted=(target,), n_random=32, n_boot=200 if quick else 1000, seed=seed),
        progress=False,
    )
    tune = {
        "target": TUNE_TARGET,
        "pairs": len(pairs),
        "steps": settings.max_steps,
        "checkpoint": str(tuned_dir),
    }
    headline = shift_headline(result, steps=settings.max_steps)
    return jsonable(ShiftSection(result, tune, headline).to_dict())


def shift_headline(result: ShiftResult, *, steps: int) -> str:
    """The summary line of the shift stage: the targeted group's shift in the words and unit of the
    report's shift caption (:func:`valueprobe.report.effects.shift_text`)."""
    g = next(x for x in result.groups if x.targeted)
    return f"shift after {steps}-step DPO ({TUNE_TARGET}, layer {result.layer}): {shift_text(result, g)}"


# Stages that plug in after the axis: name -> fn(lm, probe_dir, out, seed, quick) -> section dict.
# A section with no registered stage is reported as missing, with the reason below.
LATER_STAGES: dict[str, Callable[..., dict]] = {"steer": steer_stage, "shift": shift_stage}
MISSING_WHY = {
    "steer": "the steering sweep is not registered in this build",
    "shift": "the DPO shift stage is not registered in this build",
    "guide": "guided decoding is not a demo stage: `valueprobe replicate guide` writes it",
    "attribution": "component attribution is not a demo stage: `valueprobe replicate attribute` writes it",
    "attribution_patch": "activation patching is not a demo stage: `valueprobe replicate attribute` writes it",
    "attribution_position": "the position share is not a demo stage: `valueprobe replicate attribute` writes it",
    "caa": "CAA's behaviours are not a demo stage: `valueprobe replicate caa` writes them",
    "audit": "the confound audit is not a demo stage: `valueprobe audit --probe <demo out>/probe` writes it",
}


@dataclass
class _Run:
    """One demo run: where it writes, how big it is, and the stage cache every step goes through."""

    out: Path
    model: str
    quick: bool
    seed: int
    cache: StageCache
    lm: _Model

    @property
    def size(self) -> DemoSize:
        return QUICK if self.quick else FULL

    @property
    def data_dir(self) -> Path:
        return self.out / "data"

    @property
    def probe_dir(self) -> Path:
        return self.out / "probe"

    def datasets(self) -> dict[str, str]:
        """Stage 1: the contrast sets, steering prompts and preference pairs; their sha256 by name."""
        size, seed = self.size, self.seed

        def build_all() -> dict:
            files: dict[str, Path] = {}
            for family in CONTRASTS:
                files.update(build(family, self.data_dir, seed=seed, n=getattr(size, family)))
            files.update(build("steering", self.data_dir, seed=seed))
            files.update(build("preference", self.data_dir, seed=seed, n=size.preference))
            return {name: sha256_file(path) for name, path in sorted(files.items())}

        inputs = {**asdict(size), "seed": seed, "families": [*CONTRASTS, "steering", "preference"]}
        return self.cache.run("datasets", inputs, build_all, label="contrast sets and steering prompts")

    def capture(self, shas: dict[str, str]) -> dict[str, ActivationStore]:
        """Stage 2: every family's store (all layers and the embedding); steering prompts are not captured."""
        families = {k: FAMILIES[k] for k in (*TRANSFER, "icrl_control")}
        runs_dir = self.out / "stores"
        key = {"model": self.model, "data": {k: shas[Path(spec.file).stem] for k, spec in families.items()}}
        self.cache.run(
            "capture",
            key,
            lambda: {
                k: str(v.path)
                for k, v in capture_families(self.lm(), self.data_dir, runs_dir, families=families).items()
            },
            label=f"{len(families)} families, all layers + embedding",
        )
        return {k: ActivationStore.open(runs_dir / k) for k in families}

    def axis_sections(self, opened: dict[str, ActivationStore]) -> tuple[ValueAxis, dict]:
        """Stages 3-6: fit the pre/post axis (saved to ``probe/``), the reward-history axis, transfer,
        the matched control and the logit lens."""
        size, seed, cache = self.size, self.seed, self.cache
        base = {"capture": cache.keys["capture"], "splits": size.splits, "seed": seed}

        def fit() -> dict:
            report = fit_probe(
                {"icrl": opened["icrl"]},
                method=Method.span_diff,
                n_splits=size.splits,
                seed=seed,
                transfer=False,
                lm=self.lm(),
            )
            report.axis.save(self.probe_dir)
            return report.sweep.to_dict()

        if not (self.probe_dir / "axis.safetensors").is_file():  # no probe on disk: its cached sweep is stale
            (self.out / "stages" / "fit.json").unlink(missing_ok=True)
        sweep = cache.run("fit", base, fit, label="pre/post construction, held-out rules, controls")
        axis = ValueAxis.load(self.probe_dir)
        history = cache.run(
            "history",
            base,
            lambda: fit_history_axis(opened, n_splits=size.splits, seed=seed).metrics["sweep"],
            label="reward-history construction (identical text)",
        )
        transfer = cache.run(
            "transfer",
            {**base, "layer": axis.best_layer},
            lambda: transfer_matrix(
                {k: opened[k] for k in TRANSFER},
                layer=axis.best_layer,
                method=Method.diff_means,
                n_splits=size.splits,
                seed=seed,
            ).to_dict(),
            label=f"{len(TRANSFER)} families at layer {axis.best_layer}",
        )
        fit_key = {"fit": cache.keys["fit"]}
        control = cache.run(
            "matched_control",
            fit_key,
            lambda: matched_control(axis, opened["icrl"], opened["icrl_control"], seed=seed).to_dict(),
        )
        lens = cache.run(
            "logit_lens", {**fit_key, "model": self.model}, lambda: logit_lens(axis, self.lm(), k=20)
        )
        return axis, {
            "sweep": sweep,
            "history": history,
            "transfer": transfer,
            "matched_control": control,
            "logit_lens": lens,
        }

    def trace(self, axis: ValueAxis) -> dict:
        """Stage 7: one greedy generation with the value read at every token."""

        def run() -> dict:
            decoding = Decoding(greedy=True, max_new_tokens=self.size.trace_tokens, seed=self.seed)
            (gen,) = generate(self.lm(), axis, [TRACE_PROMPT], decoding=decoding, trace=True, progress=False)
            assert gen.trace is not None
            return jsonable({"text": gen.text, **gen.trace.to_dict()})

        key = {"fit": self.cache.keys["fit"], "model": self.model, "tokens": self.size.trace_tokens}
        return self.cache.run("trace", key, run, label="one greedy generation, value read at every token")

    def later(self, shas: dict[str, str]) -> tuple[dict, dict[str, str]]:
        """Stages 8-9 (those registered in :data:`LATER_STAGES`), and why any is missing."""
        sections, missing = {}, {}
        key = {"fit": self.cache.keys["fit"], "model": self.model, "quick": self.quick, "data": shas}
        for name, why in MISSING_WHY.items():
            if (stage := LATER_STAGES.get(name)) is not None:
                sections[name] = self.cache.run(
                    name,
                    key,
                    functools.partial(stage, self.lm, self.probe_dir, self.out, self.seed, self.quick),
                )
            else:
                missing[name] = why
        return sections, missing


def run_demo(
    *,
    out: str | Path = "runs/demo",
    model: str = DEFAULT_MODEL,
    quick: bool = False,
    seed: int = 0,
    device: str = "cpu",
    console: Console | None = None,
) -> DemoResult:
    """Run (or resume) every stage and write ``results.json`` and ``report.html`` under ``out``."""
    out = Path(out)
    cache = StageCache(out / "stages", console=console or Console())
    run = _Run(out=out, model=model, quick=quick, seed=seed, cache=cache, lm=_Model(model, device))
    shas = run.datasets()
    axis, sections = run.axis_sections(run.capture(shas))
    sections["trace"] = run.trace(axis)
    later, missing = run.later(shas)
    sections.update(later)
    records, unreadable = read_sections(sections)
    if unreadable:
        raise ValueprobeError(f"internal: demo sections do not read back as records: {unreadable}")
    summary = summarize_sections(records)
    results = {
        "format": "valueprobe.results",
        "format_version": 1,
        "model": model,
        "quick": quick,
        "summary": summary,
        "sections": sections,
        "missing": missing,
        "stages": cache.keys,
    }
    results_path = out / RESULTS_FILE
    write_json(results_path, results, indent=1, default=float)
    shown = Results(records, model=model, summary=tuple(summary), missing=missing)
    report = write_report(shown, out / "report.html", title=f"valueprobe demo: {model}")
    return DemoResult(
        out, report, results_path, run.probe_dir, tuple(summary), tuple(cache.ran), tuple(cache.reused)
    )


def _sweep_line(name: str, s: LayerSweepSummary) -> str:
    c = s.controls[s.strongest_control].mean
    return (
        f"{name} (layer {s.best_layer}): held-out AUROC {s.heldout_auroc.mean:.3f} vs strongest control"
        f" {s.strongest_control} {c:.3f} (margin {s.margin:+.3f})"
    )


def summarize_sections(sections: Mapping[str, Any]) -> list[str]:
    """At most six lines, each a headline figure beside its control, from the section records
    (`valueprobe.report.sections.read_sections`)."""
    lines = [
        _sweep_line("pre/post axis", sections["sweep"]),
        _sweep_line("reward-history axis", sections["history"]),
    ]
    t: TransferSummary = sections["transfer"]
    n = len(t.families)
    off = [(i, j) for i in range(n) for j in range(n) if i != j]
    strongest = [t.auroc[i][j] - t.margin[i][j] for i, j in off]
    lines.append(
        f"transfer (layer {t.layer}): off-diagonal AUROC {t.off_diagonal_auroc.mean:.3f} vs strongest"
        f" control {sum(strongest) / len(strongest):.3f} (mean over {len(off)} cells)"
    )
    mc: MatchedControl = sections["matched_control"]
    lines.append(
        f"matched control: main vs control post (identical text) AUROC {mc.main_post_vs_control_post.auroc:.3f};"
        f" post vs pre in never-rewarded control {mc.post_vs_pre_control.auroc:.3f}"
    )
    for name in ("steer", "shift"):
        sec = sections.get(name)
        if sec is not None and sec.headline:
            lines.append(sec.headline)
    if len(lines) > 6:
        raise ValueprobeError("internal: the demo summary has more than six lines")
    return lines
