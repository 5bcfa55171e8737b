"""σ over the one neutral reference (valueprobe.probe.calibrate), α in both units, and files
written before it read in their own units (probes, steering specs)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import pytest
import torch

from valueprobe.datasets.io import Example, read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.calibrate import calibrate
from valueprobe.probe.reference import NEUTRAL_RULE, NEUTRAL_TEXT, SigmaReference
from valueprobe.probe.units import alpha_units, check_push
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.steering.hook.strength import check_strengths, spec_units
from valueprobe.vocab import Site


def _axis(lm, *, seed: int = 0, sigma: float = 5.0) -> ValueAxis:
    g = torch.Generator().manual_seed(seed)
    n = lm.n_layers
    v = torch.randn(n, lm.d_model, generator=g)
    return ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True),
        layers=tuple(range(n)),
        mu=torch.zeros(n),
        sigma=torch.full((n,), sigma),
        mean_norm=torch.full((n,), 10.0),
        best_layer=1,
        site=Site.resid_post,
        method="diff_means",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=lm.d_model,
        sigma_reference=SigmaReference("fitting set: 10 rows of test"),
    )


def _reference_moments(lm, axis: ValueAxis) -> tuple[list[float], list[float], list[float]]:
    """μ, σ and mean norm from output_hidden_states, one paragraph at a time, position 0 dropped."""
    proj: list[list[torch.Tensor]] = [[] for _ in axis.layers]
    norms: list[list[torch.Tensor]] = [[] for _ in axis.layers]
    with torch.no_grad():
        for ex in read_jsonl(NEUTRAL_TEXT):
            ids = lm.tokenizer(ex.text, return_tensors="pt")["input_ids"]
            hs = lm.model(ids, output_hidden_states=True).hidden_states
            for i, layer in enumerate(axis.layers):
                h = hs[layer + 1][0, 1:].double()  # resid_post[L] == hidden_states[L + 1]
                proj[i].append(h @ axis.direction(layer).double())
                norms[i].append(h.norm(dim=1))
    p = [torch.cat(x) for x in proj]
    return (
        [float(x.mean()) for x in p],
        [float(x.std(unbiased=False)) for x in p],
        [float(torch.cat(x).mean()) for x in norms],
    )


def test_calibrate_equals_hidden_states_over_the_reference(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = _axis(lm)
    got = calibrate(axis, lm, batch_size=5)  # padded batches must not count pad tokens
    mu, sigma, norm = _reference_moments(lm, axis)
    inner = slice(0, lm.n_layers - 1)  # HF's last hidden state is after the final norm: not resid_post
    assert got.mu.tolist()[inner] == pytest.approx(mu[inner], rel=1e-4, abs=1e-5)
    assert got.sigma.tolist()[inner] == pytest.approx(sigma[inner], rel=1e-4)
    assert got.mean_norm.tolist() == [10.0] * lm.n_layers  # the axis's own: % of the norm keeps its meaning
    no_norm = replace(axis, mean_norm=torch.full((lm.n_layers,), math.nan))
    assert calibrate(no_norm, lm).mean_norm.tolist()[inner] == pytest.approx(norm[inner], rel=1e-4)
    ref = got.sigma_reference
    assert ref.standard and ref.name == NEUTRAL_TEXT and ref.rule == NEUTRAL_RULE
    n_tokens = sum(len(lm.tokenizer(ex.text)["input_ids"]) - 1 for ex in read_jsonl(NEUTRAL_TEXT))
    assert ref.n_tokens == n_tokens and len(ref.sha256) == 64
    assert got.directions is axis.directions  # the direction is never touched


def test_calibrate_keeps_the_statistics_it_replaced(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis = _axis(lm, sigma=7.0)
    once = calibrate(axis, lm)
    former = once.former()
    assert former.sigma.tolist() == [7.0] * lm.n_layers and str(former.sigma_reference).startswith(
        "fitting set"
    )
    twice = calibrate(once, lm)  # a second calibration keeps the first record, not its own
    assert twice.formerly == once.formerly
    assert -once.former().mu.tolist()[0] == pytest.approx((-once).former().mu.tolist()[0])
    assert once[2].former().sigma.tolist() == [7.0]
    once.save(tmp_path / "p")
    back = ValueAxis.load(tmp_path / "p")
    assert (
        back.sigma_reference == once.sigma_reference and back.former().sigma.tolist() == [7.0] * lm.n_layers
    )
    with pytest.raises(ValueprobeError, match="no former calibration"):
        axis.former()


def test_arithmetic_is_calibrated_on_the_reference(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    diff = _axis(lm) - _axis(lm, seed=1)
    assert not diff.calibrated(1)
    got = calibrate(diff, lm)
    assert got.calibrated(1) and got.sigma_reference.standard and got.formerly == {}


def test_a_chat_reference_is_refused(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, [Example(id="c", label=1, group="g", messages=({"role": "user", "content": "hi"},))])
    with pytest.raises(ValueprobeError, match="is a chat; a σ reference is plain text"):
        calibrate(_axis(lm), lm, reference=path)


def test_an_axis_from_another_reference_says_so_once_when_loaded(tiny_lm_factory, tmp_path, caplog):
    lm = tiny_lm_factory("llama")
    _axis(lm).save(tmp_path / "old")
    info = json.loads((tmp_path / "old" / "probe.json").read_text())
    info["sigma_reference"] = "fitting set: 10 rows of test"  # as probe.json was written before
    (tmp_path / "old" / "probe.json").write_text(json.dumps(info))
    calibrate(_axis(lm), lm).save(tmp_path / "new")
    with caplog.at_level(logging.WARNING, logger="valueprobe"):
        old = ValueAxis.load(tmp_path / "old")
        ValueAxis.load(tmp_path / "new")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "not the neutral reference every axis shares" in lines[0]
    assert "1σ = 50.0% of the mean residual norm" in lines[0]  # σ 5 over a mean norm of 10
    assert old.sigma_at(1) == 5.0  # read as recorded, never rescaled


def test_alpha_in_both_units_is_one_conversion(tiny_lm_factory):
    axis = _axis(tiny_lm_factory("llama"), sigma=2.0)  # 1σ = 2 raw = 20% of a mean norm of 10
    both = alpha_units(axis, 3, layer=1, unit="sigma")
    assert (both.sigma, both.norm) == pytest.approx((3.0, 60.0))
    back = alpha_units(axis, 60, layer=1, unit="norm")
    assert (back.sigma, back.norm) == pytest.approx((3.0, 60.0))
    assert alpha_units(axis, 4, layer=1, unit="raw").sigma == pytest.approx(2.0)
    assert str(both) == "+3σ (+60% of the norm)"
    uncalibrated = replace(axis, sigma=torch.full((axis.sigma.shape[0],), math.nan))
    assert math.isnan(alpha_units(uncalibrated, 10, layer=1, unit="norm").sigma)


def test_a_push_past_the_norm_is_refused_unless_allowed(tiny_lm_factory):
    axis = _axis(tiny_lm_factory("llama"), sigma=2.0)
    check_push(axis, [-5, 5], layer=1, unit="sigma", allow_large=False)  # exactly 100%: allowed
    with pytest.raises(
        ValueprobeError, match=r"--alphas: α = 6 sigma at layer 1 is \+6σ \(\+120% of the norm\)"
    ):
        check_push(axis, [0, 6], layer=1, unit="sigma", allow_large=False)
    check_push(axis, [0, 6], layer=1, unit="sigma", allow_large=True)
    spec = SteeringSpec(axis, layers=[0, 1])
    with pytest.raises(ValueprobeError, match="--alpha: "):
        check_strengths(spec, [7], allow_large=False, option="--alpha")
    check_strengths(SteeringSpec(axis, op="ablate"), [7], allow_large=False)  # α is a share there
    assert [u.norm for u in spec_units(spec, [-1, 2])] == pytest.approx([-20.0, 40.0])


def test_a_spec_file_written_before_the_reference_keeps_its_units(tiny_lm_factory, tmp_path, caplog):
    lm = tiny_lm_factory("llama")
    calibrate(_axis(lm, sigma=7.0), lm).save(tmp_path / "probe")
    spec = SteeringSpec(probe=str(tmp_path / "probe"), layers=[1])
    now = spec.to_dict()
    assert now["format_version"] == 2 and now["sigma_reference"][0].startswith("neutral_text (sha256")
    assert SteeringSpec.from_dict(now).first_axis().sigma_at(1) == spec.first_axis().sigma_at(1)

    old = {k: v for k, v in now.items() if k != "sigma_reference"} | {"format_version": 1}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger="valueprobe"):
        read = SteeringSpec.load(tmp_path / "old.json").check()
    assert read.first_axis().sigma_at(1) == 7.0  # the units it was written in, not the new σ
    assert any("its α is read in those units" in r.getMessage() for r in caplog.records)
    assert read.to_dict()["sigma_reference"][0].startswith("fitting set")  # saved again: says which

    drifted = now | {"sigma_reference": ["some other text"]}
    with pytest.raises(ValueprobeError, match="keeps no record of that one"):
        SteeringSpec.from_dict(drifted).check()
    with pytest.raises(ValueprobeError, match=r"sigma_reference: expected one text \(or null\) per probe"):
        SteeringSpec.from_dict(now | {"sigma_reference": "x"})
