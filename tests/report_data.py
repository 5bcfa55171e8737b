"""Result sections for report tests: every section present, built from the real records and saved by
their ``to_dict`` (numbers made up for layout only), so a report test reads what a run writes."""

from __future__ import annotations

import numpy as np

from valueprobe.attribute.records import (
    AblatedMetric,
    Ablation,
    Agreement,
    Attribution,
    Baselines,
    DirectTerm,
    GridView,
    PatchTerm,
    ResidGrid,
)
from valueprobe.audit.records import Audit, AuditTest
from valueprobe.audit.records import Curve as AuditCurve
from valueprobe.audit.records import Effect as AuditEffect
from valueprobe.guided.budget import BudgetPoint, GuideBudget, GuideReplication, MethodCurve, Separation
from valueprobe.probe.axis import ProbeRef
from valueprobe.probe.contrast import Contrast, MatchedControl
from valueprobe.probe.layer_sweep import LayerAurocs, LayerSweepSummary, SplitGroups
from valueprobe.probe.transfer import TransferSummary
from valueprobe.read.readout import LogitLens
from valueprobe.report.sections import ShiftSection, SteerSection, TracedText
from valueprobe.stats.metrics import MeanSd, Slope
from valueprobe.steering.decode.generation import Trace
from valueprobe.steering.experiment.baseline import prompt_baseline
from valueprobe.steering.experiment.caa_result import CaaBehaviour, CaaReplication
from valueprobe.steering.experiment.dose import Curve, Effect, SteerSweep, SweepRow, summarize_rows
from valueprobe.steering.experiment.prompting import Goal
from valueprobe.steering.experiment.reliability import item_reliability
from valueprobe.tune.shift_records import GroupShift, PairSeparation, ShiftResult


def _ms(x: float, sd: float = 0.02) -> MeanSd:
    return MeanSd(x, sd)


def sweep_record(n_layers: int = 4) -> LayerSweepSummary:
    rng = np.random.default_rng(0)
    cos = np.clip(np.eye(n_layers) + 0.3 * rng.random((n_layers, n_layers)), -1, 1)
    return LayerSweepSummary(
        method="span_diff",
        best_layer=n_layers - 1,
        n_splits=3,
        chosen_layers=(n_layers - 1,) * 3,
        heldout_auroc=_ms(0.75),
        by_layer={
            i: LayerAurocs(_ms(0.6 + 0.05 * i), _ms(0.6 + 0.05 * i), _ms(0.5), _ms(0.5), _ms(0.55))
            for i in range(n_layers)
        },
        controls={
            "embed": _ms(0.6),
            "position:token_index": _ms(0.52),
            "shuffled": _ms(0.5),
            "random": _ms(0.55),
        },
        strongest_control="embed",
        margin=0.15,
        cosine_layers=tuple(range(n_layers)),
        cosine=tuple(tuple(row) for row in cos.tolist()),
        splits=(SplitGroups(("a", "b"), ("c",), ("d",)),) * 3,
    )


def sweep_section(n_layers: int = 4) -> dict:
    return sweep_record(n_layers).to_dict()


def matched_control_record() -> MatchedControl:
    return MatchedControl(
        layer=3,
        post_vs_pre_main=Contrast(0.95, (0.9, 0.99), 2.0),
        post_vs_pre_control=Contrast(0.9, (0.85, 0.95), 1.5),
        main_post_vs_control_post=Contrast(0.6, (0.5, 0.7), 0.3),
        embed_main_post_vs_control_post=Contrast(0.5, (0.45, 0.55), 0.0),
        main_minus_control_post_sigma=0.2,
    )


def _steer() -> SteerSection:
    alphas = (-4.0, 0.0, 4.0)
    effect = Effect(
        metric="p_yes",
        subset="direct",
        axis=Slope(0.02, (0.01, 0.03), 5, 15),
        other=Slope(0.0, (-0.01, 0.01), 5, 15),
        other_name="other:history",
        null=(-0.01, 0.0, 0.01),
        null_range=(-0.01, 0.01),
        dropped=(),
        curves={
            "axis": Curve(alphas, (0.3, 0.4, 0.5), (0.2, 0.3, 0.4), (0.4, 0.5, 0.6)),
            "other": Curve(alphas, (0.4,) * 3, (0.3,) * 3, (0.5,) * 3),
            "null": Curve(alphas, (0.4,) * 3, (0.35,) * 3, (0.45,) * 3),
        },
    )
    return SteerSection(
        SteerSweep(unit="sigma", effects=(effect,), n_rows=45), headline="steering: slope +0.02"
    )


def caa_record() -> CaaReplication:
    """Two behaviours, 4 items each, summarised by the real functions from planted rows: the vector
    raises p(match) with the multiplier, two random directions do not, and a toward prompt adds 0.1."""
    rng = np.random.default_rng(0)
    target = Goal("p_match", "all", 1)
    behaviours = {}
    for b, slope in (("refusal", 0.2), ("sycophancy", 0.0)):
        rows = [
            SweepRow(f"{b}-{i}", b, m, d, 0, None, "", {"p_match": float(np.clip(base + lift, 0, 1))}, c)
            for i in range(4)
            for m in (-1.0, 0.0, 1.0)
            for d in ("axis", "random-0", "random-1")
            for c in ("none", "toward")
            for base in [0.5 + 0.05 * rng.standard_normal()]
            for lift in [(slope * m if d == "axis" else 0.0) + (0.1 if c == "toward" else 0.0)]
        ]
        plain = summarize_rows(rows, unit="caa", metrics=("p_match",))
        prompted = {
            "toward": summarize_rows(rows, unit="caa", metrics=("p_match",), condition="toward").effects
        }
        sweep = SteerSweep("caa", plain.effects, len(rows), prompted=prompted)
        behaviours[b] = CaaBehaviour(b, 3.0, 0.5, 8, sweep, sweep, prompt_baseline(sweep, target),
                                     item_reliability(rows, target), ())  # fmt: skip
    return CaaReplication("tiny", 2, {1: 0.05, 2: 0.1}, behaviours, 2, 4)


def _shift() -> ShiftSection:
    group = GroupShift(
        group="words",
        n=3,
        targeted=True,
        base_mean=-0.03,
        tuned_mean=0.5,
        shift=0.53,
        ci=(0.4, 0.7),
        shift_data_sigma=4.24,
        null_range=(-0.2, 0.2),
        null_percentile=100.0,
        d_before=None,
        d_after=None,
        share=1.0,
        quartiles_before=(0.25, 0.25, 0.25, 0.25),
        quartiles_after=(0.0, 0.0, 0.33, 0.67),
        counts=True,
    )
    result = ShiftResult(
        base_id="tiny",
        tuned_id="tiny-dpo",
        base_fingerprint="a",
        tuned_fingerprint="b",
        probe=ProbeRef(
            "tiny", "a", "span_diff", "resid_post", 0.0, 2.0, "fitting set"
        ),  # 1 base σ = 8 data σ
        layer=2,
        layers=(0, 1, 2, 3),
        tokens="all",
        n_random=8,
        groups=(group,),
        shift_by_layer={"words": (0.1, 0.3, 0.53, 0.4)},
        pairs=(PairSeparation("words", "other", (0.0, 0.1, 0.2, 0.1), (0.0, 0.5, 0.9, 0.6)),),
        untargeted_range=None,
        axis_cosine=None,
        records=tuple(
            {"id": f"w{i}", "group": "words", "label": 1, "base": b, "tuned": t}
            for i, (b, t) in enumerate([(0.0, 0.5), (0.1, 0.7), (-0.2, 0.4)])
        ),
    )
    return ShiftSection(result, tune={"target": "words", "pairs": 4, "steps": 1}, headline="shift +0.5 σ")


def _guide() -> GuideReplication:
    def point(n: int, acc: float, null: tuple[float, float] | None = None) -> BudgetPoint:
        return BudgetPoint(n, 40.0 * n, acc, (acc - 0.1, acc + 0.1), null)

    curves = (
        MethodCurve("greedy", "baseline", (point(1, 0.2),)),
        MethodCurve("one sample", "baseline", (point(1, 0.1),)),
        MethodCurve("best-of-n by log-prob", "baseline", (point(1, 0.1), point(2, 0.15), point(4, 0.2))),
        MethodCurve("self-consistency", "baseline", (point(1, 0.1), point(2, 0.12), point(4, 0.22))),
        MethodCurve("oracle (any of n right)", "oracle", (point(1, 0.1), point(2, 0.2), point(4, 0.35))),
        MethodCurve("best-of-n by value", "policy", (point(1, 0.1), point(2, 0.16), point(4, 0.25)), "value"),
        MethodCurve("best-of-n by random directions", "null",
                    tuple(point(n, 0.1 + 0.02 * n, (0.08, 0.2)) for n in (1, 2, 4)), "value"),
        MethodCurve("prune", "policy", (BudgetPoint(4, 90.0, 0.18, (0.1, 0.26)),), "value"),
    )  # fmt: skip
    budget = GuideBudget("arithmetic", "data/task_arithmetic.jsonl", 20, 4, curves,
                         (Separation("value", 3, 0.74, 0.69, (0.45, 0.71), 80, 8),), {"temperature": 0.8})  # fmt: skip
    return GuideReplication({"arithmetic": budget}, ("value",), "tiny")


def _ablation() -> Ablation:
    def metric(name: str, none: float, top: float, null: tuple[float, ...]) -> AblatedMetric:
        return AblatedMetric(name, none, top, null, none - top, (-0.01, 0.02), none - top > 0.02)

    return Ablation(
        k=2, components=("L1H0", "L0.mlp"), n_draws=3, n_units=6, steer_sigma=2.0,
        auroc=metric("AUROC", 0.9, 0.7, (0.9, 0.88, 0.91)), gap=metric("gap σ", 0.4, 0.1, (0.4, 0.39, 0.41)),
        steer=metric("steering slope (yes-no per σ)", 0.2, 0.19, (0.2, 0.21, 0.2)),
    )  # fmt: skip


def attribution_record(method: str = "direct") -> Attribution:
    """An attribution of a 2-layer, 2-head model: direct (terms, ablation) or patching (grid, agreement)."""
    names = [("embed", "embed", -1, -1)] + [
        (f"L{b}H{h}" if kind == "head" else f"L{b}.mlp", kind, b, h if kind == "head" else -1)
        for b in range(2) for kind, h in (("head", 0), ("head", 1), ("mlp", 0))
    ]  # fmt: skip
    common = dict(
        model_id="tiny", fingerprint="f-g", probe="probes/tiny", layer=1, sigma=0.5, data=("data/icrl_pairs.jsonl",),
        read="spans (post)", n_units=6, n_rows=12, paired=True, axis_gap=0.3, axis_gap_ci=(0.2, 0.4), axis_auroc=0.9,
    )  # fmt: skip
    if method == "direct":
        terms = tuple(
            DirectTerm(n, k, b, h, 0.1 * i, 0.05 * i, 0.05 * i - 0.1, (0.05 * i - 0.15, 0.05 * i - 0.05), (-0.02, 0.02),
                       True, 0.1)
            for i, (n, k, b, h) in enumerate(names)
        )  # fmt: skip
        return Attribution(
            method="direct", n_random=8, closure=1e-7, terms=terms, ablation=_ablation(), **common
        )  # type: ignore[arg-type]
    patches = tuple(
        PatchTerm(n, k, b, h, 0.02 * i, (0.01 * i, 0.03 * i), -0.02 * i, (-0.03 * i, -0.01 * i), 0.1, -0.1)
        for i, (n, k, b, h) in enumerate(names[1:])
    )  # fmt: skip
    views = (
        GridView("first difference", 0, ("+", "1"), ((0.3, 0.1), (0.0, 0.2)), ((-0.3, -0.1), (0.0, -0.2))),
        GridView(
            "read",
            -1,
            ("a", "b", "c"),
            ((0.0, 0.0, 0.1), (0.0, 0.1, 0.2)),
            ((0.0, 0.0, -0.1), (0.0, -0.1, -0.2)),
        ),
    )
    grid = ResidGrid(layers=(0, 1), views=views)
    return Attribution(
        method="patch", patches=patches, baselines=Baselines(0.2, -0.1, 1.0, 0.5), grid=grid,
        agreement=Agreement(6, 0.8, 0.9, 3, 0.67, ("L1H0",), ()), **common,  # type: ignore[arg-type]
    )  # fmt: skip


def audit_record() -> Audit:
    """An audit of two tests: the 2×2 (effects and its cells' curves) and the lens (effects only)."""

    def effect(name: str, role: str, est: float, null: tuple[float, float]) -> AuditEffect:
        return AuditEffect(
            name=name, role=role, expected="+", estimate=est, ci=(est - 0.05, est + 0.05), unit="σ",
            reference=2 * est, null=null, null_percentile=97.0, n=40, n_positive=38,
        )  # fmt: skip

    a = AuditTest(
        key="a", title="End of turn vs value, a 2×2", design="four arms, identical tails",
        effects=(effect("value", "value", 0.2, (-0.1, 0.1)), effect("end", "rival", 0.05, (-0.2, 0.2))),
        verdict="value", why="value: holds; rival: fails (inside the random null (60th percentile))",
        held_fixed=True, cost="160 sequences, 33828 tokens forwarded", seconds=12.0, notes=("40 kept, 0 dropped",),
        curves=(AuditCurve("value high", (0.0, 1.0), (0.3, 0.2), (0.25, 0.15), (0.35, 0.25)),
                AuditCurve("value low", (0.0, 1.0), (0.1, 0.0))),
    )  # fmt: skip
    e = AuditTest(
        key="e", title="Logit lens", design="top 50 promoted tokens",
        effects=(effect("success words", "value", 0.0, (0.0, 0.02)), effect("closing", "rival", 0.1, (0.0, 0.04))),
        verdict="the rival", why="value: fails; rival: holds", held_fixed=None, cost="65 directions", seconds=1.0,
    )  # fmt: skip
    return Audit(
        probe="tiny-axis", model_id="tiny", layer=3, site="resid_post", axis_sigma=2.0, sigma_reference="neutral",
        reference_sigma=1.0, reference_tokens=100, n_random=64, rendering="the model's chat template",
        tests=(a, e), command="valueprobe audit --probe tiny-axis --out runs/a", seconds=13.0,
    )  # fmt: skip


def all_sections() -> dict:
    """A ``results.json`` object with every section the report draws."""
    trace = Trace(
        tokens=("Hi", " <there>", "!"),
        n_prompt=1,
        values={"resid_post[3]": (0.1, -1.5, 2.5)},
        alpha=(0.0, 0.0, 0.0),
        steered="resid_post[3]",
    )
    transfer = TransferSummary(
        families=("icrl", "code"),
        layer=3,
        method="diff_means",
        auroc=((0.9, 0.6), (0.55, 0.8)),
        cohens_d=((1.5, 0.3), (0.2, 1.0)),
        cosine=((1.0, 0.4), (0.4, 1.0)),
        controls={"shuffled": ((0.5, 0.5), (0.5, 0.5)), "embed": ((0.8, 0.55), (0.55, 0.6))},
        margin=((0.1, 0.05), (0.0, 0.2)),
        off_diagonal_auroc=_ms(0.575),
        notes=(),
    )
    sections = {
        "sweep": sweep_record(),
        "history": sweep_record(),
        "transfer": transfer,
        "matched_control": matched_control_record(),
        "logit_lens": LogitLens(3, (("<b>", 2.0), ("yes", 1.0)), (("no", 1.5),)),
        "trace": TracedText("Hi <there>!", trace),
        "steer": _steer(),
        "shift": _shift(),
        "guide": _guide(),
        "attribution": attribution_record("direct"),
        "attribution_patch": attribution_record("patch"),
        "attribution_position": attribution_record("direct"),
        "caa": caa_record(),
        "audit": audit_record(),
    }
    return {
        "model": "tiny",
        "summary": ["axis: AUROC 0.75 vs control 0.60"],
        "sections": {k: r.to_dict() for k, r in sections.items()},
    }
