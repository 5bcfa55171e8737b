"""ICRL reward-flip pairs: one conversation twice, its rule-satisfying round scored +1 or -1, for patching.

    valueprobe datasets build --family icrl_pairs --out data --seed 0
    valueprobe attribute --probe probes/smollm2-135m-reward-history --data data/icrl_pairs.jsonl --method patch ...

Each pair is an ICRL conversation (`valueprobe.datasets.icrl.conversation`, drawn from its own
``random.Random("icrl_pairs:<seed>")``, so none is a conversation of ``icrl.jsonl``) in two rows:

* ``rewarded`` (label 1): as in ``icrl.jsonl``: rounds before ``d`` fail and are scored ``-1``, the
  round-``d`` attempt follows the rule and is scored ``+1``, round ``d + 1`` applies the rule;
* ``flipped`` (label 0): the same text with one character changed, the ``+`` of that ``+1`` made a
  ``-``: the rule-satisfying attempt is scored ``-1``, so the history never rewards the rule.

Both end with one more user turn asking a yes/no question ("Have you worked out my rule? Answer
yes or no."), so the model's answer is a behaviour readout (``meta.behaviour = "yes_no"``): the
yes/no logit difference at the assistant's first token. The ``pre``/``post`` spans of the
post-discovery paragraph are the ones ``icrl.jsonl`` has. A ``+`` and a ``-`` before a digit are
one token each in byte-level BPE tokenizers, so the rows of a pair have the same length and aligned
positions; ``valueprobe attribute`` checks it under the model it runs, and refuses a pair that is
not, in one line naming it and the first position where its token ids differ.
"""

from __future__ import annotations

import random

from valueprobe.datasets import icrl
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError

DEFAULT_N = 96  # two conversations per rule
MAX_N = 5_000
CONSTRUCTION = "reward-flip"
QUESTIONS: tuple[str, ...] = (
    "Have you worked out my rule? Answer yes or no.",
    "Do you think you have found my rule? Answer yes or no.",
    "Do you know the hidden rule now? Answer yes or no.",
)


def _note(d: int) -> str:
    return (
        f"identical text but one character: the user's score of the round-{d} attempt, which follows the"
        " rule, is +1 in the rewarded row and -1 in the flipped row, so the flipped history never rewards"
        " the rule"
    )


def _pair(i: int, rng: random.Random) -> tuple[Example, Example]:
    main, _ = icrl.conversation(i, rng)
    assert main.messages is not None
    d = int(main.meta["discovery_round"])
    scored = 2 * d  # messages: user 0, assistant 0, ..., user d (scores round d's attempt), assistant d
    text = main.messages[scored]["content"]
    if text.count("+1") != 1:  # the scores are the only "+1" a user turn after the first holds
        raise ValueprobeError(f"conversation {i}: round {d}'s score is not one '+1' in {text[:60]!r}")
    at = text.index("+1")
    question = {"role": "user", "content": rng.choice(QUESTIONS)}
    rewarded = [*map(dict, main.messages), question]
    flipped = [dict(m) for m in rewarded]
    flipped[scored]["content"] = text[:at] + "-" + text[at + 1 :]
    pair = f"pair-{i:04d}"
    meta = {
        **{k: v for k, v in main.meta.items() if k != "control"},
        "pair": pair,
        "construction": CONSTRUCTION,
        "construction_note": _note(d),
        "flipped_message": scored,
        "flipped_char": at,
        "behaviour": "yes_no",
    }
    rows = []
    for role, label, msgs in (("rewarded", 1, rewarded), ("flipped", 0, flipped)):
        rows.append(
            Example(
                id=f"{pair}-{role}",
                label=label,
                group=main.group,
                messages=tuple(msgs),
                spans=main.spans,
                meta={**meta, "role": role},
            )
        )
    return rows[0], rows[1]


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """``n`` reward-flip pairs, both rows of each in turn (rewarded, then flipped): ``{"icrl_pairs": [...]}``.

    >>> rows = generate(seed=0, n=2)["icrl_pairs"]
    >>> [ex.id for ex in rows]
    ['pair-0000-rewarded', 'pair-0000-flipped', 'pair-0001-rewarded', 'pair-0001-flipped']
    """
    n = DEFAULT_N if n is None else n
    if n > MAX_N:
        raise ValueprobeError(f"--n {n} is too large for icrl_pairs; use at most {MAX_N}")
    rng = random.Random(f"icrl_pairs:{seed}")
    return {"icrl_pairs": [row for i in range(n) for row in _pair(i, rng)]}
