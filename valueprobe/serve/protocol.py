"""OpenAI request bodies in, `SteerRequest` out; `Chunk`s in, OpenAI responses and stream chunks out.

    >>> req = parse_request(body, limits, chat=True)      # RequestError("steering.alpha", ...) → HTTP 400
    >>> completion(req, chunks, limits, chat=True)["choices"][0]["values"]   # one σ per token

The words the HTTP layer and an engine share live here too: the checked request (`SteerRequest`),
one streamed token (`Chunk`), and the refusal (`RequestError`); `valueprobe.serve.engine` is the
engine contract built on them.

What valueprobe adds to the OpenAI API, and nothing else differs:
- request: ``steering: {"alpha": 2, "unit": "sigma", "layer": 20, "positions": "all"}`` (all but
  ``alpha`` optional; the rest default to the server's steering spec, ``serve --spec``, else the
  probe's best layer in σ on every position), ``value_layer`` (the layer the value is read at;
  default the spec's read layer, else the probe's best), and vLLM's ``ignore_eos``;
- response: each choice carries ``values`` (one σ per generated token, an EOS included) and
  ``token_ids``; each stream chunk's choice carries the values of its own tokens; the top level
  echoes the resolved ``steering`` and ``value_layer``.

Each request becomes the server's `SteeringSpec` with the request's layer, unit, positions and
value layer, and its α (the spec's only per-row part).

Unknown top-level fields are ignored (clients send their own); unknown keys inside ``steering``
are refused, so a typo never passes silently as "no steering".
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal
from uuid import uuid4

from valueprobe.errors import ValueprobeError
from valueprobe.steering.hook.spec import WHERE as POSITIONS
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Unit

__all__ = [
    "Chunk",
    "FinishReason",
    "Limits",
    "RequestError",
    "SteerRequest",
    "completion",
    "error_body",
    "parse_request",
    "stream_chunk",
]

FinishReason = Literal["stop", "length"]

UNITS = ("sigma", "norm")
STEERING_KEYS = ("alpha", "unit", "layer", "positions")


class RequestError(ValueprobeError):
    """A request the server refuses: HTTP 400 with ``{"error": {"message", "param": field}}``.

    Args:
        param: the request field at fault, dotted (``"steering.alpha"``, ``"messages"``).
        message: one line saying what is wrong and what would be accepted.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True)
class SteerRequest:
    """One completion to run: exactly one of ``prompt`` and ``messages`` is set.

    Attributes:
        id: the response id (``cmpl-…`` / ``chatcmpl-…``), unique per request.
        prompt: raw text (``/v1/completions``); messages: a chat (``/v1/chat/completions``),
            rendered with the model's chat template, assistant turn opened.
        max_tokens: new tokens at most (>= 1).
        temperature: 0 is greedy; top_p in (0, 1]; seed: the row's sampling seed (None: fresh).
        spec: what the request steers, and where its values are read (``spec.read_layer``).
        alpha: its strength, in the spec's unit (0: bit-identical to no steering); the only per-row part.
        steered: whether it asked for steering (None in the response otherwise; then α is 0).
        ignore_eos: generate ``max_tokens`` even past EOS (vLLM's extension; fixed-length benchmarks).
    """

    id: str
    prompt: str | None
    messages: tuple[Mapping[str, str], ...] | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    spec: SteeringSpec
    alpha: float = 0.0
    steered: bool = False
    ignore_eos: bool = False

    @property
    def value_layer(self) -> int:
        """The layer the per-token value is read at."""
        assert self.spec.read_layer is not None, "parse_request sets every request's read layer"
        return self.spec.read_layer

    def steering(self) -> dict[str, Any] | None:
        """The resolved steering the response echoes: None when the request asked for none."""
        if not self.steered:
            return None
        layers = self.spec.layers
        layer = layers[0] if isinstance(layers, tuple) else layers
        return {
            "alpha": self.alpha,
            "unit": self.spec.unit.value,
            "layer": layer,
            "positions": self.spec.positions,
        }


@dataclass(frozen=True)
class Chunk:
    """One generated token as an engine streams it.

    Attributes:
        text: the text this token adds (may be empty while a multi-byte character is incomplete).
        token_id: the token's id.
        value: its σ-score (see `valueprobe.serve.engine` for where and when it is read).
        finish_reason: set on the request's last chunk: ``stop`` (EOS or a stop string) or
            ``length`` (``max_tokens`` reached); None before.
        prompt_tokens: the prompt's length in tokens, if the engine knows it (then the response
            carries OpenAI's ``usage``); optional.
    """

    text: str
    token_id: int
    value: float
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class Limits:
    """What every request is checked against: the served model's id, the server's steering spec
    (its probe, and the defaults of every request's steering), the α cap."""

    model: str
    spec: SteeringSpec
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


def _layer(value: Any, limits: Limits, param: str, default: int | None) -> int:
    axis = limits.spec.first_axis()
    if value is None:
        return axis.best_layer if default is None else default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(param, f"must be an integer layer, got {value!r}")
    if value not in axis.layers:
        raise RequestError(param, f"the probe has no layer {value}: use one of {list(axis.layers)}")
    return value


def _served_layer(spec: SteeringSpec) -> int | None:
    """The server spec's steered layer, when it names exactly one (else each request's default is the best)."""
    return spec.layers[0] if isinstance(spec.layers, tuple) and len(spec.layers) == 1 else None


def parse_steering(value: Any, limits: Limits) -> tuple[SteeringSpec, float] | None:
    """The ``steering`` field: None, or an object with ``alpha`` and optional unit, layer, positions;
    the request's spec (the server's, with these; its read layer is the request's ``value_layer``)
    and its α."""
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
    unit = value.get("unit")
    if unit is None:
        unit = limits.spec.unit.value  # the server's spec says it (sigma unless serve --spec says otherwise)
    elif unit not in UNITS:
        raise RequestError("steering.unit", f"unknown unit {unit!r}: use one of {', '.join(UNITS)}")
    positions = value.get("positions", limits.spec.positions)
    if positions not in POSITIONS:
        raise RequestError(
            "steering.positions", f"unknown positions {positions!r}: use one of {', '.join(POSITIONS)}"
        )
    layer = _layer(value.get("layer"), limits, "steering.layer", _served_layer(limits.spec))
    try:
        limits.spec.first_axis().unit_size(layer, unit)
    except ValueprobeError as exc:
        raise RequestError("steering.unit", str(exc)) from None
    return replace(limits.spec, layers=(layer,), unit=Unit(unit), positions=positions), alpha


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
    temperature = _number(body, "temperature", 1.0, lo=0.0, hi=2.0)
    top_p = _number(body, "top_p", 1.0, lo=1e-9, hi=1.0)
    seed = _integer(body, "seed", None, lo=0)
    steering = parse_steering(body.get("steering"), limits)
    value_layer = _layer(body.get("value_layer"), limits, "value_layer", limits.spec.read_layer)
    # no steering: the server's spec at the value layer with α = 0, which adds nothing at all
    spec, alpha = steering or (replace(limits.spec, layers=(value_layer,)), 0.0)
    return SteerRequest(
        id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid4().hex[:24]}",
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        spec=replace(spec, read_layer=value_layer),
        alpha=alpha,
        steered=steering is not None,
        ignore_eos=_flag(body, "ignore_eos"),
    )


def _header(req: SteerRequest, limits: Limits, *, chat: bool, stream: bool) -> dict[str, Any]:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if stream and chat else "")
    return {
        "id": req.id,
        "object": kind,
        "created": int(time.time()),
        "model": limits.model,
        "steering": req.steering(),
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
