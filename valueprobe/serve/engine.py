"""The contract between `valueprobe serve`'s HTTP layer and an engine (``hf`` here, ``vllm`` beside it).

    valueprobe serve --probe probes/smollm2-135m-value --engine hf

The HTTP layer (`valueprobe.serve.app`) parses and checks each OpenAI request into one `SteerRequest`
(every field already valid: a layer the probe has, |α| within ``--max-alpha``, a known unit and
positions), hands it to ``engine.submit`` and turns the `Chunk` stream it gets back into an OpenAI
response or an SSE stream. An engine never sees JSON and never answers HTTP; a request it cannot
run raises `RequestError` naming the field, which the HTTP layer turns into a 400.

The value of a token (``Chunk.value``) is the σ-score ``(h·v̂ − μ)/σ`` of the residual at
``SteerRequest.value_layer`` (the probe's site) in the forward that *produced* the token, like its
logprob: for the first generated token that is the last prompt position. It is read in that same
forward (no second pass), after any steering upstream and, at the steered layer itself, before the
addition, as `valueprobe.steering.decode.generation.Trace` reads the steered point.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.handle import Where

__all__ = [
    "Chunk",
    "Engine",
    "FinishReason",
    "Positions",
    "RequestError",
    "ServeOptions",
    "SteerRequest",
    "SteerSpec",
]

Positions = Where  # the steering handle's phases: prompt, generated, all
FinishReason = Literal["stop", "length"]


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
class SteerSpec:
    """The ``steering`` object of one request, resolved against the probe.

    Attributes:
        alpha: strength in ``unit``; positive is value up (0: bit-identical to no steering).
        unit: ``sigma`` (α σ of the probe's reference set) or ``norm`` (α % of the mean residual norm).
        layer: the steered block, one the probe has (default: its best layer).
        positions: steer the ``prompt``, the ``generated`` tokens, or ``all`` of them.
    """

    alpha: float
    unit: Literal["sigma", "norm"]
    layer: int
    positions: Positions = "all"


@dataclass(frozen=True)
class SteerRequest:
    """One completion to run: exactly one of ``prompt`` and ``messages`` is set.

    Attributes:
        id: the response id (``cmpl-…`` / ``chatcmpl-…``), unique per request.
        prompt: raw text (``/v1/completions``); messages: a chat (``/v1/chat/completions``),
            rendered with the model's chat template, assistant turn opened.
        max_tokens: new tokens at most (>= 1).
        temperature: 0 is greedy; top_p in (0, 1]; seed: the row's sampling seed (None: fresh).
        steering: the steering, or None for none (the engine then adds nothing at all).
        value_layer: the layer the per-token value is read at (default: the probe's best layer).
        ignore_eos: generate ``max_tokens`` even past EOS (vLLM's extension; fixed-length benchmarks).
    """

    id: str
    prompt: str | None
    messages: tuple[Mapping[str, str], ...] | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    steering: SteerSpec | None
    value_layer: int
    ignore_eos: bool = False

    @property
    def alpha(self) -> float:
        """The strength, 0 without steering."""
        return 0.0 if self.steering is None else self.steering.alpha


@dataclass(frozen=True)
class Chunk:
    """One generated token as an engine streams it.

    Attributes:
        text: the text this token adds (may be empty while a multi-byte character is incomplete).
        token_id: the token's id.
        value: its σ-score (see the module doc for where and when it is read).
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


@runtime_checkable
class Engine(Protocol):
    """What `valueprobe.serve.app` needs of an engine: ``model`` is the id ``/v1/models`` lists
    and requests name; the HTTP layer checks requests against the probe before ``submit``."""

    model: str

    async def start(self) -> None:
        """Start background work (the batching loop); called once the event loop runs."""
        ...

    async def close(self) -> None:
        """Stop background work; pending requests end."""
        ...

    def submit(self, request: SteerRequest) -> AsyncGenerator[Chunk, None]:
        """Run ``request``; yield one `Chunk` per generated token, the last with its finish_reason.

        Raises `RequestError` (before the first chunk) for a request this engine cannot run,
        e.g. a prompt longer than the model's context. Leaving the iterator early (a client that
        disconnected) cancels the request without touching the others.
        """
        ...


@dataclass(frozen=True)
class ServeOptions:
    """What ``valueprobe serve`` hands an engine's factory (``make_engine(opts) -> Engine``):
    the probe (folder and axis, already read and checked for units), the model, and how the
    transformers path loads it (``load(model)``: the command's --device, --device-map, --model-dtype).
    The factory loads the model and refuses, in one `ValueprobeError` line, a probe of another
    model (``axis.check``, the fingerprint check ``score`` does)."""

    probe: Path
    axis: ValueAxis
    model: str
    load: Callable[[str], LoadedModel]
    model_dtype: str = "float32"  # what an engine that loads the model itself (vLLM) runs it in
