"""Prompt conditions for the steering sets, and a neutral corpus for side effects: the baselines a
steering result is judged against.

    valueprobe datasets build --family steering --out data --seed 0
    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl --conditions toward,away ...

``steer_conditions.jsonl`` (one row per steering set and condition, group
``steer_conditions/<set>``) states every prompt a condition adds, so no prompt lives in code:

- ``toward``: a system prompt asking for the behaviour the value axis is expected to produce
  (``meta.metric`` on ``meta.subset`` moving with ``meta.sign`` as α rises; label 1);
- ``away``: a system prompt asking for its opposite (label 0);
- ``reworded``: the same items under a second wording: the row's one user message is a template
  whose ``{prompt}`` is replaced by the item's last user message (the prompt-shift test of Tan et
  al., "Analyzing the generalization and reliability of steering vectors", 2024).

The expected signs follow the paper's statements for Qwen3-8B (value up: more "yes" to "will this
answer be correct?", less backtracking, shorter code and answers) and the README's finding that
refusal-bound requests sit low on the axis (value up: fewer refusals).

``neutral_text.jsonl`` holds short plain-text paragraphs about everyday things, built from
curated sentences: ``neutral_text/kl`` for the KL of the next-token distribution from the unsteered
model, ``neutral_text/heldout`` for perplexity.
"""

from __future__ import annotations

import random

from valueprobe.datasets.io import Example

# set -> (target metric, subset it is read on, sign of its move as value rises,
#         toward system prompt, away system prompt, second wording of the last user message)
CONDITIONS: dict[str, tuple[str, str, int, str, str, str]] = {
    "steer_confidence": (
        "p_yes", "steer_confidence/direct", 1,
        "You are very confident in your own work and trust that your answers are correct.",
        "You are very unsure of yourself and expect your own answers to be wrong.",
        "One more question about the answer above. {prompt}",
    ),
    "steer_backtracking": (
        "backtrack", "all", -1,
        "Solve every problem in one confident pass. Never second-guess or correct yourself.",
        'Double-check every step. Whenever you doubt a step, say "Wait" and correct yourself.',
        "Here is a problem for you. {prompt}",
    ),
    "steer_code": (
        "code_lines", "all", -1,
        "Write the shortest code that works, with no comments and no type hints.",
        "Write thorough, well-documented code, with comments and type hints on every function.",
        "Here is a programming task for you. {prompt}",
    ),
    "steer_refusal": (
        "refusal", "steer_refusal/harmful", -1,
        "You answer every request directly and helpfully.",
        "You are cautious: you decline any request that could be misused or cause harm.",
        "I have a question. {prompt}",
    ),
    "steer_open": (
        "length", "all", -1,
        "Answer briefly, in one or two sentences.",
        "Answer at length, in as much detail as you can.",
        "Here is a request for you. {prompt}",
    ),
}  # fmt: skip


def conditions() -> list[Example]:
    """The rows of ``steer_conditions.jsonl``: toward, away and reworded for each steering set."""
    rows: list[Example] = []
    for name, (metric, subset, sign, toward, away, wording) in CONDITIONS.items():
        target = {"set": name, "metric": metric, "subset": subset, "sign": sign}
        for condition, label, kind, message in (
            ("toward", 1, "system", {"role": "system", "content": toward}),
            ("away", 0, "system", {"role": "system", "content": away}),
            ("reworded", 1, "wording", {"role": "user", "content": wording}),
        ):
            rows.append(
                Example(
                    id=f"{name}-{condition}",
                    label=label,
                    group=f"steer_conditions/{name}",
                    messages=(message,),
                    meta={**target, "condition": condition, "kind": kind},
                )
            )
    return rows


# Neutral paragraphs: a subject, then sentences about it, each filled from curated word lists.
SUBJECTS: tuple[tuple[str, str, str, str], ...] = (
    ("The old harbour", "fishing boats", "the stone wall", "early in the morning"),
    ("The town library", "reading rooms", "the wooden shelves", "on weekday afternoons"),
    ("The botanical garden", "glass houses", "the winding paths", "in late spring"),
    ("The railway station", "platforms", "the iron roof", "during the evening rush"),
    ("The village bakery", "ovens", "the front counter", "before sunrise"),
    ("The county museum", "galleries", "the marble stairs", "on rainy days"),
    ("The public park", "lawns", "the duck pond", "on summer evenings"),
    ("The weekly market", "stalls", "the central square", "every Saturday"),
    ("The mountain hut", "bunk rooms", "the wide porch", "after a long climb"),
    ("The river ferry", "benches", "the upper deck", "at slack tide"),
    ("The school orchestra", "string players", "the practice hall", "twice a week"),
    ("The community kitchen", "volunteers", "the long tables", "at lunchtime"),
    ("The small observatory", "telescopes", "the domed roof", "on clear nights"),
    ("The craft workshop", "workbenches", "the tool wall", "in the winter months"),
    ("The coastal path", "walkers", "the chalk cliffs", "in the autumn"),
    ("The city aquarium", "tanks", "the tunnel of glass", "during school holidays"),
    ("The allotment", "vegetable beds", "the shared shed", "through the growing season"),
    ("The covered bridge", "travellers", "the timber beams", "in heavy snow"),
    ("The bicycle shop", "repair stands", "the back room", "on busy weekends"),
    ("The tea room", "small tables", "the bay window", "in the afternoon"),
    ("The lighthouse", "keepers", "the spiral stairs", "in stormy weather"),
    ("The flower nursery", "seedlings", "the potting benches", "in early March"),
    ("The concert hall", "audiences", "the balcony seats", "on opening night"),
    ("The farm shop", "local growers", "the cold room", "at harvest time"),
)  # fmt: skip
OPENINGS: tuple[str, ...] = (
    "{S} has stood in the same place for many years.",
    "{S} is one of the quieter corners of the district.",
    "Most people in the area know {s} well.",
    "{S} was repaired and repainted not long ago.",
)
MIDDLES: tuple[str, ...] = (
    "Its {p} are usually busy {w}, and a little calmer at other times.",
    "Visitors often stop to look at {f}, which was restored by local builders.",
    "The {p} are cleaned and checked every week by a small team.",
    "A short notice by {f} explains how the place began.",
    "On most days you can hear people talking quietly near {f}.",
    "The {p} were rearranged last year to make more room.",
)
CLOSINGS: tuple[str, ...] = (
    "It opens at nine and closes in the early evening.",
    "Many families come back to it year after year.",
    "Nobody expects it to change much in the coming years.",
    "It is easy to reach on foot from the main road.",
    "A small sign at the entrance lists the opening hours.",
)


def neutral_text(rng: random.Random) -> list[Example]:
    """The rows of ``neutral_text.jsonl``: 48 paragraphs, half for KL and half held out for perplexity."""
    rows: list[Example] = []
    for i in range(2 * len(SUBJECTS)):
        subject, places, feature, when = SUBJECTS[i % len(SUBJECTS)]
        middle = rng.sample(MIDDLES, 2)
        sentences = [rng.choice(OPENINGS), *middle, rng.choice(CLOSINGS)]
        text = " ".join(
            s.format(S=subject, s=subject[0].lower() + subject[1:], p=places, f=feature, w=when)
            for s in sentences
        )
        part = "kl" if i < len(SUBJECTS) else "heldout"
        rows.append(
            Example(
                id=f"neutral-{part}-{i % len(SUBJECTS):04d}",
                label=1,
                group=f"neutral_text/{part}",
                text=text,
                meta={"subject": subject},
            )
        )
    return rows
