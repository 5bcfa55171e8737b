"""The vLLM steering record (`valueprobe.engines.vllm_spec`): needs no vLLM, runs in the main venv."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from valueprobe.engines.vllm_spec import EXTRA_KEY, VllmSteer, resolve
from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis

PROBE = str(Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-value")


def test_round_trip_through_json_and_extra_args():
    spec = VllmSteer(probe=PROBE, alpha=-2.5, unit="norm", layer=12, positions="generated", key="k")
    assert VllmSteer.parse(json.dumps(spec.to_dict())) == spec
    assert VllmSteer.parse(spec.extra_args()[EXTRA_KEY]) == spec


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"probe": PROBE, "alpha": "big"}, "alpha"),
        ({"probe": PROBE, "alpha": float("inf")}, "alpha"),
        ({"probe": PROBE, "alpha": 1, "layer": 99}, "layer"),
        ({"probe": PROBE, "alpha": 1, "layer": 2.5}, "layer"),
        ({"probe": PROBE, "unit": "furlongs"}, "unit"),
        ({"probe": PROBE, "positions": "middle"}, "positions"),
        ({"probe": PROBE, "alpha": 1, "direction": [1.0, 2.0]}, "direction"),
        ({"probe": "/nonexistent/probe"}, "probe"),
        ({"alpha": 1}, "probe"),
        ({"probe": PROBE, "alpah": 1}, "alpah"),
        ({"probe": PROBE, "read_layer": 99}, "read_layer"),
    ],
)
def test_bad_fields_are_one_line_naming_the_field(raw, field):
    with pytest.raises(ValueprobeError, match=rf"^{EXTRA_KEY}\.{field}: ") as err:
        VllmSteer.parse(raw)
    assert "\n" not in str(err.value)


def test_not_json_and_not_an_object():
    with pytest.raises(ValueprobeError, match="not JSON"):
        VllmSteer.parse("{alpha: 1")
    with pytest.raises(ValueprobeError, match="expected an object"):
        VllmSteer.parse([1, 2])


def test_resolved_vector_is_alpha_sigma_vhat_at_the_layer():
    axis = ValueAxis.load(PROBE)
    layer = axis.best_layer
    got = resolve(VllmSteer(probe=PROBE, alpha=3.0, layer=layer))
    expected = 3.0 * axis.sigma_at(layer) * axis.direction(layer).float()
    torch.testing.assert_close(got.delta, expected)
    assert got.block == layer and got.read_block == layer
    assert resolve(VllmSteer(probe=PROBE, alpha=3.0, layer=layer, site="resid_pre")).block == layer - 1
    norm = resolve(VllmSteer(probe=PROBE, alpha=10.0, unit="norm", layer=layer))
    i = axis.layers.index(layer)
    torch.testing.assert_close(float(norm.delta.norm()), 0.1 * float(axis.mean_norm[i]), rtol=1e-5, atol=0)


def test_a_control_direction_keeps_the_axis_size():
    axis = ValueAxis.load(PROBE)
    d = torch.randn(axis.d_model)
    got = resolve(VllmSteer(probe=PROBE, alpha=2.0, direction=tuple(d.tolist())))
    torch.testing.assert_close(got.delta, 2.0 * axis.sigma_at(axis.best_layer) * d / d.norm())


def test_salt_separates_every_steering_and_none_for_zero():
    a = VllmSteer(probe=PROBE, alpha=2.0)
    assert VllmSteer(probe=PROBE, alpha=0.0).salt() is None
    assert a.salt() == VllmSteer(probe=PROBE, alpha=2.0, key="other").salt()  # the key is not the KV
    others = [
        VllmSteer(probe=PROBE, alpha=-2.0),
        VllmSteer(probe=PROBE, alpha=2.0, layer=3),
        VllmSteer(probe=PROBE, alpha=2.0, unit="norm"),
        VllmSteer(probe=PROBE, alpha=2.0, positions="prompt"),
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
        assert "--op add only" in err
    code, _, err = run_cli([*args, "--engine", "vllm", "--device-map", "auto"], capsys)
    assert code == 2 and "--engine vllm places the model itself" in err
