"""Who may call the server, and from where: the API key, the workbench's key cookie, no cross-origin calls.

    valueprobe serve --probe smollm2-135m-value --api-key "$KEY"      # clients: Authorization: Bearer KEY
    open http://127.0.0.1:8000/?key=$KEY                              # the page: once, then a cookie

- **The API key**, when set, guards every ``/v1`` route and the workbench page with its assets
  (``/health`` and ``/metrics`` stay open for the operator): ``Authorization: Bearer KEY``, or
  the cookie the page gets by opening ``/?key=KEY`` once (an HMAC of the key, never the key;
  ``HttpOnly``, ``SameSite=Strict``), after which the address bar no longer shows the key. Without
  either the page answers 401 with a form asking for the key.
- **No cross-origin request**: a request whose ``Origin`` is not the server's own is refused (403)
  before it runs, so no other site open in the browser can make this server generate, whatever
  it sends. The server never sends CORS headers, so no other origin reads an answer either.
- **Served on this machine only** (the default, 127.0.0.1): a ``Host`` header that is not a
  loopback name is refused (403), so a DNS name rebound to 127.0.0.1 reaches nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any
from urllib.parse import parse_qs, urlsplit

from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse

from valueprobe.serve.errors import error_body

__all__ = ["COOKIE", "LOCAL_HOSTS", "Guard", "cookie_value"]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
COOKIE = "valueprobe_key"
_OPEN = ("/health", "/metrics")
_ASK = """<!doctype html><html><head><meta charset="utf-8"><title>valueprobe workbench</title></head>
<body style="font-family:sans-serif;margin:3em"><h2>valueprobe workbench</h2>
<p>This server wants its API key (<code>valueprobe serve --api-key</code>).</p>
<form method="get" action="/"><input name="key" type="password" autofocus> <button>open</button></form>
</body></html>"""


def cookie_value(key: str) -> str:
    """What the page's cookie holds: an HMAC of the key (the key itself never sits in the browser)."""
    return hmac.new(key.encode(), b"valueprobe workbench", hashlib.sha256).hexdigest()


def _hostname(host: str) -> str:
    """``127.0.0.1:8000`` → ``127.0.0.1``; ``[::1]:8000`` → ``::1``."""
    return urlsplit(f"//{host}").hostname or ""


class Guard:
    """ASGI middleware for the rules of the module doc.

    Args:
        app: the app it guards.
        key: the API key (None: no key asked).
        local: the server listens on this machine only, so the ``Host`` must be a loopback name.
    """

    def __init__(self, app: Any, *, key: str | None, local: bool = True) -> None:
        self.app = app
        self.key = key
        self.local = local
        self.bearer = f"Bearer {key}".encode() if key else b""
        self.cookie = cookie_value(key) if key else ""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        refusal = self._refusal(scope, headers, host)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any, headers: dict[str, str], host: str) -> Any:
        if self.local and _hostname(host) not in LOCAL_HOSTS:
            return _refuse(403, f"Host {host!r} is not this machine: open the server as 127.0.0.1")
        origin = headers.get("origin")
        if origin is not None and origin != f"http://{host}":
            return _refuse(
                403, f"cross-origin request from {origin!r} refused: this server answers its own page only"
            )
        path = scope["path"]
        if not self.key or path in _OPEN:
            return None
        if hmac.compare_digest(headers.get("authorization", "").encode(), self.bearer):
            return None
        if hmac.compare_digest(_cookie(headers.get("cookie", "")), self.cookie):
            return None
        if path == "/" and scope["method"] == "GET":
            given = parse_qs(scope.get("query_string", b"").decode()).get("key", [""])[0]
            if given and hmac.compare_digest(given.encode(), self.key.encode()):
                page = RedirectResponse("/", status_code=303)
                page.set_cookie(COOKIE, self.cookie, httponly=True, samesite="strict", path="/")
                return page
            return HTMLResponse(_ASK, status_code=401, headers={"Cache-Control": "no-store"})
        return JSONResponse(
            error_body(
                "missing or wrong API key: send 'Authorization: Bearer KEY'", kind="authentication_error"
            ),
            status_code=401,
        )


def _cookie(header: str) -> str:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return ""


def _refuse(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind="permission_error"), status_code=status)
