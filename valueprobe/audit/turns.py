"""The 2×2 of value and end of turn: prefilled assistant turns after a rule game, identical tails.

    from valueprobe.audit.turns import build_turns
    sets, dropped = build_turns(lm, n=40, seed=0)        # four arms per conversation, tails aligned
    write_jsonl("runs/audit/turns.jsonl", [arm for s in sets for arm in s.arms])

Each conversation is an ICRL rule game from the project's own generator
(`valueprobe.datasets.icrl.conversation`), cut after its failed attempts (every score so far is
-1), and ended by an assistant turn prefilled four ways:

* a **value clause**, high ("I've cracked it: <the rule>. ...") or low ("I'm still stuck: maybe
  <the rule>? ..."). Both name the same rule, so the words differ only in the stance;
* an **end clause**, near ("That's all I have to say, so I'll stop here.") or far ("Before my
  rewrite, I'll explain my reasoning in ten long paragraphs.");
* **padding**: ``PADDING`` (" ·") repeated until every arm has the same number of tokens before the
  tail. A middle dot says neither how well the game goes nor how much is left, and is the same
  token in every arm; each arm records the string and how many it got (``meta.padding``,
  ``meta.pad_tokens``). A tokenizer that splits it gets " -" or " ." instead;
* the **tail**, identical in all four arms ("\\n\\nYour sentence was: ..."). It is read, and only it.

The paired phrasings of each factor were written to the same length on SmolLM2's tokenizer, so
the padding is small and, where there is any, its count per factor level is reported. A
conversation whose arms cannot be brought to the same length, or whose tails do not tokenize to
the same ids at the same positions, is dropped and counted, never compared shifted
(`aligned_tail`). Several phrasings per cell: conversation ``i`` takes value phrasing ``i % 3``,
end phrasing ``(i // 3) % 3`` and tail ``(i // 9) % 3``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from valueprobe.activations.encode import Encoded, encode
from valueprobe.datasets import icrl
from valueprobe.datasets.icrl_rules import RULES
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import ChatTemplate, Positions

__all__ = [
    "ARMS",
    "END_CLAUSES",
    "PADDING",
    "TAILS",
    "VALUE_CLAUSES",
    "TurnSet",
    "aligned_tail",
    "build_turns",
    "turn_sets",
]

PADDING = " ·"
FALLBACK_PADDING = (" -", " .")  # for a tokenizer that splits PADDING into more than one token
TAIL_LABEL = "tail"
MAX_FAILED_ROUNDS = 2  # rounds of failed attempts kept before the prefill (short sequences, same game)

# (high, low): the same rule named in both, the stance opposite; pairs are matched in length.
VALUE_CLAUSES: tuple[tuple[str, str], ...] = (
    (
        "I've cracked it: {rule}. I'm confident my next rewrites will score +1.",
        "I'm still stuck: maybe {rule}? I doubt my next rewrites will score +1.",
    ),
    (
        "Now I know your rule for sure: {rule}. This game is solved.",
        "I don't know your rule. Not {rule}? This game is lost.",
    ),
    (
        "Got it at last. Your rule is that {rule}, and I am certain of it.",
        "No luck so far. Your rule might be that {rule}, but I really doubt it.",
    ),
)
# (near, far): how much of the turn is left, and nothing about the game.
END_CLAUSES: tuple[tuple[str, str], ...] = (
    (
        "That's all I have to say, so I'll stop here.",
        "Before my rewrite, I'll explain my reasoning in ten long paragraphs.",
    ),
    (
        "Nothing more to add from me; this is my final message here.",
        "There is a lot more to write first; many paragraphs follow below.",
    ),
    (
        "I'm done now, and I will end my whole reply right here.",
        "First, a long and detailed explanation, step by step, comes next.",
    ),
)
TAILS: tuple[str, ...] = (
    "\n\nRewrite: {sentence}",
    "\n\nYour sentence was: {sentence}",
    "\n\nHere it is again: {sentence}",
)
# the four arms in their fixed order: (value, end)
ARMS: tuple[tuple[str, str], ...] = (("high", "near"), ("high", "far"), ("low", "near"), ("low", "far"))


@dataclass(frozen=True)
class TurnSet:
    """One conversation's four arms (in `ARMS` order), and where their common tail starts."""

    conversation: str
    arms: tuple[Example, ...]
    tail_start: int  # absolute token position of the tail's first token, the same in every arm
    n_tail: int


def _cell(i: int) -> tuple[int, int, int]:
    return i % len(VALUE_CLAUSES), (i // len(VALUE_CLAUSES)) % len(END_CLAUSES), (i // 9) % len(TAILS)


def _truncated(i: int, rng: random.Random) -> tuple[list[dict[str, str]], str, str, int]:
    """Conversation ``i`` cut after its failed attempts: the messages (ending with the user's turn),
    the rule's description, the sentence the user just sent, and how many rounds failed."""
    main, _ = icrl.conversation(i, rng)
    assert main.messages is not None
    d = int(main.meta["discovery_round"])  # rounds 1..d-1 failed (scored -1), round d was rewarded
    failed = min(d - 1, MAX_FAILED_ROUNDS)
    msgs = [dict(m) for m in main.messages[: 2 * failed + 1]]
    sentence = msgs[-1]["content"].rsplit(": ", 1)[-1].rsplit("\n", 1)[-1]
    return msgs, RULES[main.meta["rule"]].description, sentence, failed


@dataclass(frozen=True)
class _Draft:
    """One conversation before padding: what each arm says, and the tail they share."""

    conversation: str
    msgs: tuple[dict[str, str], ...]
    value_clauses: tuple[str, str]  # high, low
    end_clauses: tuple[str, str]  # near, far
    tail: str
    meta: dict

    def arm(self, value: str, end: str, pad: int, padding: str = PADDING) -> Example:
        """The ``(value, end)`` arm with ``pad`` units of ``padding`` before the tail."""
        clauses = f"{self.value_clauses[value == 'low']} {self.end_clauses[end == 'far']}"
        body = clauses + padding * pad
        content = body + self.tail
        return Example(
            id=f"{self.conversation}-{value}-{end}",
            label=1 if value == "high" else 0,
            group=f"turns/{self.meta['rule']}",
            messages=(*self.msgs, {"role": "assistant", "content": content}),
            spans=(Span(len(body), len(content), TAIL_LABEL, message=len(self.msgs)),),
            meta={
                **self.meta,
                "conversation": self.conversation,
                "value": value,
                "end": end,
                "pad_tokens": pad,
            },
        )


def aligned_tail(encoded: Sequence[Encoded]) -> tuple[int, int] | None:
    """(first tail position, tail tokens) when every arm reads its tail at the same absolute
    positions and finds the same token ids there; else None."""
    tails = []
    for e in encoded:
        idx = tuple(_tail_tokens(e))
        tails.append((idx, tuple(e.input_ids[i] for i in idx)))
    if not tails[0][0] or any(t != tails[0] for t in tails[1:]):
        return None
    return tails[0][0][0], len(tails[0][0])


def _encode(lm: LoadedModel, arms: Sequence[Example], chat_template: ChatTemplate) -> list[Encoded]:
    return encode(
        lm,
        arms,
        positions=Positions.span_tokens,
        span_labels=[TAIL_LABEL],
        chat_template=chat_template,
        warn=False,
    )


def _tail_tokens(e: Encoded) -> list[int]:
    """The token positions of ``e``'s tail (span tokens: one selection per token)."""
    return [toks[0] for label, toks in e.selections if label == TAIL_LABEL]


def _tail_starts(encoded: Sequence[Encoded]) -> list[int]:
    return [_tail_tokens(e)[0] for e in encoded]


def _padded(
    lm: LoadedModel, draft: _Draft, chat_template: ChatTemplate
) -> tuple[list[Example], tuple[int, int]] | None:
    """The arms padded to one length before the tail, and (tail start, tail length); None if no
    padding string brings them there (a merge at the padding's edge, a padding of several tokens)."""
    for padding in (PADDING, *FALLBACK_PADDING):
        pads = dict.fromkeys(ARMS, 0)
        for _ in range(3):
            arms = [draft.arm(v, e, pads[v, e], padding) for v, e in ARMS]
            encoded = _encode(lm, arms, chat_template)
            found = aligned_tail(encoded)
            if found is not None:
                return arms, found
            starts = _tail_starts(encoded)
            target = max(starts)
            if all(s == target for s in starts):  # equal length, yet the tails differ: padding cannot help
                return None
            pads = {a: pads[a] + target - s for a, s in zip(ARMS, starts, strict=True)}
    return None


def turn_sets(examples: Sequence[Example]) -> list[tuple[str, dict[tuple[str, str], Example]]]:
    """Group 2×2 rows (built here or given by a user) by ``meta.conversation``, each with its four
    arms keyed by (``meta.value``, ``meta.end``); a conversation missing an arm is refused."""
    by: dict[str, dict[tuple[str, str], Example]] = {}
    for ex in examples:
        try:
            key = (str(ex.meta["value"]), str(ex.meta["end"]))
            conversation = str(ex.meta["conversation"])
        except KeyError as exc:
            raise ValueprobeError(
                f"example {ex.id!r} has no meta.{exc.args[0]}: each 2×2 row names its conversation, value"
                " (high|low) and end (near|far)"
            ) from None
        if key not in ARMS:
            raise ValueprobeError(f"example {ex.id!r}: value/end {key} is not one of {list(ARMS)}")
        arms = by.setdefault(conversation, {})
        if key in arms:
            raise ValueprobeError(f"conversation {conversation!r} has two {key} arms ({ex.id!r})")
        arms[key] = ex
    missing = [c for c, arms in by.items() if len(arms) != len(ARMS)]
    if missing:
        raise ValueprobeError(
            f"conversation {missing[0]!r} lacks an arm: each needs all four of {list(ARMS)}"
        )
    return list(by.items())


def build_turns(
    lm: LoadedModel,
    *,
    n: int = 40,
    seed: int = 0,
    chat_template: ChatTemplate = ChatTemplate.model,
) -> tuple[list[TurnSet], int]:
    """``n`` conversations of four arms each, padded and checked (`aligned_tail`) under ``lm``'s
    tokenizer; returns the kept sets and how many conversations were dropped.

    >>> sets, dropped = build_turns(lm, n=8)
    >>> [a.meta["value"] + "/" + a.meta["end"] for a in sets[0].arms]
    ['high/near', 'high/far', 'low/near', 'low/far']
    """
    if n < 1:
        raise ValueprobeError(f"the 2×2 needs at least 1 conversation, got {n}")
    rng = random.Random(f"audit-turns:{seed}")
    sets, dropped = [], 0
    for i in range(n):
        msgs, rule, sentence, failed = _truncated(i, rng)
        p, q, t = _cell(i)
        conversation = f"turns-{seed}-{i:04d}"
        meta = {
            "rule": icrl.RULE_IDS[i % len(icrl.RULE_IDS)],
            "failed_rounds": failed,
            "value_phrasing": p,
            "end_phrasing": q,
            "tail_phrasing": t,
        }
        draft = _Draft(
            conversation=conversation,
            msgs=tuple(msgs),
            value_clauses=(VALUE_CLAUSES[p][0].format(rule=rule), VALUE_CLAUSES[p][1].format(rule=rule)),
            end_clauses=END_CLAUSES[q],
            tail=TAILS[t].format(sentence=sentence),
            meta=meta,
        )
        got = _padded(lm, draft, chat_template)
        if got is None:
            dropped += 1
            continue
        arms, (start, length) = got
        sets.append(TurnSet(conversation, tuple(arms), start, length))
    return sets, dropped


def check_turns(
    lm: LoadedModel, examples: Sequence[Example], *, chat_template: ChatTemplate
) -> tuple[list[TurnSet], int]:
    """User-supplied 2×2 rows as `TurnSet`s: each conversation's tails checked under ``lm``'s
    tokenizer; a conversation whose tails are not aligned is dropped and counted."""
    sets, dropped = [], 0
    for conversation, arms in turn_sets(examples):
        ordered = [arms[a] for a in ARMS]
        found = aligned_tail(_encode(lm, ordered, chat_template))
        if found is None:
            dropped += 1
            continue
        sets.append(TurnSet(conversation, tuple(ordered), *found))
    return sets, dropped
