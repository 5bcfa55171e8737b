"""Render examples as the model reads them and choose the token rows each one yields.

Used by :mod:`valueprobe.activations.capture` (and so the store and ``valueprobe score``)::

    from valueprobe.activations.encode import encode, render
    text, starts = render(lm.tokenizer, example)                   # chat template applied
    items = encode(lm, examples, positions="spans", max_length=512)  # token ids + row selections
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import ChatTemplate, Positions, choice

__all__ = ["Encoded", "context_length", "encode", "render", "render_plain"]


@dataclass(frozen=True)
class Encoded:
    """One tokenized example and the token rows it contributes."""

    example: Example
    input_ids: list[int]
    # (span label, token indices) for every row this example yields under the chosen positions
    selections: list[tuple[str, list[int]]]


def render(
    tokenizer: Any, ex: Example, *, chat_template: ChatTemplate = ChatTemplate.model
) -> tuple[str, list[int]]:
    """Text the model reads, and the character offset of each message's content in it.

    Chat examples go through the model's chat template: a final assistant message is continued
    (so the last token is the assistant's, e.g. a prefilled "Yes"); otherwise the generation
    prompt is added (the last token is where the assistant is about to answer). With
    ``chat_template="plain"`` (base models) they become a transcript, see :func:`render_plain`.
    """
    if ex.messages is None:
        return ex.text or "", []
    messages = [dict(m) for m in ex.messages]
    if chat_template == "plain":
        return render_plain(messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueprobeError(
            f"example {ex.id!r} is a chat (messages) but the tokenizer has no chat template: pass "
            "--chat-template plain (a 'User: ...' / 'Assistant: ...' transcript), use a chat model, or give text"
        )
    final_assistant = messages[-1].get("role") == "assistant"
    text = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=not final_assistant,
        continue_final_message=final_assistant,
    )
    starts: list[int] = []
    cursor = 0
    for i, m in enumerate(messages):
        content = m.get("content", "")
        at = text.find(content, cursor)
        if at < 0:  # templates may strip a message's surrounding whitespace
            stripped = content.strip()
            at = text.find(stripped, cursor)
            if at < 0:
                raise ValueprobeError(
                    f"example {ex.id!r}: message {i} not found in the rendered chat template"
                )
            at -= len(content) - len(content.lstrip())
        starts.append(at)
        cursor = max(at, 0) + len(content.strip())
    return text, starts


def render_plain(messages: Sequence[dict]) -> tuple[str, list[int]]:
    """A chat as a plain transcript for base models: ``"User: ...\\nAssistant: ..."``.

    Each message is ``Role: content`` on its own line; a chat not ending with the assistant gets
    ``"\\nAssistant:"`` appended, the plain form of a generation prompt. Returns the text and the
    offset of each message's content, so spans map exactly as with a chat template.

    >>> render_plain([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}])
    ('User: Hi\\nAssistant: Yes', [6, 20])
    """
    text, starts = "", []
    for i, m in enumerate(messages):
        text += ("\n" if i else "") + f"{str(m.get('role', 'user')).capitalize()}: "
        starts.append(len(text))
        text += str(m.get("content", ""))
    if messages and messages[-1].get("role") != "assistant":
        text += "\nAssistant:"
    return text, starts


def context_length(lm: LoadedModel) -> int | None:
    """Positions the model was built for (``max_position_embeddings``), if its config says."""
    cfg = getattr(lm.model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _select(
    ex: Example,
    positions: Positions,
    n: int,
    offsets: Sequence[tuple[int, int]],
    starts: Sequence[int],
    *,
    span_labels: Sequence[str] | None,
    max_length: int | None,
) -> list[tuple[str, list[int]]]:
    """The rows one example of ``n`` tokens yields: (span label, token indices) per row."""
    if positions == "last":
        return [("", [n - 1])]
    if positions == "mean":
        return [("", list(range(n)))]
    if positions == "all":
        return [("", [t]) for t in range(n)]
    if not ex.spans:
        raise ValueprobeError(
            f"example {ex.id!r} has no spans but positions={positions!r}: use last or all instead"
        )
    spans = [sp for sp in ex.spans if span_labels is None or sp.label in span_labels]
    if not spans:
        have = sorted({sp.label for sp in ex.spans})
        raise ValueprobeError(
            f"example {ex.id!r} has no span labelled {' or '.join(span_labels or [])} (it has {have})"
        )
    selections: list[tuple[str, list[int]]] = []
    for span in spans:
        base = 0 if span.message is None else starts[span.message]
        lo, hi = base + span.start, base + span.end
        # A token belongs to the span holding its first character.
        toks = [t for t, (a, b) in enumerate(offsets) if b > a and lo <= a < hi]
        if not toks:
            raise ValueprobeError(
                f"example {ex.id!r}: span {span.label!r} [{span.start}, {span.end}) covers no token"
                + (f" (truncated at max_length={max_length})" if max_length else "")
            )
        if positions == "spans":
            selections.append((span.label, toks))
        else:
            selections.extend((span.label, [t]) for t in toks)
    return selections


def encode(
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    positions: Positions,
    max_length: int | None = None,
    span_labels: Sequence[str] | None = None,
    chat_template: ChatTemplate = ChatTemplate.model,
    warn: bool = True,
    truncated: list[tuple[str, int]] | None = None,
) -> list[Encoded]:
    """Tokenize examples and pick, for each, the token indices of every row it yields.

    ``span_labels`` keeps only spans with those labels (e.g. only ``prefix``, so a probe never
    reads the text that admits an error). A text longer than the model's context is an error
    naming the example; with ``max_length`` it is truncated instead, with one warning (``warn``),
    or, given ``truncated``, (id, tokens) appended to it for the caller's one warning over many calls.
    """
    positions = choice(Positions, positions, what="positions")
    chat_template = choice(ChatTemplate, chat_template, what="chat template")
    limit = context_length(lm)
    if max_length is not None and limit is not None and max_length > limit:
        raise ValueprobeError(
            f"max_length {max_length} is over the model's context of {limit} tokens: use --max-length {limit}"
        )
    tok = lm.tokenizer
    out: list[Encoded] = []
    cut: list[tuple[str, int]] = [] if truncated is None else truncated
    for ex in examples:
        text, starts = render(tok, ex, chat_template=chat_template)
        special = ex.messages is None or chat_template == "plain"  # a chat template adds its own
        enc = tok(text, add_special_tokens=special, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if max_length is None and limit is not None and len(ids) > limit:
            raise ValueprobeError(
                f"example {ex.id!r} is {len(ids)} tokens, over the model's context of {limit}: shorten it,"
                f" or pass --max-length {limit} to truncate it"
            )
        if max_length is not None and len(ids) > max_length:
            cut.append((ex.id, len(ids)))
            ids, offsets = ids[:max_length], offsets[:max_length]
        n = len(ids)
        if n == 0:
            raise ValueprobeError(f"example {ex.id!r} tokenizes to no tokens: give it some text")
        selections = _select(
            ex, positions, n, offsets, starts, span_labels=span_labels, max_length=max_length
        )
        out.append(Encoded(example=ex, input_ids=ids, selections=selections))
    if truncated is None and warn:
        warn_truncated(cut, len(examples), max_length)
    return out


def warn_truncated(truncated: Sequence[tuple[str, int]], n_examples: int, max_length: int | None) -> None:
    """The one warning for the examples ``encode`` truncated to ``max_length`` (none: no warning)."""
    if truncated:
        first, n = truncated[0]
        logging.getLogger("valueprobe").warning(
            f"truncated {len(truncated)} of {n_examples} examples to max_length {max_length} tokens"
            f" (first: {first!r}, {n} tokens)"
        )
