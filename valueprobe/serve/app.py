"""The OpenAI-compatible HTTP layer over any `valueprobe.serve.engine.Engine`, and the server.

    valueprobe serve --probe probes/smollm2-135m-value --port 8000
    curl -N localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{"model": "smollm2-135m",
      "prompt": "Is 91 prime?", "max_tokens": 20, "stream": true, "steering": {"alpha": 2}}'

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream:
true`` gives server-sent events ``data: {...}`` ending in ``data: [DONE]``). A bad request is a 400
whose JSON error names the field (``param``), checked before the engine sees it; the first chunk
of a stream is awaited before the 200 goes out, so an engine's refusal is a 400 too. The
workbench page is at ``/`` with the routes it reads (`valueprobe.serve.workbench`). With an API
key every ``/v1`` route and the page want the key (401 otherwise), and no other origin may call
at all (`valueprobe.serve.guard`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from valueprobe.errors import ValueprobeError
from valueprobe.serve.engine import Engine
from valueprobe.serve.errors import RequestError, error_body
from valueprobe.serve.guard import LOCAL_HOSTS, Guard
from valueprobe.serve.limits import Limits, probe_card
from valueprobe.serve.ops import Admission, Metrics, Operations, Refused, Tally, log_request
from valueprobe.serve.protocol import (
    Chunk,
    SteerRequest,
    StreamUsage,
    completion,
    parse_request,
    stream_chunk,
    stream_usage,
    usage,
    usage_chunk,
)
from valueprobe.serve.streams import first_chunks, merged, until_stop
from valueprobe.serve.workbench import workbench_routes

__all__ = ["bind", "build_app", "check_host", "serve"]

log = logging.getLogger("valueprobe.serve")


def check_host(host: str, api_key: str | None) -> None:
    """Refuse, in one line, a host beyond this machine without an API key."""
    if host not in LOCAL_HOSTS and not api_key:
        raise ValueprobeError(
            f"--host {host} lets other machines reach the server: give --api-key KEY too "
            "(clients then send 'Authorization: Bearer KEY'), or keep the default 127.0.0.1"
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), or one line saying the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueprobeError(
            f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port"
        ) from exc
    sock.listen(128)
    return sock


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, param=exc.param), status_code=400)


_KINDS = {429: "rate_limit_error", 503: "service_unavailable", 504: "timeout", 404: "not_found_error"}


def _refusal(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        error_body(message, kind=_KINDS.get(status, "invalid_request_error")),
        status_code=status,
        headers=headers,
    )


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def _out_of_memory(exc: Exception) -> Response:
    """HTTP 503 for a request the device ran out of memory on (it alone fails; the server goes on);
    any other exception goes on to the app's 500 handler."""
    if type(exc).__name__ != "OutOfMemoryError":  # torch.OutOfMemoryError, without importing torch here
        raise exc
    log.warning("request ran out of device memory: %s", one_line_of(exc))
    body = error_body(
        "out of device memory for this request: retry later, or ask for fewer tokens", kind="server_error"
    )
    return JSONResponse(body, status_code=503)


def one_line_of(exc: Exception) -> str:
    return next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)


@dataclass
class _Context:
    """What every request's handler shares: the engine, the checks, and the operator's side."""

    engine: Engine
    limits: Limits
    ops: Operations
    metrics: Metrics
    gate: Admission


@dataclass
class _Exchange:
    """One request as it is handled: what it asked, what it measured; `done` ends it once."""

    ctx: _Context
    tally: Tally
    req: SteerRequest | None = None
    ended: bool = False

    def count(self, chunk: Chunk) -> Chunk:
        self.tally.token(self.ctx.metrics, chunk.prompt_tokens)
        return chunk

    def done(self, status: int) -> None:
        if self.ended:
            return
        self.ended = True
        self.ctx.gate.leave()
        req = self.req
        log_request(
            self.tally,
            self.ctx.metrics,
            request_id=req.id if req else "-",
            status=status,
            alpha=req.alpha if req and req.steered else None,
            prompt=(req.prompt if req.messages is None else list(req.messages)) if req else None,
            ops=self.ctx.ops,
        )


def _handler(ctx: _Context, *, chat: bool) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        ex = _Exchange(ctx, Tally("chat" if chat else "completions", time.monotonic()))
        try:
            ctx.gate.enter()
        except Refused as r:
            log_request(
                ex.tally, ctx.metrics, request_id="-", status=r.status, alpha=None, prompt=None, ops=ctx.ops
            )
            return _refusal(r.status, r.message, r.headers)
        try:
            response = await _answer(ex, request, chat=chat)
        except BaseException:
            ex.done(500)
            raise
        if not isinstance(response, StreamingResponse):
            ex.done(response.status_code)
        return response

    return handle


async def _answer(ex: _Exchange, request: Request, *, chat: bool) -> Response:
    ctx = ex.ctx
    try:
        body = json.loads(await request.body())
    except ValueError:
        return _error(RequestError("body", "is not valid JSON"))
    deadline = None if ctx.ops.request_timeout is None else time.monotonic() + ctx.ops.request_timeout
    try:
        req = ex.req = parse_request(body, ctx.limits, chat=chat)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream", f"must be true or false, got {stream!r}")
        report = stream_usage(body, stream=stream)
        async with asyncio.timeout(ctx.ops.request_timeout):
            # each choice through the stop layer, which takes the stops alone (α goes on in the request
            # to the engine, rows, handle and operators)
            streams = [until_stop(r.stop, r.stop_token_ids, ctx.engine.submit(r)) for r in req.choices()]
            firsts = await first_chunks(streams)
            if not stream:
                got: list[list[Chunk]] = [[] for _ in streams]
                async for i, c in merged(streams, firsts):
                    got[i].append(ex.count(c))
                return JSONResponse(completion(req, got, ctx.limits, chat=chat))
    except RequestError as exc:
        return _error(exc)
    except TimeoutError:
        return _refusal(
            504, f"the request took longer than this server's --request-timeout {ctx.ops.request_timeout:g} s"
        )
    except Exception as exc:
        return _out_of_memory(exc)
    return StreamingResponse(
        _events(ex, merged(streams, firsts), deadline, report, chat=chat),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def _events(
    ex: _Exchange,
    chunks: AsyncGenerator[tuple[int, Chunk], None],
    deadline: float | None,
    report: StreamUsage,
    *,
    chat: bool,
) -> AsyncIterator[str]:
    """The SSE stream of a request's choices, ``data: [DONE]`` last (after the usage chunk when
    ``stream_options`` asks for it); an error (or the request timeout) after the headers went out
    is reported in-band, and the server keeps serving."""
    req, limits = ex.req, ex.ctx.limits
    assert req is not None
    sent: dict[int, int] = {}  # characters of each started choice's text so far (completions' text_offset)
    made: dict[int, int] = {}  # tokens of each choice so far
    prompt, status = 0, 200
    try:
        async with asyncio.timeout_at(None if deadline is None else _loop_time(deadline)):
            async for i, c in chunks:
                event = stream_chunk(
                    req, i, ex.count(c), limits, chat=chat, first=i not in sent, offset=sent.get(i, 0)
                )
                made[i], prompt = made.get(i, 0) + 1, c.prompt_tokens or prompt
                if report.include:
                    event["usage"] = usage(prompt, made[i]) if report.continuous else None
                yield _sse(event)
                sent[i] = sent.get(i, 0) + len(c.text)
        if report.include:
            yield _sse(usage_chunk(req, limits, prompt, sum(made.values()), chat=chat))
        yield _sse("[DONE]")
    except TimeoutError:
        status = 504
        yield _sse(error_body("the request took longer than this server's --request-timeout", kind="timeout"))
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band, keep serving
        status = 500
        log.exception("stream %s failed", req.id)
        yield _sse(error_body(f"generation failed: {exc}", kind="server_error"))
    finally:
        await chunks.aclose()
        ex.done(status)


def _loop_time(deadline: float) -> float:
    """A `time.monotonic` deadline on the running loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


def build_app(
    engine: Engine,
    limits: Limits,
    *,
    api_key: str | None = None,
    ops: Operations | None = None,
    local: bool = True,
) -> Starlette:
    """The ASGI app: the ``/v1`` routes, the workbench page at ``/``, ``/health`` and ``/metrics``;
    the key (when ``api_key`` is set) and origin rules of `valueprobe.serve.guard` (``local``: it
    listens on this machine only); every refusal an OpenAI error object; ``ops``: the operator's settings."""
    metrics = Metrics()
    ops = ops or Operations()
    ctx = _Context(engine, limits, ops, metrics, Admission(ops, metrics))

    async def models(request: Request) -> Response:
        card = {"id": limits.model, "object": "model", "created": 0, "owned_by": "valueprobe"}
        return JSONResponse({"object": "list", "data": [card | {"valueprobe": probe_card(limits)}]})

    async def health(request: Request) -> Response:
        state = "draining" if ctx.gate.draining else "ok"
        return JSONResponse(
            {"status": state, "in_flight": ctx.gate.in_flight}, status_code=503 if ctx.gate.draining else 200
        )

    async def prometheus(request: Request) -> Response:
        metrics.observe_batches(getattr(engine, "batch_sizes", None))
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers) if exc.headers else None
        return _refusal(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", headers)

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("request failed", exc_info=exc)
        return JSONResponse(error_body(f"internal error: {exc}", kind="server_error"), status_code=500)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.close()

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", _handler(ctx, chat=False), methods=["POST"]),
            Route("/v1/chat/completions", _handler(ctx, chat=True), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            *workbench_routes(engine, limits),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal},
        lifespan=lifespan,
    )
    app.state.gate = ctx.gate
    app.state.ops = ops
    app.add_middleware(Guard, key=api_key, local=local)
    return app


def serve(app: Starlette, sock: socket.socket, *, log_level: str = "info") -> None:
    """Serve ``app`` on an already bound socket (`bind`) until interrupted; SIGTERM
    drains: new requests get 503, in-flight ones finish within ``--drain-seconds``, then it stops."""
    import uvicorn  # the serve extra: imported where it is used, so the package imports without it

    gate: Admission = app.state.gate
    drain = app.state.ops.drain_seconds

    class Draining(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if gate.draining or sig != signal.SIGTERM:  # Ctrl-C, or a second SIGTERM: stop now
                super().handle_exit(sig, frame)
                return
            gate.draining = True
            log.info("draining %d requests in flight (at most %g s)", gate.in_flight, drain)
            threading.Thread(target=self._drain, daemon=True).start()

        def _drain(self) -> None:
            deadline = time.monotonic() + drain
            while gate.in_flight and time.monotonic() < deadline:
                time.sleep(0.05)
            self.should_exit = True

    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=2)
    Draining(config).run(sockets=[sock])
