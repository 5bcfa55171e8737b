"""Preference family: DPO pairs for word preference and for safety.

    valueprobe datasets build --family preference --out data --seed 0

Word preference follows the paper's "How does preference learning affect the internal value
function" setup: "Select the item that stands out to you the most: dolphin / broccoli / ...",
chosen = the target word, rejected = each other option (one row per rejected option).
Held-out evaluation prompts (``preference_words_eval.jsonl``) use instruction wordings and
distractor words that never appear in training.

Safety pairs reuse the refusal family's requests: for a harmful request chosen = a refusal and
rejected = a compliant opening; for the matched benign request the reverse. The compliant
openings are one sentence and contain no instructions (non-operational on purpose).

Rows follow the dataset contract: ``messages`` = the prompt (one user turn), ``label`` = 1, and
``meta.chosen`` / ``meta.rejected`` hold the two assistant responses.
"""

from __future__ import annotations

import random
import re

from valueprobe.datasets.io import Example
from valueprobe.datasets.refusal import ACTION_PAIRS, REQUEST_TEMPLATES, refusal_pairs, split_of
from valueprobe.errors import ValueprobeError

DEFAULT_N = 20  # training prompts per target word; safety uses 8 * n pairs
MAX_N = 50
EVAL_PROMPTS = 10  # per target word

TARGETS: tuple[str, ...] = (
    "dolphin",
    "volcano",
    "lighthouse",
    "saxophone",
    "cinnamon",
    "telescope",
    "origami",
    "hummingbird",
    "lantern",
    "glacier",
    "pomegranate",
    "kaleidoscope",
)
DISTRACTORS: tuple[str, ...] = (
    "broccoli",
    "stapler",
    "spoon",
    "sock",
    "carpet",
    "pencil",
    "envelope",
    "bucket",
    "doorknob",
    "spreadsheet",
    "napkin",
    "eraser",
    "folder",
    "brick",
    "sponge",
    "toaster",
    "paperclip",
    "shoelace",
    "ruler",
    "doormat",
    "cabbage",
    "kettle",
    "mop",
    "hanger",
    "calculator",
    "binder",
    "gravel",
    "ladle",
    "coaster",
    "thermostat",
    "receipt",
    "tissue",
    "plank",
    "bolt",
    "clipboard",
    "dustpan",
    "lettuce",
    "funnel",
    "drawer",
    "tape",
    "button",
    "fork",
    "curtain",
    "sandpaper",
    "pillowcase",
    "colander",
    "hinge",
    "mailbox",
    "potato",
    "whisk",
    "cardboard",
    "faucet",
    "battery",
    "notepad",
    "bathmat",
    "padlock",
    "onion",
    "trowel",
    "cushion",
    "invoice",
)
TRAIN_INSTRUCTIONS: tuple[str, ...] = (
    "Select the item that stands out to you the most: {opts}",
    "Which of these do you like best? {opts}",
    "Pick one word from this list: {opts}",
    "Choose your favourite: {opts}",
    "Out of these, which one appeals to you most? {opts}",
)
EVAL_INSTRUCTIONS: tuple[str, ...] = (
    "If you had to pick one of these, which would it be? {opts}",
    "Name the option you prefer: {opts}",
    "Which item would you choose? {opts}",
)

REFUSALS: tuple[str, ...] = (
    "I'm sorry, but I can't help with that. It could hurt someone or get you into serious trouble.",
    "I can't help with that, because it would be dishonest and could harm other people.",
    "Sorry, I won't help with this one. If something is bothering you, I'm happy to look for a fair way to deal with it.",
)
COMPLIANCES: tuple[str, ...] = (
    "Sure, I can help you {a}. Here's a simple plan to get started.",
    "Of course! Here's how you can {a}, step by step.",
    "Happy to help. Let's go through how to {a}.",
)
OVER_REFUSAL = "I'm sorry, but I can't help with that."

_SWAPS = (
    ("I'm", "you're"),
    ("I", "you"),
    ("my", "your"),
    ("me", "you"),
    ("mine", "yours"),
    ("myself", "yourself"),
)


def second_person(action: str) -> str:
    """Turn a first-person request into the assistant's second-person echo ("my door" -> "your door")."""
    for first, second in _SWAPS:
        action = re.sub(rf"\b{re.escape(first)}(?![\w'])", second, action)
    return action


def _prompt(instruction: str, options: list[str]) -> str:
    return instruction.format(opts=" / ".join(options))


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """Word-preference DPO rows (``n`` prompts per target), eval prompts, and ``8 n`` safety pairs.

    >>> out = generate(seed=0, n=1)
    >>> sorted(out), out["preference_words"][0].meta["chosen"]
    (['preference_safety', 'preference_words', 'preference_words_eval'], 'dolphin')
    """
    n = DEFAULT_N if n is None else n
    if n > MAX_N:
        raise ValueprobeError(
            f"--n {n} is too large for preference (prompts per target word); use at most {MAX_N}"
        )
    rng = random.Random(f"preference:{seed}")
    train_pool, eval_pool = DISTRACTORS[0::2], DISTRACTORS[1::2]  # disjoint, so eval prompts are unseen
    words: list[Example] = []
    evals: list[Example] = []
    for target in TARGETS:
        seen: set[str] = set()
        for j in range(n + EVAL_PROMPTS):
            is_eval = j >= n
            pool, instructions = (
                (eval_pool, EVAL_INSTRUCTIONS) if is_eval else (train_pool, TRAIN_INSTRUCTIONS)
            )
            while True:
                options = [target, *rng.sample(pool, rng.randint(3, 5))]
                rng.shuffle(options)
                prompt = _prompt(rng.choice(instructions), options)
                if prompt not in seen:
                    seen.add(prompt)
                    break
            msgs = ({"role": "user", "content": prompt},)
            base = f"pw-{target}-{j:03d}"
            if is_eval:
                evals.append(
                    Example(
                        id=base,
                        label=1,
                        group=f"preference_words/{target}",
                        messages=msgs,
                        meta={"target": target, "options": options, "split": "eval"},
                    )
                )
                continue
            for other in options:
                if other != target:
                    words.append(
                        Example(
                            id=f"{base}-{other}",
                            label=1,
                            group=f"preference_words/{target}",
                            messages=msgs,
                            meta={
                                "chosen": target,
                                "rejected": other,
                                "target": target,
                                "options": options,
                                "split": "train",
                                "pair": base,
                            },
                        )
                    )
    safety: list[Example] = []
    n_safety = min(8 * n, len(ACTION_PAIRS) * len(REQUEST_TEMPLATES))
    for i, (tid, _, harmful, benign) in enumerate(refusal_pairs(n_safety, rng)):
        harmful_action, benign_action = (second_person(a) for a in ACTION_PAIRS[tid])
        pid = f"ps-{i:04d}"
        meta = {"pair": pid, "topic": tid, "split": split_of(tid)}
        safety.append(
            Example(
                id=f"{pid}-harmful",
                label=1,
                group="preference_safety/harmful",
                messages=({"role": "user", "content": harmful},),
                meta={
                    **meta,
                    "chosen": rng.choice(REFUSALS),
                    "rejected": rng.choice(COMPLIANCES).format(a=harmful_action),
                    "should_refuse": True,
                },
            )
        )
        safety.append(
            Example(
                id=f"{pid}-benign",
                label=1,
                group="preference_safety/benign",
                messages=({"role": "user", "content": benign},),
                meta={
                    **meta,
                    "chosen": rng.choice(COMPLIANCES).format(a=benign_action),
                    "rejected": OVER_REFUSAL,
                    "should_refuse": False,
                },
            )
        )
    return {"preference_words": words, "preference_words_eval": evals, "preference_safety": safety}
