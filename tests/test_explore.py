"""``vp.explore``: the notebook view, against ``vp.generate`` on a tiny model.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_explore.py``
References: ``vp.generate`` with the same spec, α and decoding (each strip's tokens and values),
a random direction drawn by `random_directions` (the null), the strip's own markup rules.
"""

from __future__ import annotations

import re

import pytest
import torch
from test_steer import planted_axis

import valueprobe as vp
from valueprobe.report.explore import Explorer
from valueprobe.stats.null import random_directions
from valueprobe.steering.hook.spec import SteeringSpec

DECODING = vp.Decoding(greedy=True, max_new_tokens=6)


@pytest.fixture(scope="module")
def explorer(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    return Explorer(lm, planted_axis(lm), "Is 7 prime?", alpha=2.0, decoding=DECODING, null_seed=4)


def _strip_values(markup: str) -> list[list[float]]:
    """Each strip's data-value attributes, strip by strip."""
    return [
        [float(v) for v in re.findall(r'data-value="([^"]+)"', part)] for part in markup.split("vp-strip")[1:]
    ]


def test_each_strip_is_the_generation_it_names(explorer):
    lm, spec = explorer.lm, explorer.spec
    rows = explorer.run(2.0)
    steered, plain = vp.generate(
        lm, spec, ["Is 7 prime?"], alphas=[2.0, 0.0], decoding=DECODING, trace=True, progress=False
    )
    r = torch.from_numpy(random_directions(lm.d_model, 1, seed=4)[0]).float()
    null_spec = SteeringSpec(spec.first_axis(), direction=r, direction_name="random-4")
    (null,) = vp.generate(
        lm, null_spec, ["Is 7 prime?"], alphas=[2.0], decoding=DECODING, trace=True, progress=False
    )
    for name, want in (("steered", steered), ("unsteered", plain), ("random", null)):
        assert rows[name].token_ids == want.token_ids and rows[name].values == want.values, name
    markup = explorer.strips(2.0)._repr_html_()
    assert _strip_values(markup) == [list(w.values.sigma) for w in (steered, plain, null)]
    assert "random-4: α = 2 sigma" in markup and "steered: α = 2 sigma" in markup


def test_the_slider_regenerates_at_its_value(explorer):
    pytest.importorskip("ipywidgets")
    box = explorer.widget()
    slider, out = box.children
    assert slider.max == pytest.approx(round(explorer.cap(), 1)) and slider.min == -slider.max
    slider.value = -1.5
    assert explorer.alpha == -1.5 and out.value == explorer.strips(-1.5).markup
    want = vp.generate(
        explorer.lm,
        explorer.spec,
        ["Is 7 prime?"],
        alphas=[-1.5],
        decoding=DECODING,
        trace=True,
        progress=False,
    )[0]
    # batched with the unsteered row, the steered one differs from a row alone in the last bits only
    assert _strip_values(out.value)[0] == pytest.approx(list(want.values.sigma), abs=1e-5)
    assert explorer.run(-1.5)["steered"].token_ids == want.token_ids


def test_the_cap_is_the_layers_mean_norm(explorer):
    axis = explorer.spec.first_axis()
    layer = axis.best_layer
    assert explorer.cap() * axis.unit_size(layer, "sigma") == pytest.approx(float(axis.mean_norm[layer]))
