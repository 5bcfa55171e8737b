"""OpenAI request bodies in, `SteerRequest` out; `Chunk`s in, OpenAI responses and stream chunks out.

    >>> req = parse_request(body, limits, chat=True)      # RequestError("steering.alpha", ...) → HTTP 400
    >>> completion(req, chunks, limits, chat=True)["choices"][0]["values"]   # one σ per token

What valueprobe adds to the OpenAI API, and nothing else differs:
- request: ``steering: {"alpha": 2, "unit": "sigma", "layer": 20, "positions": "all"}`` (all but
  ``alpha`` optional), ``value_layer`` (the layer the value is read at; default the probe's best),
  and vLLM's ``ignore_eos``;
- response: each choice carries ``values`` (one σ per generated token, an EOS included) and
  ``token_ids``; each stream chunk's choice carries the values of its own tokens; the top level
  echoes the resolved ``steering`` and ``value_layer``.

Unknown top-level fields are ignored (clients send their own); unknown keys inside ``steering``
are refused, so a typo never passes silently as "no steering".
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from uuid import uuid4

from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.serve.engine import Chunk, RequestError, SteerRequest, SteerSpec
from valueprobe.steering.hook.handle import WHERE as POSITIONS
from valueprobe.steering.hook.handle import check_unit

__all__ = ["Limits", "completion", "error_body", "parse_request", "stream_chunk"]

UNITS = ("sigma", "norm")
STEERING_KEYS = ("alpha", "unit", "layer", "positions")


@dataclass(frozen=True)
class Limits:
    """What every request is checked against: the served model's id, the probe, the α cap."""

    model: str
    axis: ValueAxis
    max_alpha: float | None = None
    max_tokens: int = 4096


def error_body(
    message: str, *, param: str | None = None, kind: str = "invalid_request_error"
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _number(
    body: Mapping[str, Any], key: str, default: float, *, lo: float, hi: float, param: str = ""
) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(param or key, f"must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise RequestError(param or key, f"must be in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _integer(
    body: Mapping[str, Any], key: str, default: int | None, *, lo: int, param: str = ""
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(param or key, f"must be an integer, got {value!r}")
    if value < lo:
        raise RequestError(param or key, f"must be >= {lo}, got {value}")
    return value


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise RequestError(key, f"must be true or false, got {value!r}")
    return value


def _layer(value: Any, axis: ValueAxis, param: str) -> int:
    if value is None:
        return axis.best_layer
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(param, f"must be an integer layer, got {value!r}")
    if value not in axis.layers:
        raise RequestError(param, f"the probe has no layer {value}: use one of {list(axis.layers)}")
    return value


def parse_steering(value: Any, limits: Limits) -> SteerSpec | None:
    """The ``steering`` field: None, or an object with ``alpha`` and optional unit, layer, positions."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RequestError("steering", f'must be an object like {{"alpha": 2}}, got {value!r}')
    for key in value:
        if key not in STEERING_KEYS:
            raise RequestError(f"steering.{key}", f"unknown steering field: use {', '.join(STEERING_KEYS)}")
    if "alpha" not in value:
        raise RequestError("steering.alpha", "missing: give the strength (positive is value up)")
    cap = math.inf if limits.max_alpha is None else limits.max_alpha
    alpha = _number(value, "alpha", 0.0, lo=-math.inf, hi=math.inf, param="steering.alpha")
    if abs(alpha) > cap:
        raise RequestError(
            "steering.alpha", f"|alpha| = {abs(alpha):g} is beyond this server's --max-alpha {cap:g}"
        )
    unit = value.get("unit", "sigma")
    if unit not in UNITS:
        raise RequestError("steering.unit", f"unknown unit {unit!r}: use one of {', '.join(UNITS)}")
    positions = value.get("positions", "all")
    if positions not in POSITIONS:
        raise RequestError(
            "steering.positions", f"unknown positions {positions!r}: use one of {', '.join(POSITIONS)}"
        )
    layer = _layer(value.get("layer"), limits.axis, "steering.layer")
    try:
        check_unit(limits.axis, layer, unit)
    except ValueprobeError as exc:
        raise RequestError("steering.unit", str(exc)) from exc
    return SteerSpec(alpha=alpha, unit=unit, layer=layer, positions=positions)


def _prompt(body: Mapping[str, Any], chat: bool) -> tuple[str | None, tuple[Mapping[str, str], ...] | None]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages", "must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not (
                isinstance(m, Mapping)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise RequestError(f"messages[{i}]", 'must be {"role": str, "content": str}')
        return None, tuple({"role": m["role"], "content": m["content"]} for m in messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt", "must be one non-empty string")
    return prompt, None


def parse_request(body: Any, limits: Limits, *, chat: bool) -> SteerRequest:
    """Check one ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body.

    Raises `RequestError` naming the first field at fault.
    """
    if not isinstance(body, Mapping):
        raise RequestError("body", "must be a JSON object")
    model = body.get("model")
    if model != limits.model:
        raise RequestError("model", f"this server serves {limits.model!r}, not {model!r} (see /v1/models)")
    if _integer(body, "n", 1, lo=1) != 1:
        raise RequestError("n", "only n = 1 is served: send one request per completion")
    if body.get("stop"):
        raise RequestError("stop", "stop sequences are not supported: stop on max_tokens or EOS")
    prompt, messages = _prompt(body, chat)
    tokens_key = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _integer(body, tokens_key, 16 if not chat else 256, lo=1)
    assert max_tokens is not None
    if max_tokens > limits.max_tokens:
        raise RequestError(tokens_key, f"at most {limits.max_tokens} new tokens, got {max_tokens}")
    return SteerRequest(
        id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid4().hex[:24]}",
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, lo=0.0, hi=2.0),
        top_p=_number(body, "top_p", 1.0, lo=1e-9, hi=1.0),
        seed=_integer(body, "seed", None, lo=0),
        steering=parse_steering(body.get("steering"), limits),
        value_layer=_layer(body.get("value_layer"), limits.axis, "value_layer"),
        ignore_eos=_flag(body, "ignore_eos"),
    )


def _header(req: SteerRequest, limits: Limits, *, chat: bool, stream: bool) -> dict[str, Any]:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if stream and chat else "")
    return {
        "id": req.id,
        "object": kind,
        "created": int(time.time()),
        "model": limits.model,
        "steering": None if req.steering is None else asdict(req.steering),
        "value_layer": req.value_layer,
    }


def completion(req: SteerRequest, chunks: Sequence[Chunk], limits: Limits, *, chat: bool) -> dict[str, Any]:
    """The whole response of a non-streamed request from all its chunks."""
    text = "".join(c.text for c in chunks)
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": chunks[-1].finish_reason if chunks else "length",
        "logprobs": None,
        "values": [c.value for c in chunks],
        "token_ids": [c.token_id for c in chunks],
    }
    choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    out = _header(req, limits, chat=chat, stream=False) | {"choices": [choice]}
    prompt = chunks[0].prompt_tokens if chunks else None
    if prompt is not None:
        out["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": len(chunks),
            "total_tokens": prompt + len(chunks),
        }
    return out


def stream_chunk(
    req: SteerRequest, chunk: Chunk, limits: Limits, *, chat: bool, first: bool
) -> dict[str, Any]:
    """One SSE event's object for one token."""
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": chunk.finish_reason,
        "logprobs": None,
        "values": [chunk.value],
        "token_ids": [chunk.token_id],
    }
    if chat:
        choice["delta"] = {"content": chunk.text} | ({"role": "assistant"} if first else {})
    else:
        choice["text"] = chunk.text
    return _header(req, limits, chat=chat, stream=True) | {"choices": [choice]}
