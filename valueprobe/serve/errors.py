"""How the server refuses: a `RequestError` naming the field, and the OpenAI error object.

    >>> raise RequestError("steering.alpha", "|alpha| = 20 is beyond this server's cap 16")
    >>> error_body("...", param="steering.alpha")   # {"error": {"message", "type", "param", "code"}}

Every refusal the server sends, whatever its status, is `error_body`'s object, as OpenAI's API
and vLLM's server send it; ``param`` names the request field at fault (None when no field is).
"""

from __future__ import annotations

from typing import Any

from valueprobe.errors import ValueprobeError

__all__ = ["RequestError", "error_body"]


class RequestError(ValueprobeError):
    """A request the server refuses: HTTP 400 with ``{"error": {"message", "param": field}}``.

    Args:
        param: the request field at fault, dotted (``"steering.alpha"``, ``"messages[0].role"``).
        message: one line saying what is wrong and what would be accepted.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def error_body(
    message: str, *, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
