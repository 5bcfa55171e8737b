"""An Inspect AI model provider, ``valueprobe/<model>``: a steered model with per-token values.

    inspect eval valueprobe/arithmetic --model valueprobe/smollm2-135m -M spec=runs/spec.json -M alpha=15
    inspect eval my_task.py --model valueprobe/smollm2-135m -M probe=smollm2-135m-value -M alpha=-15 -M random=2

Inspect finds the provider through the ``inspect_ai`` entry point valueprobe installs
(``pyproject.toml``: ``valueprobe = "valueprobe.evals.inspect_registry"``), so a task needs no
import of valueprobe. Model arguments (``-M k=v``): the steering
(`valueprobe.evals.steering.EvalSteering`, as the lm-eval model takes it): ``spec`` (a steering
spec JSON file) or ``probe`` (a shipped axis's name or folder), ``alpha`` (in the spec's unit,
default 0), ``random`` (steer along random direction K instead, the axis's sizes: the null),
``seed`` (of the random directions), ``allow_large``, ``force``; and the provider's own
(`InspectOptions`): ``device``, ``value_at`` (``after`` the addition, the default, or
``before``), ``max_batch``. Inspect reads each ``-M`` value as YAML; both records are read from
them once, each value converted to its field's type, and a key of neither is refused in one line
that names every key. The model is ``<model>`` in ``valueprobe/<model>``: a name
(``smollm2-135m``) or a folder.

Requests run on `valueprobe serve`'s hf engine (`valueprobe.serve.hf_engine.HFEngine`): the
samples Inspect sends at once are gathered into batches, one α per row, through
`valueprobe.steering.decode.rows.generate_rows`, and stop strings end a row as the server ends
one (`valueprobe.serve.streams.until_stop`). The chat is rendered with the model's chat template
(assistant turn opened); ``temperature`` (0: greedy; unset: 1), ``top_p``, ``max_tokens``,
``stop_seqs``, ``seed`` and ``logprobs`` / ``top_logprobs`` are honoured, tools are refused. Each
output's ``metadata["valueprobe"]`` holds the per-token values (σ-scores at the read layer, as the
server reads them), the tokens, where they were read, and the steering.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, replace
from typing import Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    GenerateConfig,
    Logprob,
    Logprobs,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    StopReason,
    TopLogprob,
    modelapi,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from valueprobe.errors import ValueprobeError
from valueprobe.evals.steering import EvalSteering, ModelArgs
from valueprobe.model.load import LoadedModel, load
from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.protocol import Chunk, SteerRequest
from valueprobe.serve.streams import until_stop
from valueprobe.steering.decode.rows import ValueAt

__all__ = ["InspectOptions", "ValueprobeAPI"]

DEFAULT_MAX_TOKENS = 1024
_ids = itertools.count()


@dataclass(frozen=True)
class InspectOptions(ModelArgs):
    """The provider's own ``-M`` arguments beside the steering (`EvalSteering`): ``device``,
    ``value_at`` (read each token's value ``after`` the addition, or ``before``), ``max_batch``
    (samples in one batch of the engine)."""

    device: str = "cpu"
    value_at: ValueAt = "after"
    max_batch: int = 32


class ValueprobeAPI(ModelAPI):
    """Inspect's `ModelAPI` for one steered valueprobe model (see the module doc for the arguments).

    Inspect builds it as ``ValueprobeAPI(model_name=..., base_url=..., api_key=..., config=...,
    **model_args)`` (``get_model``), ``model_args`` being the ``-M`` arguments: read here once
    into `EvalSteering` and `InspectOptions`. In process, ``lm`` is a model already loaded and
    ``spec`` may be the spec itself: ``get_model("valueprobe/m", lm=lm, spec=spec, alpha=15.0)``.
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008 - Inspect's signature
        lm: LoadedModel | None = None,
        **model_args: Any,
    ) -> None:
        super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config)
        steering, options = EvalSteering.parse(model_args, beside=InspectOptions, harness="Inspect")
        self.lm = lm if lm is not None else load(model_name, device=options.device)
        spec = steering.resolve(self.lm)
        self.alpha = steering.alpha
        self.value_at = options.value_at
        # the engine reads each request's value at the spec's read layer: resolved once, here
        self.spec = replace(spec, read_layer=spec.read_at(self.lm.n_layers))
        # a wide window: the samples Inspect sends together (up to max_connections) make one batch
        self.engine = HFEngine(self.lm, model=model_name, window_s=0.25, max_batch=options.max_batch)
        self._loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        """Stop the engine's worker thread (``with model:`` calls this on leaving)."""
        self.engine.worker.shutdown(wait=False, cancel_futures=True)

    def max_tokens(self) -> int | None:
        return DEFAULT_MAX_TOKENS

    def max_connections(self) -> int:
        """Samples in flight at once: what one batch of the engine takes."""
        return self.engine.max_batch

    async def _started(self) -> HFEngine:
        """The engine, its batching loop running on the current event loop (Inspect may run each
        eval on a new one)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            await self.engine.start()
            self._loop = loop
        return self.engine

    async def generate(
        self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
    ) -> ModelOutput:
        if tools:
            raise ValueprobeError("the valueprobe provider runs no tools: give a task without tools")
        request = self._request(input, config)
        engine = await self._started()
        chunks: list[Chunk] = []
        async for chunk in until_stop(request.stop, (), engine.submit(request)):
            chunks.append(chunk)
        return self._output(request, chunks)

    def _request(self, messages: list[ChatMessage], config: GenerateConfig) -> SteerRequest:
        chat = tuple({"role": m.role, "content": m.text} for m in messages)
        return SteerRequest(
            id=f"valueprobe-{next(_ids)}",
            prompt=None,
            messages=chat,
            max_tokens=int(config.max_tokens or DEFAULT_MAX_TOKENS),
            temperature=1.0 if config.temperature is None else float(config.temperature),
            top_p=1.0 if config.top_p is None else float(config.top_p),
            seed=config.seed,
            spec=self.spec,
            alpha=self.alpha,
            steered=True,
            value_at=self.value_at,
            logprobs=int(config.top_logprobs or 0) if config.logprobs else None,
            stop=tuple(config.stop_seqs or ()),
        )

    def _output(self, request: SteerRequest, chunks: list[Chunk]) -> ModelOutput:
        text = "".join(c.text for c in chunks)
        last = chunks[-1] if chunks else None
        stop: StopReason = "max_tokens" if last is not None and last.finish_reason == "length" else "stop"
        logprobs = None
        if request.logprobs is not None:
            logprobs = Logprobs(
                content=[
                    Logprob(
                        token=c.token,
                        logprob=float(c.logprob or 0.0),
                        top_logprobs=[TopLogprob(token=t, logprob=lp) for t, lp in c.top],
                    )
                    for c in chunks
                ]
            )
        prompt = last.prompt_tokens if last is not None and last.prompt_tokens is not None else 0
        tokenizer = self.lm.tokenizer
        metadata = {
            "values": [c.value for c in chunks],
            "tokens": [tokenizer.decode([c.token_id]) for c in chunks],
            "value_read": request.value_read(),
            "steering": {
                "alpha": request.alpha,
                "unit": self.spec.unit.value,
                "direction": self.spec.name(),
                "op": self.spec.op.describe(),
            },
        }
        choice = ChatCompletionChoice(
            message=ChatMessageAssistant(content=text, model=self.model_name, source="generate"),
            stop_reason=stop,
            logprobs=logprobs,
        )
        usage = ModelUsage(input_tokens=prompt, output_tokens=len(chunks), total_tokens=prompt + len(chunks))
        return ModelOutput(
            model=self.model_name, choices=[choice], usage=usage, metadata={"valueprobe": metadata}
        )


@modelapi(name="valueprobe")
def valueprobe() -> type[ModelAPI]:
    """The provider class Inspect builds for ``valueprobe/<model>``."""
    return ValueprobeAPI
