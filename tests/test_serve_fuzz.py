# ruff: noqa: F811 - the fixtures imported from test_serve are parameters here
"""``valueprobe serve`` under request bodies drawn by a property-based fuzzer (issue 30, "Bad input"):
whatever a client sends, the answer is a 200 whose body is the OpenAI response (or an SSE stream
ending in ``[DONE]``), or a 400 whose body is the OpenAI error object with ``param`` naming the
field, never a traceback and never a 500, and the server keeps serving afterwards.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_serve_fuzz.py``
Bodies: every field the server reads, each either a plausible value (so requests get deep, into
the engine) or any JSON at all; the example count is small so CI stays quick (a few seconds).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import MODEL, PROMPT, STEER_LAYER, VALUE_LAYER, Server, axis, lm  # noqa: F401 - fixtures

from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.limits import Limits
from valueprobe.steering.hook.spec import SteeringSpec

EXAMPLES = (
    25  # per route and stream or not; each is one HTTP request of at most a few tokens on the tiny model
)

JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()  # NaN and ±inf too: Python's json writes (and the server's reads) them
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _or_junk(
    plausible: st.SearchStrategy[Any], *, one_in: int = 15, junk: st.SearchStrategy[Any] = JSON
) -> st.SearchStrategy[Any]:
    """``plausible`` mostly, ``junk`` (any JSON) one time in ``one_in``: most bodies get past the
    checks into the engine, and every field is still drawn broken now and then."""
    # junk on a middle draw: hypothesis draws a range's ends far more often than its middle
    return st.integers(min_value=0, max_value=one_in - 1).flatmap(
        lambda k: junk if k == one_in // 2 else plausible
    )


TEXT = st.text(max_size=24)
SMALL = st.integers(min_value=1, max_value=5)
ROLE = _or_junk(
    st.sampled_from(["user", "system", "assistant", "developer"]),
    junk=st.sampled_from(["wizard", "tool", ""]),
)
PART = st.fixed_dictionaries(
    {
        "type": _or_junk(st.just("text"), junk=st.sampled_from(["image_url", "input_audio"])),
        "text": _or_junk(TEXT),
    }
)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLE, "content": _or_junk(TEXT | st.lists(PART, min_size=1, max_size=3))}
)
STEERING = st.fixed_dictionaries(
    {"alpha": _or_junk(st.floats(min_value=-9, max_value=9))},
    optional={
        "unit": _or_junk(st.sampled_from(["sigma", "norm"])),
        "layer": _or_junk(st.integers(min_value=0, max_value=3)),
        "positions": _or_junk(st.sampled_from(["all", "prompt", "generated"])),
    },
)
COMMON: dict[str, st.SearchStrategy[Any]] = {
    "temperature": _or_junk(st.floats(min_value=0, max_value=2)),
    "top_p": _or_junk(st.floats(min_value=0.01, max_value=1)),
    "seed": _or_junk(st.integers(min_value=-1, max_value=2**63)),
    "n": _or_junk(st.integers(min_value=1, max_value=3)),
    "stop": _or_junk(st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=3)),
    "stop_token_ids": _or_junk(st.lists(st.integers(min_value=0, max_value=400), max_size=3)),
    "presence_penalty": _or_junk(st.floats(min_value=-2, max_value=2)),
    "frequency_penalty": _or_junk(st.floats(min_value=-2, max_value=2)),
    "steering": _or_junk(STEERING),
    "value_layer": _or_junk(st.integers(min_value=0, max_value=3)),
    "value_at": _or_junk(st.sampled_from(["before", "after"])),
    "ignore_eos": _or_junk(st.booleans()),
    "stream": _or_junk(st.booleans()),
    "stream_options": _or_junk(
        st.fixed_dictionaries({}, optional={"include_usage": _or_junk(st.booleans())})
    ),
    "logit_bias": _or_junk(st.just({})),
    "response_format": _or_junk(st.just({"type": "text"})),
    "user": JSON,
}
MODEL_FIELD = _or_junk(st.just(MODEL), one_in=30)
COMPLETION = st.fixed_dictionaries(
    {
        "model": MODEL_FIELD,
        "max_tokens": _or_junk(SMALL),
        "prompt": _or_junk(
            st.text(min_size=1, max_size=24) | st.lists(st.text(min_size=1), min_size=1, max_size=1)
        ),
    },
    optional=COMMON
    | {
        "logprobs": _or_junk(st.integers(min_value=0, max_value=20)),
        "echo": _or_junk(st.just(False)),
    },
)
CHAT = st.fixed_dictionaries(
    {
        "model": MODEL_FIELD,
        "max_tokens": _or_junk(SMALL),
        "messages": _or_junk(st.lists(MESSAGE, min_size=1, max_size=3)),
    },
    optional=COMMON
    | {
        "logprobs": _or_junk(st.booleans()),
        "top_logprobs": _or_junk(st.integers(min_value=0, max_value=20)),
        "max_completion_tokens": _or_junk(SMALL),
    },
)


@pytest.fixture(scope="module")
def fuzzed(lm, axis):
    """A server with no batching window, so each drawn request is answered at once."""
    s = Server(HFEngine(lm, model=MODEL, window_s=0.0), Limits(MODEL, SteeringSpec(axis), max_alpha=8))
    yield s
    s.close()


def _check_answer(r: httpx.Response) -> None:
    assert "Traceback" not in r.text and 'File "' not in r.text, r.text
    if r.status_code != 200:
        assert r.status_code == 400, (r.status_code, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["param"], str) and error["param"], error
        assert isinstance(error["message"], str) and "\n" not in error["message"], error
        return
    if not r.headers["content-type"].startswith("text/event-stream"):
        assert r.json()["choices"], r.text
        return
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", r.text
    for event in events[:-1]:
        assert "error" not in json.loads(event), event


def _still_serving(server: Server) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{server.url}/completions", json=body, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 2, r.text


def _post(server: Server, path: str, body: Any) -> None:
    # allow_nan: NaN and infinities go out as JSON's common extension, as some clients write them
    r = httpx.post(
        f"{server.url}/{path}",
        content=json.dumps(body, allow_nan=True),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    _check_answer(r)


_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("stream", [False, True])
@_SETTINGS
@given(body=COMPLETION)
def test_any_completions_body_is_answered_or_refused_by_field(fuzzed, stream, body):
    _post(fuzzed, "completions", body | ({"stream": True} if stream else {}))


@pytest.mark.parametrize("stream", [False, True])
@_SETTINGS
@given(body=CHAT)
def test_any_chat_body_is_answered_or_refused_by_field(fuzzed, stream, body):
    _post(fuzzed, "chat/completions", body | ({"stream": True} if stream else {}))


@settings(max_examples=EXAMPLES // 3, deadline=None)
@given(body=JSON | st.binary(max_size=40))
def test_any_json_or_bytes_at_all_is_refused_by_field(fuzzed, body):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    for path in ("completions", "chat/completions"):
        _check_answer(httpx.post(f"{fuzzed.url}/{path}", content=content, timeout=60))


def test_the_server_still_serves_after_the_fuzzing(fuzzed):
    """Run last in this file (pytest keeps file order): whatever came before, it answers."""
    _still_serving(fuzzed)
    health = httpx.get(fuzzed.url.removesuffix("/v1") + "/health", timeout=30).json()
    assert health == {"status": "ok", "in_flight": 0}
