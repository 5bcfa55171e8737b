# ruff: noqa: F811 - the fixtures imported from test_serve are parameters here
"""``valueprobe serve``'s request layer as OpenAI clients use it (issue 30): content parts, roles,
logprobs, stop, n, seed, penalties, value_at and the α cap, through the official ``openai`` client.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_serve_api.py``
References: the model's own logits (log_softmax) for logprobs; a hand-written greedy loop with
vLLM's penalty formula; the same request alone (n's choices = single requests with seed + i, stops =
the unstopped text cut); and a closed form for value_at: with a unit axis steered in σ at the read
layer, the value after the addition is the value before it plus α.
"""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest
import torch
from conftest import curl_events
from test_serve import MODEL, PROMPT, STEER_LAYER, VALUE_LAYER, Server, axis, lm, server  # noqa: F401 - fixtures

from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.limits import Limits
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.hook.spec import SteeringSpec

CHAT = [{"role": "user", "content": "Is 7 prime?"}]


def _text(client: openai.OpenAI, **kw):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0} | kw
    return client.completions.create(**body)


def _chat(client: openai.OpenAI, **kw):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 6, "temperature": 0} | kw
    return client.chat.completions.create(**body)


def _refused(server: Server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.url}/{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


def test_content_parts_are_joined_text_and_other_parts_are_refused_by_name(server):
    client = server.client()
    parts = [{"type": "text", "text": "Is 7"}, {"type": "text", "text": "prime?"}]
    got = _chat(client, messages=[{"role": "user", "content": parts}])
    same = _chat(client, messages=[{"role": "user", "content": "Is 7\nprime?"}])
    assert got.choices[0].model_extra["token_ids"] == same.choices[0].model_extra["token_ids"]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as exc:
        _chat(client, messages=[{"role": "user", "content": [parts[0], image]}])
    assert exc.value.body["param"] == "messages[0].content[1]" and "image_url" in exc.value.body["message"]


@pytest.mark.parametrize("role", ["wizard", "tool", "function", ""])
def test_a_role_the_template_does_not_know_is_a_400(server, role):
    body = {"model": MODEL, "messages": [{"role": role, "content": "hi"}]}
    assert _refused(server, "chat/completions", body)["param"] == "messages[0].role"


def _logits(server: Server, lm, ids: list[int]) -> torch.Tensor:
    """The plain model's logits at every position of ``ids``, once the engine is idle (`Server.idle`)."""
    server.idle()
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([ids])).logits[0]


def _reference_logprobs(server: Server, lm, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at each position that produced a token (no steering)."""
    logits = _logits(server, lm, prompt_ids + token_ids[:-1])[len(prompt_ids) - 1 :]
    return torch.log_softmax(logits.float(), dim=-1)


def test_chat_logprobs_are_the_models_own(server, lm):
    got = _chat(server.client(), logprobs=True, top_logprobs=3).choices[0]
    ids = got.model_extra["token_ids"]
    (prompt,) = encode_prompts(lm, [CHAT])
    ref = _reference_logprobs(server, lm, prompt, ids)
    content = got.logprobs.content
    assert len(content) == len(ids)
    for i, entry in enumerate(content):
        assert entry.logprob == pytest.approx(float(ref[i, ids[i]]), abs=1e-4)
        top = torch.topk(ref[i], 3)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)  # greedy: the top one
        assert entry.token == lm.tokenizer.decode([ids[i]]) and entry.bytes == list(entry.token.encode())


def test_completion_logprobs_streamed_equal_whole(server, lm):
    client = server.client()
    whole = _text(client, logprobs=2).choices[0]
    (prompt,) = encode_prompts(lm, [PROMPT], chat=False)
    ref = _reference_logprobs(server, lm, prompt, whole.model_extra["token_ids"])
    ids = whole.model_extra["token_ids"]
    assert whole.logprobs.token_logprobs == pytest.approx(
        [float(ref[i, t]) for i, t in enumerate(ids)], abs=1e-4
    )
    assert all(len(top) == 2 for top in whole.logprobs.top_logprobs)
    streamed = [c.choices[0].logprobs.token_logprobs[0] for c in _text(client, logprobs=2, stream=True)]
    assert streamed == pytest.approx(whole.logprobs.token_logprobs, abs=1e-6)
    assert _chat(client).choices[0].logprobs is None  # not asked, not given


def _stop_string(text: str) -> str:
    """A stop string from the middle of ``text`` that first occurs there."""
    for start in range(1, len(text) - 2):
        s = text[start : start + 2]
        if s.strip() and text.find(s) == start:
            return s
    pytest.skip(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_text_before_it(server, stream):
    client = server.client()
    free = _text(client, max_tokens=12).choices[0].text
    stop = _stop_string(free)
    if stream:
        chunks = [c.choices[0] for c in _text(client, max_tokens=12, stop=[stop, "never-seen"], stream=True)]
        text, reason = "".join(c.text for c in chunks), chunks[-1].finish_reason
        assert all(stop not in c.text for c in chunks)
    else:
        got = _text(client, max_tokens=12, stop=[stop, "never-seen"]).choices[0]
        text, reason = got.text, got.finish_reason
    assert text == free[: free.find(stop)] and reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_token_id_keeps_its_id_and_value_not_its_text(server, lm, stream):
    client = server.client()
    free = _text(client, max_tokens=8).choices[0]
    ids = free.model_extra["token_ids"]
    k = next((i for i in range(1, len(ids)) if ids[i] not in ids[:i]), None)
    if k is None:
        pytest.skip("the greedy run repeats one token")
    extra = {"stop_token_ids": [ids[k]]}
    if stream:
        chunks = [c.choices[0] for c in _text(client, max_tokens=8, stream=True, extra_body=extra)]
        got_ids = [i for c in chunks for i in c.model_extra["token_ids"]]
        text, reason = "".join(c.text for c in chunks), chunks[-1].finish_reason
    else:
        got = _text(client, max_tokens=8, extra_body=extra).choices[0]
        got_ids, text, reason = got.model_extra["token_ids"], got.text, got.finish_reason
    assert got_ids == ids[: k + 1] and reason == "stop"
    # the text before the stop token, less a trailing incomplete character (never sent half, as vLLM)
    assert text == lm.tokenizer.decode(ids[:k], skip_special_tokens=True).rstrip("\ufffd")


def test_n_choices_are_each_the_request_alone_with_seed_plus_index(server):
    client = server.client()
    got = _text(client, n=3, seed=11, temperature=1.0, max_tokens=5)
    assert [c.index for c in got.choices] == [0, 1, 2] and got.usage.completion_tokens == 15
    for i, choice in enumerate(got.choices):
        alone = _text(client, seed=11 + i, temperature=1.0, max_tokens=5).choices[0]
        assert choice.model_extra["token_ids"] == alone.model_extra["token_ids"]
        assert choice.model_extra["values"] == pytest.approx(alone.model_extra["values"], abs=1e-5)
    assert len({tuple(c.model_extra["token_ids"]) for c in got.choices}) > 1, "every choice drew the same"
    streamed: dict[int, list[int]] = {}
    for chunk in _chat(client, n=2, seed=5, temperature=1.0, max_tokens=4, stream=True):
        for c in chunk.choices:
            streamed.setdefault(c.index, []).extend(c.model_extra["token_ids"])
    whole = _chat(client, n=2, seed=5, temperature=1.0, max_tokens=4)
    assert streamed == {c.index: c.model_extra["token_ids"] for c in whole.choices}


def test_seed_repeats_a_sample(server):
    client = server.client()
    a, b = (_text(client, seed=3, temperature=1.0).choices[0].model_extra["token_ids"] for _ in range(2))
    assert a == b


def test_penalties_are_vllms(server, lm):
    """Greedy with frequency 1.5 and presence 0.5 equals a hand loop: logit - f·count - p·[count > 0]
    over the generated tokens."""
    got = _text(server.client(), frequency_penalty=1.5, presence_penalty=0.5, max_tokens=8).choices[0]
    (ids,) = encode_prompts(lm, [PROMPT], chat=False)
    out: list[int] = []
    for _ in range(8):
        logits = _logits(server, lm, ids + out)[-1].float()
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float()
        out.append(int((logits - 1.5 * counts - 0.5 * (counts > 0).float()).argmax()))
    assert got.model_extra["token_ids"] == out
    plain = _text(server.client(), max_tokens=8).choices[0].model_extra["token_ids"]
    assert plain != out, "the penalties changed nothing: pick a prompt that repeats"


def test_value_at_the_steered_layer_shows_the_steering(server):
    """A unit axis steered α σ at the read layer: after = before + α, token for token; the default
    is after, and the response says where it read."""
    client = server.client()
    alpha = 3.0

    def run(**extra):
        body = {"steering": {"alpha": alpha}, "value_layer": STEER_LAYER} | extra
        return _text(client, extra_body=body)

    default, before = run(), run(value_at="before")
    assert default.choices[0].model_extra["token_ids"] == before.choices[0].model_extra["token_ids"]
    after = torch.tensor(default.choices[0].model_extra["values"])
    assert after.sub(torch.tensor(before.choices[0].model_extra["values"])).tolist() == pytest.approx(
        [alpha] * len(after), abs=1e-4
    )
    assert default.model_extra["value_read"] == {
        "layer": STEER_LAYER,
        "at": "after",
        "steered_layer": STEER_LAYER,
        "read": f"resid_post[{STEER_LAYER}], after the addition",
    }
    assert before.model_extra["value_read"]["at"] == "before"
    later = _text(client, extra_body={"steering": {"alpha": alpha}, "value_layer": VALUE_LAYER})
    assert later.model_extra["value_read"] == {
        "layer": VALUE_LAYER,
        "at": "after",
        "steered_layer": STEER_LAYER,
        "read": f"resid_post[{VALUE_LAYER}], after the addition at layer {STEER_LAYER}",
    }
    assert _refused(server, "completions", {"model": MODEL, "prompt": PROMPT, "value_at": "during"})[
        "param"
    ] == ("value_at")


@pytest.fixture(scope="module")
def capped(lm, axis):
    """A server with no --max-alpha: the cap is the probe's (planted: σ 0.5, mean norm 8)."""
    s = Server(HFEngine(lm, model=MODEL), Limits(MODEL, SteeringSpec(axis)))
    yield s
    s.close()


def test_default_alpha_cap_is_the_probes_and_stated_in_models(capped):
    card = httpx.get(f"{capped.url}/models", timeout=30).json()["data"][0]["valueprobe"]
    # the addition α·unit stays within 1 × the layer's mean norm: 8 / 0.5 = 16 σ, 100 % of the norm
    assert card["max_alpha"]["by_unit"]["sigma"][str(STEER_LAYER)] == pytest.approx(16.0)
    assert card["max_alpha"]["by_unit"]["norm"][str(STEER_LAYER)] == pytest.approx(100.0)
    assert "mean residual norm" in card["max_alpha"]["rule"]
    assert card["value"]["default_at"] == "after" and card["layers"] == [0, 1, 2, 3]
    client = capped.client()
    assert _text(client, max_tokens=2, extra_body={"steering": {"alpha": -16}}).choices[0].text is not None
    for alpha, unit in [(16.5, "sigma"), (1e9, "sigma"), (101, "norm")]:
        body = {"model": MODEL, "prompt": PROMPT, "steering": {"alpha": alpha, "unit": unit}}
        assert _refused(capped, "completions", body)["param"] == "steering.alpha"


@pytest.mark.parametrize(
    ("path", "patch", "param"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages[0].content[0]",
        ),
        ("chat/completions", {"messages": "hi"}, "messages"),
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("completions", {"logprobs": -1}, "logprobs"),
        ("completions", {"stop": [""]}, "stop"),
        ("completions", {"stop": 3}, "stop"),
        ("completions", {"stop_token_ids": ["a"]}, "stop_token_ids"),
        ("completions", {"n": 0}, "n"),
        ("completions", {"n": 17}, "n"),
        ("completions", {"seed": -1}, "seed"),
        ("completions", {"presence_penalty": 3}, "presence_penalty"),
        ("completions", {"frequency_penalty": "x"}, "frequency_penalty"),
        ("completions", {"logit_bias": {"1": 5}}, "logit_bias"),
        ("completions", {"echo": True}, "echo"),
        ("completions", {"best_of": 3}, "best_of"),
        ("chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat/completions", {"tools": [{"type": "function"}]}, "tools"),
        ("chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),  # no stream
        ("completions", {"stream_options": [True], "stream": True}, "stream_options"),
        (
            "completions",
            {"stream_options": {"include_usage": "yes"}, "stream": True},
            "stream_options.include_usage",
        ),
    ],
)
def test_every_refusal_is_an_openai_error_naming_the_field(server, path, patch, param):
    base = {"model": MODEL, "max_tokens": 2} | (
        {"messages": CHAT} if path.startswith("chat") else {"prompt": PROMPT}
    )
    assert _refused(server, path, base | patch)["param"] == param
    assert _text(server.client(), max_tokens=1).choices[0].model_extra["values"]


def _curl(server: Server, path: str, body: dict) -> list[dict]:
    return curl_events(f"{server.url}/{path}", body)


def _assemble(events: list[dict], *, chat: bool) -> dict[int, dict]:
    """Each choice of a stream put back together: text, token ids, values, logprobs, finish."""
    got: dict[int, dict] = {}
    for event in events:
        for c in event["choices"]:
            d = got.setdefault(c["index"], {"text": "", "token_ids": [], "values": [], "logprobs": []})
            d["text"] += c["delta"].get("content", "") if chat else c["text"]
            d["token_ids"] += c["token_ids"]
            d["values"] += c["values"]
            if c["logprobs"] is not None:
                d["logprobs"] += c["logprobs"]["content"] if chat else c["logprobs"]["token_logprobs"]
            d["finish_reason"] = c["finish_reason"]
    return got


def _whole(choice: dict, *, chat: bool) -> dict:
    logprobs = choice["logprobs"]
    return {
        "text": choice["message"]["content"] if chat else choice["text"],
        "token_ids": choice["token_ids"],
        "values": choice["values"],
        "logprobs": [] if logprobs is None else logprobs["content"] if chat else logprobs["token_logprobs"],
        "finish_reason": choice["finish_reason"],
    }


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("completions", {"logprobs": 2}),
        ("chat/completions", {"logprobs": True, "top_logprobs": 2}),
        ("completions", {"stop": "STOP"}),  # the stop string is made from the free text below
        ("chat/completions", {"stop": "STOP"}),
        ("completions", {"n": 2, "seed": 7, "temperature": 1.0}),
        ("chat/completions", {"n": 3, "seed": 7, "temperature": 1.0, "logprobs": True}),
        ("completions", {"value_at": "before", "value_layer": STEER_LAYER, "steering": {"alpha": 3}}),
        ("chat/completions", {"value_at": "after", "value_layer": STEER_LAYER, "steering": {"alpha": -3}}),
    ],
)
def test_curl_stream_of_each_field_equals_the_whole_response(server, path, extra):
    chat = path.startswith("chat")
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0} | (
        {"messages": CHAT} if chat else {"prompt": PROMPT}
    )
    if extra.get("stop") == "STOP":
        free = httpx.post(f"{server.url}/{path}", json=body, timeout=60).json()["choices"][0]
        extra = {"stop": [_stop_string(_whole(free, chat=chat)["text"])]}
    body |= extra
    whole = httpx.post(f"{server.url}/{path}", json=body, timeout=60).json()
    events = _curl(server, path, body | {"stream": True})
    streamed = _assemble(events, chat=chat)
    assert sorted(streamed) == list(range(body.get("n", 1)))
    for i, choice in enumerate(whole["choices"]):
        want, got = _whole(choice, chat=chat), streamed[i]
        assert got["token_ids"] == want["token_ids"] and got["text"] == want["text"]
        assert got["values"] == pytest.approx(want["values"], abs=1e-6)
        assert got["finish_reason"] == want["finish_reason"]
        if chat:
            assert [e["logprob"] for e in got["logprobs"]] == pytest.approx(
                [e["logprob"] for e in want["logprobs"]], abs=1e-6
            )
            assert [[t["token"] for t in e["top_logprobs"]] for e in got["logprobs"]] == [
                [t["token"] for t in e["top_logprobs"]] for e in want["logprobs"]
            ]
        else:
            assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-6)
        assert bool(got["logprobs"]) == ("logprobs" in extra)
    if "stop" in extra:
        assert streamed[0]["finish_reason"] == "stop"
        assert all(extra["stop"][0] not in c["text"] for e in events for c in e["choices"] if "text" in c)
    assert all(e["value_read"] == whole["value_read"] for e in events)
    assert all("usage" not in e for e in events)  # not asked for: no usage field at all


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_stream_options_include_usage_ends_with_the_usage_chunk(server, path):
    """As OpenAI and vLLM: every chunk has ``usage: null`` and one last chunk, before ``[DONE]``,
    has no choices and the whole request's usage (the prompt once, every choice's tokens)."""
    chat = path.startswith("chat")
    body = {"model": MODEL, "max_tokens": 5, "temperature": 1.0, "seed": 3, "n": 2, "ignore_eos": True} | (
        {"messages": CHAT} if chat else {"prompt": PROMPT}
    )
    whole = httpx.post(f"{server.url}/{path}", json=body, timeout=60).json()
    assert whole["usage"]["completion_tokens"] == 10
    events = _curl(server, path, body | {"stream": True, "stream_options": {"include_usage": True}})
    *tokens, last = events
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    assert len(tokens) == 10 and all(e["usage"] is None for e in tokens)
    continuous = {"include_usage": True, "continuous_usage_stats": True}
    *tokens, last = _curl(server, path, body | {"stream": True, "stream_options": continuous})
    assert last["usage"] == whole["usage"]
    for i in (0, 1):  # vLLM's continuous stats: each choice's own tokens so far
        mine = [e["usage"] for e in tokens if e["choices"][0]["index"] == i]
        assert [u["completion_tokens"] for u in mine] == [1, 2, 3, 4, 5]
        assert {u["prompt_tokens"] for u in mine} == {whole["usage"]["prompt_tokens"]}


def test_stream_options_with_the_official_client(server):
    chunks = list(_chat(server.client(), stream=True, stream_options={"include_usage": True}))
    whole = _chat(server.client())
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
