"""Test b: cut invariance. Is the construction contrast a jump at the reward event, or a ramp?

    from valueprobe.audit.cut import cut_examples, read_cuts, cut_test
    examples = cut_examples(read_jsonl("icrl")[:48])          # adds a cut to each failed attempt
    test = cut_test(read_cuts(lm, dirs, examples, site=axis.site), dirs)

The construction contrast of one paragraph is the mean reading after a cut minus the mean before
it. At the real cut (the rule-satisfying token, where the ``post`` span starts) it is what the axis
was fitted to separate. Moved to placebo fractions 0.1 … 0.9 of the same paragraph's tokens, a
jump at the reward event shrinks on both sides of the real cut; a quantity that ramps through the
response gives the same contrast at every cut (the mean after minus the mean before of a line is
half its rise, wherever the cut falls). In each failed attempt (an earlier assistant turn the user
scored -1), cut at the word nearest the real cut's fraction of its paragraph, nothing was earned:
a ramp shows the same contrast there, a reading of value none.

Value effect: real-cut contrast − failed-attempt contrast, paired per conversation; it stays with
the ramp held fixed if the real cut also beats the mean of the placebo cuts of its own paragraph.
Rival effect: the failed attempts' contrast itself. The Spearman correlation of the contrast with
the cut fraction is reported beside them (the replication's flat −0.077).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from valueprobe.audit.effects import mean_effect, statistic_effect
from valueprobe.audit.reading import Directions, read_spans
from valueprobe.audit.records import AuditTest, Curve, verdict_of
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.stats.metrics import spearman_columns
from valueprobe.vocab import ChatTemplate, Site

__all__ = ["FRACTIONS", "CutReads", "cut_examples", "cut_test", "read_cuts"]

FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 10))
DESIGN = (
    "On the construction paragraphs (ICRL: the post-discovery turn, cut at the rule-satisfying token), the"
    " contrast mean(after) − mean(before) at the real cut, at placebo cuts 0.1 … 0.9 of the same paragraph's"
    " tokens, and in each failed attempt (an earlier turn scored -1) cut at the word nearest the real cut's"
    " fraction. A jump at the reward peaks at the real cut and is absent in failed attempts; a ramp is flat"
    " and as large in failed attempts."
)


def _word_cut(text: str, fraction: float) -> int:
    """The start of the word nearest ``fraction`` of ``text`` (never 0: both halves non-empty)."""
    starts = [i for i in range(1, len(text)) if text[i - 1] == " " and text[i] != " "]
    if not starts:
        raise ValueprobeError(f"a failed attempt has one word only, no cut: {text[:40]!r}")
    return min(starts, key=lambda i: abs(i - fraction * len(text)))


def cut_examples(examples: Sequence[Example]) -> list[Example]:
    """Each construction example with its failed attempts cut: spans ``fail{j}-pre`` / ``-post``.

    Needs ``pre`` and ``post`` spans on one assistant message (`valueprobe.audit.guard` checks
    it); the failed attempts are the assistant turns before ``meta.discovery_round`` (ICRL), or
    those a ``fail`` span marks (one span per failed turn, over its whole content)."""
    out = []
    for ex in examples:
        spans = {s.label: s for s in ex.spans}
        if "pre" not in spans or "post" not in spans or ex.messages is None:
            raise ValueprobeError(f"example {ex.id!r} needs 'pre' and 'post' spans in a chat (messages)")
        final = ex.messages[spans["post"].message or 0]["content"]
        fraction = spans["post"].start / max(len(final), 1)
        failed = _failed_messages(ex)
        extra = []
        for j, m in enumerate(failed):
            text = ex.messages[m]["content"]
            cut = _word_cut(text, fraction)
            extra += [
                Span(0, cut, f"fail{j}-pre", message=m),
                Span(cut, len(text), f"fail{j}-post", message=m),
            ]
        out.append(replace(ex, spans=(spans["pre"], spans["post"], *extra)))
    return out


def _failed_messages(ex: Example) -> list[int]:
    assert ex.messages is not None
    marked = [s.message for s in ex.spans if s.label == "fail" and s.message is not None]
    if marked:
        return marked
    d = ex.meta.get("discovery_round")
    if d is None or ex.meta.get("control"):
        return []
    assistant = [i for i, m in enumerate(ex.messages) if m["role"] == "assistant"]
    return assistant[: int(d) - 1]  # rounds 1..d-1 failed (scored -1)


@dataclass(frozen=True)
class CutReads:
    """Per conversation: the contrast at the real cut, at each placebo fraction, and in its failed
    attempts (NaN where it has none), each [1 + k] in neutral σ."""

    real: np.ndarray  # [conversations, 1 + k]
    placebo: np.ndarray  # [conversations, fractions, 1 + k]
    failed: np.ndarray  # [conversations, 1 + k]
    real_fraction: np.ndarray  # [conversations] where the real cut falls in its paragraph (tokens)
    n_sequences: int
    n_tokens: int


def _contrast(p: np.ndarray, cut: int) -> np.ndarray:
    return p[cut:].mean(axis=0) - p[:cut].mean(axis=0)


def read_cuts(
    lm: LoadedModel,
    dirs: Directions,
    examples: Sequence[Example],
    *,
    site: Site,
    chat_template: ChatTemplate = ChatTemplate.model,
    batch_size: int = 8,
    on_batch: Callable[[int], object] | None = None,
) -> CutReads:
    """One forward per conversation, reading its paragraph and its failed attempts."""
    reads = read_spans(
        lm, examples, layer=dirs.layer, site=site, labels=None, chat_template=chat_template,
        batch_size=batch_size, on_batch=on_batch,
    )  # fmt: skip
    proj = dirs.in_reference(reads.hidden)
    real, placebo, failed, where = [], [], [], []
    for i, ex in enumerate(examples):
        pre, post = reads.rows(i, "pre"), reads.rows(i, "post")
        p = proj[np.concatenate([pre, post])]
        n = len(p)
        real.append(_contrast(p, len(pre)))
        where.append(len(pre) / n)
        placebo.append([_contrast(p, int(np.clip(round(f * n), 1, n - 1))) for f in FRACTIONS])
        fails = []
        for j in range(sum(s.label.startswith("fail") and s.label.endswith("-pre") for s in ex.spans)):
            a, b = reads.rows(i, f"fail{j}-pre"), reads.rows(i, f"fail{j}-post")
            if len(a) and len(b):
                fails.append(_contrast(proj[np.concatenate([a, b])], len(a)))
        failed.append(np.mean(fails, axis=0) if fails else np.full(proj.shape[1], np.nan))
    return CutReads(
        real=np.array(real),
        placebo=np.array(placebo),
        failed=np.array(failed),
        real_fraction=np.array(where),
        n_sequences=len(examples),
        n_tokens=int(reads.n_tokens.sum()),
    )


def _spearman(reads: CutReads) -> Callable[[np.ndarray, slice], np.ndarray]:
    """Spearman ρ of the contrast with the cut fraction, over (conversation, placebo cut) pairs."""

    def rho(units: np.ndarray, columns: slice) -> np.ndarray:
        y = reads.placebo[units][:, :, columns]  # [units, fractions, directions]
        return spearman_columns(np.tile(np.array(FRACTIONS), len(units)), y.reshape(-1, y.shape[-1]))

    return rho


def cut_test(reads: CutReads, dirs: Directions, *, seconds: float, seed: int = 0) -> AuditTest:
    """Test b's effects, null and verdict."""
    has_failed = np.isfinite(reads.failed[:, 0])
    peak = reads.real - reads.placebo.mean(axis=1)
    effects = [
        mean_effect("contrast at the real cut", "context", "+", reads.real, dirs=dirs, seed=seed),
        mean_effect("real cut − mean of placebo cuts (a jump peaks)", "context", "+", peak, dirs=dirs, seed=seed),
        statistic_effect(
            "Spearman ρ of the contrast with the cut fraction (a ramp: 0)", "context", "±", _spearman(reads),
            n_units=len(reads.real), unit="ρ", seed=seed,
        ),
    ]  # fmt: skip
    notes = [f"{len(reads.real)} conversations; {int(has_failed.sum())} with failed attempts"]
    value = rival = None
    held: bool | None = None
    if has_failed.sum() >= 2:
        gap = (reads.real - reads.failed)[has_failed]
        value = mean_effect(
            "real-cut contrast − failed-attempt contrast", "value", "+", gap, dirs=dirs, seed=seed
        )
        rival = mean_effect("contrast in failed attempts (nothing earned)", "rival", "+", reads.failed[has_failed], dirs=dirs, seed=seed)  # fmt: skip
        held = effects[1].excludes_neutral and effects[1].estimate > 0
        effects = [value, rival, *effects]
        real, fail = reads.real[has_failed, 0].mean(), reads.failed[has_failed, 0].mean()
        notes.append(
            f"failed-attempt contrast / real-cut contrast: {fail / real:.2f} (the replication: 1.34)"
        )
    else:
        notes.append("no failed attempts to compare: value and rival effects not measured")
    verdict, why = verdict_of(value, rival, held)
    factor = dirs.axis_units() if np.isfinite(dirs.axis_units()) else 1.0
    ys = reads.placebo[:, :, 0] * factor
    curve = Curve(
        name="contrast at a placebo cut",
        x=FRACTIONS,
        y=tuple(float(v) for v in ys.mean(axis=0)),
        lo=tuple(float(v) for v in ys.mean(axis=0) - 1.96 * ys.std(axis=0, ddof=1) / np.sqrt(len(ys))),
        hi=tuple(float(v) for v in ys.mean(axis=0) + 1.96 * ys.std(axis=0, ddof=1) / np.sqrt(len(ys))),
        x_label="cut, fraction of the paragraph",
        y_label="mean after − mean before (σ)",
    )
    marks = Curve(
        name="real cut",
        x=(float(reads.real_fraction.mean()),),
        y=(float(reads.real[:, 0].mean() * factor),),
    )
    return AuditTest(
        key="b",
        title="Cut invariance: a jump at the reward, or a ramp",
        design=DESIGN,
        effects=tuple(effects),
        verdict=verdict,
        why=why,
        held_fixed=held,
        cost=f"{reads.n_sequences} sequences, {reads.n_tokens} tokens forwarded",
        seconds=seconds,
        notes=tuple(notes),
        curves=(curve, marks),
    )
