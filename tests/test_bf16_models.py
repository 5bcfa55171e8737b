"""Tiny bfloat16 Qwen3, Llama and Gemma-3 models (random weights from their configs) capture and steer
as their float32 originals do, within bf16's precision.

Stated tolerance: bf16 keeps 8 significant bits (relative rounding 2^-8 ≈ 0.4% per operation), and a
3-block forward compounds a few dozen roundings, so a captured residual may differ from float32 by
at most 3% of its norm, and a steering effect (steered minus unsteered logits) by at most 5% of its norm.
Measured on this machine: capture 0.4-0.7%, steering effect 0.6-1.4% (Gemma-3 the largest).

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_bf16_models.py
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.io import Example
from valueprobe.hooks.route import steered_logits
from valueprobe.model.load import wrap
from valueprobe.steering.decode.generation import encode_prompts

CAPTURE_TOL, STEER_TOL = 0.03, 0.05
EXAMPLES = [
    Example(
        id=f"e{i}", text=f"The capital of France is Paris, {i} times. " * (1 + i % 3), label=i % 2, group="g"
    )
    for i in range(6)
]


def _config(arch: str, vocab: int):
    shape = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=16, **shape)
    if arch == "gemma3":
        return tf.Gemma3TextConfig(head_dim=16, sliding_window=8, **shape)
    return tf.LlamaConfig(**shape)


@pytest.fixture(params=["qwen3", "llama", "gemma3"])
def pair(request, tiny_tokenizer):
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(
        _config(request.param, len(tiny_tokenizer)), attn_implementation="eager"
    ).eval()
    half = copy.deepcopy(model).to(torch.bfloat16)
    return wrap(model, tiny_tokenizer, model_id=request.param), wrap(
        half, tiny_tokenizer, model_id=request.param
    )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_bf16_capture_is_float32_capture_within_tolerance(pair):
    full, half = pair
    assert next(half.model.parameters()).dtype == torch.bfloat16
    a = capture(full, EXAMPLES, CaptureSettings(layers="all", positions="mean"), progress=False).acts
    b = capture(half, EXAMPLES, CaptureSettings(layers="all", positions="mean"), progress=False).acts
    errors = {layer: _rel(b[layer], a[layer]) for layer in a}
    assert max(errors.values()) < CAPTURE_TOL, errors
    assert max(errors.values()) > 0  # really computed in bf16


def test_bf16_steering_effect_is_float32_effect_within_tolerance(pair):
    full, half = pair
    ids = torch.tensor([encode_prompts(full, ["The capital of France is Paris"])[0]])
    mask = torch.ones_like(ids)
    v = torch.nn.functional.normalize(torch.randn(64, generator=torch.Generator().manual_seed(1)), dim=0)
    effects, unsteered = [], []
    for lm in (full, half):
        unsteered.append(steered_logits(lm, ids, mask, layer=1, vector=v, alpha=0.0).float())
        effects.append(steered_logits(lm, ids, mask, layer=1, vector=v, alpha=8.0).float() - unsteered[-1])
    assert effects[0].norm() > 0.3 * unsteered[0].norm()  # the steering moved the logits (measured 0.5-1.4)
    assert _rel(effects[1], effects[0]) < STEER_TOL  # measured 0.6% (Qwen3, Llama) to 1.4% (Gemma-3)
