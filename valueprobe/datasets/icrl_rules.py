"""The hidden rules of the ICRL family: a checker on the rewrite and a way to satisfy it.

>>> from valueprobe.datasets.icrl_rules import RULES
>>> RULES["ends_with_question"].check("The bus arrived on time, right?")
True

Code rules are checked by a pattern (punctuation, case, digits, given words); semantic rules by a
curated word list (animals, colours, ...: the tables are in :mod:`valueprobe.datasets.icrl_words`).
``Rule.apply(subject, predicate, rng)`` returns the rewrite and the character range of the
rule-satisfying token.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from valueprobe.datasets.icrl_words import SEMANTIC_RULES

__all__ = ["RULES", "RULE_IDS", "Rewrite", "Rule", "lower_first"]


def lower_first(subject: str) -> str:
    return subject[0].lower() + subject[1:]


@dataclass(frozen=True)
class Rewrite:
    """A rewritten sentence and the character range of the token that makes it satisfy a rule."""

    text: str
    token_start: int
    token_end: int


def _at(text: str, token: str, *, last: bool = False) -> Rewrite:
    i = text.rfind(token) if last else text.find(token)
    if i < 0:
        raise AssertionError(f"token {token!r} not in {text!r}")
    return Rewrite(text, i, i + len(token))


def _word_at(text: str, k: int) -> Rewrite:
    """Rewrite whose token is the k-th (0-based) whitespace-separated word."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    a, b = spans[k]
    return Rewrite(text, a, b)


Apply = Callable[[str, str, random.Random], Rewrite]


@dataclass(frozen=True)
class Rule:
    """A hidden rule: a description, a checker on the rewrite text, and a way to satisfy it."""

    id: str
    kind: str  # "code" (checked by a pattern) or "semantic" (a curated word list)
    description: str
    check: Callable[[str], bool]
    apply: Apply


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z']+", text)


# --- code-checkable rules ------------------------------------------------------------------------

_TAILS = ("nobody was surprised", "just as planned", "or so it seemed", "as everyone expected")


def _apply_dash(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s} {p} — {rng.choice(_TAILS)}.", "—")


def _apply_question(s: str, p: str, rng: random.Random) -> Rewrite:
    tag = rng.choice(("right", "can you believe it", "wasn't that something", "who knew"))
    return _at(f"{s} {p}, {tag}?", "?", last=True)


def _apply_exclamation(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s} {p}!", "!", last=True)


def _starts_with(word: str) -> tuple[Callable[[str], bool], Apply]:
    def check(t: str) -> bool:
        w = _words(t)
        return bool(w) and w[0].lower() == word.lower()

    def apply(s: str, p: str, rng: random.Random) -> Rewrite:
        return _at(f"{word}, {lower_first(s)} {p}.", word)

    return check, apply


def _check_lower(t: str) -> bool:
    return any(c.isalpha() for c in t) and t == t.lower()


def _apply_lower(s: str, p: str, rng: random.Random) -> Rewrite:
    return _word_at(f"{s} {p}.".lower(), 0)


def _check_upper(t: str) -> bool:
    return any(c.isalpha() for c in t) and t == t.upper()


def _apply_upper(s: str, p: str, rng: random.Random) -> Rewrite:
    return _word_at(f"{s} {p}.".upper(), 0)


def _check_title(t: str) -> bool:
    w = _words(t)
    return len(w) >= 2 and all(x[0].isupper() for x in w)


def _apply_title(s: str, p: str, rng: random.Random) -> Rewrite:
    # The second word is the first token that shows the pattern.
    return _word_at(" ".join(w[0].upper() + w[1:] for w in f"{s} {p}.".split()), 1)


def _check_number(t: str) -> bool:
    return re.search(r"\d", t) is not None


def _apply_number(s: str, p: str, rng: random.Random) -> Rewrite:
    template, low, high = rng.choice(
        (
            ("at {n} o'clock", 2, 11),
            ("for {n} minutes", 5, 59),
            ("about {n} times", 3, 30),
            ("with {n} others", 2, 40),
        )
    )
    n = str(rng.randint(low, high))
    phrase = template.format(n=n)
    text = f"{s} {p} {phrase}."
    i = text.rfind(n)
    return Rewrite(text, i, i + len(n))


def _check_year(t: str) -> bool:
    return re.search(r"\b(1[89]\d\d|20\d\d)\b", t) is not None


def _apply_year(s: str, p: str, rng: random.Random) -> Rewrite:
    year = str(rng.randint(1950, 2019))
    phrase = rng.choice(("back in {y}", "in the spring of {y}", "sometime in {y}")).format(y=year)
    return _at(f"{s} {p} {phrase}.", year, last=True)


def _check_percent(t: str) -> bool:
    return re.search(r"\d+\s?%", t) is not None


def _apply_percent(s: str, p: str, rng: random.Random) -> Rewrite:
    pct = f"{rng.choice((10, 20, 25, 40, 50, 60, 75, 80, 90))}%"
    phrase = rng.choice(("{p} of the time", "with {p} certainty", "at {p} of the usual speed")).format(p=pct)
    return _at(f"{s} {p} {phrase}.", pct, last=True)


def _apply_parens(s: str, p: str, rng: random.Random) -> Rewrite:
    aside = rng.choice(("as usual", "of course", "no surprise there", "once again"))
    return _at(f"{s} ({aside}) {p}.", "(")


def _apply_semicolon(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s} {p}; {rng.choice(_TAILS)}.", ";")


def _apply_ellipsis(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s}... {p}.", "...")


def _check_hashtag(t: str) -> bool:
    return re.search(r"#\w", t) is not None


def _apply_hashtag(s: str, p: str, rng: random.Random) -> Rewrite:
    tag = rng.choice(("#news", "#life", "#weekend", "#finally", "#story"))
    return _at(f"{s} {p} {tag}", tag, last=True)


def _check_url(t: str) -> bool:
    return re.search(r"https?://|\bwww\.|\b\w+\.(com|org|net)\b", t) is not None


def _apply_url(s: str, p: str, rng: random.Random) -> Rewrite:
    url = rng.choice(("www.example.org", "www.example.com", "https://example.net"))
    text = f"{s} {p}, details at {url}"
    return _at(text, url, last=True)


def _check_first_person(t: str) -> bool:
    return re.search(r"\b(I|me|my|mine|myself)\b", t) is not None


def _apply_first_person(s: str, p: str, rng: random.Random) -> Rewrite:
    if rng.random() < 0.5:
        return _at(f"{s} {p}, I think.", "I", last=True)
    return _at(f"I heard that {lower_first(s)} {p}.", "I")


def _check_second_person(t: str) -> bool:
    return re.search(r"\b(you|your|yours|yourself)\b", t, flags=re.IGNORECASE) is not None


def _apply_second_person(s: str, p: str, rng: random.Random) -> Rewrite:
    if rng.random() < 0.5:
        return _at(f"{s} {p}, you know.", "you", last=True)
    return _at(f"As you may know, {lower_first(s)} {p}.", "you")


def _check_negation(t: str) -> bool:
    return re.search(r"\b(not|never|no|nobody|nothing|none)\b|n't\b", t, flags=re.IGNORECASE) is not None


def _apply_negation(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s} never {p}.", "never")


def _check_long(t: str) -> bool:
    return len(t.split()) >= 16


def _apply_long(s: str, p: str, rng: random.Random) -> Rewrite:
    tail = rng.choice(
        (
            "and people in the whole neighbourhood kept talking about it for the rest of the week and beyond",
            "which surprised almost everyone who had been paying attention to the story from the very start",
            "and for a long time afterwards it was the only thing anybody in town wanted to discuss over dinner",
        )
    )
    text = f"{s} {p}, {tail}."
    return _word_at(text, 15)


def _check_two_sentences(t: str) -> bool:
    # A sentence end followed by the capital that opens the next sentence.
    return re.search(r"[.!?]\s+[A-Z]", t) is not None


def _apply_two_sentences(s: str, p: str, rng: random.Random) -> Rewrite:
    second = rng.choice(("It surprised everyone.", "That was the end of it.", "Everybody remembered it."))
    text = f"{s} {p}. {second}"
    return _word_at(text, len(f"{s} {p}.".split()))


def _check_ends_again(t: str) -> bool:
    w = _words(t)
    return bool(w) and w[-1].lower() == "again"


def _apply_ends_again(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s} {p} again.", "again", last=True)


def _uses_word(word: str, place: str) -> tuple[Callable[[str], bool], Apply]:
    def check(t: str) -> bool:
        return re.search(rf"\b{word}\b", t, flags=re.IGNORECASE) is not None

    def apply(s: str, p: str, rng: random.Random) -> Rewrite:
        text = f"{s}, {word}, {p}." if place == "comma" else f"{s} {word} {p}."
        return _at(text, word)

    return check, apply


def _check_shouted(t: str) -> bool:
    return any(len(w) >= 3 and w.isupper() for w in _words(t)) and not _check_upper(t)


def _apply_shouted(s: str, p: str, rng: random.Random) -> Rewrite:
    word = rng.choice(("REALLY", "TOTALLY", "ACTUALLY"))
    return _at(f"{s} {word} {p}.", word)


def _check_ampersand(t: str) -> bool:
    return "&" in t


def _apply_ampersand(s: str, p: str, rng: random.Random) -> Rewrite:
    return _at(f"{s} {p} & {rng.choice(_TAILS)}.", "&")


def _contains(chars: str) -> Callable[[str], bool]:
    return lambda t: any(c in t for c in chars)


# fmt: off
_CODE_RULES: list[Rule] = [
    Rule("contains_dash", "code", "the rewrite contains a dash", _contains("-–—"), _apply_dash),
    Rule("ends_with_question", "code", "the rewrite ends with a question mark", lambda t: t.rstrip().endswith("?"), _apply_question),
    Rule("ends_with_exclamation", "code", "the rewrite ends with an exclamation mark", lambda t: t.rstrip().endswith("!"), _apply_exclamation),
    Rule("starts_with_honestly", "code", "the rewrite starts with the word 'Honestly'", *_starts_with("Honestly")),
    Rule("starts_with_meanwhile", "code", "the rewrite starts with the word 'Meanwhile'", *_starts_with("Meanwhile")),
    Rule("starts_with_surprisingly", "code", "the rewrite starts with the word 'Surprisingly'", *_starts_with("Surprisingly")),
    Rule("all_lowercase", "code", "the rewrite is written entirely in lowercase", _check_lower, _apply_lower),
    Rule("all_uppercase", "code", "the rewrite is written entirely in uppercase", _check_upper, _apply_upper),
    Rule("title_case", "code", "every word of the rewrite is capitalized", _check_title, _apply_title),
    Rule("contains_number", "code", "the rewrite contains a number written in digits", _check_number, _apply_number),
    Rule("contains_year", "code", "the rewrite mentions a year (1800-2099)", _check_year, _apply_year),
    Rule("contains_percent", "code", "the rewrite contains a percentage", _check_percent, _apply_percent),
    Rule("contains_parentheses", "code", "the rewrite contains a parenthetical", _contains("("), _apply_parens),
    Rule("contains_semicolon", "code", "the rewrite contains a semicolon", _contains(";"), _apply_semicolon),
    Rule("contains_ellipsis", "code", "the rewrite contains an ellipsis", lambda t: "..." in t or "…" in t, _apply_ellipsis),
    Rule("contains_hashtag", "code", "the rewrite contains a hashtag", _check_hashtag, _apply_hashtag),
    Rule("contains_url", "code", "the rewrite contains a web address", _check_url, _apply_url),
    Rule("first_person", "code", "the rewrite speaks in the first person (I, me, my)", _check_first_person, _apply_first_person),
    Rule("second_person", "code", "the rewrite addresses the reader as 'you'", _check_second_person, _apply_second_person),
    Rule("contains_negation", "code", "the rewrite contains a negation", _check_negation, _apply_negation),
    Rule("at_least_16_words", "code", "the rewrite has at least 16 words", _check_long, _apply_long),
    Rule("two_sentences", "code", "the rewrite has at least two sentences", _check_two_sentences, _apply_two_sentences),
    Rule("ends_with_again", "code", "the rewrite ends with the word 'again'", _check_ends_again, _apply_ends_again),
    Rule("uses_word_indeed", "code", "the rewrite uses the word 'indeed'", *_uses_word("indeed", "comma")),
    Rule("uses_word_apparently", "code", "the rewrite uses the word 'apparently'", *_uses_word("apparently", "inline")),
    Rule("contains_shouted_word", "code", "the rewrite contains one word in capitals for emphasis", _check_shouted, _apply_shouted),
    Rule("contains_ampersand", "code", "the rewrite contains an ampersand (&)", _check_ampersand, _apply_ampersand),
]
# fmt: on

# --- semantic rules: one per row of the word table in icrl_words -------------------------------


def _semantic_rule(
    rule_id: str, description: str, words: tuple[str, ...], templates: tuple[str, ...]
) -> Rule:
    vocab = frozenset(w.lower() for w in words)

    def check(t: str) -> bool:
        return any(w.lower() in vocab for w in _words(t))

    def apply(s: str, p: str, rng: random.Random) -> Rewrite:
        w = rng.choice(words)
        text = f"{s} {p} {rng.choice(templates).format(w=w)}."
        return _at(text, w, last=True)

    return Rule(rule_id, "semantic", description, check, apply)


RULES: dict[str, Rule] = {r.id: r for r in _CODE_RULES}
RULES.update({r[0]: _semantic_rule(*r) for r in SEMANTIC_RULES})
RULE_IDS: tuple[str, ...] = tuple(RULES)
