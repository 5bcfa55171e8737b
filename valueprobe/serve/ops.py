"""What an operator of ``valueprobe serve`` sees and sets: metrics, admission, timeouts, drain, logs.

    valueprobe serve --probe probes/smollm2-135m-value --max-queue 64 --request-timeout 60 --drain-seconds 30
    curl localhost:8000/metrics        # Prometheus text: requests by status, tokens, queue, batch, TTFT...
    curl localhost:8000/health         # {"status": "ok"|"draining", "in_flight": 3}

- ``--max-queue N``: at most N requests admitted at once (running or waiting for a batch); one
  more is a 429 with ``Retry-After`` (seconds) and the OpenAI error object.
- ``--request-timeout S``: a request not done in S seconds is cancelled (its row alone) and
  answered 504; a stream already under way ends with an in-band error event instead.
- SIGTERM: new requests get 503 while in-flight ones finish, for at most ``--drain-seconds``;
  then the server stops and the process exits 0.
- One log line per request: id, route, status, tokens in and out, α, latency; the prompt only
  with ``--log-prompts``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Admission", "Metrics", "Operations", "Refused", "Tally", "log_request"]

log = logging.getLogger("valueprobe.serve")
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class Operations:
    """The operator's settings: ``max_queue`` None admits all; ``request_timeout`` None waits
    forever; ``drain_seconds`` bounds SIGTERM's drain; ``log_prompts`` puts prompts in the log."""

    max_queue: int | None = None
    request_timeout: float | None = None
    drain_seconds: float = 30.0
    log_prompts: bool = False
    retry_after: int = 1


class Refused(Exception):  # noqa: N818 - a refusal, not an error of the server
    """A request not admitted: its HTTP status, message and headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Admission:
    """Admission: counts requests in flight, refuses past ``max_queue`` (429) or while draining (503)."""

    def __init__(self, ops: Operations, metrics: Metrics) -> None:
        self.ops = ops
        self.metrics = metrics
        self.in_flight = 0
        self.draining = False

    def enter(self) -> None:
        if self.draining:
            raise Refused(503, "the server is shutting down: retry on another instance")
        if self.ops.max_queue is not None and self.in_flight >= self.ops.max_queue:
            raise Refused(
                429,
                f"the queue is full ({self.ops.max_queue} requests in flight): retry after"
                f" {self.ops.retry_after} s",
                {"Retry-After": str(self.ops.retry_after)},
            )
        self.in_flight += 1
        self.metrics.queue.set(self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        self.metrics.queue.set(self.in_flight)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (two servers in one process,
    as tests run them, never share counts)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "valueprobe_requests", "Requests answered, by route and status", ["route", "status"], registry=r
        )
        self.tokens = Counter(
            "valueprobe_tokens", "Tokens read (prompt) and generated (completion)", ["kind"], registry=r
        )
        self.queue = Gauge("valueprobe_queue_depth", "Requests admitted and not yet done", registry=r)
        self.batch = Histogram(
            "valueprobe_batch_size",
            "Rows per batch the engine ran",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.ttft = Histogram(
            "valueprobe_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY, registry=r
        )
        self.per_token = Histogram(
            "valueprobe_time_per_output_token_seconds",
            "Time between tokens of a request",
            buckets=_LATENCY,
            registry=r,
        )
        self.latency = Histogram(
            "valueprobe_request_latency_seconds", "Request latency", buckets=_LATENCY, registry=r
        )
        self._batches_seen = 0

    def observe_batches(self, sizes: list[int] | None) -> None:
        """Take the engine's batch sizes run since the last call (an engine that keeps them)."""
        if sizes is None:
            return
        for size in sizes[self._batches_seen :]:
            self.batch.observe(size)
        self._batches_seen = len(sizes)

    def text(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class Tally:
    """One request's measurements as it runs: when it began, its first and latest token, tokens."""

    route: str
    start: float
    first: float | None = None
    last: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def token(self, metrics: Metrics, prompt_tokens: int | None) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
            metrics.ttft.observe(now - self.start)
        elif self.last is not None:
            metrics.per_token.observe(now - self.last)
        self.last = now
        self.completion_tokens += 1
        self.prompt_tokens = prompt_tokens or self.prompt_tokens


def log_request(
    tally: Tally,
    metrics: Metrics,
    *,
    request_id: str,
    status: int,
    alpha: float | None,
    prompt: Any,
    ops: Operations,
) -> None:
    """Count the request, and write its one log line (the prompt only with --log-prompts)."""
    latency = time.monotonic() - tally.start
    metrics.requests.labels(tally.route, str(status)).inc()
    metrics.tokens.labels("prompt").inc(tally.prompt_tokens)
    metrics.tokens.labels("completion").inc(tally.completion_tokens)
    metrics.latency.observe(latency)
    line = (
        f"request id={request_id} route={tally.route} status={status} prompt_tokens={tally.prompt_tokens}"
        f" completion_tokens={tally.completion_tokens} alpha={'none' if alpha is None else f'{alpha:g}'}"
        f" latency_ms={latency * 1000:.0f}"
    )
    if ops.log_prompts and prompt is not None:
        line += f" prompt={prompt!r}"
    log.info(line)
