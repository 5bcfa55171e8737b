"""``vp.values`` and the one prompt rule, against ``output_hidden_states`` on tiny models.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_values.py``
References: the chat template called by hand, the tokenizer on the raw text, each token's
residual from ``output_hidden_states`` (σ-score, projection, cos), exact h + α·σ·v̂ under `steer`.
"""

from __future__ import annotations

import html
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_steer import planted_axis  # tests/ is on sys.path under pytest

import valueprobe as vp
from valueprobe.activations.prompts import prompt_ids
from valueprobe.errors import ValueprobeError
from valueprobe.read.strip import SCALE, colour
from valueprobe.read.values import Values
from valueprobe.steering.decode.generation import Generation


@pytest.fixture(scope="module")
def lm(tiny_lm_factory):
    return tiny_lm_factory("llama")


def test_a_string_is_a_user_turn_unless_raw(lm):
    tok = lm.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Is 7 prime?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert prompt_ids(lm, "Is 7 prime?") == tok(text, add_special_tokens=False)["input_ids"]
    assert prompt_ids(lm, "Is 7 prime?", chat=False) == tok("Is 7 prime?")["input_ids"]
    # a chat ending on the assistant is continued (a prefilled answer), not given a new turn
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}]
    got = tok.decode(prompt_ids(lm, chat))
    assert got.endswith("assistant\nYes") and got.count("assistant") == 1
    # token ids pass through; a tensor row too
    ids = prompt_ids(lm, "Hi")
    assert prompt_ids(lm, ids) == ids == prompt_ids(lm, torch.tensor([ids]))


def test_a_tokenizer_without_a_template_reads_a_string_as_is(lm):
    tok = lm.tokenizer
    saved = tok.chat_template
    tok.chat_template = None
    try:
        assert prompt_ids(lm, "Is 7 prime?") == tok("Is 7 prime?")["input_ids"]
        with pytest.raises(ValueprobeError, match="no chat template"):
            prompt_ids(lm, [{"role": "user", "content": "Hi"}])
    finally:
        tok.chat_template = saved


def test_bad_prompts_are_one_line(lm):
    with pytest.raises(ValueprobeError, match="another tokenizer") as err:
        prompt_ids(lm, [1, 2, len(lm.tokenizer) + 5])
    assert "\n" not in str(err.value) and f"vocabulary of {len(lm.tokenizer)}" in str(err.value)
    with pytest.raises(ValueprobeError, match="empty"):
        prompt_ids(lm, "")
    with pytest.raises(ValueprobeError, match="empty"):
        prompt_ids(lm, [])
    with pytest.raises(ValueprobeError, match="whole numbers"):
        prompt_ids(lm, [1.5, 2.0])
    axis = planted_axis(lm)
    with pytest.raises(ValueprobeError, match="another tokenizer"):
        vp.values(lm, axis, list(range(len(lm.tokenizer) - 2, len(lm.tokenizer) + 2)))
    with pytest.raises(ValueprobeError, match="layer 9"):
        vp.values(lm, axis, "Hi", layer=9)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox"])
def test_values_equal_the_hidden_states(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = planted_axis(lm)
    v = vp.values(lm, axis, "The capital of France is", layer=1)
    ids = prompt_ids(lm, "The capital of France is")
    with torch.no_grad():
        hs = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[2][
            0
        ]  # resid_post[1]
    assert v.token_ids == tuple(ids) and v.tokens == tuple(lm.tokenizer.decode([t]) for t in ids)
    assert (v.layer, v.site, v.produced) == (1, "resid_post", False)
    assert v.read == "resid_post[1], after any steering on the model"
    torch.testing.assert_close(torch.tensor(v.sigma).double(), axis.score(hs, 1).double(), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        torch.tensor(v.projection).double(), axis.project(hs, 1).double(), atol=1e-4, rtol=0
    )
    cos = axis.project(hs, 1) / hs.norm(dim=-1)
    torch.testing.assert_close(torch.tensor(v.cos).double(), cos.double(), atol=1e-5, rtol=0)
    assert vp.values(lm, axis, "The capital of France is", layer=2).layer == 2
    assert vp.values(lm, axis, "The capital of France is").layer == axis.best_layer


def test_values_inside_steer_read_after_the_addition(lm):
    axis = planted_axis(lm)
    plain = vp.values(lm, axis, "Is 7 prime?", layer=1)
    with vp.steer(lm, axis, 2.0):  # +2 σ at resid_post[1] on every position
        steered = vp.values(lm, axis, "Is 7 prime?", layer=1)
    moved = torch.tensor(steered.sigma) - torch.tensor(plain.sigma)
    torch.testing.assert_close(moved, torch.full_like(moved, 2.0), atol=1e-4, rtol=0)


def test_the_strip_escapes_every_token_and_colours_by_value(lm):
    axis = planted_axis(lm)
    v = vp.values(lm, axis, "<script>alert(1)</script><img src=x onerror=alert(2)>", chat=False)
    page = v._repr_html_()
    assert not re.findall(r"<(?!/?(?:div|span)[\s>])", page)  # every "<" opens one of the strip's own tags
    assert page.count("&lt;") == 2 * sum(t.count("<") for t in v.tokens) > 0  # as text and in its title
    spans = re.findall(r'data-value="([^"]+)"[^>]*style="background:(rgb\([^)]*\))', page)
    assert [float(x) for x, _ in spans] == list(v.sigma)
    assert [c for _, c in spans] == [colour(s) for s in v.sigma]
    text = "".join(
        html.unescape(t) for t in re.findall(r">([^<]*)</span>", page.split("<div style='line-height")[1])
    )
    assert text == "".join(v.tokens)
    assert v.caption() in html.unescape(page)


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-50, max_value=50))
def test_the_colour_scale_is_diverging_and_clipped(x):
    r, g, b = (int(c) for c in re.findall(r"\d+", colour(x)))
    if x > 0:
        assert b >= r and b >= g  # blue side
    elif x < 0:
        assert r >= g and r >= b  # red side
    else:
        assert (r, g, b) == (255, 255, 255)
    assert colour(max(-SCALE, min(SCALE, x))) == colour(x)  # beyond the scale the colour stays full


def test_values_and_generations_round_trip(lm):
    axis = planted_axis(lm)
    (g,) = vp.generate(
        lm,
        axis,
        ["Hi"],
        alphas=[1.0],
        trace=True,
        decoding=vp.Decoding(greedy=True, max_new_tokens=3),
        progress=False,
    )
    assert isinstance(g.values, Values) and len(g.values) == len(g.token_ids)
    again = Generation.from_dict(g.to_dict())
    assert again.values == g.values and again.trace.read == g.trace.read
    # rows generated without a trace keep the file's old bytes: no "values" key at all
    (plain,) = vp.generate(
        lm, axis, ["Hi"], decoding=vp.Decoding(greedy=True, max_new_tokens=3), progress=False
    )
    assert "values" not in plain.to_dict() and plain.values is None
    frame = pytest.importorskip("pandas")
    df = g.values.to_pandas()
    assert isinstance(df, frame.DataFrame) and list(df.columns) == [
        "token",
        "token_id",
        "sigma",
        "projection",
        "cos",
    ]
    assert df["sigma"].tolist() == list(g.values.sigma)
