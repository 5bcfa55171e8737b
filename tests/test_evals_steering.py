"""The steering arguments both harness adapters take (`EvalSteering`): read once from the model
arguments each harness hands over (typed as that harness guessed), unknown keys refused in one
line naming the known ones, and resolved on a model as `valueprobe steer` resolves a spec."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_steer import planted_axis  # tests/ is on sys.path under pytest

from valueprobe.errors import ValueprobeError
from valueprobe.evals.steering import EvalSteering, ModelArgs, along_random
from valueprobe.steering.decode.rows import ValueAt
from valueprobe.steering.hook.spec import SteeringSpec

lm_eval_utils = pytest.importorskip("lm_eval.utils")
lm_eval_cli = pytest.importorskip("lm_eval._cli.utils")
inspect_config = pytest.importorskip("inspect_ai._util.config")


@dataclass(frozen=True)
class Own(ModelArgs):
    """An adapter's own keys beside the steering, one of each kind the adapters use."""

    device: str | None = None
    batch_size: int | str = 16
    value_at: ValueAt = "after"


def _as_each_harness_reads(text: dict[str, str]) -> dict[str, dict[str, object]]:
    """``k=v`` text as lm-eval's two parsers and Inspect's ``-M`` parser type it."""
    joined = ",".join(f"{k}={v}" for k, v in text.items())
    return {
        "text": dict(text),
        "lm-eval create_from_arg_string": lm_eval_utils.simple_parse_args_string(joined),
        "lm-eval --model_args": lm_eval_cli.key_val_to_dict(joined),
        "Inspect -M": inspect_config.parse_cli_args([f"{k}={v}" for k, v in text.items()]),
    }


@settings(max_examples=60, deadline=None)
@given(
    alpha=st.floats(allow_nan=False, allow_infinity=False),
    k=st.integers(0, 64),
    seed=st.integers(0, 2**31 - 1),
    allow=st.booleans(),
    batch=st.integers(1, 512),
)
def test_every_harness_parser_gives_the_same_typed_steering(alpha, k, seed, allow, batch):
    text = {
        "probe": "smollm2-135m-value",
        "alpha": repr(alpha),
        "random": str(k),
        "seed": str(seed),
        "allow_large": str(allow).lower(),
        "batch_size": str(batch),
    }
    want = EvalSteering(probe="smollm2-135m-value", alpha=alpha, random=k, seed=seed, allow_large=allow)
    for name, given_args in _as_each_harness_reads(text).items():
        steering, own = EvalSteering.parse(given_args, beside=Own, harness=name)
        assert (steering, own) == (want, Own(batch_size=batch)), name
        assert type(steering.alpha) is float and type(steering.random) is int, name


def test_a_spec_file_becomes_a_path_and_an_in_process_spec_passes_as_itself(tmp_path):
    steering, own = EvalSteering.parse(
        {"spec": str(tmp_path / "spec.json"), "batch_size": "auto"}, beside=Own, harness="lm-eval"
    )
    assert steering.spec == tmp_path / "spec.json" and own.batch_size == "auto"
    spec = SteeringSpec(probe="smollm2-135m-value")
    steering, _ = EvalSteering.parse({"spec": spec, "alpha": 2}, beside=Own, harness="Inspect")
    assert steering.spec is spec and steering.alpha == 2.0


def test_an_unknown_key_is_one_line_naming_every_key_the_model_takes():
    with pytest.raises(ValueprobeError) as info:
        EvalSteering.parse({"probe": "p", "alhpa": 1}, beside=Own, harness="lm-eval")
    line = str(info.value)
    assert "\n" not in line and "'alhpa'" in line
    assert line.endswith(
        "use spec, probe, alpha, random, seed, allow_large, force, device, batch_size, value_at"
    )


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("alpha", "strong", "alpha='strong': give a finite number"),
        ("alpha", float("nan"), "give a finite number"),
        ("alpha", True, "give a finite number"),
        ("random", 1.5, "random=1.5: give a whole number"),
        ("random", [1, 2], "give a whole number"),  # Inspect reads `-M random=1,2` as a list
        ("allow_large", "yes", "allow_large='yes': give true or false"),
        ("value_at", "sideways", "give before or after"),
        ("batch_size", True, "give a whole number or text"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_line_naming_the_key_and_what_it_takes(key, value, says):
    with pytest.raises(ValueprobeError, match=says.replace("[", r"\[").replace("(", r"\(")):
        EvalSteering.parse({key: value}, beside=Own, harness="Inspect")


@pytest.fixture(scope="module")
def lm(tiny_lm_factory):
    return tiny_lm_factory("llama")


def test_resolve_is_the_spec_or_its_random_direction_checked_against_the_model(lm):
    spec = SteeringSpec(planted_axis(lm), layers=[1], unit="sigma")
    assert EvalSteering(spec=spec, alpha=3.0).resolve(lm) is not None
    null = EvalSteering(spec=spec, alpha=3.0, random=2, seed=5).resolve(lm)
    assert null.name() == "random-2"
    assert torch.equal(null.direction, along_random(spec, 2, seed=5).direction)
    # planted: σ = 0.5 of a mean norm of 8, so the cap (the addition no larger than h) is 16σ
    with pytest.raises(ValueprobeError, match="--allow-large"):
        EvalSteering(spec=spec, alpha=20.0).resolve(lm)
    EvalSteering(spec=spec, alpha=20.0, allow_large=True).resolve(lm)
    with pytest.raises(ValueprobeError, match="d_model"):
        EvalSteering(probe="smollm2-135m-value").resolve(lm)  # the shipped axis is 576 wide
    with pytest.raises(ValueprobeError, match="not both"):
        EvalSteering(spec=Path("s.json"), probe="p").resolve(lm)
