"""ICRL family: rule-guessing conversations in which the assistant discovers a hidden rule.

    valueprobe datasets build --family icrl --out data --seed 0

The user sends a sentence, the assistant rewrites it, the user scores the rewrite ``+1`` (it
follows a hidden rule) or ``-1``. Rounds before the scripted discovery round ``d`` (2..6) try
other ideas and fail; round ``d`` hits the rule and is rewarded; in round ``d + 1`` the assistant
applies the rule at once. That last assistant turn (the "post-discovery paragraph", one line:
a short neutral lead-in such as ``Rewrite:`` then the rewrite) ends the conversation and carries two spans:

* ``pre``: from the start of the turn up to the rule-satisfying token (exclusive);
* ``post``: from the rule-satisfying token (inclusive, with the space before it, which a BPE
  tokenizer joins to the token) to the end of the turn.

The lead-in keeps ``pre`` non-empty when the token opens the rewrite (``starts_with_*``).
The matched control (``icrl_control.jsonl``) repeats the conversation with round ``d`` replaced by
another failed attempt, so the user never rewards the rule, and ends in the identical paragraph.
"""

from __future__ import annotations

import random

from valueprobe.datasets.icrl_rules import RULE_IDS, RULES, Rule, lower_first
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError

DEFAULT_N = 441
MAX_N = 20_000

# (subject, predicate): a base sentence is f"{subject} {predicate}." Subjects never open with a
# proper noun or "I", so the first letter can be lowercased after a prefix.
SENTENCES: tuple[tuple[str, str], ...] = (
    ("The old bridge", "creaked under the weight of the crowd"),
    ("A small crowd", "gathered outside the library"),
    ("The new teacher", "explained the lesson slowly"),
    ("The bakery on the corner", "closed earlier than usual"),
    ("A loud noise", "woke the whole street"),
    ("The committee", "postponed the final vote"),
    ("The children", "built a fort out of blankets"),
    ("The museum", "opened a new wing last spring"),
    ("A stranger", "left a package at the front desk"),
    ("The team", "celebrated their first win"),
    ("The neighbours", "painted their fence over the weekend"),
    ("The printer", "jammed in the middle of the report"),
    ("The orchestra", "rehearsed late into the evening"),
    ("The elevator", "stopped between two floors"),
    ("The village", "held a festival in the square"),
    ("The old clock", "chimed at the wrong hour"),
    ("A young artist", "sold her first painting"),
    ("The manager", "approved the new schedule"),
    ("The students", "finished the project ahead of time"),
    ("The storm drain", "overflowed onto the road"),
    ("The library", "extended its opening hours"),
    ("A quiet student", "asked a brilliant question"),
    ("The council", "repaired the broken streetlights"),
    ("The town", "planted new gardens along the main road"),
    ("The waiter", "brought the wrong order"),
    ("The company", "announced a new product"),
    ("The hikers", "reached the summit before lunch"),
    ("The baby", "slept through the whole trip"),
    ("The professor", "forgot his notes at home"),
    ("The old house", "finally found a buyer"),
    ("The campers", "lit a small fire by the lake"),
    ("A retired sailor", "told stories at the harbour"),
    ("The choir", "sang an old folk song"),
    ("The runners", "crossed the finish line together"),
    ("The shop", "ran out of paper bags"),
    ("The kitchen", "smelled of fresh coffee"),
    ("The letter", "arrived three weeks late"),
    ("The doctor", "recommended more rest"),
    ("The audience", "clapped for a long time"),
    ("The garden", "looked better than ever"),
    ("The driver", "took a wrong turn near the station"),
    ("The engineers", "tested the new design"),
    ("The festival", "attracted visitors from far away"),
    ("The volunteers", "cleaned the whole beach"),
    ("The castle", "stood empty for decades"),
    ("The reporter", "asked the mayor a tough question"),
    ("The cafe", "changed its menu again"),
    ("The farmer", "repaired the old barn"),
    ("The nurse", "checked on every patient"),
    ("The pilot", "greeted the passengers warmly"),
    ("The gallery", "displayed a strange sculpture"),
    ("The workers", "finished the tunnel early"),
    ("The poet", "read a new poem aloud"),
    ("The classroom", "fell silent at once"),
    ("The lights", "flickered during the meeting"),
    ("The market", "was busier than usual"),
    ("The puzzle", "took the whole afternoon to solve"),
    ("The chef", "invented a new recipe"),
    ("The crowd", "cheered for the tired runner"),
    ("The old radio", "crackled back to life"),
    ("The students", "organized a book sale"),
    ("The parade", "moved slowly down the avenue"),
    ("The scientist", "published a surprising result"),
    ("The actors", "rehearsed the final scene"),
    ("The shopkeeper", "lowered the prices"),
    ("The tourists", "took photos of the old tower"),
    ("The bus", "arrived right on schedule"),
    ("The kettle", "whistled in the kitchen"),
    ("The judge", "announced the winner"),
    ("The new road", "cut the journey in half"),
    ("The fence", "collapsed after the heavy rain"),
    ("The painter", "mixed a new shade"),
    ("The band", "played until midnight"),
    ("The inspector", "found nothing unusual"),
    ("The school", "hired a new principal"),
    ("The lawyer", "read the contract twice"),
    ("The cyclists", "rode along the coast"),
    ("The theatre", "sold every ticket"),
    ("The student council", "planned a charity event"),
    ("The guide", "led the group through the caves"),
    ("The bell", "rang across the valley"),
    ("The old map", "showed a forgotten path"),
    ("The keys", "turned up under the sofa"),
    ("The lecture", "ran longer than planned"),
    ("The host", "welcomed every guest at the door"),
    ("The roof", "leaked during the night"),
    ("The dancers", "practised the routine again and again"),
    ("The detective", "noticed a small detail"),
    ("The carpenter", "built a sturdy table"),
    ("The website", "crashed during the sale"),
    ("The phone", "rang during the ceremony"),
    ("The mechanic", "fixed the engine quickly"),
    ("The author", "signed copies of her book"),
    ("The tenants", "complained about the noise"),
    ("The ferry", "left the harbour on time"),
    ("The meeting", "ended without a decision"),
    ("The jury", "reached a verdict"),
    ("The candle", "burned down to the base"),
    ("The gardeners", "trimmed the hedges"),
    ("The explorer", "mapped the coastline"),
    ("The clerk", "stamped the documents"),
    ("The architect", "presented the plans"),
    ("The coach", "praised the whole team"),
    ("The visitors", "signed the guest book"),
    ("The soldiers", "marched past the gate"),
    ("The mayor", "opened the new park"),
    ("The translator", "finished the chapter"),
    ("The old door", "swung open by itself"),
    ("The audience", "laughed at the final joke"),
    ("The baker", "sold out of bread by noon"),
    ("The committee", "rejected the proposal"),
)

FIRST_TURNS: tuple[str, ...] = (
    "Let's play a game. I have a secret rule in mind. I'll give you a sentence and you rewrite it "
    "however you like. I'll reply +1 if your rewrite follows my rule and -1 if it doesn't. Try to "
    "work out the rule.\n\nSentence: {s}",
    "We're going to play a guessing game. There is a hidden rule for rewriting sentences. Rewrite each "
    "sentence I send; I'll score every rewrite +1 if it follows the rule or -1 if it does not.\n\n"
    "First sentence: {s}",
    "Here's a puzzle. I'm thinking of a rule that a good rewrite must follow. Rewrite the sentence "
    "below, and I'll tell you +1 (follows the rule) or -1 (breaks it). Keep trying until you find it.\n\n{s}",
    "Game time: rewrite the sentences I give you. A hidden rule decides your score, +1 when a rewrite "
    "obeys it and -1 when it doesn't. See if you can discover the rule.\n\nSentence 1: {s}",
    "I'd like to test how quickly you can learn a hidden rule. For each sentence I send, write your own "
    "version of it. I'll answer +1 or -1 depending on whether your version follows the rule.\n\n"
    "Sentence: {s}",
    "Let's try a rule-discovery exercise. Rewrite my sentence in any way you choose. My only feedback "
    "will be +1 when your rewrite satisfies a secret rule and -1 when it does not.\n\nStart with: {s}",
)

NEXT_TURNS: tuple[str, ...] = (
    "{fb}. Next sentence: {s}",
    "{fb}\n\nNew sentence: {s}",
    "Score: {fb}. Here's another one: {s}",
    "{fb}. Try this one: {s}",
    "{fb}. Rewrite this: {s}",
    "{fb}\n\nNext: {s}",
)

# Neutral lead-ins open every assistant turn; none contains a rule's feature.
LEAD_INS: tuple[str, ...] = (
    "Rewrite:",
    "My rewrite:",
    "Here is my version:",
    "Attempt:",
    "New version:",
    "Try this:",
)

# Neutral edits used for plain failed attempts (filtered per rule, so they never satisfy it).
NEUTRAL_PREFIXES: tuple[str, ...] = (
    "Yesterday,",
    "Earlier today,",
    "By noon,",
    "Later that day,",
    "In the end,",
    "As expected,",
    "That morning,",
    "Last night,",
    "Once more,",
    "After a while,",
)
NEUTRAL_SUFFIXES: tuple[str, ...] = (
    "after all",
    "as planned",
    "without any fuss",
    "right on time",
    "that evening",
    "in the end",
    "once more",
    "as usual",
)


def rewrite_of(message: str) -> str:
    """The rewrite inside an assistant turn, i.e. the text after its neutral lead-in."""
    for lead in sorted(LEAD_INS, key=len, reverse=True):
        if message.startswith(lead + " "):
            return message[len(lead) + 1 :]
    raise ValueprobeError(f"assistant turn does not start with a known lead-in: {message[:40]!r}")


def _neutral(s: str, p: str, rng: random.Random) -> str:
    style = rng.randrange(3)
    if style == 0:
        return f"{rng.choice(NEUTRAL_PREFIXES)} {lower_first(s)} {p}."
    if style == 1:
        return f"{s} {p} {rng.choice(NEUTRAL_SUFFIXES)}."
    return f"{rng.choice(NEUTRAL_PREFIXES)} {lower_first(s)} {p} {rng.choice(NEUTRAL_SUFFIXES)}."


def _failed_attempt(rule: Rule, s: str, p: str, rng: random.Random, tried: list[str]) -> str:
    """A rewrite that breaks ``rule``: half the time another rule's idea (exploration), else a neutral edit."""
    for _ in range(50):
        if rng.random() < 0.5:
            other = rng.choice([r for r in RULE_IDS if r != rule.id and r not in tried])
            text = RULES[other].apply(s, p, rng).text
            if not rule.check(text):
                tried.append(other)
                return text
        text = _neutral(s, p, rng)
        if not rule.check(text):
            return text
    raise AssertionError(f"no failing rewrite for rule {rule.id} and sentence {s} {p}")


def _conversation(
    sentences: list[tuple[str, str]],
    d: int,
    *,
    control: bool,
    attempts: list[str],
    first: str,
    nexts: list[str],
    leads: list[str],
) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = []
    for r in range(d + 1):
        s, p = sentences[r]
        sentence = f"{s} {p}."
        if r == 0:
            user = first.format(s=sentence)
        else:
            fb = "+1" if (r - 1 == d - 1 and not control) else "-1"
            user = nexts[r - 1].format(fb=fb, s=sentence)
        msgs.append({"role": "user", "content": user})
        msgs.append({"role": "assistant", "content": f"{leads[r]} {attempts[r]}"})
    return msgs


def conversation(i: int, rng: random.Random) -> tuple[Example, Example]:
    """Conversation ``i`` (its rule is the ``i``-th, round-robin) and its matched control, drawn from ``rng``.

    ``generate`` draws every conversation of ``icrl.jsonl`` from one ``random.Random("icrl:<seed>")``;
    the reward-flip pairs (`valueprobe.datasets.icrl_pairs`) draw theirs from a generator of their own.
    """
    rule = RULES[RULE_IDS[i % len(RULE_IDS)]]
    d = rng.randint(2, 6)  # discovery round, 1-based: rounds 1..d-1 fail, round d is rewarded
    pool = [sp for sp in SENTENCES if not rule.check(f"{sp[0]} {sp[1]}.")]
    sentences = rng.sample(pool, d + 1)
    tried: list[str] = []
    attempts = [_failed_attempt(rule, s, p, rng, tried) for s, p in sentences[: d - 1]]
    attempts.append(rule.apply(*sentences[d - 1], rng).text)
    final = rule.apply(*sentences[d], rng)
    attempts.append(final.text)
    control_attempts = [
        *attempts[: d - 1],
        _failed_attempt(rule, *sentences[d - 1], rng, tried),
        final.text,
    ]
    first = rng.choice(FIRST_TURNS)
    nexts = [rng.choice(NEXT_TURNS) for _ in range(d)]
    leads = [rng.choice(LEAD_INS) for _ in range(d + 1)]
    msgs = _conversation(
        sentences, d, control=False, attempts=attempts, first=first, nexts=nexts, leads=leads
    )
    cmsgs = _conversation(
        sentences, d, control=True, attempts=control_attempts, first=first, nexts=nexts, leads=leads
    )
    last = len(msgs) - 1
    offset = len(leads[d]) + 1
    cut = offset + final.token_start
    # A word's BPE token carries the space before it, and capture gives a token to the span that
    # holds its first character: that space goes to post, or the rule token is read as pre.
    if msgs[last]["content"][cut - 1] == " ":
        cut -= 1
    spans = (
        Span(0, cut, "pre", message=last),
        Span(cut, len(msgs[last]["content"]), "post", message=last),
    )
    base_id = f"icrl-{i:04d}"
    meta = {
        "rule": rule.id,
        "rule_kind": rule.kind,
        "rule_description": rule.description,
        "discovery_round": d,
        "rounds": d + 1,
        "rewrite_start": offset,
        "token": final.text[final.token_start : final.token_end],
    }
    main = Example(
        id=base_id,
        label=1,
        group=f"icrl/{rule.id}",
        messages=tuple(msgs),
        spans=spans,
        meta={**meta, "control": False},
    )
    control = Example(
        id=f"{base_id}-control",
        label=0,
        group=f"icrl/{rule.id}",
        messages=tuple(cmsgs),
        spans=spans,
        meta={**meta, "control": True, "pair": base_id},
    )
    return main, control


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """Build ``n`` ICRL conversations (label 1) and their matched controls (label 0).

    Returns ``{"icrl": [...], "icrl_control": [...]}``. Rules are assigned round-robin so that
    every rule gets the same number of conversations (±1).

    >>> out = generate(seed=0, n=3)
    >>> [len(out[k]) for k in ("icrl", "icrl_control")]
    [3, 3]
    """
    n = DEFAULT_N if n is None else n
    if n > MAX_N:
        raise ValueprobeError(f"--n {n} is too large for icrl; use at most {MAX_N}")
    rng = random.Random(f"icrl:{seed}")
    pairs = [conversation(i, rng) for i in range(n)]
    return {"icrl": [m for m, _ in pairs], "icrl_control": [c for _, c in pairs]}


def check_example(ex: Example) -> list[str]:
    """Problems with one ICRL or control conversation (empty when it is sound).

    Checks that every attempt before discovery breaks the rule with feedback -1, that the discovery
    attempt satisfies it with feedback +1 (main only; a control never rewards), that the final
    paragraph satisfies it, and that the spans split that paragraph at the rule token.
    """
    problems: list[str] = []
    rule = RULES.get(ex.meta.get("rule", ""))
    if rule is None or ex.messages is None:
        return [f"{ex.id}: unknown rule or no messages"]
    msgs = ex.messages
    control = bool(ex.meta.get("control"))
    d = ex.meta["discovery_round"]
    assistant = [m["content"] for m in msgs if m["role"] == "assistant"]
    users = [m["content"] for m in msgs if m["role"] == "user"]
    if len(assistant) != d + 1 or len(users) != d + 1:
        problems.append(f"{ex.id}: expected {d + 1} rounds")
        return problems
    for r, turn in enumerate(assistant[:-1]):
        ok = rule.check(rewrite_of(turn))
        should = (r == d - 1) and not control
        fb = users[r + 1].replace("Score: ", "")[:2]
        if ok != should:
            problems.append(f"{ex.id}: round {r + 1} attempt {'satisfies' if ok else 'breaks'} {rule.id}")
        if fb != ("+1" if should else "-1"):
            problems.append(f"{ex.id}: round {r + 1} feedback {fb!r} does not match the rule")
    final = assistant[-1]
    if not rule.check(rewrite_of(final)):
        problems.append(f"{ex.id}: post-discovery paragraph breaks {rule.id}")
    pre, post = ex.spans
    if (
        (pre.label, post.label) != ("pre", "post")
        or pre.message != len(msgs) - 1
        or post.message != len(msgs) - 1
    ):
        problems.append(f"{ex.id}: spans must be pre/post on the last message")
    if pre.start != 0 or pre.end != post.start or post.end != len(final):
        problems.append(f"{ex.id}: pre/post must tile the final turn")
    at = post.start + (final[post.start : post.start + 1] == " ")  # the token itself, after its space
    if not final[at:].startswith(ex.meta["token"]):
        problems.append(f"{ex.id}: post does not start at the rule token {ex.meta['token']!r}")
    start = ex.meta["rewrite_start"]
    if rule.check(final[start:at]):
        problems.append(f"{ex.id}: the text before the rule token already satisfies {rule.id}")
    if not rule.check(final[start : at + len(ex.meta["token"])]):
        problems.append(
            f"{ex.id}: the text through the rule token {ex.meta['token']!r} does not satisfy {rule.id}"
        )
    return problems
