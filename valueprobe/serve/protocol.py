"""OpenAI request bodies in, `SteerRequest` out; `Chunk`s in, OpenAI responses and stream chunks out.

    >>> req = parse_request(body, limits, chat=True)      # RequestError("steering.alpha", ...) → HTTP 400
    >>> completion(req, chunks, limits, chat=True)["choices"][0]["values"]   # one σ per token

The words the HTTP layer and an engine share live here too: the checked request (`SteerRequest`),
one streamed token (`Chunk`), and the refusal (`RequestError`); `valueprobe.serve.engine` is the
engine contract built on them.

What valueprobe adds to the OpenAI API, and nothing else differs:
- request: ``steering: {"alpha": 2, "unit": "sigma", "layer": 20, "positions": "all"}`` (all but
  ``alpha`` optional; the rest default to the server's steering spec, ``serve --spec``, else the
  probe's best layer in σ on every position; a ``window`` and a ``random`` direction too:
  `valueprobe.serve.limits`), ``value_layer`` (the layer the value is read at; default the
  spec's read layer, else the probe's best), and vLLM's ``ignore_eos``;
- response: each choice carries ``values`` (one σ per generated token, an EOS included) and
  ``token_ids``; each stream chunk's choice carries the values of its own tokens; the top level
  echoes the resolved ``steering``, ``value_layer`` and ``value_read`` (the read point, in words too).

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
from valueprobe.serve.errors import RequestError, error_body
from valueprobe.serve.limits import (
    ALPHA_RULE,
    STEERING_KEYS,
    UNITS,
    Limits,
    check_layer,
    random_spec,
    served_layer,
    steering_window,
)
from valueprobe.serve.logprobs import chat_logprobs, completion_logprobs
from valueprobe.serve.messages import chat_messages
from valueprobe.steering.decode.reading import VALUE_AT, ValueAt, describe
from valueprobe.steering.hook.spec import WHERE as POSITIONS
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Unit

__all__ = [
    "Chunk",
    "FinishReason",
    "RequestError",
    "SteerRequest",
    "StreamUsage",
    "completion",
    "error_body",
    "parse_request",
    "stream_chunk",
    "stream_usage",
    "usage",
    "usage_chunk",
]

FinishReason = Literal["stop", "length"]

MAX_LOGPROBS = 20


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
        value_at: at the steered layer, read the value ``after`` the addition (the default: the
            value shows the steering) or ``before`` it.
        logprobs: None, or each token's log-probability with the ``logprobs`` likeliest (0: its own).
        stop, stop_token_ids: end the choice at any of these strings (not included in the text)
            or token ids (its token kept, its text not), as vLLM does.
        presence_penalty, frequency_penalty: vLLM's and OpenAI's, over the generated tokens.
        n: choices to generate; index: which choice this is (`SteerRequest.choices`).
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
    value_at: ValueAt = "after"
    logprobs: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1
    index: int = 0

    def choices(self) -> list[SteerRequest]:
        """One request per choice, each with its own seed (``seed + index``, as vLLM's n does)."""
        return [
            replace(self, index=i, seed=None if self.seed is None else self.seed + i) for i in range(self.n)
        ]

    @property
    def value_layer(self) -> int:
        """The layer the per-token value is read at."""
        assert self.spec.read_layer is not None, "parse_request sets every request's read layer"
        return self.spec.read_layer

    def value_read(self) -> dict[str, Any]:
        """Where the value is read, stated in each response: the layer, and ``before`` or ``after``
        the steering's addition (resolved: a layer past the steered one is after it, one before is before)."""
        out: dict[str, Any] = {"layer": self.value_layer, "at": self.value_at}
        steered = None
        if self.steered:
            layers = self.spec.layers
            steered = layers[0] if isinstance(layers, tuple) else layers
            if isinstance(steered, int) and steered != self.value_layer:
                out["at"] = "after" if self.value_layer > steered else "before"
            out["steered_layer"] = steered
        site = str(self.spec.first_axis().site)
        out["read"] = describe(
            self.value_layer, site, self.value_at, steered if isinstance(steered, int) else None
        )
        return out

    def steering(self) -> dict[str, Any] | None:
        """The resolved steering the response echoes: None when the request asked for none."""
        if not self.steered:
            return None
        layers = self.spec.layers
        layer = layers[0] if isinstance(layers, tuple) else layers
        out = {
            "alpha": self.alpha,
            "unit": self.spec.unit.value,
            "layer": layer,
            "positions": self.spec.positions,
        }
        if self.spec.window is not None:
            out["window"] = list(self.spec.window)
        if self.spec.direction_name is not None:
            out["direction"] = self.spec.direction_name  # a random direction: random-<seed>
        return out


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
        logprob, token, top: when the request asked for logprobs, the token's log-probability,
            its own text, and the likeliest tokens' ``(text, logprob)``.
    """

    text: str
    token_id: int
    value: float
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    logprob: float | None = None
    token: str = ""
    top: tuple[tuple[str, float], ...] = ()


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
    body: Mapping[str, Any], key: str, default: int | None, *, lo: int, hi: int | None = None, param: str = ""
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(param or key, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise RequestError(param or key, f"must be {bound}, got {value}")
    return value


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise RequestError(key, f"must be true or false, got {value!r}")
    return value


def _alpha(value: Any) -> float:
    if value is None:
        raise RequestError("steering.alpha", "missing: give the strength (positive is value up)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError("steering.alpha", f"must be a number, got {value!r}")
    return float(value)


def parse_steering(value: Any, limits: Limits) -> tuple[SteeringSpec, float] | None:
    """The ``steering`` field: None, or an object with ``alpha`` and optional unit, layer,
    positions, window and random; the request's spec (the server's, with these; its read layer is
    the request's ``value_layer``) and its α."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RequestError("steering", f'must be an object like {{"alpha": 2}}, got {value!r}')
    for key in value:
        if key not in STEERING_KEYS:
            raise RequestError(f"steering.{key}", f"unknown steering field: use {', '.join(STEERING_KEYS)}")
    alpha = _alpha(value.get("alpha"))
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
    window = steering_window(value.get("window"), positions) if "window" in value else limits.spec.window
    layer = check_layer(value.get("layer"), limits, "steering.layer", served_layer(limits.spec))
    try:
        cap = limits.alpha_cap(layer, unit)
    except ValueprobeError as exc:
        raise RequestError("steering.unit", str(exc)) from None
    if abs(alpha) > cap:
        why = "--max-alpha" if limits.max_alpha is not None else "cap (see /v1/models: " + ALPHA_RULE + ")"
        raise RequestError(
            "steering.alpha",
            f"|alpha| = {abs(alpha):g} {unit} at layer {layer} is beyond this server's {why} of {cap:g}",
        )
    spec = replace(limits.spec, layers=(layer,), unit=Unit(unit), positions=positions, window=window)
    return random_spec(value.get("random"), spec), alpha


def _prompt(body: Mapping[str, Any], chat: bool) -> tuple[str | None, tuple[Mapping[str, str], ...] | None]:
    if chat:
        return None, chat_messages(body.get("messages"))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt", "must be one non-empty string")
    return prompt, None


def _stops(body: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``stop`` (a string or a list of them) and vLLM's ``stop_token_ids`` (a list of ids)."""
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop", f"must be a non-empty string or a list of them, got {body.get('stop')!r}")
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise RequestError(
            "stop_token_ids", f"must be a list of token ids, got {body.get('stop_token_ids')!r}"
        )
    return tuple(stop), tuple(ids)


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    """Chat: ``logprobs: true`` with ``top_logprobs: k``; completions: ``logprobs: k``. None: none."""
    if not chat:
        return _integer(body, "logprobs", None, lo=0, hi=MAX_LOGPROBS)
    top = _integer(body, "top_logprobs", None, lo=0, hi=MAX_LOGPROBS)
    if not _flag(body, "logprobs"):
        if top is not None:
            raise RequestError("top_logprobs", "needs logprobs: true")
        return None
    return top or 0


# fields OpenAI clients may send that this server does not do: refused unless at their no-op value
UNSERVED: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "repetition_penalty": (None, 1, 1.0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "use_beam_search": (None, False),
}


def _unserved(body: Mapping[str, Any]) -> None:
    for key, fine in UNSERVED.items():
        if key in body and not any(body[key] == f and type(body[key]) is type(f) for f in fine):
            raise RequestError(key, f"{key} is not served here: leave it out")
    kind = body.get("response_format") or {"type": "text"}
    if not isinstance(kind, Mapping) or kind.get("type") != "text":
        raise RequestError("response_format", 'only {"type": "text"} is served: leave it out')


def _value_at(body: Mapping[str, Any]) -> ValueAt:
    at = body.get("value_at", "after")
    if at not in VALUE_AT:
        raise RequestError("value_at", f"must be one of {', '.join(VALUE_AT)}, got {at!r}")
    return "before" if at == "before" else "after"


def parse_request(body: Any, limits: Limits, *, chat: bool) -> SteerRequest:
    """Check one ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body.

    Raises `RequestError` naming the first field at fault.
    """
    if not isinstance(body, Mapping):
        raise RequestError("body", "must be a JSON object")
    model = body.get("model")
    if model != limits.model:
        raise RequestError("model", f"this server serves {limits.model!r}, not {model!r} (see /v1/models)")
    _unserved(body)
    n = _integer(body, "n", 1, lo=1, hi=limits.max_n)
    prompt, messages = _prompt(body, chat)
    tokens_key = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _integer(body, tokens_key, 16 if not chat else 256, lo=1, hi=limits.max_tokens)
    stop, stop_token_ids = _stops(body)
    steering = parse_steering(body.get("steering"), limits)
    value_layer = check_layer(body.get("value_layer"), limits, "value_layer", limits.spec.read_layer)
    # no steering: the server's spec at the value layer with α = 0, which adds nothing at all
    spec, alpha = steering or (replace(limits.spec, layers=(value_layer,)), 0.0)
    assert max_tokens is not None and n is not None
    return SteerRequest(
        id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid4().hex[:24]}",
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, lo=0.0, hi=2.0),
        top_p=_number(body, "top_p", 1.0, lo=1e-9, hi=1.0),
        seed=_integer(body, "seed", None, lo=0, hi=2**62),
        spec=replace(spec, read_layer=value_layer),
        alpha=alpha,
        steered=steering is not None,
        ignore_eos=_flag(body, "ignore_eos"),
        value_at=_value_at(body),
        logprobs=_logprobs(body, chat),
        stop=stop,
        stop_token_ids=stop_token_ids,
        presence_penalty=_number(body, "presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        n=n,
    )


@dataclass(frozen=True)
class StreamUsage:
    """``stream_options`` as OpenAI and vLLM read it: ``include_usage`` adds one last chunk with
    no choices and the request's ``usage`` (every other chunk then has ``usage: null``);
    ``continuous_usage_stats`` (vLLM's) puts each choice's usage so far on every chunk instead."""

    include: bool = False
    continuous: bool = False


def stream_usage(body: Mapping[str, Any], *, stream: bool) -> StreamUsage:
    """The body's ``stream_options``; set on a request that does not stream is a 400 (as vLLM)."""
    options = body.get("stream_options")
    if options is None:
        return StreamUsage()
    if not isinstance(options, Mapping):
        raise RequestError(
            "stream_options", f'must be an object like {{"include_usage": true}}, got {options!r}'
        )
    if options and not stream:
        raise RequestError("stream_options", "can only be given with stream: true")
    flags = {}
    for key in ("include_usage", "continuous_usage_stats"):
        value = options.get(key)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"stream_options.{key}", f"must be true or false, got {value!r}")
        flags[key] = bool(value)
    include = flags["include_usage"]
    return StreamUsage(include=include, continuous=include and flags["continuous_usage_stats"])


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def usage_chunk(
    req: SteerRequest, limits: Limits, prompt_tokens: int, completion_tokens: int, *, chat: bool
) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the whole request's usage
    (the prompt once, every choice's tokens), as vLLM sends it."""
    header = _header(req, limits, chat=chat, stream=True)
    return header | {"choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def _header(req: SteerRequest, limits: Limits, *, chat: bool, stream: bool) -> dict[str, Any]:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if stream and chat else "")
    return {
        "id": req.id,
        "object": kind,
        "created": int(time.time()),
        "model": limits.model,
        "steering": req.steering(),
        "value_layer": req.value_layer,
        "value_read": req.value_read(),
    }


def _choice(
    req: SteerRequest, index: int, chunks: Sequence[Chunk], *, chat: bool, offset: int = 0
) -> dict[str, Any]:
    """One choice's fields shared by whole responses and stream chunks (not its text)."""
    logprobs: dict[str, Any] | None = None
    if req.logprobs is not None:
        logprobs = chat_logprobs(chunks) if chat else completion_logprobs(chunks, offset)
    return {
        "index": index,
        "finish_reason": chunks[-1].finish_reason if chunks else None,
        "logprobs": logprobs,
        "values": [c.value for c in chunks],
        "token_ids": [c.token_id for c in chunks],
    }


def completion(
    req: SteerRequest, choices: Sequence[Sequence[Chunk]], limits: Limits, *, chat: bool
) -> dict[str, Any]:
    """The whole response of a non-streamed request from all its choices' chunks."""
    out = _header(req, limits, chat=chat, stream=False) | {"choices": []}
    for i, chunks in enumerate(choices):
        text = "".join(c.text for c in chunks)
        choice = _choice(req, i, chunks, chat=chat)
        choice["finish_reason"] = choice["finish_reason"] or "length"
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        out["choices"].append(choice)
    prompt = next((c[0].prompt_tokens for c in choices if c), None)
    if prompt is not None:
        out["usage"] = usage(prompt, sum(len(c) for c in choices))
    return out


def stream_chunk(
    req: SteerRequest, index: int, chunk: Chunk, limits: Limits, *, chat: bool, first: bool, offset: int = 0
) -> dict[str, Any]:
    """One SSE event's object for one token of choice ``index`` (``offset``: the characters of
    that choice's text already sent, for completions' ``text_offset``)."""
    choice = _choice(req, index, [chunk], chat=chat, offset=offset)
    if chat:
        choice["delta"] = {"content": chunk.text} | ({"role": "assistant"} if first else {})
    else:
        choice["text"] = chunk.text
    return _header(req, limits, chat=chat, stream=True) | {"choices": [choice]}
