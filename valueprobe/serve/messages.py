"""Chat messages as OpenAI clients send them, checked into what a chat template renders.

    >>> chat_messages([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    ({'role': 'user', 'content': 'Hi'},)

``content`` is a string or a list of parts, as vLLM's server accepts it: the text parts are
joined with a newline (vLLM's rule); any other part (an image, audio, a file) is refused naming
the part, since the served model reads text only. Roles are the ones every chat template knows
(system, user, assistant; ``developer``, OpenAI's newer name for system, is rendered as system);
anything else, tool turns included, is refused naming the message's role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from valueprobe.serve.errors import RequestError

__all__ = ["ROLES", "chat_messages"]

ROLES = ("system", "user", "assistant", "developer")
_AS = {"developer": "system"}  # what the template sees


def _text(content: Any, at: str) -> str:
    """The message's text: a string as is, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise RequestError(at, 'must be a string or a non-empty list of {"type": "text", "text": ...} parts')
    texts = []
    for j, part in enumerate(content):
        where = f"{at}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            got = repr(kind) if isinstance(kind, str) else "a part without a type"
            raise RequestError(where, f"{got} parts are not served: this model reads text parts only")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.text", "must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_messages(messages: Any) -> tuple[Mapping[str, str], ...]:
    """``messages`` as ``({"role", "content"}, ...)`` with string content; a `RequestError`
    naming the message, its role or its part otherwise."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise RequestError(f"messages[{i}]", 'must be {"role": str, "content": str or parts}')
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(
                f"messages[{i}].role", f"unknown role {role!r}: the chat template knows {', '.join(ROLES)}"
            )
        out.append(
            {"role": str(_AS.get(role, role)), "content": _text(m.get("content"), f"messages[{i}].content")}
        )
    return tuple(out)
