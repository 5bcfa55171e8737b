"""Model loading routes, layer detection, fingerprints; the real default model (slow)."""

from __future__ import annotations

import copy
import json
import time

import pytest
import torch
from torch import nn

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.activations.encode import encode
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError
from valueprobe.model.fingerprint import (
    Fingerprint,
    FingerprintWarning,
    Match,
    arch_fingerprint,
    compare,
    fingerprint,
)
from valueprobe.model.load import find_layers_path, load, wrap


def test_fingerprint_ignores_dtype_but_not_weights(tiny_lm_factory):

    lm = tiny_lm_factory("llama")
    fp32 = fingerprint(lm.model, lm.tokenizer)
    bf16 = fingerprint(copy.deepcopy(lm.model).to(torch.bfloat16), lm.tokenizer)
    assert fp32 == bf16 == lm.fingerprint
    tuned = copy.deepcopy(lm.model)
    with torch.no_grad():  # one small change deep inside one MLP matrix, as a fine-tune would make
        tuned.model.layers[1].mlp.down_proj.weight.mul_(1.05)
    a, b = Fingerprint.parse(fp32), Fingerprint.parse(fingerprint(tuned, lm.tokenizer))
    assert a.arch == b.arch and a.weights != b.weights
    other = Fingerprint.parse(tiny_lm_factory("qwen2").fingerprint)
    assert other.arch != a.arch
    assert compare(str(a), str(b)) == Match.weights and compare(str(a), str(other)) == Match.arch


def test_architecture_part_covers_the_vocabulary(tiny_lm_factory, tiny_tokenizer):
    lm = tiny_lm_factory("llama")
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_tokens(["<|new_token|>"])
    assert arch_fingerprint(lm.model, tok) != arch_fingerprint(lm.model, tiny_tokenizer)


def test_fine_tuned_copy_is_read_with_a_warning_other_arch_refused(tiny_lm_factory, tmp_path):
    """Save a perturbed copy, load it from its folder: the base's probe reads it with a warning."""
    from valueprobe.probe.axis import ValueAxis

    base = tiny_lm_factory("llama")
    tuned = copy.deepcopy(base.model)
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.01 * torch.randn_like(p))
    tuned.save_pretrained(tmp_path / "tuned")
    base.tokenizer.save_pretrained(tmp_path / "tuned")
    lm = load(str(tmp_path / "tuned"))
    assert Fingerprint.parse(lm.fingerprint).arch == Fingerprint.parse(base.fingerprint).arch
    axis = ValueAxis(
        directions=torch.eye(64)[:2],
        layers=(0, 1),
        mu=torch.zeros(2),
        sigma=torch.ones(2),
        mean_norm=torch.ones(2),
        best_layer=1,
        site="resid_post",
        method="diff_means",
        model_id="tiny-llama",
        fingerprint=base.fingerprint,
        d_model=64,
    )
    with pytest.warns(FingerprintWarning, match="other weights"):
        axis.check(lm)
    with pytest.raises(ValueprobeError, match="another architecture"):
        axis.check(tiny_lm_factory("qwen2"))


def test_peft_wrapped_model_finds_its_layers(tiny_lm_factory):
    """A LoRA-wrapped model (peft.get_peft_model) reads the same residual stream as its base."""
    from peft import LoraConfig, get_peft_model

    base = tiny_lm_factory("llama")
    peft_model = get_peft_model(
        copy.deepcopy(base.model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    lm = wrap(peft_model, base.tokenizer)
    assert lm.layers_path == "base_model.model.model.layers" and lm.n_layers == 3
    assert lm.final_norm is not None and lm.d_model == 64
    assert Fingerprint.parse(lm.fingerprint).arch == Fingerprint.parse(base.fingerprint).arch
    ex = Example(id="x", label=1, group="g", text="Paris is nice")
    # LoRA's B starts at zero, so the wrapped model's residual stream equals the base's.
    got = capture(lm, [ex], CaptureSettings(layers=[1], positions="last"), progress=False).acts[1]
    want = capture(base, [ex], CaptureSettings(layers=[1], positions="last"), progress=False).acts[1]
    torch.testing.assert_close(got, want)
    merged = wrap(peft_model.merge_and_unload(), base.tokenizer)
    assert merged.layers_path == "model.layers"


@pytest.mark.parametrize(
    ("arch", "path"),
    [
        ("llama", "model.layers"),
        ("gpt2", "transformer.h"),
        ("gpt_neox", "gpt_neox.layers"),
        ("gemma2", "model.layers"),
    ],
)
def test_layer_detection(tiny_lm_factory, arch, path):
    lm = tiny_lm_factory(arch)
    assert lm.layers_path == path and lm.n_layers == 3 and lm.d_model == 64
    assert lm.final_norm is not None


@pytest.mark.parametrize(
    ("config_cls", "kw"),
    [
        ("Qwen3Config", {"head_dim": 16}),
        ("MistralConfig", {}),
        ("Phi3Config", {}),
        ("PhiConfig", {}),
        ("GemmaConfig", {"head_dim": 16}),
        ("Gemma3TextConfig", {"head_dim": 16}),
    ],
)
def test_layer_detection_more_families(tiny_tokenizer, config_cls, kw):
    """The families the capture engine promises, built tiny from their configs."""
    import transformers as tf

    cfg = getattr(tf, config_cls)(
        vocab_size=len(tiny_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        **kw,
    )
    model = tf.AutoModelForCausalLM.from_config(cfg)
    lm = wrap(model, tiny_tokenizer, model_id=config_cls)
    assert lm.n_layers == 2 and lm.d_model == 64 and lm.final_norm is not None
    ex = Example(id="x", label=1, group="g", text="Paris is nice")
    ids = torch.tensor([encode(lm, [ex], positions="last")[0].input_ids])
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    res = capture(lm, [ex], CaptureSettings(layers=[0], positions="last"), progress=False)
    torch.testing.assert_close(res.acts[0][0], hs[1][0, -1], atol=1e-5, rtol=1e-5)


def test_undetected_layers_say_how_to_override(tiny_tokenizer):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Module()
            self.trunk.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    with pytest.raises(ValueprobeError, match=r"pass layers_path= \(CLI --layers-path\).*trunk.blocks"):
        find_layers_path(Odd())
    assert find_layers_path(Odd(), "trunk.blocks") == "trunk.blocks"
    with pytest.raises(ValueprobeError, match="not a non-empty ModuleList"):
        find_layers_path(Odd(), "trunk")


def test_unknown_model_lists_routes(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VALUEPROBE_CACHE", str(tmp_path))
    with pytest.raises(ValueprobeError) as err:
        load("nobody/no-such-model-xyz")
    msg = str(err.value)
    assert "not an alias (smollm2-135m)" in msg and "no local folder" in msg and "hub id" in msg
    assert "\n" not in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueprobeError, match="has no config.json"):
        load(str(tmp_path / "empty"))
    with pytest.raises(ValueprobeError, match="not a hub id"):
        load("bad spec with spaces")


def test_local_folder_route_round_trips(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("qwen2")
    lm.model.save_pretrained(tmp_path / "m")
    lm.tokenizer.save_pretrained(tmp_path / "m")
    again = load(str(tmp_path / "m"))
    assert again.fingerprint == lm.fingerprint and again.n_layers == 3
    assert not again.model.config.to_dict().get("trust_remote_code")


@pytest.mark.slow
def test_default_model_offline_answers_and_captures(default_lm):
    lm = default_lm
    assert (lm.n_layers, lm.d_model) == (30, 576)
    assert getattr(lm.model.config, "quantization_config", None) is None
    tok = lm.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = lm.model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
    text = "Paris is the capital of France."
    ex = [
        Example(id="p", label=1, group="g", text=text, spans=(Span(0, 5, "a"), Span(6, len(text), "b"))),
        Example(id="q", label=0, group="g", messages=({"role": "user", "content": "Hi"},)),
    ]
    res = capture(
        lm, ex[:1], CaptureSettings(layers="all", positions="spans", include_embed=True), progress=False
    )
    assert set(res.acts) == {"embed", *range(30)} and res.acts[21].shape == (2, 576)
    last = capture(lm, ex, CaptureSettings(layers=[-1, 0], positions="last"), progress=False)
    assert last.acts[29].shape == (2, 576) and torch.isfinite(last.acts[29]).all()
    # Values against output_hidden_states (hidden_states[L + 1] = resid_post[L] below the last
    # block, whose entry has the final norm applied): each span's mean over the tokens whose first
    # character it holds, the embedding, and the last token of the chat prompt at layer 0.
    enc = tok(text, return_offsets_mapping=True)
    with torch.no_grad():
        hs = lm.model(input_ids=torch.tensor([enc.input_ids]), output_hidden_states=True).hidden_states
    for row, span in enumerate(ex[0].spans):
        toks = [t for t, (a, b) in enumerate(enc.offset_mapping) if b > a and span.start <= a < span.end]
        for key, h in ((21, hs[22]), (0, hs[1]), ("embed", hs[0])):
            torch.testing.assert_close(
                res.acts[key][row].float(), h[0, toks].mean(0).float(), atol=2e-3, rtol=1e-3
            )
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    chat_ids = tok(chat, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        h0 = lm.model(input_ids=chat_ids, output_hidden_states=True).hidden_states[1][0, -1]
    torch.testing.assert_close(last.acts[0][1].float(), h0.float(), atol=2e-3, rtol=1e-3)


@pytest.mark.slow
def test_default_model_cache_is_plain_safetensors_and_fast(default_lm):
    from valueprobe.model.load import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m"
    assert (folder / "model.safetensors").exists()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    start = time.perf_counter()
    again = load("smollm2-135m")
    elapsed = time.perf_counter() - start
    assert again.fingerprint == default_lm.fingerprint
    print(f"cached load: {elapsed:.2f} s")
