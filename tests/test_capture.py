"""Capture is checked against transformers' own ``output_hidden_states``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.activations.encode import encode, render
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError
from valueprobe.vocab import LayerSelection, parse_layers

TEXTS = [
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b",
    "Wait, that's not right.",
    "The quick brown fox jumps over the lazy dog - twice, maybe 3 times? Yes.",
    "No.",
]


def _examples() -> list[Example]:
    out = []
    for i, t in enumerate(TEXTS):
        cut = len(t) // 2
        spans = (Span(0, cut, "pre"), Span(cut, len(t), "post")) if len(t) > 4 else (Span(0, len(t), "pre"),)
        out.append(Example(id=f"e{i}", label=i % 2, group=f"g{i % 3}", text=t, spans=spans))
    return out


def reference(lm, ex: Example) -> list[torch.Tensor]:
    """Per-layer hidden states of one unpadded example: resid_pre[0] .. resid_post[n-1].

    ``output_hidden_states`` gives resid_pre[0..n-1]; its last entry is after the final norm,
    so resid_post of the last block comes from a hook-free identity: resid_post[L] = resid_pre[L+1].
    """
    ids = torch.tensor([encode(lm, [ex], positions="last")[0].input_ids])
    with torch.no_grad():
        out = lm.model(input_ids=ids, output_hidden_states=True)
    return [h[0] for h in out.hidden_states]


def _token_spans(lm, ex):
    return encode(lm, [ex], positions="spans")[0].selections


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_last_and_mean_match_output_hidden_states(tiny_lm, padding_side):
    lm = tiny_lm
    exs = _examples()
    n = lm.n_layers
    inner = list(range(n - 1))  # hidden_states[L+1] == resid_post[L] for these
    last = capture(
        lm,
        exs,
        CaptureSettings(
            layers=inner, positions="last", batch_size=3, padding_side=padding_side, include_embed=True
        ),
        progress=False,
    )
    mean = capture(
        lm,
        exs,
        CaptureSettings(layers=inner, positions="mean", batch_size=3, padding_side=padding_side),
        progress=False,
    )
    for i, ex in enumerate(exs):
        hs = reference(lm, ex)
        torch.testing.assert_close(last.acts["embed"][i], hs[0][-1], atol=1e-5, rtol=1e-5)
        for L in inner:
            torch.testing.assert_close(last.acts[L][i], hs[L + 1][-1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(mean.acts[L][i], hs[L + 1].mean(0), atol=1e-5, rtol=1e-5)


def test_resid_pre_equals_previous_resid_post(tiny_lm):
    exs = _examples()
    pre = capture(
        tiny_lm, exs, CaptureSettings(layers="all", site="resid_pre", positions="mean"), progress=False
    )
    post = capture(
        tiny_lm, exs, CaptureSettings(layers="all", site="resid_post", positions="mean"), progress=False
    )
    for L in range(1, tiny_lm.n_layers):
        torch.testing.assert_close(pre.acts[L], post.acts[L - 1], atol=1e-6, rtol=1e-6)


def test_last_layer_resid_post_is_raw_block_output(tiny_lm_factory):
    """The final block's resid_post is before the final norm (TransformerLens convention)."""
    lm = tiny_lm_factory("llama")
    exs = _examples()
    got = capture(lm, exs, CaptureSettings(layers=[-1], positions="last"), progress=False)
    seen = []
    handle = lm.layers[-1].register_forward_hook(
        lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o)
    )
    try:
        for i, ex in enumerate(exs):
            ids = torch.tensor([encode(lm, [ex], positions="last")[0].input_ids])
            with torch.no_grad():
                lm.model(input_ids=ids)
            torch.testing.assert_close(got.acts[lm.n_layers - 1][i], seen[-1][0, -1], atol=1e-5, rtol=1e-5)
    finally:
        handle.remove()


@pytest.mark.parametrize("positions", ["spans", "span_tokens", "all"])
def test_spans_and_tokens_match_reference(tiny_lm_factory, positions):
    lm = tiny_lm_factory("qwen2")
    exs = _examples()
    res = capture(
        lm,
        exs,
        CaptureSettings(layers=[0, 1], positions=positions, batch_size=2, padding_side="left"),
        progress=False,
    )
    r = 0
    for ex in exs:
        hs = reference(lm, ex)
        sels = encode(lm, [ex], positions=positions)[0].selections
        for label, toks in sels:
            assert res.rows.example_id[r] == ex.id and res.rows.span[r] == label
            for L in (0, 1):
                torch.testing.assert_close(res.acts[L][r], hs[L + 1][toks].mean(0), atol=1e-5, rtol=1e-5)
            r += 1
    assert r == len(res.rows)


def test_batched_equals_unbatched(tiny_lm):
    exs = _examples()
    one = capture(
        tiny_lm, exs, CaptureSettings(layers="all", positions="spans", batch_size=1), progress=False
    )
    many = capture(
        tiny_lm,
        exs,
        CaptureSettings(layers="all", positions="spans", batch_size=5, padding_side="left"),
        progress=False,
    )
    for L in one.acts:
        torch.testing.assert_close(one.acts[L], many.acts[L], atol=1e-5, rtol=1e-5)
    assert one.rows.example_id == many.rows.example_id
    np.testing.assert_array_equal(one.rows.token_index, many.rows.token_index)


def test_span_tokens_follow_character_offsets(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    text = "Paris is nice. Rome is old."
    ex = Example(
        id="x", label=1, group="g", text=text, spans=(Span(0, 14, "pre"), Span(15, len(text), "post"))
    )
    enc = lm.tokenizer(text, return_offsets_mapping=True)
    sels = dict(_token_spans(lm, ex))
    pre_text = "".join(text[a:b] for t, (a, b) in enumerate(enc["offset_mapping"]) if t in sels["pre"])
    post_text = "".join(text[a:b] for t, (a, b) in enumerate(enc["offset_mapping"]) if t in sels["post"])
    assert pre_text.replace(" ", "") == "Parisisnice."
    assert post_text.replace(" ", "") == "Romeisold."


def test_chat_rendering_and_message_spans(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    msgs = ({"role": "user", "content": "Is it Paris?"}, {"role": "assistant", "content": "Yes"})
    ex = Example(id="c", label=1, group="g", messages=msgs, spans=(Span(0, 3, "resp", message=1),))
    text, starts = render(lm.tokenizer, ex)
    assert text.endswith("Yes")  # the final assistant message is continued, not closed
    assert text[starts[1] : starts[1] + 3] == "Yes"
    sel = _token_spans(lm, ex)[0][1]
    ids = encode(lm, [ex], positions="last")[0].input_ids
    assert sel[-1] == len(ids) - 1
    user_only = Example(id="u", label=1, group="g", messages=msgs[:1])
    assert render(lm.tokenizer, user_only)[0].endswith("<|im_start|>assistant\n")


def test_capture_does_not_change_model_outputs(tiny_lm_factory):
    lm = tiny_lm_factory("gpt2")
    ids = torch.tensor([encode(lm, _examples()[:1], positions="last")[0].input_ids])
    with torch.no_grad():
        before = lm.model(input_ids=ids).logits.clone()
    hooks_before = [(dict(b._forward_hooks), dict(b._forward_pre_hooks)) for b in lm.layers]
    capture(
        lm, _examples(), CaptureSettings(layers="all", positions="last", include_embed=True), progress=False
    )
    assert [(dict(b._forward_hooks), dict(b._forward_pre_hooks)) for b in lm.layers] == hooks_before
    with torch.no_grad():
        after = lm.model(input_ids=ids).logits
    assert torch.equal(before, after)


def test_bad_input_is_one_clear_error(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    exs = _examples()
    with pytest.raises(ValueprobeError, match=r"out of range: this model has 3 layers: use 0..2 or -3..-1"):
        capture(lm, exs, CaptureSettings(layers=[5]), progress=False)
    with pytest.raises(ValueprobeError, match="empty"):
        capture(lm, [], progress=False)
    with pytest.raises(ValueprobeError, match="unknown positions"):
        capture(lm, exs, CaptureSettings(positions="middle"), progress=False)  # type: ignore[arg-type]
    with pytest.raises(ValueprobeError, match="has no spans"):
        capture(
            lm,
            [Example(id="n", label=0, group="g", text="abc")],
            CaptureSettings(positions="spans"),
            progress=False,
        )
    text_only = Example(id="t", label=0, group="g", text="a b c d e f g", spans=(Span(12, 13, "end"),))
    with pytest.raises(ValueprobeError, match="covers no token"):
        capture(lm, [text_only], CaptureSettings(positions="spans", max_length=2), progress=False)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("all", [0, 1, 2]),
        ("-1", [2]),
        ("0:2", [0, 1]),
        ("1:", [1, 2]),
        ("0,-1", [0, 2]),
        (1, [1]),
        ([0, -3], [0]),
    ],
)
def test_capture_layers(tiny_lm_factory, spec, want):
    lm = tiny_lm_factory("llama")
    assert parse_layers(spec, n_layers=lm.n_layers) == want
    assert capture(
        lm, [Example(id="a", label=0, group="g", text="a b c")], CaptureSettings(layers=spec), progress=False
    ).acts.keys() == set(want)


@pytest.mark.parametrize("spec", ["3", "-4", "5:9", "2:1"])
def test_layers_out_of_range_name_the_model_range(tiny_lm_factory, spec):
    LayerSelection.parse(spec)  # the syntax is fine: only the model can refuse it
    with pytest.raises(ValueprobeError, match="0..2"):
        parse_layers(spec, n_layers=tiny_lm_factory("llama").n_layers)


@pytest.mark.parametrize("spec", ["x", "", "1:2:3:4", "::0", "1,,y"])
def test_layer_syntax_fails_before_any_model(spec):
    with pytest.raises(ValueprobeError, match="layer"):
        LayerSelection.parse(spec)
