"""The contract between `valueprobe serve`'s HTTP layer and an engine (``hf`` here, ``vllm`` beside it).

    valueprobe serve --probe probes/smollm2-135m-value --engine hf

The HTTP layer (`valueprobe.serve.app`) parses and checks each OpenAI request into one
`valueprobe.serve.protocol.SteerRequest` (every field already valid: a layer the probe has, |α|
within ``--max-alpha``, a known unit and positions; its steering one `SteeringSpec` and α), hands
it to ``engine.submit`` and turns the `Chunk` stream it gets back into an OpenAI response or an
SSE stream. An engine never sees JSON and never answers HTTP; a request it cannot run raises
`RequestError` naming the field, which the HTTP layer turns into a 400.

The value of a token (``Chunk.value``) is the σ-score ``(h·v̂ − μ)/σ`` of the residual at
``SteerRequest.value_layer`` (the probe's site) in the forward that *produced* the token, like its
logprob: for the first generated token that is the last prompt position. It is read in that same
forward (no second pass), after any steering upstream and, at the steered layer itself, before the
addition, as `valueprobe.steering.decode.generation.Trace` reads the steered point.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from valueprobe.model.load import LoadedModel
from valueprobe.serve.protocol import Chunk, SteerRequest
from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["Engine", "OnModel", "ServeOptions"]

T = TypeVar("T")


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


@runtime_checkable
class OnModel(Protocol):
    """An engine that holds the transformers model (``hf``): the workbench's reads of one
    context (values at every layer, the next token's alternatives, the logit lens) run on it,
    in its own worker, between batches. The vllm engine has no such model: those routes 404."""

    async def on_model(self, fn: Callable[[LoadedModel], T]) -> T:
        """``fn(lm)`` run where the engine runs its batches; its result."""
        ...


@dataclass(frozen=True)
class ServeOptions:
    """What ``valueprobe serve`` hands an engine's factory (``make_engine(opts) -> Engine``):
    the server's steering spec (its probe already read and checked), the model, and how the
    transformers path loads it (``load(model)``: the command's --device, --device-map, --model-dtype).
    The factory loads the model and refuses, in one `ValueprobeError` line, a probe of another
    model (``axis.check``, the fingerprint check ``score`` does)."""

    spec: SteeringSpec
    model: str
    load: Callable[[str], LoadedModel]
    model_dtype: str = "float32"  # what an engine that loads the model itself (vLLM) runs it in
