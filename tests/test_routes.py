"""The three routes (plain hooks, nnsight, TransformerBridge) against ``output_hidden_states``.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_routes.py``
Tiny random models of five architectures (tests/conftest.py), padded batches, 1e-4.
Only real (mask == 1) positions are compared: what a route returns at pad cells is unspecified.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.route import ROUTES, position_ids_from_mask, residuals, steered_logits
from valueprobe.model.load import wrap

ARCHS = ("llama", "qwen2", "gpt2", "gemma2", "gpt_neox")
ATOL = 1e-4


def _batch(vocab: int, *, padding_side: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 7, 4 and 6 real tokens, padded to 7 on ``padding_side``."""
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 4, 6]
    ids = torch.zeros((3, 7), dtype=torch.long)
    mask = torch.zeros((3, 7), dtype=torch.long)
    for i, n in enumerate(lengths):
        cols = slice(7 - n, 7) if padding_side == "left" else slice(0, n)
        ids[i, cols] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, cols] = 1
    return ids, mask


def _reference(lm, ids, mask) -> tuple[list[torch.Tensor], torch.Tensor]:
    """HF ``hidden_states`` (resid_pre of every block) and the last block's raw output, by a hook."""
    last: dict[str, torch.Tensor] = {}
    handle = lm.layers[-1].register_forward_hook(
        lambda m, a, out: last.__setitem__("h", out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            out = lm.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids_from_mask(mask),
                output_hidden_states=True,
            )
    finally:
        handle.remove()
    return [h.float() for h in out.hidden_states], last["h"].float()


def _close(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> None:
    real = mask.bool()
    assert got.dtype == torch.float32 and got.device.type == "cpu" and not got.requires_grad
    assert got.shape == want.shape
    torch.testing.assert_close(got[real], want[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("arch", ARCHS)
def test_residuals_match_hidden_states(tiny_lm_factory, arch, route, padding_side):
    lm = tiny_lm_factory(arch)
    n = lm.n_layers
    ids, mask = _batch(lm.model.config.vocab_size, padding_side=padding_side)
    hidden, last_out = _reference(lm, ids, mask)
    layers = [0, 1, -1]

    pre = residuals(lm, ids, mask, layers=layers, site="resid_pre", include_embed=True, route=route)
    assert set(pre) == {0, 1, -1, "embed"}
    _close(pre["embed"], hidden[0], mask)
    for layer in layers:
        _close(pre[layer], hidden[layer % n], mask)

    post = residuals(lm, ids, mask, layers=layers, site="resid_post", include_embed=True, route=route)
    _close(post["embed"], hidden[0], mask)
    _close(post[0], hidden[1], mask)
    _close(post[1], hidden[2], mask)
    # hidden_states[-1] is after the final norm; resid_post of the last block is its raw output.
    _close(post[-1], last_out, mask)
    assert not torch.allclose(post[-1][mask.bool()], hidden[-1][mask.bool()], atol=ATOL)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_padded_row_equals_unpadded_row(tiny_lm_factory, arch, route):
    """Default positions count from the first real token, so left padding changes nothing (GPT-2's
    absolute positions would show it otherwise)."""
    lm = tiny_lm_factory(arch)
    ids, mask = _batch(lm.model.config.vocab_size, padding_side="left")
    batched = residuals(lm, ids, mask, layers=[-1], site="resid_post", route=route)[-1]
    alone = residuals(lm, ids[1:2, 3:], mask[1:2, 3:], layers=[-1], site="resid_post", route=route)[-1]
    torch.testing.assert_close(batched[1, 3:], alone[0], atol=ATOL, rtol=0)


def _steered_reference(lm, ids, mask, *, block: int, site: str, delta: torch.Tensor) -> torch.Tensor:
    """Logits with h += delta at one block, by a hand-written hook: the trusted h + α·v."""
    module = lm.layers[block]
    if site == "resid_post":
        handle = module.register_forward_hook(
            lambda m, a, out: (out[0] + delta, *out[1:]) if isinstance(out, tuple) else out + delta
        )
    else:
        handle = module.register_forward_pre_hook(
            lambda m, args, kwargs: (
                ((args[0] + delta, *args[1:]), kwargs)
                if args
                else (args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta})
            ),
            with_kwargs=True,
        )
    try:
        with torch.no_grad():
            return lm.model(
                input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
            ).logits
    finally:
        handle.remove()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("arch", ARCHS)
def test_steered_logits_match_reference(tiny_lm_factory, arch, route):
    lm = tiny_lm_factory(arch)
    ids, mask = _batch(lm.model.config.vocab_size, padding_side="right", seed=1)
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(2))
    alpha = torch.tensor([1.0, -2.0, 3.0])
    where = torch.zeros_like(mask, dtype=torch.bool)
    where[:, 2:] = True
    delta = alpha[:, None, None] * where[:, :, None] * v
    for site, layer in (("resid_post", 1), ("resid_pre", -1)):
        want = _steered_reference(lm, ids, mask, block=layer % lm.n_layers, site=site, delta=delta)
        got = steered_logits(
            lm, ids, mask, layer=layer, vector=v, alpha=alpha, site=site, positions=where, route=route
        )
        _close(got, want, mask)
    # alpha = 0 is the plain forward; resid_post[L] and resid_pre[L+1] are the same place.
    with torch.no_grad():
        plain = lm.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    _close(steered_logits(lm, ids, mask, layer=0, vector=v, alpha=0.0, route=route), plain, mask)
    post0 = steered_logits(lm, ids, mask, layer=0, vector=v, alpha=2.0, site="resid_post", route=route)
    pre1 = steered_logits(lm, ids, mask, layer=1, vector=v, alpha=2.0, site="resid_pre", route=route)
    _close(post0, pre1, mask)
    assert (post0 - plain).abs().max() > 1e-3


def _snapshot(model: torch.nn.Module) -> dict:
    return {
        "tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()},
        "buffers": {k: v.clone() for k, v in model.named_buffers()},
        "modules": [(name, type(m)) for name, m in model.named_modules()],
        "attn": model.config._attn_implementation,
    }


def _assert_untouched(model: torch.nn.Module, before: dict) -> None:
    after = _snapshot(model)
    assert after["modules"] == before["modules"]
    assert after["attn"] == before["attn"]
    for key in ("tensors", "buffers"):
        assert after[key].keys() == before[key].keys()
        for k in before[key]:
            assert torch.equal(after[key][k], before[key][k]), k
    for name, module in model.named_modules():
        assert "forward" not in module.__dict__, f"{name}.forward was patched"
        assert not module._forward_hooks and not module._forward_pre_hooks, f"hook left on {name}"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_routes_leave_the_model_bit_identical(tiny_lm_factory, tiny_tokenizer, arch):
    base = tiny_lm_factory(arch)
    # A private sdpa copy: the session fixture is eager, and the bridge switches its own model to eager.
    # (from_config writes attn_implementation into the config it is given: never the fixture's.)
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(base.model.config), attn_implementation="sdpa"
    ).eval()
    model.load_state_dict(base.model.state_dict())
    lm = wrap(model, tiny_tokenizer, model_id=f"tiny-{arch}-sdpa")
    ids, mask = _batch(model.config.vocab_size, padding_side="left")
    before = _snapshot(model)
    with torch.no_grad():
        logits_before = model(input_ids=ids, attention_mask=mask).logits
    ref = residuals(lm, ids, mask, layers=[0, 1, 2], site="resid_post", route="hooks")
    for route in ROUTES:
        got = residuals(lm, ids, mask, layers=[0, 1, 2], site="resid_post", route=route)
        for layer in ref:
            _close(got[layer], ref[layer], mask)
        steered_logits(lm, ids, mask, layer=1, vector=torch.ones(lm.d_model), route=route)
    # Hooks come off after an exception inside the forward, too.
    with pytest.raises(IndexError):
        residuals(lm, ids + 10_000, mask, layers=[1], site="resid_post", route="hooks")
    with pytest.raises(IndexError):
        steered_logits(lm, ids + 10_000, mask, layer=1, vector=torch.ones(lm.d_model), route="hooks")
    _assert_untouched(model, before)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, logits_before)


@pytest.mark.parametrize("route", ["nnsight", "tlens"])
def test_wrappers_follow_weight_changes(tiny_lm_factory, tiny_tokenizer, route):
    """The wrapped twin shares the weights; a dtype or device change rebuilds it."""
    base = tiny_lm_factory("qwen2")
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(base.model.config), attn_implementation="eager"
    ).eval()
    model.load_state_dict(base.model.state_dict())
    lm = wrap(model, tiny_tokenizer, model_id="tiny-qwen2-private")
    ids, mask = _batch(model.config.vocab_size, padding_side="right")

    def check() -> None:
        want = residuals(lm, ids, mask, layers=[1], site="resid_post", route="hooks")[1]
        got = residuals(lm, ids, mask, layers=[1], site="resid_post", route=route)[1]
        _close(got, want, mask)

    check()
    with torch.no_grad():
        lm.layers[0].mlp.down_proj.weight.mul_(3.0)
    check()
    model.to(torch.float64)
    check()


def test_nnsight_remote_local_dry_run(tiny_lm_factory):
    """``remote="local"`` serializes the trace exactly as for NDIF (valueprobe hidden) and runs it here."""
    lm = tiny_lm_factory("llama")
    ids, mask = _batch(lm.model.config.vocab_size, padding_side="left")
    local = residuals(lm, ids, mask, layers=[0, -1], site="resid_pre", include_embed=True, route="nnsight")
    dry = residuals(
        lm, ids, mask, layers=[0, -1], site="resid_pre", include_embed=True, route="nnsight", remote="local"
    )
    for key in local:
        _close(dry[key], local[key], mask)
    v = torch.randn(lm.d_model)
    _close(
        steered_logits(lm, ids, mask, layer=1, vector=v, alpha=2.0, route="nnsight", remote="local"),
        steered_logits(lm, ids, mask, layer=1, vector=v, alpha=2.0, route="hooks"),
        mask,
    )


def test_bad_inputs_raise_one_line_errors(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    ids, mask = _batch(lm.model.config.vocab_size, padding_side="right")
    cases = [
        (dict(layers=[3], site="resid_post", route="hooks"), "layer 3 out of range"),
        (dict(layers=[-4], site="resid_post", route="nnsight"), "out of range"),
        (dict(layers=[0], site="resid_mid", route="hooks"), "unknown site"),
        (dict(layers=[0], site="resid_post", route="vllm"), "unknown route"),
        (dict(layers=[0], site="resid_post", route="tlens", remote=True), "goes through nnsight"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueprobeError, match=message) as info:
            residuals(lm, ids, mask, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueprobeError, match="attention_mask shape"):
        residuals(lm, ids, mask[:, :3], layers=[0], site="resid_post", route="hooks")
    with pytest.raises(ValueprobeError, match="alpha has 2 values"):
        steered_logits(lm, ids, mask, layer=0, vector=torch.ones(lm.d_model), alpha=torch.ones(2))


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 2], [0, 1, 2, 3]]


@pytest.mark.parametrize("route", ROUTES)
def test_explicit_position_ids_reach_every_route(tiny_lm_factory, route):
    """Positions given by the caller win over each library's own derivation (GPT-2: absolute)."""
    lm = tiny_lm_factory("gpt2")
    ids, mask = _batch(lm.model.config.vocab_size, padding_side="left")
    positions = torch.arange(7).expand(3, 7) + 5  # what no route would pick by itself
    with torch.no_grad():
        want = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
    got = residuals(lm, ids, mask, layers=[1, -2], site="resid_post", route=route, position_ids=positions)
    assert set(got) == {1, -2}
    _close(got[1], want.hidden_states[2].float(), mask)
    _close(got[-2], want.hidden_states[2].float(), mask)
