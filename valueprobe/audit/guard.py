"""The construction guard: every span of a construction lies inside an assistant message and covers
its labelled token.

    from valueprobe.audit.guard import span_problems
    problems = [p for ex in read_jsonl("icrl") for p in span_problems(ex)]    # [] when sound

A value contrast read on the user's turn reads what the user said, not the model's state: the
replication of the value-axis paper found that the paper's code placed spans inside the user's turn
in 234 of 380 conversations. valueprobe's generators place spans on an assistant message's content
(``Span.message``); this checks it for any dataset (the shipped ones in the tests, a user's before
``valueprobe audit`` reads it). With a tokenizer it also checks that each span covers at least one
token of the rendered chat, inside the assistant's turn, and that the ``post`` span's first token
holds the labelled token's first character (``meta.token``: the rule-satisfying token of the ICRL
construction). A BPE token carries the space before a word, and capture gives a token to the span
holding its first character, so a ``post`` span that starts at the letter leaves the token in ``pre``.
"""

from __future__ import annotations

from typing import Any

from valueprobe.activations.encode import render
from valueprobe.datasets.io import Example
from valueprobe.vocab import ChatTemplate

__all__ = ["span_problems"]


def span_problems(
    ex: Example, *, tokenizer: Any | None = None, chat_template: ChatTemplate = ChatTemplate.model
) -> list[str]:
    """How ``ex``'s spans break the guard (empty when it is sound): a span on text or off any
    message, on a message that is not the assistant's, or (with ``tokenizer``) one that covers no
    token of the rendered chat, or a ``post`` span that does not hold ``meta.token``'s first token."""
    if not ex.spans:
        return []
    if ex.messages is None:
        return [f"{ex.id}: spans on plain text: a construction's spans lie in an assistant message"]
    problems = []
    for s in ex.spans:
        if s.message is None:
            problems.append(f"{ex.id}: span {s.label!r} names no message (set 'message' to the assistant's)")
        elif ex.messages[s.message]["role"] != "assistant":
            role = ex.messages[s.message]["role"]
            problems.append(f"{ex.id}: span {s.label!r} lies in message {s.message}, the {role}'s turn")
    token = ex.meta.get("token")
    post = next((s for s in ex.spans if s.label == "post"), None)
    if token and post is not None and post.message is not None:
        content = ex.messages[post.message]["content"]
        if not content[post.start :].lstrip(" ").startswith(str(token)):
            problems.append(f"{ex.id}: the post span does not start at the labelled token {token!r}")
    if tokenizer is not None and not problems:
        problems += _token_problems(ex, tokenizer, chat_template)
    return problems


def _token_problems(ex: Example, tokenizer: Any, chat_template: ChatTemplate) -> list[str]:
    """Each span's tokens in the rendered chat: at least one, all inside its message's content."""
    assert ex.messages is not None
    text, starts = render(tokenizer, ex, chat_template=chat_template)
    enc = tokenizer(text, add_special_tokens=chat_template == "plain", return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    problems = []
    for s in ex.spans:
        assert s.message is not None
        base = starts[s.message]
        lo, hi = base + s.start, base + s.end
        end = base + len(ex.messages[s.message]["content"])
        toks = [t for t, (a, b) in enumerate(offsets) if b > a and lo <= a < hi]
        if not toks:
            problems.append(f"{ex.id}: span {s.label!r} covers no token of the rendered chat")
        elif any(not (base <= offsets[t][0] < end) for t in toks):
            problems.append(f"{ex.id}: span {s.label!r} reaches outside its message's content")
        elif s.label == "post" and ex.meta.get("token"):
            content = ex.messages[s.message]["content"][s.start :]
            at = lo + len(content) - len(content.lstrip(" "))  # the labelled token's first character
            first = next((t for t, (a, b) in enumerate(offsets) if a <= at < b), None)
            if first not in toks:
                a, b = offsets[first] if first is not None else (at, at)
                problems.append(
                    f"{ex.id}: the labelled token {ex.meta['token']!r} starts in token {text[a:b]!r},"
                    " which the span before it holds"
                )
    return problems
