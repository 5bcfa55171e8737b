"""The public hook layer (`valueprobe.hooks.route.record` / `intervene`) against trusted references.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_hooks.py``
References: ``output_hidden_states`` (what the blocks carry), and the model's own outputs before
any hook (bit-identical after removal, exception or not).
"""

from __future__ import annotations

import pytest
import torch

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_rows
from valueprobe.hooks.route import (
    ROUTES,
    Handle,
    Point,
    Route,
    intervene,
    position_ids_from_mask,
    record,
    route_for,
)
from valueprobe.vocab import Site

ARCHS = ("llama", "gpt2", "gpt_neox", "qwen2")


def _batch(vocab: int, lengths=(7, 4, 6), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows of the given lengths (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    return pad_rows(rows, pad_id=0, side="left")


def _logits(lm, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits


def _hooks(lm) -> set[tuple[str, str, int]]:
    """Every forward hook on the model but transformers' own output-capturing ones (installed
    lazily by the first ``output_hidden_states`` forward and kept)."""
    return {
        (name, kind, key)
        for name, m in lm.model.named_modules()
        for kind, table in (("post", m._forward_hooks), ("pre", m._forward_pre_hooks))
        for key, fn in table.items()
        if getattr(fn, "__name__", "") != "output_capturing_hook"
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_record_equals_output_hidden_states(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    hooks = _hooks(lm)
    ids, mask = _batch(lm.model.config.vocab_size)
    points = [Point(layer, Site.resid_pre) for layer in range(lm.n_layers)]
    with torch.no_grad(), record(lm, points) as rec:
        out = lm.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            output_hidden_states=True,
        )
    real = mask.bool()
    for layer, point in enumerate(points):
        torch.testing.assert_close(rec[point][real], out.hidden_states[layer][real], atol=0, rtol=0)
    assert _hooks(lm) == hooks


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_sees_every_column_once_with_kv_cache(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    hooks = _hooks(lm)
    ids, mask = _batch(lm.model.config.vocab_size, lengths=(5, 3))
    seen: list[tuple[int, int, torch.Tensor]] = []

    def fn(h, step):
        assert h.shape[1] == step.n_new
        seen.append((step.offset, step.n_new, step.pad.clone()))

    new = 4
    with intervene(lm, Point(1), fn), torch.no_grad():
        out = lm.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    assert out.shape[1] == ids.shape[1] + new
    offsets = [o for o, _, _ in seen]
    assert offsets == [0, 5, 6, 7]  # each forward starts where the last ended: no column twice
    assert sum(n for _, n, _ in seen) == ids.shape[1] + new - 1  # the last token is never fed back
    assert torch.equal(seen[0][2], mask == 0)
    assert all(not p.any() for _, _, p in seen[1:])
    assert _hooks(lm) == hooks


@pytest.mark.parametrize("arch", ARCHS)
def test_bit_identical_after_exception(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    hooks = _hooks(lm)
    ids, mask = _batch(lm.model.config.vocab_size)
    before = _logits(lm, ids, mask)

    def boom(h, step):
        if step.index == 2:
            raise RuntimeError("inside generation")
        return h + 100.0

    with (
        pytest.raises(RuntimeError, match="inside generation"),
        intervene(lm, Point(0), boom),
        record(lm, [Point(1), Point(2, Site.resid_pre)]),
    ):
        lm.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0
        )
    assert _hooks(lm) == hooks
    assert torch.equal(_logits(lm, ids, mask), before)


def test_handle_remove_without_with(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    hooks = _hooks(lm)
    ids, mask = _batch(lm.model.config.vocab_size)
    before = _logits(lm, ids, mask)
    handle = intervene(lm, Point(-1, Site.resid_pre), lambda h, step: h * 2)
    assert not torch.equal(_logits(lm, ids, mask), before)
    handle.remove()
    handle.remove()  # twice is fine
    assert torch.equal(_logits(lm, ids, mask), before) and _hooks(lm) == hooks


@pytest.mark.parametrize("arch", ARCHS)
def test_joined_handle_removes_every_hook_even_after_exception(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    hooks = _hooks(lm)
    ids, mask = _batch(lm.model.config.vocab_size)
    before = _logits(lm, ids, mask)
    steer_ = intervene(lm, Point(0), lambda h, step: h + 100.0)
    rec = record(lm, [Point(1), Point(2, Site.resid_pre)])
    both = Handle().join(steer_, rec)
    with pytest.raises(RuntimeError, match="inside the forward"), both:
        steer_.join(intervene(lm, Point(-1), lambda h, step: h * 2))  # joins after joining: still taken off
        both.join(steer_)
        _logits(lm, ids, mask)
        assert rec.values[Point(1)] and not torch.equal(_logits(lm, ids, mask), before)
        raise RuntimeError("inside the forward")
    assert _hooks(lm) == hooks
    assert torch.equal(_logits(lm, ids, mask), before)
    assert len(rec.values[Point(1)]) == 2  # the joined recording kept what it read
    steer_.remove()  # empty after joining: a no-op
    rec.remove()
    assert _hooks(lm) == hooks


def test_intervene_changes_what_later_blocks_see(tiny_lm_factory):
    lm = tiny_lm_factory("gpt2")
    ids, mask = _batch(lm.model.config.vocab_size)
    delta = torch.randn(lm.d_model)
    with torch.no_grad(), record(lm, [Point(0)]) as base:
        lm.model(input_ids=ids, attention_mask=mask)
    # resid_post[0] == resid_pre[1]: the recorder on block 1's input sees the intervention
    with (
        torch.no_grad(),
        intervene(lm, Point(0), lambda h, step: h + delta),
        record(lm, [Point(1, "resid_pre")]) as r,
    ):
        lm.model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(r[Point(1, Site.resid_pre)], base[Point(0)] + delta, atol=1e-6, rtol=0)


def test_registry_routes_satisfy_protocol():
    for name in ROUTES:
        impl = route_for(name)
        assert isinstance(impl.name, str) and impl.name == name
        assert callable(impl.read) and callable(impl.steered_logits) and callable(impl.generate)
        assert isinstance(impl, Route)  # runtime-checkable: every member of the protocol is there
    # ... and the check can fail: an object missing one member is not a Route
    half = type("Half", (), {"name": "half", "read": lambda *a: {}, "steered_logits": lambda *a: None})()
    assert not isinstance(half, Route)
    with pytest.raises(ValueprobeError, match="unknown route"):
        route_for("vllm")
    with pytest.raises(ValueprobeError, match="through nnsight"):
        route_for("hooks", remote=True)


def test_bad_layer_one_clear_error(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    hooks = _hooks(lm)
    with pytest.raises(ValueprobeError, match="out of range"):
        record(lm, [Point(7)])
    assert _hooks(lm) == hooks
