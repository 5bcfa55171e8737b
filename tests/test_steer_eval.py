"""Judging steering: side effects against a hand computation, the front and reliability on planted
data, the prompt baseline's verdict, and ``replicate steer`` writing it all on a tiny model.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_steer_eval.py
References: KL and perplexity recomputed with a plain forward hook adding α·σ·v̂ to block L's
output; slopes, shares and fronts in closed form on rows and points built by the test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from test_replicate_steer import DATA
from test_steer_sweep import settings_for, tiny_axis

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.replicate import steer_eval
from valueprobe.replicate.steer import ReplicateSteerSettings, replicate_steer
from valueprobe.replicate.steer_eval import SteerEvaluation
from valueprobe.report.browser import open_report
from valueprobe.report.steering_eval import (
    baseline_figure,
    caa_figure,
    front_figure,
    reliability_figure,
    side_effects_figure,
)
from valueprobe.stats.metrics import Slope
from valueprobe.steering.experiment.baseline import Mean, PromptBaseline, prompt_baseline
from valueprobe.steering.experiment.dose import Curve, Effect, SteerSweep, SweepRow
from valueprobe.steering.experiment.front import Front, FrontPoint, effect_front
from valueprobe.steering.experiment.prompting import Goal
from valueprobe.steering.experiment.reliability import item_reliability, item_slopes
from valueprobe.steering.experiment.side_effects import PREFIX, SideMetric, text_side_effects
from valueprobe.steering.hook.spec import SteeringSpec

HAVE_CHROMIUM = bool(
    shutil.which("chromium") or shutil.which("chromium-browser") or os.environ.get("VALUEPROBE_CHROMIUM")
)


def _texts(n: int = 3) -> list[Example]:
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "then",
        "it",
        "ran",
        "to",
        "the",
        "door",
        "of",
        "the",
        "house",
        "quite",
        "fast",
    ]
    return [
        Example(
            id=f"t{i}-{part}", label=1, group=f"neutral_text/{part}", text=" ".join(words[i:] + words[:i])
        )
        for part in ("kl", "heldout")
        for i in range(n)
    ]


def _hand_log_probs(lm, ids: torch.Tensor, mask: torch.Tensor, adds: dict[int, torch.Tensor] | None = None):
    """Log-probabilities with ``adds[L]`` ([d_model], or [pos, d_model]) added to block L's output."""

    def hook(add):
        def fn(_m, _i, out):
            h = out[0] if isinstance(out, tuple) else out
            h = h + add
            return (h, *out[1:]) if isinstance(out, tuple) else h

        return fn

    handles = [lm.layers[layer].register_forward_hook(hook(add)) for layer, add in (adds or {}).items()]
    try:
        with torch.no_grad():
            logits = lm.model(input_ids=ids, attention_mask=mask).logits
    finally:
        for handle in handles:
            handle.remove()
    return torch.log_softmax(logits[:, PREFIX - 1 : -1].double(), dim=-1)


def _kl(
    lm, rows: list[list[int]], adds: dict[int, torch.Tensor]
) -> tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL(p0 ‖ p_α) over the continuations by hand, and the steered log-probabilities, ids, mask."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    ref = _hand_log_probs(lm, ids, mask)
    got = _hand_log_probs(lm, ids, mask, adds)
    keep = mask[:, PREFIX:].double()
    per_pos = (ref.exp() * (ref - got)).sum(-1)
    return float(((per_pos * keep).sum(1) / keep.sum(1)).mean()), got, ids, mask


def test_kl_and_perplexity_equal_a_plain_hook(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)  # σ = 2 at every layer
    sweep = settings_for(
        tmp_path, axis, spec=SteeringSpec(axis, probe="tiny", layers=1), alphas=(0.0, 1.5), controls=1
    )
    kl, ppl = text_side_effects(lm, sweep, _texts(), progress=False)
    rows = [lm.tokenizer(t.text)["input_ids"] for t in _texts()[:3]]
    expect, got, ids, mask = _kl(lm, rows, {1: 3.0 * axis.direction(1)})
    keep = mask[:, PREFIX:].double()
    assert kl.values["axis"][0] == 0.0 and kl.values["axis"][1] == pytest.approx(float(expect), rel=1e-4)
    assert kl.values["axis"][1] > 1e-4  # the steering moved the distribution: not a trivial match
    nll = -(got.gather(-1, ids[:, PREFIX:, None])[..., 0] * keep).sum(1) / keep.sum(
        1
    )  # held-out = same words
    assert ppl.values["axis"][1] == pytest.approx(float(np.exp(nll.mean())), rel=1e-4)
    lo, hi = kl.axis_ci[1]
    assert lo <= kl.values["axis"][1] <= hi


def test_side_effects_steer_with_the_sweeps_spec_whole(tiny_lm_factory, tmp_path):
    """Two layers and a window of generated tokens (the continuation's tokens a <= i < b after the
    PREFIX read as the prompt) reach the KL: it is the KL of a hook adding α·σ·v̂ at both layers on
    those positions only, and neither the first layer alone nor every position gives it."""
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)  # σ = 2 at every layer, its own v̂ per layer
    a, b = 1, 4
    spec = SteeringSpec(axis, probe="tiny", layers=[0, 2], window=(a, b))
    sweep = settings_for(tmp_path, axis, spec=spec, alphas=(0.0, 1.5), controls=1)
    kl, _ = text_side_effects(lm, sweep, _texts(), progress=False)
    rows = [lm.tokenizer(t.text)["input_ids"] for t in _texts()[:3]]
    width = max(map(len, rows))
    on = torch.zeros(width, 1)
    on[PREFIX + a : PREFIX + b] = 1.0

    def adds(layers, where):
        return {layer: where * (3.0 * axis.direction(layer)) for layer in layers}

    whole, *_ = _kl(lm, rows, adds([0, 2], on))
    first_only, *_ = _kl(lm, rows, adds([0], on))
    everywhere, *_ = _kl(lm, rows, adds([0, 2], torch.ones(width, 1)))
    assert kl.values["axis"][1] == pytest.approx(whole, rel=1e-4)
    assert min(abs(whole - first_only), abs(whole - everywhere)) > 1e-3 * whole  # each setting mattered


def _row(
    item: str, alpha: float, value: float, *, direction: str = "axis", condition: str = "none"
) -> SweepRow:
    return SweepRow(item, "g", alpha, direction, 0, None, "", {"m": value}, condition)


def test_reliability_counts_items_against_the_sign_and_the_shift():
    slopes = {"a": 1.0, "b": 2.0, "c": -1.0, "d": 0.0}  # planted: one item against, one still
    reworded = {"a": -1.0, "b": 2.0, "c": -1.0, "d": 1.0}
    rows = [_row(i, a, s * a) for i, s in slopes.items() for a in (-1.0, 0.0, 1.0)]
    rows += [_row(i, a, s * a, condition="reworded") for i, s in reworded.items() for a in (-1.0, 0.0, 1.0)]
    rows += [_row(i, a, -a, direction="random-0") for i in slopes for a in (-1.0, 1.0)]  # every item against
    rows += [_row(i, a, a, direction="random-1") for i in slopes for a in (-1.0, 1.0)]  # none against
    assert item_slopes(rows, "m", "all") == pytest.approx(slopes)
    rel = item_reliability(rows, Goal("m", "all", 1))
    assert (rel.with_, rel.against) == (0.5, 0.25)
    assert rel.null_against == pytest.approx((0.025, 0.975))
    assert rel.shift is not None and rel.shift.change == pytest.approx(np.mean([-2, 0, 0, 1]))
    assert rel.shift.sign_flips == 0.5  # a (+ to −) and d (0 to +)
    flipped = item_reliability(rows, Goal("m", "all", -1))
    assert flipped.against == 0.5


def test_front_counts_an_alpha_only_beyond_the_random_front_at_a_reached_kl():
    axis = (
        FrontPoint("axis", 0.0, 0.0, 0.0),
        FrontPoint("axis", 1.0, 0.1, 0.5),
        FrontPoint("axis", 2.0, 0.9, 2.0),
    )
    random = (FrontPoint("random-0", 1.0, 0.05, 0.2), FrontPoint("random-0", 2.0, 0.3, 0.6))
    front = Front("m", "all", 1, axis, random)
    assert front.useful == (1.0,)  # α = 2 moves most but at a KL no random direction reaches
    assert front.random_front() == [(0.05, 0.2), (0.3, 0.6)]
    beaten = Front("m", "all", 1, axis, (*random, FrontPoint("random-1", 1.0, 0.08, 0.7)))
    assert beaten.useful == ()
    assert Front.from_dict(json.loads(json.dumps(front.to_dict()))) == front


def test_effect_front_reads_moves_from_rows_and_needs_an_alpha_zero():
    rows = [_row(i, a, 1.0 + 2 * a) for i in ("a", "b") for a in (0.0, 1.0)]
    rows += [_row(i, 1.0, 1.0, direction="random-0") for i in ("a", "b")]
    kl = SideMetric("kl", "kl", (0.0, 1.0), {"axis": (0.0, 0.2), "random-0": (0.0, 0.4)}, ((0, 0), (0, 0)), 2)
    front = effect_front(rows, kl, Goal("m", "all", -1))
    assert [(p.alpha, p.kl, p.effect) for p in front.axis] == [(0.0, 0.0, 0.0), (1.0, 0.2, -2.0)]
    with pytest.raises(ValueprobeError, match="no α = 0"):
        effect_front([r for r in rows if r.alpha != 0], kl, Goal("m", "all", 1))


def _effect(means: tuple[float, ...], *, null: tuple[float, float] = (0.4, 0.6)) -> Effect:
    alphas = (-1.0, 0.0, 1.0)
    lo = tuple(m - 0.05 for m in means)
    hi = tuple(m + 0.05 for m in means)
    curves = {
        "axis": Curve(alphas, means, lo, hi),
        "null": Curve(alphas, (0.5,) * 3, (null[0],) * 3, (null[1],) * 3),
    }
    nan = Slope(math.nan, (math.nan, math.nan), 0, 0)
    return Effect("m", "all", nan, None, None, (), null, (), curves)


def test_baseline_verdict_compares_steering_with_asking():
    sweep = SteerSweep(
        "sigma",
        (_effect((0.4, 0.5, 0.6)),),
        0,
        prompted={"toward": (_effect((0.8, 0.9, 1.0)),), "away": (_effect((0.1, 0.2, 0.3)),)},
    )
    (row,) = prompt_baseline(sweep, Goal("m", "all", 1))
    assert row.toward is not None and row.away_down is not None  # both prompt conditions ran
    assert (row.alpha, row.plain.mean, row.toward.mean, row.away_down.mean) == (1.0, 0.5, 0.9, 0.1)
    assert row.verdict == "asking beats steering" and row.steering_leaves_null is False
    (unsigned,) = prompt_baseline(sweep, None)
    assert unsigned.verdict == "-"
    strong = SteerSweep("sigma", (_effect((0.0, 0.5, 2.0)),), 0, prompted=sweep.prompted)
    assert prompt_baseline(strong, Goal("m", "all", 1))[0].verdict == "steering beats asking"
    assert prompt_baseline(strong, Goal("m", "all", -1))[0].verdict == "asking beats steering"
    assert PromptBaseline.from_dict(json.loads(json.dumps(row.to_dict()))) == row
    assert Mean(1.0, 0.5, 2.0).signed(-1) == (-2.0, -0.5)


def test_replicate_steer_judges_its_sweeps(tiny_lm_factory, tmp_path, monkeypatch):
    lm = tiny_lm_factory("llama")
    small = {
        "arithmetic": ("task_arithmetic.jsonl", "task_arithmetic/level1", 2, 8),
        "code": ("task_code.jsonl", None, 1, 8),
    }
    monkeypatch.setattr(steer_eval, "TASKS", small)
    run = ReplicateSteerSettings(
        probe=Path("p/value"), other_probe=Path("p/history"), data_dir=DATA, runs_dir=tmp_path / "runs",
        prompts=4, alphas=(-1.0, 0.0, 1.0), unit="sigma", controls=2, tokens=0.05, rows=("add",),
        benchmarks=("length", "confidence"), conditions=("toward", "away", "reworded"),
    )  # fmt: skip
    report = replicate_steer(
        lm, run, axis=tiny_axis(lm), other=tiny_axis(lm, seed=1), out=tmp_path / "out", evaluate=True
    )
    assert set(report.sweeps) == {"confidence", "length"}
    ev = SteerEvaluation.from_dict(json.loads((tmp_path / "out" / "evaluation.json").read_text()))
    assert set(ev.benches) == {"confidence", "length"}
    length = ev.benches["length"]
    assert length.target == Goal("length", "all", -1)
    assert [b.verdict != "-" for b in length.baseline] == [b.metric == "length" for b in length.baseline]
    assert length.reliability is not None and length.reliability.n_items == 4 and length.reliability.shift
    assert length.front is not None and len(length.front.random) == 2 * 3
    names = [m.name for m in ev.side.metrics]
    assert names[:2] == ["kl", "perplexity"] and {"accuracy_arithmetic", "accuracy_code"} <= set(names)
    assert {"target_length", "target_confidence"} <= set(names)
    assert set(ev.side.metric("kl").values) == {"axis", "random-0", "random-1"}
    summary = (tmp_path / "out" / "summary.md").read_text()
    for heading in (
        "Does steering beat asking?",
        "Side effects",
        "Effect against KL",
        "Per-item reliability",
    ):
        assert heading in summary
    figures = [
        baseline_figure([b for x in ev.benches.values() for b in x.baseline], unit=ev.unit),
        front_figure([length.front]),
        reliability_figure([length.reliability]),
        side_effects_figure(ev.side),
        caa_figure({"confidence": report.sweeps["confidence"]}, {"confidence": (0.2, 0.5, 0.8)}, layer=1),
    ]
    assert all(fig.data for fig in figures)
    if (
        HAVE_CHROMIUM or os.environ.get("VALUEPROBE_REQUIRE_BROWSER") == "1"
    ):  # every figure draws in a real browser
        page = tmp_path / "figures.html"
        parts = [f.to_html(full_html=False, include_plotlyjs=i == 0) for i, f in enumerate(figures)]
        page.write_text("<!DOCTYPE html><html><body>" + "".join(parts) + "</body></html>")
        check = open_report(page, height=900)
        assert check.n_figures == len(figures) and check.ok, check.problems()
    first = read_jsonl(DATA / "neutral_text.jsonl")[0]
    assert first.group == "neutral_text/kl" and len(lm.tokenizer(first.text)["input_ids"]) > PREFIX + 1


def test_steer_cli_judges_its_sweep(tiny_lm_factory, tiny_dir, tmp_path, capsys, monkeypatch):
    small = {
        "arithmetic": ("task_arithmetic.jsonl", "task_arithmetic/level1", 1, 4),
        "code": ("task_code.jsonl", None, 1, 4),
    }
    monkeypatch.setattr("valueprobe.replicate.steer_eval.TASKS", small)
    lm = tiny_lm_factory("llama")
    tiny_axis(lm).save(tmp_path / "probe")
    base = ["steer", "--probe", str(tmp_path / "probe"), "--model", tiny_dir, "--force", "--limit", "2",
            "--alphas=-1,0,1", "--max-new-tokens", "2", "--random-directions", "1", "--greedy", "--side-effects"]  # fmt: skip
    code, out, err = run_cli([*base, "--prompts", str(DATA / "steer_open.jsonl"), "--conditions", "toward,away,reworded",
                              "--out", str(tmp_path / "s")], capsys)  # fmt: skip
    assert code == 0, err
    for heading in (
        "steering, prompting and both",
        "per-item reliability",
        "side effects",
        "effect against KL",
    ):
        assert heading in out
    side = json.loads((tmp_path / "s" / "side_effects.json").read_text())
    assert [m["name"] for m in side["metrics"]] == [
        "kl",
        "perplexity",
        "accuracy_arithmetic",
        "accuracy_code",
    ]
    assert (tmp_path / "s" / "front.html").is_file()
    assert set(json.loads((tmp_path / "s" / "metrics.json").read_text())["prompted"]) == {
        "toward",
        "away",
        "reworded",
    }
    (tmp_path / "p.jsonl").write_text((DATA / "steer_open.jsonl").read_text())
    code, _, err = run_cli(
        [*base, "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "t")], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "neutral_text.jsonl, which does not exist" in err
