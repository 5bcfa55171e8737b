"""The OpenAI-compatible HTTP layer over any `valueprobe.serve.engine.Engine`, and the server.

    valueprobe serve --probe probes/smollm2-135m-value --port 8000
    curl -N localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{"model": "smollm2-135m",
      "prompt": "Is 91 prime?", "max_tokens": 20, "stream": true, "steering": {"alpha": 2}}'

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream:
true`` gives server-sent events ``data: {...}`` ending in ``data: [DONE]``). A bad request is a 400
whose JSON error names the field (``param``), checked before the engine sees it; the first chunk
of a stream is awaited before the 200 goes out, so an engine's refusal is a 400 too. With an API
key every ``/v1`` route wants ``Authorization: Bearer KEY`` (401 otherwise).
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from valueprobe.errors import ValueprobeError
from valueprobe.serve.engine import Engine
from valueprobe.serve.errors import RequestError, error_body
from valueprobe.serve.protocol import (
    Chunk,
    Limits,
    SteerRequest,
    completion,
    parse_request,
    probe_card,
    stream_chunk,
)
from valueprobe.serve.streams import first_chunks, merged, until_stop

__all__ = ["LOCAL_HOSTS", "bind", "build_app", "check_host", "serve"]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
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


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _run(
    engine: Engine, req: SteerRequest
) -> tuple[list[AsyncGenerator[Chunk, None]], list[Chunk | None]]:
    """Every choice of ``req`` submitted, each through the stop layer, and each one's first chunk."""
    streams = [until_stop(r, engine.submit(r)) for r in req.choices()]
    return streams, await first_chunks(streams)


def _handler(engine: Engine, limits: Limits, *, chat: bool) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(RequestError("body", "is not valid JSON"))
        try:
            req = parse_request(body, limits, chat=chat)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError("stream", f"must be true or false, got {stream!r}")
            streams, firsts = await _run(engine, req)
        except RequestError as exc:
            return _error(exc)
        if not stream:
            got: list[list[Chunk]] = [[] for _ in streams]
            async for i, c in merged(streams, firsts):
                got[i].append(c)
            return JSONResponse(completion(req, got, limits, chat=chat))
        return StreamingResponse(
            _events(req, limits, merged(streams, firsts), chat=chat),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    return handle


async def _events(
    req: SteerRequest, limits: Limits, chunks: AsyncIterator[tuple[int, Chunk]], *, chat: bool
) -> AsyncIterator[str]:
    """The SSE stream of a request's choices, ``data: [DONE]`` last; an error after the headers
    went out is reported in-band, and the server keeps serving."""
    sent: dict[int, int] = {}  # characters of each started choice's text so far (completions' text_offset)
    try:
        async for i, c in chunks:
            yield _sse(stream_chunk(req, i, c, limits, chat=chat, first=i not in sent, offset=sent.get(i, 0)))
            sent[i] = sent.get(i, 0) + len(c.text)
        yield _sse("[DONE]")
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band, keep serving
        log.exception("stream %s failed", req.id)
        yield _sse(error_body(f"generation failed: {exc}", kind="server_error"))
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def build_app(engine: Engine, limits: Limits, *, api_key: str | None = None) -> Starlette:
    """The ASGI app: the three routes, Bearer auth when ``api_key`` is set, JSON errors."""

    async def models(request: Request) -> Response:
        card = {"id": limits.model, "object": "model", "created": 0, "owned_by": "valueprobe"}
        return JSONResponse({"object": "list", "data": [card | {"valueprobe": probe_card(limits)}]})

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
            Route("/v1/completions", _handler(engine, limits, chat=False), methods=["POST"]),
            Route("/v1/chat/completions", _handler(engine, limits, chat=True), methods=["POST"]),
        ],
        exception_handlers={Exception: internal},
        lifespan=lifespan,
    )
    if api_key:
        app.add_middleware(_BearerAuth, key=api_key)
    return app


class _BearerAuth:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer KEY``."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = error_body(
                    "missing or wrong API key: send 'Authorization: Bearer KEY'", kind="authentication_error"
                )
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def serve(app: Starlette, sock: socket.socket, *, log_level: str = "info") -> None:
    """Serve ``app`` on an already bound socket (`bind`) until interrupted."""
    import uvicorn  # the serve extra: imported where it is used, so the package imports without it

    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])
