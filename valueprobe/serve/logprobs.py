"""OpenAI's ``logprobs`` objects from the chunks an engine streams (each token's log-probability,
its text and the likeliest tokens', `valueprobe.serve.protocol.Chunk`).

    >>> chat_logprobs(chunks)["content"][0]          # {"token", "logprob", "bytes", "top_logprobs"}
    >>> completion_logprobs(chunks)["token_logprobs"]

The two shapes are OpenAI's: chat's ``{"content": [...]}`` and completions' legacy
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, as vLLM's server writes them.
The log-probabilities are of the model's own distribution at that step, before penalties and
temperature (vLLM's default ``raw_logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Chunk = Any  # valueprobe.serve.protocol.Chunk, which imports this module: read by its fields

__all__ = ["chat_logprobs", "completion_logprobs"]


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": max(logprob, -9999.0), "bytes": list(token.encode("utf-8"))}


def chat_logprobs(chunks: Sequence[Chunk]) -> dict[str, Any]:
    """Chat's ``logprobs``: one entry per token with its ``top_logprobs``."""
    return {
        "content": [
            _entry(c.token, c.logprob or 0.0) | {"top_logprobs": [_entry(t, lp) for t, lp in c.top]}
            for c in chunks
        ]
    }


def completion_logprobs(chunks: Sequence[Chunk], offset: int = 0) -> dict[str, Any]:
    """Completions' ``logprobs``; ``offset``: where the first chunk's text starts in the choice."""
    offsets = []
    for c in chunks:
        offsets.append(offset)
        offset += len(c.text)
    return {
        "tokens": [c.token for c in chunks],
        "token_logprobs": [max(c.logprob or 0.0, -9999.0) for c in chunks],
        "top_logprobs": [{t: max(lp, -9999.0) for t, lp in c.top} for c in chunks],
        "text_offset": offsets,
    }
