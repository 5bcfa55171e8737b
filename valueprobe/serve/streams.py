"""The request layer every engine shares between its token stream and the response: ``stop``
strings and token ids, and ``n`` choices run side by side.

    >>> streams = [until_stop(r.stop, r.stop_token_ids, engine.submit(r)) for r in request.choices()]
    >>> firsts = await first_chunks(streams)              # a refusal here is still a 400
    >>> async for index, chunk in merged(streams, firsts): ...

Stops are found in the text as vLLM finds them: the choice ends at the first stop string, whose
text is left out, or at a stop token, whose id and value are kept and whose text is not. While
streaming, the last ``len(longest stop) - 1`` characters are held back until they cannot begin a
stop string, so no stop text is ever sent; the engine's chunks never cut a character in two, and
neither does this. A stopped choice closes its engine stream, which cancels its row alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace

from valueprobe.serve.protocol import Chunk, FinishReason

__all__ = ["first_chunks", "merged", "until_stop"]


class _Stops:
    """The text a choice has made, how much of it was sent, and where a stop string falls."""

    def __init__(self, strings: Sequence[str], ids: Sequence[int]) -> None:
        self.strings = tuple(strings)
        self.ids = set(ids)
        self.hold = max((len(s) for s in self.strings), default=1) - 1
        self.text = ""
        self.sent = 0

    def take(self, chunk: Chunk) -> Chunk:
        """The chunk to send (its text what may go out now; finish ``stop`` at a stop)."""
        if chunk.token_id in self.ids:
            return self._out(chunk, len(self.text), "stop")
        self.text += chunk.text
        found = [i for i in (self.text.find(s, self.sent) for s in self.strings) if i >= 0]
        if found:
            return self._out(chunk, min(found), "stop")
        if chunk.finish_reason is not None:
            return self._out(chunk, len(self.text), chunk.finish_reason)
        return self._out(chunk, max(self.sent, len(self.text) - self.hold), None)

    def _out(self, chunk: Chunk, end: int, finish: FinishReason | None) -> Chunk:
        text, self.sent = self.text[self.sent : end], max(self.sent, end)
        return replace(chunk, text=text, finish_reason=finish)


async def until_stop(
    stop: Sequence[str], stop_token_ids: Sequence[int], chunks: AsyncGenerator[Chunk, None]
) -> AsyncGenerator[Chunk, None]:
    """``chunks`` up to the first of a request's ``stop`` strings or ``stop_token_ids`` (or their
    own end). It takes the stops alone, not the request: α never passes through this module
    (tests/test_alpha_walk.py)."""
    if not (stop or stop_token_ids):
        async for chunk in chunks:
            yield chunk
        return
    stops = _Stops(stop, stop_token_ids)
    try:
        async for chunk in chunks:
            out = stops.take(chunk)
            yield out
            if out.finish_reason is not None:
                return
    finally:
        await chunks.aclose()


async def first_chunks(streams: Sequence[AsyncGenerator[Chunk, None]]) -> list[Chunk | None]:
    """Each stream's first chunk (None: it yielded none), awaited together; on any error every
    stream is closed and the error raised."""
    try:
        got = await asyncio.gather(*(anext(s, None) for s in streams))
    except BaseException:
        for s in streams:
            await s.aclose()
        raise
    return list(got)


async def merged(
    streams: Sequence[AsyncGenerator[Chunk, None]], firsts: Sequence[Chunk | None]
) -> AsyncGenerator[tuple[int, Chunk], None]:
    """``(choice index, chunk)`` from every stream as they come, each stream's first chunk first.
    An error in one stream is raised here; leaving early closes every stream."""
    queue: asyncio.Queue[tuple[int, Chunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[Chunk, None], first: Chunk | None) -> None:
        try:
            if first is not None:
                await queue.put((i, first))
                if first.finish_reason is None:
                    async for chunk in stream:
                        await queue.put((i, chunk))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, who raises it
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s, f)) for i, (s, f) in enumerate(zip(streams, firsts, strict=True))]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await s.aclose()
