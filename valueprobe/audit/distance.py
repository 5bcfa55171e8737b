"""Test c: distance to the end. Does the reading track how many tokens are left in the turn?

    from valueprobe.audit.distance import answer_examples, read_answers, distance_test
    reads = read_answers(lm, dirs, answer_examples(prompts, answers), site=axis.site)
    test = distance_test(reads, dirs)

On the model's own answers to neutral prompts (`valueprobe.audit.sampled`; only answers that ended
on EOS, so the end of the turn is known), every answer token's reading is regressed jointly on the
tokens remaining in the turn and on its absolute position. Their partial correlations say what
each explains with the other held fixed (across answers of different lengths after prompts of
different lengths, the two part ways). The AUROC of the answer's last 10% of tokens against its
first 10% says how well the reading tells the end from the start. Each is set beside random
directions on the same tokens; CIs resample whole answers. Nothing here varies value, so this test
measures the rival alone: its verdict is "the rival" or "neither".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from valueprobe.audit.effects import statistic_effect
from valueprobe.audit.reading import Directions, read_spans
from valueprobe.audit.records import AuditTest, Curve, verdict_of
from valueprobe.audit.sampled import Chat
from valueprobe.datasets.io import Example, Span
from valueprobe.model.load import LoadedModel
from valueprobe.stats.metrics import auroc, partial_correlations
from valueprobe.steering.decode.generation import Generation
from valueprobe.vocab import ChatTemplate, Site

__all__ = ["AnswerReads", "answer_examples", "distance_test", "read_answers"]

ANSWER = "answer"
DESIGN = (
    "The model's own sampled answers to neutral prompts (only those that ended on EOS). Each answer token's"
    " reading is regressed on the tokens remaining in the turn and on its absolute position together;"
    " partial correlations, and the AUROC of the last 10% of each answer's tokens against its first 10%,"
    " beside random directions on the same tokens. Value does not vary here: it measures the rival only."
)


def answer_examples(prompts: Sequence[Chat], answers: Sequence[Generation]) -> list[Example]:
    """Each finished, non-empty answer as a chat ending in it, its content one ``answer`` span."""
    out = []
    for g in answers:
        if not g.finished or not g.text.strip():
            continue
        chat = (*prompts[g.prompt], {"role": "assistant", "content": g.text})
        out.append(
            Example(
                id=f"answer-{g.prompt:04d}-{g.sample}",
                label=1,
                group="answers",
                messages=chat,
                spans=(Span(0, len(g.text), ANSWER, message=len(chat) - 1),),
            )
        )
    return out


@dataclass(frozen=True)
class AnswerReads:
    """Every answer token's reading [tokens, 1 + k] (neutral σ), its answer, the tokens left in the
    turn after it, and its absolute position."""

    proj: np.ndarray
    answer: np.ndarray  # int64 [tokens]
    remaining: np.ndarray  # float64 [tokens]
    position: np.ndarray  # float64 [tokens]
    n_answers: int
    n_tokens: int


def read_answers(
    lm: LoadedModel,
    dirs: Directions,
    examples: Sequence[Example],
    *,
    site: Site,
    chat_template: ChatTemplate = ChatTemplate.model,
    batch_size: int = 8,
    on_batch: Callable[[int], object] | None = None,
) -> AnswerReads:
    """One forward per answer; the reading on each of its tokens."""
    reads = read_spans(
        lm, examples, layer=dirs.layer, site=site, labels=[ANSWER], chat_template=chat_template,
        batch_size=batch_size, on_batch=on_batch,
    )  # fmt: skip
    rows, answer, remaining = [], [], []
    for i in range(len(examples)):
        r = reads.rows(i, ANSWER)
        rows.append(r)
        answer.append(np.full(len(r), i))
        remaining.append(np.arange(len(r) - 1, -1, -1, dtype=np.float64))
    idx = np.concatenate(rows)
    return AnswerReads(
        proj=dirs.in_reference(reads.hidden[idx]),
        answer=np.concatenate(answer),
        remaining=np.concatenate(remaining),
        position=reads.position[idx].astype(np.float64),
        n_answers=len(examples),
        n_tokens=int(reads.n_tokens.sum()),
    )


def _take(reads: AnswerReads, units: np.ndarray) -> np.ndarray:
    """Token rows of the answers ``units`` (with repeats, as a bootstrap draws them)."""
    by = [np.flatnonzero(reads.answer == u) for u in range(reads.n_answers)]
    return np.concatenate([by[u] for u in units])


def _partial(reads: AnswerReads, which: int) -> Callable[[np.ndarray, slice], np.ndarray]:
    def stat(units: np.ndarray, columns: slice) -> np.ndarray:
        rows = _take(reads, units)
        x = np.stack([reads.remaining[rows], reads.position[rows]], axis=1)
        return partial_correlations(reads.proj[rows][:, columns], x)[which]

    return stat


def _ends(reads: AnswerReads) -> tuple[np.ndarray, np.ndarray]:
    """Per token: 1 in its answer's last 10%, 0 in its first 10%, -1 otherwise; and nothing else."""
    label = np.full(len(reads.answer), -1.0)
    for u in range(reads.n_answers):
        rows = np.flatnonzero(reads.answer == u)
        k = max(1, math.ceil(0.1 * len(rows)))
        if len(rows) >= 2 * k:
            label[rows[:k]], label[rows[-k:]] = 0.0, 1.0
    return label, reads.answer


def _end_auroc(reads: AnswerReads) -> Callable[[np.ndarray, slice], np.ndarray]:
    label, _ = _ends(reads)

    def stat(units: np.ndarray, columns: slice) -> np.ndarray:
        rows = _take(reads, units)
        rows = rows[label[rows] >= 0]
        p = reads.proj[rows][:, columns]
        return np.array([auroc(p[:, j], label[rows]) for j in range(p.shape[1])])

    return stat


def _curve(reads: AnswerReads, factor: float) -> Curve:
    """Mean axis reading by tokens remaining (bins of 5, the last 60 tokens of the turn)."""
    xs, ys, lo, hi = [], [], [], []
    for start in range(0, 60, 5):
        sel = (reads.remaining >= start) & (reads.remaining < start + 5)
        if sel.sum() < 3:
            continue
        y = reads.proj[sel, 0] * factor
        xs.append(float(start + 2))
        ys.append(float(y.mean()))
        half = 1.96 * y.std(ddof=1) / np.sqrt(sel.sum())
        lo.append(float(y.mean() - half))
        hi.append(float(y.mean() + half))
    return Curve("axis reading by tokens left", x=tuple(xs), y=tuple(ys), lo=tuple(lo), hi=tuple(hi),
                 x_label="tokens remaining in the turn", y_label="mean reading (σ)")  # fmt: skip


def distance_test(
    reads: AnswerReads, dirs: Directions, *, n_sampled: int, seconds: float, generated: int, seed: int = 0
) -> AuditTest:
    """Test c's effects, null and verdict (the rival only)."""
    n = reads.n_answers
    remaining = statistic_effect(
        "partial r with tokens remaining (position held fixed)", "rival", "±", _partial(reads, 0),
        n_units=n, unit="r", seed=seed,
    )  # fmt: skip
    effects = (
        remaining,
        statistic_effect(
            "partial r with absolute position (tokens remaining held fixed)", "context", "±",
            _partial(reads, 1), n_units=n, unit="r", seed=seed,
        ),
        statistic_effect(
            "AUROC, last 10% of the turn vs first 10%", "context", "±", _end_auroc(reads),
            n_units=n, unit="AUROC", neutral=0.5, seed=seed,
        ),
    )  # fmt: skip
    verdict, why = verdict_of(None, remaining, None)
    factor = dirs.axis_units() if np.isfinite(dirs.axis_units()) else 1.0
    return AuditTest(
        key="c",
        title="Distance to the end of the turn",
        design=DESIGN,
        effects=effects,
        verdict=verdict,
        why=why,
        held_fixed=None,
        cost=f"{n_sampled} answers sampled ({generated} tokens), {n} sequences, {reads.n_tokens} tokens forwarded",
        seconds=seconds,
        notes=(f"{n} of {n_sampled} sampled answers ended on EOS and are read; the rest have no known end",),
        curves=(_curve(reads, factor),),
    )
