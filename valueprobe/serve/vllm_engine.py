"""``valueprobe serve --engine vllm``: the serve engine contract on vLLM's ``AsyncLLM`` with the plugin.

    valueprobe serve --probe probes/smollm2-135m-value --engine vllm     # pip install 'valueprobe[vllm]'

Each `SteerRequest` becomes one vLLM request whose ``extra_args`` carry its steering spec, its α
and its readout key (`valueprobe.vllm.request.VllmArgs`), so vLLM's continuous batching mixes
requests of any spec and α, and the plugin steers each one in the workers and salts its prefix
cache. The stream comes back as vLLM's deltas; after each delta the engine takes that request's
new per-token values from the workers (``collective_rpc``, see `valueprobe.vllm.plugin`)
and yields one `Chunk` per token. A client that leaves aborts only its own request.

Every field of the shared request layer is honoured, none refused: ``value_at`` travels in the
payload (the plugin reads before or after the addition at the steered block); ``logprobs`` /
``top_logprobs``, ``presence_penalty`` / ``frequency_penalty`` and ``seed`` are vLLM's own
sampling parameters (its log-probabilities are the raw ones, before penalties and temperature,
as the hf engine's); ``stop`` and ``n`` are the shared layer's (`valueprobe.serve.streams`), each
choice a vLLM request of its own (id and value key ``<request id>-<choice>``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

from valueprobe.errors import ValueprobeError
from valueprobe.serve.protocol import Chunk, FinishReason, RequestError, SteerRequest
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vllm.generate import INSTALL, absolute, check_plugin, engine_kwargs
from valueprobe.vllm.request import VllmArgs, check_spec

__all__ = ["VllmEngine", "make_engine"]


class VllmEngine:
    """The `valueprobe.serve.engine.Engine` on vLLM.

    Args:
        spec: the server's steering spec (its probe folder, which the workers read the axis from).
        model: the model spec (an alias, a folder or a hub id); its id is what ``/v1/models`` lists.
        enforce_eager: skip vLLM's torch.compile (faster start, slower steps).
        dtype: what vLLM runs the model in (``--model-dtype``; float32 as the HF route loads).
    """

    def __init__(
        self,
        spec: SteeringSpec,
        model: str,
        *,
        enforce_eager: bool = False,
        dtype: str = "float32",
    ) -> None:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs  # optional dependency: the [vllm] extra
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError:
            raise ValueprobeError(f"--engine vllm needs vLLM: {INSTALL}") from None
        check_plugin()  # before the engine starts: its workers load plugins as this process does
        check_spec(spec)  # what the vllm engine cannot steer (an operator but add...), in one line
        axis = spec.first_axis()
        self.model = model
        self.probe = absolute(spec).probe
        args = AsyncEngineArgs(**engine_kwargs(model, enforce_eager=enforce_eager, dtype=dtype))
        self.llm = AsyncLLM.from_engine_args(args)
        config = self.llm.model_config
        width, depth = config.get_hidden_size(), config.get_num_layers(self.llm.vllm_config.parallel_config)
        if width != axis.d_model or max(axis.layers) >= depth:
            self.llm.shutdown()
            raise ValueprobeError(
                f"the probe is from {axis.model_id} (d_model {axis.d_model}) but {model} has d_model {width}"
                f" and {depth} layers: use a probe fitted on this model"
            )
        self.tokenizer = self.llm.get_tokenizer()
        self.context = int(config.max_model_len)

    async def start(self) -> None:
        """Nothing to start: vLLM's engine core runs from construction on."""

    async def close(self) -> None:
        self.llm.shutdown()

    def _args(self, request: SteerRequest) -> VllmArgs:
        """The request's spec (its probe absolute, for the workers), α, readout key (one per
        choice: the choices of one request run side by side) and where the value is read."""
        return VllmArgs(
            replace(request.spec, probe=self.probe),
            alpha=request.alpha,
            key=_vllm_id(request),
            value_at=request.value_at,
        )

    def _ids(self, request: SteerRequest) -> list[int]:
        prompt: Any = request.prompt if request.messages is None else [dict(m) for m in request.messages]
        field = "prompt" if request.messages is None else "messages"
        try:
            tokenizer = cast(Any, SimpleNamespace(tokenizer=self.tokenizer))
            ids = encode_prompts(tokenizer, [prompt], chat=False)[0]  # completions: raw, as OpenAI
        except ValueprobeError as e:
            raise RequestError(field, str(e)) from None
        if len(ids) + request.max_tokens > self.context:
            raise RequestError(
                field,
                f"{len(ids)} prompt tokens plus max_tokens {request.max_tokens} exceed the model's context of"
                f" {self.context}",
            )
        return ids

    async def submit(self, request: SteerRequest) -> AsyncGenerator[Chunk, None]:
        """One `Chunk` per generated token, its value taken from the workers as the token arrives."""
        from vllm import SamplingParams  # optional dependency: the [vllm] extra
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        ids = self._ids(request)
        spec = self._args(request)
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p if request.temperature > 0 else 1.0,
            seed=request.seed,
            ignore_eos=request.ignore_eos,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            logprobs=request.logprobs,
            output_kind=RequestOutputKind.DELTA,
            extra_args=spec.extra_args(),
        )
        values: dict[int, float] = {}
        sent, finished, rid = 0, False, _vllm_id(request)
        try:
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
                done = out.outputs[0]
                new = list(done.token_ids)
                if new:
                    await self._take(spec.key, values)
                finished = out.finished
                reason: FinishReason | None = None
                if finished:
                    reason = "length" if done.finish_reason == "length" else "stop"
                for j, token in enumerate(new):
                    last = j == len(new) - 1
                    chunk = Chunk(
                        text=done.text if last else "",
                        token_id=int(token),
                        value=values.get(sent, math.nan),
                        finish_reason=reason if last else None,
                        prompt_tokens=len(ids),
                    )
                    if request.logprobs is not None and done.logprobs is not None:
                        chunk = self._logprobs(chunk, done.logprobs[j], request.logprobs)
                    yield chunk
                    sent += 1
        finally:
            if not finished:
                await self.llm.abort(rid)
            await self._take(spec.key, {})  # forget what is left

    def _logprobs(self, chunk: Chunk, entry: Mapping[int, Any], k: int) -> Chunk:
        """The chunk with its token's log-probability and the ``k`` likeliest tokens', from vLLM's
        entry for that position (token id -> Logprob with its rank; the sampled token first)."""
        top = sorted(
            (lp.rank, t, lp.logprob) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k
        )
        return replace(
            chunk,
            logprob=float(entry[chunk.token_id].logprob),
            token=self.tokenizer.decode([chunk.token_id]),
            top=tuple((self.tokenizer.decode([t]), float(lp)) for _, t, lp in top),
        )

    async def _take(self, key: str | None, into: dict[int, float]) -> None:
        if key is None:
            return
        for part in await self.llm.collective_rpc("valueprobe_take_values", args=([key],)):
            for first, got in (part or {}).values():
                into.update({int(first) + i: float(v) for i, v in enumerate(got)})


def _vllm_id(request: SteerRequest) -> str:
    """One vLLM request id (and value key) per choice of a request."""
    return f"{request.id}-{request.index}"


def make_engine(opts: Any) -> VllmEngine:
    """The factory `valueprobe.cli.serve` calls with its ServeOptions (spec, model)."""
    return VllmEngine(opts.spec, opts.model, dtype=opts.model_dtype)
