"""The vLLM request payload (`valueprobe.vllm.request`): a steering spec, α and a key. Needs no vLLM."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vllm.request import EXTRA_KEY, VllmArgs, resolve

PROBE = str(Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-value")
N_LAYERS = 30  # SmolLM2-135M's blocks


def spec(**kw) -> SteeringSpec:
    return SteeringSpec(probe=PROBE, **kw)


def test_round_trip_through_json_and_extra_args():
    args = VllmArgs(spec(unit="norm", layers=12, positions="generated"), alpha=-2.5, key="k")
    assert VllmArgs.parse(json.dumps(args.to_dict())) == args
    assert VllmArgs.parse(args.extra_args()[EXTRA_KEY]) == args
    after = VllmArgs(spec(layers=12), alpha=1.0, key="k", value_at="after")
    assert VllmArgs.parse(after.to_dict()) == after and after.to_dict()["value_at"] == "after"
    assert VllmArgs.parse({"spec": {"probe": PROBE}}).value_at == "after"  # as the HF route's trace reads
    assert after.salt() == VllmArgs(spec(layers=12), alpha=1.0).salt()  # where it reads shares KV
    assert args.to_dict()["spec"] == args.spec.to_dict()  # the spec's own JSON form, α beside it


def _payload(**spec_kw) -> dict:
    return {"spec": {"probe": PROBE, **spec_kw}, "alpha": 1.0}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"spec": {"probe": PROBE}, "alpha": "big"}, r"alpha: "),
        ({"spec": {"probe": PROBE}, "alpha": float("inf")}, r"alpha: "),
        (_payload(layers=99), r"spec: .*no layer 99"),
        (_payload(layers=[2.5]), r"spec: layers: "),
        (_payload(unit="furlongs"), r"spec: unit: "),
        (_payload(positions="middle"), r"spec: positions: "),
        (_payload(direction=[1.0, 2.0]), r"spec: .*direction"),
        (
            _payload(op="ablate"),
            r"spec: op ablate: the vllm engine only adds α·unit·v̂ on the residual stream, one axis at a time: use --engine hf",
        ),
        (_payload(site="attn_out"), r"spec: site attn_out: the vllm engine only adds"),
        (_payload(window=[0, 4]), r"spec: a window of generated tokens: the vllm engine only adds"),
        ({"spec": {"probe": "/nonexistent/probe"}, "alpha": 1}, r"spec.probe: "),
        ({"alpha": 1}, r"spec: missing"),
        ({"spec": {"probe": PROBE}, "alpah": 1}, r"alpah: unknown field"),
        (_payload(read_layer=99), r"spec: .*no layer 99"),
        (_payload(layers=3, read_layer=99), r"spec: read layer 99"),
        ({"spec": {"probe": PROBE, "layrs": 3}, "alpha": 1}, r"spec: layrs: unknown field"),
        ({"spec": {"probe": PROBE}, "value_at": "during"}, r"value_at: expected one of after, before"),
    ],
)
def test_bad_fields_are_one_line_naming_the_field(raw, field):
    with pytest.raises(ValueprobeError, match=rf"^{EXTRA_KEY}\.{field}") as err:
        VllmArgs.parse(raw)
    assert "\n" not in str(err.value)


def test_not_json_and_not_an_object():
    with pytest.raises(ValueprobeError, match="not JSON"):
        VllmArgs.parse("{alpha: 1")
    with pytest.raises(ValueprobeError, match="expected an object"):
        VllmArgs.parse([1, 2])


def test_resolved_vector_is_alpha_sigma_vhat_at_the_layer():
    axis = ValueAxis.load(PROBE)
    layer = axis.best_layer
    got = resolve(VllmArgs(spec(layers=layer), alpha=3.0), N_LAYERS)
    ((block, delta),) = got.adds
    expected = 3.0 * axis.sigma_at(layer) * axis.direction(layer).float()
    torch.testing.assert_close(delta, expected)
    assert block == layer and got.read_block == layer
    pre = resolve(VllmArgs(spec(layers=layer, site="resid_pre"), alpha=3.0), N_LAYERS)
    assert pre.adds[0][0] == layer - 1
    norm = resolve(VllmArgs(spec(unit="norm", layers=layer), alpha=10.0), N_LAYERS)
    i = axis.layers.index(layer)
    torch.testing.assert_close(
        float(norm.adds[0][1].norm()), 0.1 * float(axis.mean_norm[i]), rtol=1e-5, atol=0
    )


def test_several_layers_each_take_their_own_unit():
    axis = ValueAxis.load(PROBE)
    layers = [axis.layers[0], axis.best_layer]
    got = resolve(VllmArgs(spec(layers=layers), alpha=2.0), N_LAYERS)
    assert [b for b, _ in got.adds] == layers
    for (_, delta), layer in zip(got.adds, layers, strict=True):
        torch.testing.assert_close(
            delta, 2.0 * axis.unit_size(layer, "sigma") * axis.direction(layer).float()
        )


def test_a_control_direction_keeps_the_axis_size():
    axis = ValueAxis.load(PROBE)
    d = torch.randn(axis.d_model)
    got = resolve(VllmArgs(spec(direction=d), alpha=2.0), N_LAYERS)
    torch.testing.assert_close(got.adds[0][1], 2.0 * axis.sigma_at(axis.best_layer) * d / d.norm())
    torch.testing.assert_close(got.read_v, axis.direction(axis.best_layer).float())  # read along the axis


def test_salt_separates_every_steering_and_none_for_zero():
    a = VllmArgs(spec(), alpha=2.0)
    assert VllmArgs(spec(), alpha=0.0).salt() is None
    assert a.salt() == VllmArgs(spec(), alpha=2.0, key="other").salt()  # the key is not the KV
    assert a.salt() == VllmArgs(spec(read_layer=3), alpha=2.0).salt()  # nor where values are read
    others = [
        VllmArgs(spec(), alpha=-2.0),
        VllmArgs(spec(layers=3), alpha=2.0),
        VllmArgs(spec(unit="norm"), alpha=2.0),
        VllmArgs(spec(positions="prompt"), alpha=2.0),
    ]
    assert len({a.salt(), *(o.salt() for o in others)}) == 5


def test_steer_engine_choices_are_checked_before_loading(tmp_path, capsys):
    args = ["steer", "--probe", PROBE, "--prompts", "data/steer_open.jsonl", "--out", str(tmp_path / "o")]
    code, _, err = run_cli([*args, "--engine", "tgi"], capsys)
    assert code == 2 and "unknown --engine 'tgi'" in err
    code, _, err = run_cli([*args, "--engine", "vllm", "--op", "ablate"], capsys)
    assert code == 2
    if importlib.util.find_spec("vllm") is None:
        assert "pip install 'valueprobe[vllm]'" in err
    else:
        assert "op ablate: the vllm engine only adds" in err
    code, _, err = run_cli([*args, "--engine", "vllm", "--device-map", "auto"], capsys)
    assert code == 2 and "--engine vllm places the model itself" in err
