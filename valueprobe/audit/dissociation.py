"""Test d: steering dissociation. Steered up the axis, does the model end sooner, or grow surer?

    from valueprobe.audit.dissociation import steer_rows, dissociation_test
    rows = steer_rows(lm, axis, dirs, prompts, alphas=(-30, 30), n_random=4)
    test = dissociation_test(rows)

Each prompt (`valueprobe.audit.sampled`) is answered with α·v̂ added at the axis's layer on every
position, α in % of the layer's mean residual norm (the paper's unit, the same push for the axis
and for each random direction), sampled with common random numbers across strengths. Then, under
the same steering, the model is asked for a 0–10 rating of its answer (`CONFIDENCE`), read
greedily and parsed by `parse_confidence`. The slopes of answer length and of stated confidence
against α, per 10% of the norm, are set beside the same slopes along random directions; CIs
resample prompts. An answer whose rating does not parse is counted; where more than half of one
α's ratings do not parse, that α's ratings are marked unreliable and left out of the slope.

Value effect: the confidence slope; it stays with the rival held fixed if its partial slope, with
length held fixed (both residualised on length), keeps its CI above 0. Rival: the length slope.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from valueprobe.audit.reading import Directions
from valueprobe.audit.records import AuditTest, Curve, Effect, Role, Sign, verdict_of
from valueprobe.audit.sampled import ANSWERS, Chat, as_prompt
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.records import Record
from valueprobe.stats.metrics import Slope, dose_slope
from valueprobe.stats.null import null_range, percentile_in
from valueprobe.steering.decode.generation import encode_prompts, generate
from valueprobe.steering.decode.rows import RowSpec, generate_rows
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import ChatTemplate, Unit

__all__ = ["CONFIDENCE", "PER", "SteerRow", "dissociation_test", "parse_confidence", "steer_rows"]

CONFIDENCE = "On a scale from 0 to 10, how confident are you that your answer is good? Reply with one number."
PER = 10.0  # slopes are given per 10% of the layer's mean residual norm
UNRELIABLE = 0.5  # a larger share of unparsed ratings at one α marks that α unreliable
DESIGN = (
    "Neutral prompts answered with α·v̂ added at the axis's layer (α in % of the mean residual norm), sampled"
    " with common random numbers, then asked under the same steering: '" + CONFIDENCE + "' (greedy, parsed:"
    " 'N/10', 'N out of 10', 'N%' as N/10, or a first number 0–10). Slopes of answer length (tokens) and of"
    " stated confidence against α, beside random directions at the same %-norm strengths."
)

_OUT_OF = re.compile(r"(\d+(?:\.\d+)?)\s*(?:/|out of)\s*10\b")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)")


def parse_confidence(text: str) -> float | None:
    """A 0–10 rating from a reply: ``N/10`` or ``N out of 10``, then ``N%`` (as N/10), then the first
    number if it is within 0–10; None when none of these is there.

    >>> parse_confidence("I'm 90% confident"), parse_confidence("8/10"), parse_confidence("Maybe 12")
    (9.0, 8.0, None)
    """
    for pattern, scale in ((_OUT_OF, 1.0), (_PERCENT, 0.1)):
        m = pattern.search(text)
        if m:
            value = float(m.group(1)) * scale
            return value if 0.0 <= value <= 10.0 else None
    m = _NUMBER.search(text)
    if m and 0.0 <= float(m.group(1)) <= 10.0:
        return float(m.group(1))
    return None


@dataclass(frozen=True)
class SteerRow(Record):
    """One steered answer: its direction (0 the axis), prompt, α (% norm), length, and the rating."""

    direction: int
    prompt: int
    alpha: float
    n_tokens: int
    finished: bool
    rating_text: str
    confidence: float | None


def _spec(axis: ValueAxis, dirs: Directions, j: int) -> SteeringSpec:
    direction = None if j == 0 else torch.from_numpy(dirs.matrix[j]).float()
    return SteeringSpec(axis, layers=dirs.layer, unit=Unit.norm, direction=direction,
                        direction_name="axis" if j == 0 else f"random-{j - 1}")  # fmt: skip


def steer_rows(
    lm: LoadedModel,
    axis: ValueAxis,
    dirs: Directions,
    prompts: Sequence[Chat],
    *,
    alphas: Sequence[float],
    direction: int,
    decoding: Decoding = ANSWERS,
    chat_template: ChatTemplate = ChatTemplate.model,
    batch_size: int = 32,
    progress: bool = True,
) -> list[SteerRow]:
    """Every (prompt, α) row steered along direction ``direction`` (0: the axis), with its rating."""
    spec = _spec(axis, dirs, direction)
    gens = generate(
        lm, spec, [as_prompt(p, chat_template) for p in prompts], alphas=alphas, decoding=decoding,
        batch_size=batch_size, progress=progress,
    )  # fmt: skip
    asks = [(*prompts[g.prompt], {"role": "assistant", "content": g.text}, {"role": "user", "content": CONFIDENCE})
            for g in gens]  # fmt: skip
    ids = encode_prompts(lm, [as_prompt(a, chat_template) for a in asks])
    replies: list[str] = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        outs = generate_rows(lm, spec, [RowSpec(tuple(i), max_new_tokens=12) for i in chunk],
                             [g.alpha for g in gens[start : start + batch_size]])  # fmt: skip
        replies += [lm.tokenizer.decode(list(o.token_ids), skip_special_tokens=True) for o in outs]
    return [
        SteerRow(
            direction=direction,
            prompt=g.prompt,
            alpha=g.alpha,
            n_tokens=len(g.token_ids),
            finished=g.finished,
            rating_text=r,
            confidence=parse_confidence(r),
        )  # fmt: skip
        for g, r in zip(gens, replies, strict=True)
    ]


def _along(rows: Sequence[SteerRow], j: int) -> list[SteerRow]:
    """Direction ``j``'s rows and the shared α = 0 rows."""
    return [r for r in rows if r.direction == j or r.alpha == 0]


def _unreliable(rows: Sequence[SteerRow]) -> tuple[dict[float, float], set[float]]:
    """The share of unparsed ratings at each α of ``rows``, and the α where it is over half."""
    shares = {
        a: float(np.mean([r.confidence is None for r in rows if r.alpha == a]))
        for a in sorted({r.alpha for r in rows})
    }
    return shares, {a for a, share in shares.items() if share > UNRELIABLE}


def _slopes(rows: Sequence[SteerRow], value: str, n_dirs: int, *, reliable_only: bool) -> list[Slope]:
    """The slope along each direction; ratings only at the α where that direction's are reliable."""
    out = []
    for j in range(n_dirs):
        skip = _unreliable(_along(rows, j))[1] if reliable_only else set()
        mine = [r for r in _along(rows, j) if r.alpha not in skip]
        mine = [r for r in mine if getattr(r, value) is not None]
        out.append(dose_slope([r.alpha for r in mine], [float(getattr(r, value)) for r in mine],
                              [str(r.prompt) for r in mine]))  # fmt: skip
    return out


def _effect(name: str, role: Role, expected: Sign, slopes: list[Slope], *, unit: str) -> Effect:
    axis, null = slopes[0], np.array([s.slope * PER for s in slopes[1:]])
    return Effect(
        name=name, role=role, expected=expected, estimate=axis.slope * PER,
        ci=(axis.ci[0] * PER, axis.ci[1] * PER), unit=unit, reference=axis.slope * PER,
        null=null_range(null), null_percentile=percentile_in(axis.slope * PER, null), n=axis.n_prompts,
    )  # fmt: skip


def _partial_slope(rows: Sequence[SteerRow], skip: set[float]) -> Slope:
    """Confidence on α with length held fixed (Frisch–Waugh: both residualised on length), the axis's rows."""
    mine = [r for r in rows if r.direction == 0 and r.confidence is not None and r.alpha not in skip]
    a, c, n = (
        np.array([getattr(r, k) for r in mine], dtype=np.float64) for k in ("alpha", "confidence", "n_tokens")
    )
    x = np.column_stack([np.ones(len(n)), n])

    def resid(y: np.ndarray) -> np.ndarray:
        return y - x @ np.linalg.lstsq(x, y, rcond=None)[0]

    return dose_slope(resid(a), resid(c), [str(r.prompt) for r in mine])


def _curves(rows: Sequence[SteerRow], n_dirs: int, skip: set[float]) -> tuple[Curve, ...]:
    """Mean length and stated confidence by α for each direction (confidence at the reliable α only),
    and the share of the axis's answers that ended on EOS (the rest ran to the token cap)."""
    out = []
    for value, label in (("n_tokens", "answer length (tokens)"), ("confidence", "stated confidence (0–10)")):
        for j, name in ((0, "axis"), *((j, "random") for j in range(1, n_dirs))):
            mine = [r for r in rows if (r.direction == j or r.alpha == 0) and getattr(r, value) is not None]
            mine = [r for r in mine if value == "n_tokens" or r.alpha not in skip]
            xs = sorted({r.alpha for r in mine})
            ys = [float(np.mean([getattr(r, value) for r in mine if r.alpha == x])) for x in xs]
            out.append(
                Curve(
                    f"{label}: {name}", tuple(xs), tuple(ys), x_label="α (% of the mean norm)", y_label=label
                )
            )
    axis = [r for r in rows if r.direction == 0]
    xs = sorted({r.alpha for r in axis})
    ended = [float(np.mean([r.finished for r in axis if r.alpha == x])) for x in xs]
    out.append(Curve("ended on EOS (share): axis", x=tuple(xs), y=tuple(ended), x_label="α (% of the mean norm)",
                     y_label="share of answers"))  # fmt: skip
    return tuple(out)


def dissociation_test(rows: Sequence[SteerRow], *, seconds: float, cost: str) -> AuditTest:
    """Test d's slopes, null and verdict."""
    n_dirs = max(r.direction for r in rows) + 1
    alphas = sorted({r.alpha for r in _along(rows, 0)})
    unparsed, skip = _unreliable(_along(rows, 0))  # the axis's; each random direction is judged on its own
    length = _effect(f"length slope (tokens per {PER:g}% norm)", "rival", "±",
                     _slopes(rows, "n_tokens", n_dirs, reliable_only=False), unit="tokens")  # fmt: skip
    confidence = _effect(f"stated-confidence slope (points per {PER:g}% norm)", "value", "+",
                         _slopes(rows, "confidence", n_dirs, reliable_only=True), unit="points")  # fmt: skip
    partial = _partial_slope(rows, skip)
    held = bool(partial.ci[0] > 0)
    verdict, why = verdict_of(confidence, length, held)
    notes = (
        "unparsed ratings by α along the axis: " + ", ".join(f"{a:+g}: {unparsed[a]:.0%}" for a in alphas)
        + ("; unreliable (over half unparsed), left out: " + ", ".join(f"{a:+g}" for a in sorted(skip)) if skip else ""),
        f"confidence slope with length held fixed: {partial.slope * PER:+.3f} [{partial.ci[0] * PER:+.3f},"
        f" {partial.ci[1] * PER:+.3f}] per {PER:g}% norm",
        f"{n_dirs - 1} random directions steered as the null",
    )  # fmt: skip
    return AuditTest(
        key="d", title="Steering dissociation: length or stated confidence", design=DESIGN,
        effects=(confidence, length), verdict=verdict, why=why, held_fixed=held, cost=cost,
        seconds=seconds, notes=notes, curves=_curves(rows, n_dirs, skip),
    )  # fmt: skip
