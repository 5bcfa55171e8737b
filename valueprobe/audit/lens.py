"""Test e: logit lens. Does the axis promote the tokens that close a turn, or the words of success?

    from valueprobe.audit.lens import lens_test
    test = lens_test(axis, lm, dirs, k=50)

The axis's direction and each random direction go through the final norm and the unembedding
(`valueprobe.read.readout.logit_lens`, the same scaling for every direction). Of the ``k`` tokens
each promotes most, the share that close a turn (the tokenizer's end-of-turn and end-of-text
tokens, and the closing and sequencing words of `CLOSING`) is the rival's effect; the share of
success and certainty words (`SUCCESS`) is the value effect. A token counts by its text, stripped
of spaces and punctuation and lower-cased, matched whole against the lists. CIs resample the
``k`` tokens; the null is the same share for each random direction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from valueprobe.audit.reading import Directions
from valueprobe.audit.records import AuditTest, Effect, Role, verdict_of
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import logit_lens
from valueprobe.stats.null import mean_ci, null_range, percentile_in

__all__ = ["CLOSING", "SUCCESS", "closing_tokens", "lens_test"]

# Words that close a turn or say what comes after: the replication's logit lens found "afterwards",
# "thereafter", "follow-up", "ending" at the top of its axis.
CLOSING = frozenset(
    [
        "end",
        "ends",
        "ending",
        "ended",
        "finally",
        "final",
        "finish",
        "finished",
        "finishing",
        "done",
        "conclusion",
        "conclude",
        "concluded",
        "concluding",
        "afterwards",
        "afterward",
        "thereafter",
        "followup",
        "follow",
        "following",
        "next",
        "then",
        "later",
        "lastly",
        "last",
        "overall",
        "summary",
        "summarize",
        "summarise",
        "bye",
        "goodbye",
        "farewell",
        "thanks",
        "thank",
        "regards",
        "cheers",
        "etc",
        "hope",
        "subsequently",
        "eventually",
        "ultimately",
        "complete",
        "completed",
        "close",
        "closing",
    ]
)
# Words of success and certainty: what a reading of "this is going well" would promote.
SUCCESS = frozenset(
    [
        "correct",
        "correctly",
        "right",
        "yes",
        "success",
        "successful",
        "successfully",
        "succeed",
        "succeeded",
        "solved",
        "solve",
        "win",
        "won",
        "winning",
        "good",
        "great",
        "excellent",
        "perfect",
        "perfectly",
        "sure",
        "certain",
        "certainly",
        "confident",
        "confidently",
        "exactly",
        "indeed",
        "precisely",
        "definitely",
        "accurate",
        "accurately",
        "true",
        "works",
        "worked",
    ]
)
_STRIP = re.compile(r"[^a-z]")


def closing_tokens(lm: LoadedModel) -> frozenset[str]:
    """The tokenizer's special tokens that end a turn or a text (EOS and the chat template's end)."""
    tok = lm.tokenizer
    added = getattr(tok, "added_tokens_decoder", {}) or {}  # a chat template's markers are often added tokens
    specials = {str(t) for t in getattr(tok, "all_special_tokens", [])}
    specials |= {str(t.content) for t in added.values() if getattr(t, "special", False)}
    ends = {t for t in specials if any(w in t.lower() for w in ("end", "eos", "eot", "</s>"))}
    return frozenset(ends | ({str(tok.eos_token)} if tok.eos_token else set()))


def _is(token: str, words: frozenset[str], specials: frozenset[str]) -> bool:
    return token in specials or _STRIP.sub("", token.lower()) in words


def _shares(promoted: Sequence[tuple[str, float]], specials: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    tokens = [t for t, _ in promoted]
    closing = np.array([_is(t, CLOSING, specials) for t in tokens], dtype=np.float64)
    success = np.array([_is(t, SUCCESS, frozenset()) for t in tokens], dtype=np.float64)
    return closing, success


def _effect(name: str, role: Role, axis: np.ndarray, null: np.ndarray, *, seed: int) -> Effect:
    share = float(axis.mean())
    return Effect(
        name=name, role=role, expected="+", estimate=share, ci=mean_ci(axis, seed=seed), unit="share",
        reference=share, null=null_range(null), null_percentile=percentile_in(share, null), n=int(axis.size),
        n_positive=int(axis.sum()),
    )  # fmt: skip


def lens_test(
    axis: ValueAxis, lm: LoadedModel, dirs: Directions, *, k: int = 50, seconds: float = 0.0, seed: int = 0
) -> AuditTest:
    """Test e: closing and success shares of the top-``k`` promoted tokens, against random directions."""
    one = axis[dirs.layer]
    specials = closing_tokens(lm)
    lenses = [logit_lens(one, lm, layer=dirs.layer, k=k)]
    for j in range(1, dirs.matrix.shape[0]):
        random = replace(one, directions=torch.from_numpy(dirs.matrix[j]).float()[None])
        lenses.append(logit_lens(random, lm, layer=dirs.layer, k=k))
    shares = [_shares(lens["promoted"], specials) for lens in lenses]
    closing = np.array([c.mean() for c, _ in shares[1:]])
    success = np.array([s.mean() for _, s in shares[1:]])
    value = _effect(f"success words among the top {k} promoted", "value", shares[0][1], success, seed=seed)
    rival = _effect(
        f"turn-closing tokens among the top {k} promoted", "rival", shares[0][0], closing, seed=seed
    )
    bottom = _shares(lenses[0]["suppressed"], specials)
    verdict, why = verdict_of(value, rival, None)
    top = ", ".join(repr(t) for t, _ in lenses[0]["promoted"][:12])
    marked = [t for t, _ in lenses[0]["promoted"] if _is(t, CLOSING, specials)]
    return AuditTest(
        key="e",
        title="Logit lens: closing tokens or success words",
        design=(
            f"The top {k} tokens the direction promotes through the final norm and the unembedding; the share"
            f" that close a turn ({', '.join(sorted(specials))} and the closing words: {', '.join(sorted(CLOSING))})"
            f" and the share of success words ({', '.join(sorted(SUCCESS))}), beside random directions."
        ),
        effects=(value, rival),
        verdict=verdict,
        why=why,
        held_fixed=None,
        cost=f"{len(lenses)} directions through the unembedding, no forward",
        seconds=seconds,
        notes=(
            f"top promoted: {top}",
            f"closing tokens among them: {', '.join(repr(t) for t in marked) or 'none'}",
            f"among the top {k} suppressed: closing {bottom[0].mean():.2f}, success {bottom[1].mean():.2f}",
        ),
    )
