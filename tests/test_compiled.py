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
from torch._dynamo.utils import counters

from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.hook.condition import Condition
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
        {"positions": "generated", "condition": Condition(-0.2, latch=True)},
    ],
    ids=["add", "generated", "clamp", "norm-window", "latch"],
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


def _compiles(lm, spec, lengths: tuple[int, ...], *, traced: bool) -> tuple[int, int]:
    """(frames dynamo compiled, graph breaks) over static-cache steered ``generate`` calls of
    ``lengths`` tokens, one after another through one compiled forward and one steering handle;
    each call's tokens equal the same call's eager tokens. Recompiles are dynamo's guards whatever
    the backend: the ``eager`` backend counts them without inductor's minutes of CPU."""
    pad = pad_id_for(lm.tokenizer)
    ids, mask = pad_rows(encode_prompts(lm, PROMPTS), pad_id=pad, side="left")
    alphas = torch.tensor([2.0, 0.0, -3.0, 1.0])

    def steering() -> Steering:  # a fresh handle: nothing left on the device by an earlier call
        return Steering(lm, spec, alphas, prompt_length=ids.shape[1], trace=traced, read_layers=[2] * traced)

    def run(tokens: int) -> torch.Tensor:
        with torch.inference_mode():
            return lm.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=pad, cache_implementation="static",
            )  # fmt: skip

    forward = lm.model.forward
    with steering().attach():
        torch._dynamo.reset()
        counters.clear()
        lm.model.forward = torch.compile(forward, dynamic=False, backend="eager")
        try:
            got = [run(n) for n in lengths]
        finally:
            lm.model.forward = forward
            torch._dynamo.reset()
    with steering().attach():
        want = [run(n) for n in lengths]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    return counters["frames"]["ok"], sum(counters["graph_break"].values())


CASES = {
    # the benchmark's row (positions as a device offset, one α per row): a second call of more
    # tokens compiles nothing more
    "steer": ({"positions": "generated"}, False, (8,), (24, 24)),
    # a latch's state is made at the first forward, so the second call compiles once more (the
    # prompt pass, now with the state there); from then on nothing, whatever the tokens
    "latch-trace-read": ({"positions": "generated", "condition": Condition(-0.2, latch=True)}, True, (8, 8), (24, 24, 24)),
}  # fmt: skip


@pytest.mark.slow  # ~40 s of CPU: five compiled generates a case
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_steering_compiles_no_more_for_more_tokens_or_calls(tiny_lm_factory, case):
    """The hooks keep no Python number that changes per step (the forward count and a static cache's
    offset are device tensors; trace lists grow outside the graph) and copy nothing to the device in
    a forward (α and v̂ go there on attach), so dynamo recompiles neither at every decode step nor
    at every call. Steering alone traces without a graph break; a trace or a read layer breaks the
    graph where its list grows (a list appended to inside a graph is guarded on its length).
    A static cache is sized by the generation's length: each length is a new shape (compiled
    once), so the longer calls here are all of one length.
    """
    options, traced, few, more = CASES[case]
    lm = tiny_lm_factory("llama")
    spec = SteeringSpec(planted_axis(lm), layers=1, **options)
    # past dynamo's limit (8 a frame) a frame runs eager and stops counting: a per-step recompile
    # would then give the same count for 8 and 24 tokens
    with torch._dynamo.config.patch(recompile_limit=64):
        short, long = _compiles(lm, spec, few, traced=traced), _compiles(lm, spec, more, traced=traced)
    assert short == long, f"(frames compiled, graph breaks): {short} for {few} tokens, {long} for {more}"
    if not traced:
        assert short[1] == 0, f"{short[1]} graph breaks in steered decoding"
