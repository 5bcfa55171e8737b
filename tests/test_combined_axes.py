"""Several axes in one steering, and axis arithmetic (sum, difference, orthogonalize) with provenance.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_combined_axes.py``
References: closed forms on the unsteered ``output_hidden_states`` (and under the KV cache, a
no-cache forward of the final sequence), and the vector formulas of each arithmetic operation.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_operators import SIGMA, cached_and_full, op_axis  # tests/ is on sys.path under pytest
from test_steer import _batch, _forward, planted_axis

from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.spec import SteeringSpec

ARCHS = ("llama", "gpt2", "gpt_neox")


def two_axes(lm) -> tuple[ValueAxis, ValueAxis]:
    a = op_axis(lm)
    b = ValueAxis(**{**a.__dict__, "directions": planted_axis(lm, seed=2).directions, "method": "other"})
    return a, b


@pytest.mark.parametrize("arch", ARCHS)
def test_several_axes_each_add_their_own_strength_under_the_cache(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    a, b = two_axes(lm)
    ids, mask = _batch(lm)
    alpha = torch.tensor([2.0, -1.5, 0.0, 3.0])
    out, base, real = cached_and_full(lm, ids, mask, 5, [2 * a, -b], alpha)
    push = 2 * SIGMA * a.direction(1) - SIGMA * b.direction(1)
    want = base.hidden_states[2] + alpha[:, None, None] * push
    torch.testing.assert_close(out.hidden_states[2][real], want[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_several_axes_ablate_in_list_order(tiny_lm_factory, arch):
    """Each axis's operator acts in list order at a shared point: not orthogonal, the order shows."""
    lm = tiny_lm_factory(arch)
    a, b = two_axes(lm)
    va, vb = a.direction(1), b.direction(1)
    assert abs(float(va @ vb)) > 1e-2
    ids, mask = _batch(lm)
    real = mask.bool()
    h = _forward(lm, ids, mask, output_hidden_states=True).hidden_states[2]
    for first, second in ((a, b), (b, a)):
        v1, v2 = first.direction(1), second.direction(1)
        h1 = h - (h @ v1)[..., None] * v1
        want = h1 - (h1 @ v2)[..., None] * v2
        with steer(lm, SteeringSpec([first, second], layers=1, op="ablate"), 1.0):
            got = _forward(lm, ids, mask, output_hidden_states=True).hidden_states[2]
        torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
        torch.testing.assert_close((got @ v2)[real], torch.zeros_like(got[..., 0])[real], atol=1e-5, rtol=0)


def test_sum_difference_and_orthogonalize_are_their_vector_formulas(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    a, b = two_axes(lm)
    for layer in a.layers:
        va, vb = a.direction(layer), b.direction(layer)
        for got, v in (
            ((2 * a + b).direction(layer), 2 * va + vb),
            ((a - b).direction(layer), va - vb),
            (a.orthogonalize(b).direction(layer), va - (va @ vb) * vb),
        ):
            torch.testing.assert_close(got, v / v.norm(), atol=1e-6, rtol=0)
        assert abs(float(a.orthogonalize(b).direction(layer) @ vb)) < 1e-6
    orth = (3 * a).orthogonalize(b)
    assert orth.scale == 3.0 and not orth.calibrated(1)
    assert orth.made["op"] == "orthogonalize" and orth.made["layers"] == list(a.layers)
    assert [p["method"] for p in orth.made["from"]] == [a.method, "other"]
    assert orth.made["from"][0]["scale"] == 3.0
    nested = (a - b).orthogonalize(a)
    assert nested.made["from"][0]["made"]["op"] == "difference"
    # probe.json keeps the record; a probe saved without one loads with none
    back = ValueAxis.load(nested.save(tmp_path / "nested"))
    assert back.made == json.loads(json.dumps(nested.made))
    assert json.loads((tmp_path / "nested" / "probe.json").read_text())["made"]["op"] == "orthogonalize"
    a.save(tmp_path / "plain")
    assert "made" not in json.loads((tmp_path / "plain" / "probe.json").read_text())
    assert ValueAxis.load(tmp_path / "plain").made == {}


def test_combining_axes_of_other_widths_or_models_is_refused(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    a, _ = two_axes(lm)
    wide = planted_axis(tiny_lm_factory("llama", d_model=32))
    other_arch = planted_axis(tiny_lm_factory("gpt2"))
    for combine in (lambda x: a + x, lambda x: a - x, lambda x: a.orthogonalize(x)):
        with pytest.raises(ValueprobeError, match="cannot combine axes of different widths"):
            combine(wide)
        with pytest.raises(ValueprobeError, match="come from different architectures"):
            combine(other_arch)
    with pytest.raises(ValueprobeError, match="cannot combine axes of different widths"):
        steer(lm, [a, wide], 1.0)
    with pytest.raises(ValueprobeError, match="different architectures"):
        steer(lm, [a, other_arch], 1.0)
    with pytest.raises(ValueprobeError, match="parallel or cancel"):
        a.orthogonalize(2 * a)
    with pytest.raises(ValueprobeError, match="override takes one axis"):
        steer(lm, SteeringSpec([a, a], direction=torch.ones(lm.d_model)), 1.0)
