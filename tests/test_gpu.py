"""The CUDA checks of issue 27, marked ``gpu`` and skipped where torch sees no CUDA device (CI).

Run on a GPU machine: ``python -m pytest -m gpu -q tests/test_gpu.py``. Each test moves a tiny
random model from tests/conftest.py to ``cuda`` and compares it with a trusted reference:
``output_hidden_states``, each operator's closed form (tests/test_operators.py), a plain hook, or
the same run on the CPU. Tolerances: float32 1e-4 absolute on hidden states (TF32 is off here);
bf16 2e-2 relative plus 2e-2 absolute (bf16 keeps 8 bits of mantissa, ~0.4 % per rounding).
"""

from __future__ import annotations

import pytest
import torch
from test_operators import OPERATORS, _alpha, closed_form, op_axis
from test_steer import PROMPTS, _batch, _forward, planted_axis

from valueprobe import guide
from valueprobe.guided.policy import BestOfN, Prune
from valueprobe.hooks.route import Point, intervene, residuals
from valueprobe.model.load import wrap
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.spec import SteeringSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOLERANCE = {torch.float32: {"atol": 1e-4, "rtol": 0.0}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


@pytest.fixture(autouse=True)
def exact_float32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def on_cuda(tiny_lm_factory, dtype=torch.float32, arch="llama"):
    """A fresh copy of the tiny model on the GPU in ``dtype`` (the factory's CPU one stays as it is)."""
    import copy

    cpu = tiny_lm_factory(arch)
    model = copy.deepcopy(cpu.model).to(device="cuda", dtype=dtype)
    return wrap(model, cpu.tokenizer, model_id=f"{cpu.model_id}-cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_capture_equals_output_hidden_states_on_cuda(tiny_lm_factory, dtype):
    lm = on_cuda(tiny_lm_factory, dtype)
    ids, mask = _batch(lm)
    got = residuals(lm, ids.cuda(), mask.cuda(), layers=list(range(lm.n_layers)), site="resid_post")
    want = _forward(lm, ids.cuda(), mask.cuda(), output_hidden_states=True).hidden_states
    real = mask.bool()
    for layer in range(lm.n_layers):
        torch.testing.assert_close(got[layer][real], want[layer + 1].float().cpu()[real], **TOLERANCE[dtype])


@pytest.mark.parametrize("name", list(OPERATORS))
def test_steering_on_cuda_is_each_operators_closed_form(tiny_lm_factory, name):
    lm = on_cuda(tiny_lm_factory)
    axis = op_axis(lm)
    ids, mask = (t.cuda() for t in _batch(lm))
    alpha = _alpha(name)
    base = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    with steer(lm, SteeringSpec(axis, layers=1, op=OPERATORS[name]), alpha):
        got = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    real = mask.bool().cpu()
    want = closed_form(name, base[2].cpu(), alpha, axis.direction(1))
    torch.testing.assert_close(got[2].cpu()[real], want[real], atol=1e-4, rtol=0)
    assert torch.equal(got[2][~mask.bool()], base[2][~mask.bool()])  # pad cells bit for bit


def test_greedy_text_of_generate_equals_a_plain_hook_on_cuda(tiny_lm_factory):
    lm = on_cuda(tiny_lm_factory)
    axis = planted_axis(lm)
    alpha = 3.0
    gens = generate(
        lm, axis, PROMPTS, alphas=[alpha], decoding=Decoding(greedy=True, max_new_tokens=8), progress=False
    )
    v = (alpha * 0.5 * axis.direction(axis.best_layer)).cuda()
    for prompt, g in zip(PROMPTS, gens, strict=True):
        ids = torch.tensor([lm.tokenizer(prompt)["input_ids"]], device="cuda")
        with intervene(lm, Point(axis.best_layer), lambda h, step: h + v.to(h.dtype)), torch.no_grad():
            out = lm.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
            )
        new = out[0, ids.shape[1] :].tolist()
        eos = lm.tokenizer.eos_token_id
        assert list(g.token_ids) == (new[: new.index(eos)] if eos in new else new)


@pytest.mark.parametrize("policy", [BestOfN(n=4), Prune(n=4, every=2)], ids=lambda p: p.name)
def test_guide_picks_the_same_candidates_on_cuda_as_on_cpu_in_float32(tiny_lm_factory, policy):
    cpu = tiny_lm_factory("llama")
    gpu = on_cuda(tiny_lm_factory)
    kw = dict(decoding=Decoding(max_new_tokens=8, seed=3), progress=False)
    here = guide(cpu, planted_axis(cpu), PROMPTS, policy, **kw)
    there = guide(gpu, planted_axis(gpu), PROMPTS, policy, **kw)
    assert [g.chosen for g in there] == [g.chosen for g in here]
    assert [g.token_ids for g in there] == [g.token_ids for g in here]


def _no_sync_in_valueprobe(run) -> None:
    """``run`` under sync debug mode "error", after a warm-up run (first-call copies are allowed)."""
    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_steered_generate_makes_no_sync_on_cuda(tiny_lm_factory):
    """Steering inside ``model.generate`` (whose own loop syncs: we check the hooks alone here by
    running one steered forward per step with the cache, as generate does)."""
    lm = on_cuda(tiny_lm_factory)
    axis = planted_axis(lm)
    ids, mask = (t.cuda() for t in _batch(lm))
    spec = SteeringSpec(axis, layers=[0, 1], positions="generated")
    with steer(
        lm, spec, torch.tensor([1.0, -2.0, 0.0, 3.0]), prompt_length=ids.shape[1], trace=True
    ) as handle:
        with torch.no_grad():
            out = lm.model(input_ids=ids, attention_mask=mask, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

            def step() -> None:
                nonlocal mask, token
                mask = torch.cat([mask, torch.ones_like(token)], dim=1)
                o = lm.model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
                token = o.logits[:, -1].argmax(-1, keepdim=True)

            _no_sync_in_valueprobe(step)
        assert len(handle.reads[handle.points[0].point]) >= 3
