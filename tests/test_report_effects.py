"""Report figures of effects: the value trace keeps an attention sink off its scale, and the shift is
stated in one unit, with one number, in the report's caption and in the demo's summary line."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from report_data import all_sections
from test_shift import calibrated_axis, examples, plant

import valueprobe as vp
from valueprobe.probe.axis import ProbeRef
from valueprobe.probe.layer_sweep import LayerSweepSummary
from valueprobe.replicate.demo import shift_headline
from valueprobe.report.effects import (
    data_sigma_per_base_sigma,
    shift_distribution_figure,
    sink_positions,
    trace_figure,
)
from valueprobe.report.page import SECTIONS, Results, render_report
from valueprobe.report.sections import ShiftSection, TracedText
from valueprobe.steering.decode.generation import Trace
from valueprobe.tune.shift import ShiftSettings, shift
from valueprobe.tune.shift_records import GroupShift, ShiftResult


def _chat_trace(sink: float = 33.0, n: int = 40, seed: int = 0) -> TracedText:
    """A trace shaped like a real one: the chat template's first token reads +33 σ, the rest ~N(0, 1)."""
    rng = np.random.default_rng(seed)
    score = (sink, *rng.normal(0.0, 1.0, n - 1).round(3).tolist())
    tokens = ("<|im_start|>", *(f" t{i}" for i in range(1, n)))
    trace = Trace(
        tokens=tokens,
        n_prompt=10,
        values={"resid_post[12]": score},
        alpha=(0.0,) * n,
        steered="resid_post[12]",
    )
    return TracedText("".join(tokens), trace)


def test_trace_leaves_the_sink_out_of_the_y_range_and_marks_it():
    d = _chat_trace()
    score = np.array(d.trace.values["resid_post[12]"])
    fig = trace_figure(d)
    lo, hi = fig.layout.yaxis.range
    assert not lo <= score[0] <= hi, "the +33 σ sink is inside the y-range and flattens the trace"
    assert lo <= score[1:].min() and score[1:].max() <= hi, "an ordinary token fell off the scale"
    assert lo <= -1.0 and hi >= 1.0  # the ±1 σ guide lines stay visible
    assert hi - lo < 10.0  # the rest of the line fills the plot
    line, *markers = fig.data
    assert np.isnan(line.y[0]) and np.allclose(line.y[1:], score[1:])
    (marker,) = markers
    assert list(marker.x) == [0] and marker.y[0] == hi  # drawn at the top edge, where it points
    assert "attention sink, +33σ, off scale" in marker.hovertext[0]
    assert any("attention sink" in a.text for a in fig.layout.annotations)


def test_trace_caption_names_the_sink():
    results = all_sections()
    results["sections"]["trace"] = _chat_trace().to_dict()
    (trace_section,) = [s for s in SECTIONS if s.key == "trace"]
    caption = trace_section.caption(_chat_trace())
    assert "'<|im_start|>' at token 0 (+33 σ)" in caption and "attention sink" in caption
    # the token strip's hover says so too, in the page rebuilt from the saved JSON
    assert "(attention sink)" in render_report(Results.from_dict(results))


def test_a_trace_without_a_sink_keeps_every_point():
    d = _chat_trace(sink=1.5)
    fig = trace_figure(d)
    assert len(fig.data) == 1 and not np.isnan(fig.data[0].y).any()
    lo, hi = fig.layout.yaxis.range
    assert lo <= min(d.trace.values["resid_post[12]"]) and max(d.trace.values["resid_post[12]"]) <= hi


def test_sink_below_the_line_is_drawn_at_the_bottom():
    fig = trace_figure(_chat_trace(sink=-40.0))
    lo, _ = fig.layout.yaxis.range
    assert fig.data[1].y[0] == lo and fig.data[1].marker.symbol == "triangle-down"


@given(
    st.lists(st.floats(-3, 3, allow_nan=False), min_size=3, max_size=60),
    st.floats(-1e3, 1e3, allow_nan=False),
)
def test_sinks_never_cover_ordinary_text(values, shift):
    # Scores within ±3 σ of each other are never sinks, wherever the trace sits.
    assert not sink_positions(np.array(values) + shift).any()


def test_sinks_found_anywhere_and_nan_is_never_one():
    score = np.array([0.1, -0.3, np.nan, 0.5, 25.0, -0.2, 0.0, -30.0])
    assert np.flatnonzero(sink_positions(score)).tolist() == [4, 7]


def _group(
    name: str,
    *,
    targeted: bool,
    shift: float,
    factor: float,
    ci: tuple,
    null: tuple,
    pct: float,
    base_mean: float,
):
    return GroupShift(
        group=name,
        n=1,
        targeted=targeted,
        base_mean=base_mean,
        tuned_mean=base_mean + shift,
        shift=shift,
        ci=ci,
        shift_data_sigma=shift * factor,
        null_range=null,
        null_percentile=pct,
        d_before=None,
        d_after=None,
        share=0.5,
        quartiles_before=(0.25,) * 4,
        quartiles_after=(0.25,) * 4,
        counts=False,
    )


def _shift_section(sigma: float, sigma_data: float, shift: float) -> ShiftResult:
    factor = sigma / sigma_data
    dolphin, volcano = "preference_words/dolphin", "preference_words/volcano"
    return ShiftResult(
        base_id="base",
        tuned_id="tuned",
        base_fingerprint="a",
        tuned_fingerprint="b",
        probe=ProbeRef("base", "a", "span_diff", "resid_post", 0.0, sigma, "fitting set"),
        layer=12,
        layers=(11, 12),
        tokens="mean",
        n_random=32,
        groups=(
            _group(
                dolphin,
                targeted=True,
                shift=shift,
                factor=factor,
                ci=(shift - 0.004, shift + 0.003),
                null=(-0.074, 0.096),
                pct=56.0,
                base_mean=0.1,
            ),
            _group(
                volcano,
                targeted=False,
                shift=0.002,
                factor=factor,
                ci=(-0.001, 0.004),
                null=(-0.08, 0.09),
                pct=52.0,
                base_mean=0.0,
            ),
        ),  # fmt: skip
        shift_by_layer={dolphin: (0.0, shift), volcano: (0.0, 0.002)},
        pairs=(),
        untargeted_range=(0.002, 0.002),
        axis_cosine=None,
        records=({"id": "d0", "group": dolphin, "label": 1.0, "base": 0.1, "tuned": 0.1 + shift},),
    )


_QUANTITY = re.compile(r"([+-]\d+\.\d+) (data σ|σ)")


def test_shift_caption_and_summary_state_one_number_in_one_unit():
    # The numbers of the issue: -0.0104 base σ is -0.093 data σ when the data spread is 1/9 of the reference.
    # read back from its JSON, as the report does: the unit factor comes from the groups, no extra key
    d = _shift_section(sigma=1.0, sigma_data=1 / 8.94, shift=-0.0104)
    d = ShiftResult.from_dict(json.loads(json.dumps(d.to_dict())))
    (section,) = [s for s in SECTIONS if s.key == "shift" and s.title.startswith("Tuning")]
    caption = section.caption(ShiftSection(d))
    summary = shift_headline(d, steps=1)
    said_in_summary = _QUANTITY.findall(summary)
    assert said_in_summary[0] == ("-0.093", "data σ")
    dolphin = caption[caption.index("preference_words/dolphin") :].split(";")[0]
    assert _QUANTITY.findall(dolphin)[0] == said_in_summary[0]
    # every shift in the caption is in data σ; the base unit is named only to relate the two
    assert {unit for _, unit in _QUANTITY.findall(caption.split("prompts: ", 1)[1])} == {"data σ"}
    assert "1 base σ = 8.94 data σ" in caption
    # the CI is converted with the shift: [-0.0144, -0.0074] base σ -> [-0.129, -0.066] data σ
    assert "95% CI [-0.129, -0.066]" in summary and "95% CI [-0.129, -0.066]" in caption


def test_shift_null_bar_is_drawn_in_the_violins_unit():
    d = _shift_section(sigma=2.0, sigma_data=0.5, shift=0.2)  # 1 base σ = 4 data σ
    assert data_sigma_per_base_sigma(d) == pytest.approx(4.0)
    fig = shift_distribution_figure(d)
    (bar,) = [t for t in fig.data if t.name == "null: random directions" and t.x[0].endswith("dolphin")]
    # null [-0.074, +0.096] data σ around the base mean 0.1, in base σ
    assert list(bar.y) == pytest.approx([0.1 - 0.074 / 4, 0.1 + 0.096 / 4])


def test_shift_records_the_data_sigma_that_converts_its_units(tiny_lm_factory):
    # A reference set twice as spread as the data: 1 base σ = 2 data σ, and a planted move of 3 base σ
    # along the axis reads 6 data σ in the caption and in the summary alike.
    base = tiny_lm_factory("gpt2")
    exs = examples()
    axis = calibrated_axis(base, exs)
    axis = dataclasses.replace(axis, sigma=2.0 * axis.sigma)
    tuned = plant(base, layer=1, vector=3.0 * float(axis.sigma[1]) * axis.direction(1))
    res = shift(
        axis, base, tuned, exs, ShiftSettings(targeted=["alpha"], n_random=8, n_boot=50), progress=False
    )
    assert set(res.to_dict()["probe"]) == {
        f.name for f in dataclasses.fields(ProbeRef)
    }  # shift.json's format holds
    assert data_sigma_per_base_sigma(res) == pytest.approx(2.0, rel=1e-4)
    alpha = res.groups[0]
    assert alpha.shift == pytest.approx(3.0, abs=1e-4)
    assert alpha.shift_data_sigma == pytest.approx(6.0, abs=1e-3)
    (section,) = [s for s in SECTIONS if s.key == "shift" and s.title.startswith("Tuning")]
    assert f"alpha {alpha.shift_data_sigma:+.3f} data σ" in section.caption(ShiftSection(res))
    assert f": {alpha.shift_data_sigma:+.3f} data σ" in shift_headline(res, steps=1)
    headers, rows = res.table()  # the printed table states the same number in the same unit
    assert headers[3] == "shift (data σ)" and rows[0][3] == f"{alpha.shift_data_sigma:+.3f}"
    ci = [float(x) for x in rows[0][4].strip("[]").split(",")]
    assert ci == pytest.approx([2.0 * c for c in alpha.ci], abs=2e-3)


def test_trace_figure_takes_a_generations_own_trace_too():
    # the notebooks draw `vp.trace_figure(gen.trace)`: the same figure as from the report's section
    traced = _chat_trace()
    assert vp.trace_figure(traced.trace).to_dict() == trace_figure(traced).to_dict()


def test_the_shipped_sweep_is_drawn_in_layer_order():
    # probe.json stores by_layer with sorted string keys ("0", "1", "10", ...): the figure must not
    # draw the line through them in that order (the README's screenshot did, after the records port)
    meta = json.loads(
        (Path(__file__).resolve().parents[1] / "probes/smollm2-135m-value/probe.json").read_text()
    )
    assert list(meta["metrics"]["sweep"]["by_layer"])[:3] == ["0", "1", "10"]  # the case this guards
    fig = vp.sweep_figure(LayerSweepSummary.from_dict(meta["metrics"]["sweep"]))
    for trace in fig.data:
        x = [v for v in trace.x if v is not None]
        assert x == sorted(x) or x == sorted(x, reverse=True) or trace.fill == "toself", trace.name
    test = next(t for t in fig.data if t.name == "test AUROC")
    assert list(test.x) == list(range(30))
