"""The ``hf`` engine: concurrent requests gathered for a short window, then run as one batch with
one α per row on the transformers path (`valueprobe.steering.decode.rows`), streamed token by token.

    valueprobe serve --probe probes/smollm2-135m-value --engine hf

One worker thread owns the model; the event loop only queues requests and relays chunks. A batch
holds the requests that share a steering spec (layer, unit, positions, value layer...): α, the
spec's only per-row part, and the sampling and length differ per row; a request without steering
joins any batch that reads its value layer (α = 0 leaves it untouched).
A request whose client leaves is cancelled at the next step, its neighbours go on. If a batch
fails before its first token, each of its requests is retried alone, so one bad request cannot
take the others down; the loop itself never stops on an error.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.serve.protocol import Chunk, RequestError, SteerRequest
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.decode.reading import ValueAt
from valueprobe.steering.decode.rows import RowSpec, RowStep, generate_rows
from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["HFEngine"]

T = TypeVar("T")

_Key = tuple[SteeringSpec, ValueAt]  # what the rows of one batch share


@dataclass(eq=False)
class _Job:
    """One request in flight: its row, where its chunks go, and its decoding state."""

    request: SteerRequest
    row: RowSpec
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Chunk | BaseException] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    tokens: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the decoded text already sent
    ended: bool = False

    def put(self, item: Chunk | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class HFEngine:
    """`valueprobe.serve.engine.Engine` on the transformers path.

    Args:
        lm: the loaded model (each request's spec is checked against it by the caller).
        model: the id requests name (``/v1/models``).
        window_s: how long the first request of a batch waits for others.
        max_batch: rows per batch at most.
    """

    def __init__(self, lm: LoadedModel, *, model: str, window_s: float = 0.02, max_batch: int = 32) -> None:
        self.lm = lm
        self.model = model
        self.window_s = window_s
        self.max_batch = max_batch
        self.context = int(getattr(lm.model.config, "max_position_embeddings", 0) or 0)
        self.tokenizer_lock = threading.Lock()  # fast tokenizers refuse concurrent use from two threads
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="valueprobe-hf")
        self.batch_sizes: list[int] = []  # rows of each batch run, in order (benchmarks, tests)
        self.cancelled_rows = 0  # rows stopped early because their client left
        self.pending: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.pending = asyncio.Queue()
        self.task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.worker.shutdown(wait=False, cancel_futures=True)

    def _row(self, request: SteerRequest) -> RowSpec:
        """The request as a row; a prompt the model cannot take is a `RequestError`."""
        field_name = "prompt" if request.messages is None else "messages"
        prompt = request.prompt if request.messages is None else [dict(m) for m in request.messages]
        assert prompt is not None
        try:
            with self.tokenizer_lock:
                (ids,) = encode_prompts(self.lm, [prompt], chat=False)  # completions: raw, as OpenAI
        except ValueprobeError as exc:
            raise RequestError(field_name, str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - no chat template, or one that refuses the turns (jinja)
            raise RequestError(field_name, f"the model's tokenizer cannot render it: {exc}") from exc
        if self.context and len(ids) + request.max_tokens > self.context:
            raise RequestError(
                "max_tokens",
                f"{len(ids)} prompt tokens + {request.max_tokens} new exceed the context {self.context}",
            )
        return RowSpec(
            tuple(ids),
            max_new_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            ignore_eos=request.ignore_eos,
            logprobs=request.logprobs,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
        )

    async def on_model(self, fn: Callable[[LoadedModel], T]) -> T:
        """``fn(lm)`` in the worker thread that owns the model, after the batch it is running."""
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, self.lm)

    async def submit(self, request: SteerRequest) -> AsyncGenerator[Chunk, None]:
        if self.pending is None:
            raise RuntimeError("the engine is not started")
        job = _Job(request, self._row(request), asyncio.get_running_loop())
        await self.pending.put(job)
        try:
            while True:
                item = await job.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            job.cancelled = True  # a client that left stops its row at the next step

    async def _loop(self) -> None:
        assert self.pending is not None
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.pending.get()]
            await asyncio.sleep(self.window_s)
            while not self.pending.empty() and len(jobs) < 4 * self.max_batch:
                jobs.append(self.pending.get_nowait())
            for spec, batch in self._batches(jobs):
                await loop.run_in_executor(self.worker, self._run, spec, batch)

    def _batches(self, jobs: list[_Job]) -> list[tuple[_Key, list[_Job]]]:
        """(spec and value_at, jobs) of each batch: steered jobs by both; an unsteered job joins
        any batch that reads its value layer (α = 0 leaves it untouched: before = after)."""
        groups: dict[_Key, list[_Job]] = {}
        for job in sorted(jobs, key=lambda j: not j.request.steered):
            key = (job.request.spec, job.request.value_at)
            if not job.request.steered:
                key = next((k for k in groups if k[0].read_layer == key[0].read_layer), key)
            groups.setdefault(key, []).append(job)
        size = self.max_batch
        return [(k, g[i : i + size]) for k, g in groups.items() for i in range(0, len(g), size)]

    def _run(self, spec: _Key, batch: list[_Job]) -> None:
        """Run one batch in the worker thread; on a failure before any token, each job alone."""
        batch = [j for j in batch if not j.cancelled]
        if not batch:
            return
        self.batch_sizes.append(len(batch))
        try:
            self._generate(spec, batch)
            for job in batch:  # never leave a client waiting for a last chunk that will not come
                if not (job.ended or job.cancelled):
                    job.put(RuntimeError("generation ended before this request finished"))
        except Exception as exc:  # noqa: BLE001 - the loop must survive anything a batch raises
            if len(batch) > 1 and not any(j.tokens for j in batch):
                for job in batch:
                    self._run(spec, [job])
                return
            for job in batch:
                if not job.ended:
                    job.put(exc)

    def _generate(self, key: _Key, batch: list[_Job]) -> None:
        gone: set[int] = set()

        def on_step(k: int, steps: list[RowStep | None]) -> Collection[int]:
            for job, step in zip(batch, steps, strict=True):
                if step is not None and not job.cancelled:
                    job.put(self._chunk(job, step))
            # a row whose client left while it still runs (its last step, already sent, may have
            # ended the client's stream, and so marked it cancelled: that row finished, it is not cut)
            left = {
                i
                for i, (j, step) in enumerate(zip(batch, steps, strict=True))
                if j.cancelled and step is not None and step.finish is None
            }
            self.cancelled_rows += len(left - gone)
            gone.update(left)
            return left

        alphas = [j.request.alpha for j in batch]
        spec, value_at = key
        generate_rows(self.lm, spec, [j.row for j in batch], alphas, on_step=on_step, value_at=value_at)

    def _chunk(self, job: _Job, step: RowStep) -> Chunk:
        """The text this token adds: decode the row so far and send what is new, holding back an
        incomplete character (U+FFFD at the end) until its next byte arrives."""
        if step.finish != "stop":
            job.tokens.append(step.token_id)
        with self.tokenizer_lock:
            text = self.lm.tokenizer.decode(job.tokens, skip_special_tokens=True)
        if step.finish is None and text.endswith("\ufffd"):
            delta = ""
        else:
            delta, job.sent = text[job.sent :], len(text)
        job.ended = step.finish is not None
        chunk = Chunk(delta, step.token_id, step.value, step.finish, prompt_tokens=len(job.row.ids))
        if step.logprob is None:
            return chunk
        with self.tokenizer_lock:
            token = self.lm.tokenizer.decode([step.token_id])
            top = tuple((self.lm.tokenizer.decode([t]), lp) for t, lp in step.top)
        return replace(chunk, logprob=step.logprob, token=token, top=top)
