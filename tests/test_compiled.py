"""Steering and reading under transformers' static cache (``cache_implementation="static"``) and
under ``torch.compile`` equal the eager dynamic-cache run (issue 27, item 5), on a tiny model.

The reference is the same ``generate`` with the default dynamic cache: greedy tokens equal, the
step scores within float32 rounding, and the handle's σ-score trace and read layer equal at every
real cell. Guided decoding is not here: it steps its own `DynamicCache` (rows leave it and roll
back in it: ``batch_select_indices`` and ``crop``), which a static cache does not offer.
"""

from __future__ import annotations

import pytest
import torch
from test_steer import PROMPTS, planted_axis

from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.hook.handle import Steering
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec

TOKENS = 6


def _generate(lm, spec, cache: str | None, *, compiled: bool = False, alphas=(2.0, 0.0, -3.0, 1.0)):
    """Greedy tokens, step scores and the handle's traces (σ before the steered layer's addition,
    and at read layer 2) of one steered ``generate``; ``compiled`` compiles the forward with the
    hooks on (dynamo does not guard module hooks: hooks added after compiling would be skipped)."""
    pad = pad_id_for(lm.tokenizer)
    ids, mask = pad_rows(encode_prompts(lm, PROMPTS), pad_id=pad, side="left")
    steering = Steering(
        lm, spec, torch.tensor(alphas), prompt_length=ids.shape[1], trace=True, read_layers=[2]
    )
    forward = lm.model.forward
    try:
        with steering.attach():
            if compiled:
                torch._dynamo.reset()
                lm.model.forward = torch.compile(forward, dynamic=False)
            with torch.inference_mode():
                out = lm.model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=TOKENS, min_new_tokens=TOKENS,
                    do_sample=False, pad_token_id=pad, output_scores=True, return_dict_in_generate=True,
                    cache_implementation=cache,
                )  # fmt: skip
    finally:
        lm.model.forward = forward
        if compiled:
            torch._dynamo.reset()
    traces, _ = steering.traced()
    real = torch.cat([mask, torch.ones(mask.shape[0], TOKENS - 1, dtype=mask.dtype)], dim=1).bool()
    reads = {p: torch.cat(parts, dim=1)[real] for p, parts in traces.items()}
    return out.sequences, torch.stack(out.scores), reads


def _assert_same(got, want, atol: float) -> None:
    assert torch.equal(got[0], want[0])
    finite = torch.isfinite(want[1])  # min_new_tokens blocks EOS with -inf
    assert torch.equal(finite, torch.isfinite(got[1]))
    torch.testing.assert_close(got[1][finite], want[1][finite], atol=atol, rtol=0)
    for point, values in want[2].items():
        torch.testing.assert_close(got[2][point], values, atol=atol, rtol=0)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"positions": "generated"},
        {"op": Operator("clamp", lo=1.0, hi=2.0)},
        {"unit": "norm", "window": (1, 3)},
    ],
    ids=["add", "generated", "clamp", "norm-window"],
)
def test_steering_and_reading_under_a_static_cache_equal_the_dynamic_cache(tiny_lm_factory, options):
    lm = tiny_lm_factory("llama")
    spec = SteeringSpec(planted_axis(lm), layers=1, **options)
    want = _generate(lm, spec, None)
    got = _generate(lm, spec, "static")
    _assert_same(got, want, atol=1e-5)
    unsteered = _generate(lm, spec, "static", alphas=(0.0,) * 4)
    assert not torch.equal(unsteered[1], got[1])  # the steering did something to compare


@pytest.mark.slow  # compiling takes ~1 min of CPU
def test_steering_compiled_with_a_static_cache_equals_eager(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    spec = SteeringSpec(planted_axis(lm), layers=1, positions="generated")
    want = _generate(lm, spec, None)
    got = _generate(lm, spec, "static", compiled=True)
    _assert_same(got, want, atol=1e-4)
