"""The one check of what an engine, a graph route or an export can run of a spec (`additive`)."""

from __future__ import annotations

import re

import pytest
from test_steer import PROMPTS, planted_axis

from valueprobe.errors import ValueprobeError
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.hook.additive import CONTROL_VECTOR, GRAPH, VLLM, beyond, check_additive
from valueprobe.steering.hook.condition import Condition
from valueprobe.steering.hook.interop import control_vector
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec

RUNNERS = {"graph": GRAPH, "vllm": VLLM, "control vector": CONTROL_VECTOR}
# what each asks beyond plain additions on the residual stream, and who refuses it
ASKS = {
    "op": (dict(op=Operator("clamp", hi=1.0)), "op clamp", {"graph", "vllm", "control vector"}),
    "site": (dict(site="mlp_out"), "site mlp_out", {"graph", "vllm", "control vector"}),
    "window": (dict(window=(0, 3)), "a window of generated tokens", {"graph", "vllm", "control vector"}),
    "condition": (dict(condition=Condition(1.0)), "a condition", {"graph", "vllm", "control vector"}),
    "phase": (dict(positions="generated"), "positions generated", {"control vector"}),
}


@pytest.mark.parametrize("ask", ASKS)
def test_each_runner_refuses_exactly_what_it_cannot_add(tiny_lm_factory, ask):
    axis = planted_axis(tiny_lm_factory("llama"))
    fields, phrase, refused_by = ASKS[ask]
    spec = SteeringSpec(axis, **fields)
    for name, runner in RUNNERS.items():
        assert beyond(SteeringSpec(axis), runner) == []
        assert beyond(spec, runner) == ([phrase] if name in refused_by else []), name
    for name in sorted(refused_by):
        runner = RUNNERS[name]
        with pytest.raises(
            ValueprobeError,
            match=f"^x: {re.escape(phrase)}: {runner.who} only adds α·unit·v̂ .*: {re.escape(runner.fix)}$",
        ):
            check_additive(spec, runner, where="x: ")


def test_several_axes_and_several_asks_in_one_line(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    two = SteeringSpec((planted_axis(lm), planted_axis(lm, seed=2)), window=(0, 2))
    assert beyond(two, VLLM) == ["a window of generated tokens", "2 axes"]
    assert beyond(two, GRAPH) == ["a window of generated tokens"]  # nnsight adds several axes
    with pytest.raises(ValueprobeError, match="^a window of generated tokens with 2 axes: the vllm engine"):
        check_additive(two, VLLM)


def test_the_callers_refuse_with_the_one_check(tiny_lm_factory):
    """The export and the graph route raise the check's line, not a wording of their own."""
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)
    with pytest.raises(
        ValueprobeError, match="^positions prompt: a control vector only adds .* at every position"
    ):
        control_vector(lm, SteeringSpec(axis, positions="prompt"))
    with pytest.raises(ValueprobeError, match="^a condition: nnsight's generate graph only adds"):
        generate(
            lm, SteeringSpec(axis, condition=Condition(1.0)), PROMPTS[:1], route="nnsight", progress=False
        )
