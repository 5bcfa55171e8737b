"""Test a: value (high / low) × end of turn (near / far), read on identical tails.

    from valueprobe.audit.two_by_two import read_turns, two_by_two
    reads = read_turns(lm, dirs, sets, site=axis.site)      # one forward per arm, tails only
    test = two_by_two(reads, dirs)                           # an AuditTest

Each conversation (`valueprobe.audit.turns`) gives four arms whose tails are the same tokens at the
same positions; the axis is read as the mean over the tail's tokens. Per conversation:

* value main effect = ((high, near) + (high, far) − (low, near) − (low, far)) / 2,
* end-of-turn effect = ((high, near) + (low, near) − (high, far) − (low, far)) / 2 (near − far),
* interaction = ((high, near) − (low, near)) − ((high, far) − (low, far)),

paired, so each conversation's own baseline cancels. The replication's single conflict cell is
(low, near) − (high, far): the end-near arm against the value-high arm. The value effect stays when
the rival is held fixed if it is positive, its CI above 0, at each end level alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from valueprobe.audit.effects import mean_effect
from valueprobe.audit.reading import Directions, read_spans
from valueprobe.audit.records import AuditTest, Curve, verdict_of
from valueprobe.audit.turns import ARMS, TAIL_LABEL, TurnSet
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import ChatTemplate, Site

__all__ = ["TurnReads", "read_turns", "two_by_two"]

DESIGN = (
    "Rule games from the ICRL generator, cut after their failed attempts, end in an assistant turn prefilled"
    " four ways: a value clause (high: 'I've cracked it: <rule>...'; low: 'I'm still stuck: maybe <rule>?...')"
    " and an end clause (near: 'That's all I have to say...'; far: '...ten long paragraphs'), padded with"
    " ' ·' to one token count, then one identical tail. The axis is read on the tail only, the same tokens"
    " at the same positions in all four arms; effects are paired per conversation."
)


@dataclass(frozen=True)
class TurnReads:
    """The tail means of every arm: in neutral σ per direction, and the residual itself (for fitting)."""

    sets: tuple[TurnSet, ...]
    tail: np.ndarray  # [conversations, 4 arms, 1 + k] mean over the tail, neutral σ
    hidden: np.ndarray  # [conversations, 4 arms, d_model] mean residual over the tail
    n_tokens: int  # tokens forwarded

    def arm(self, value: str, end: str) -> np.ndarray:
        """[conversations, 1 + k] for one arm."""
        return self.tail[:, ARMS.index((value, end))]


def read_turns(
    lm: LoadedModel,
    dirs: Directions,
    sets: Sequence[TurnSet],
    *,
    site: Site,
    chat_template: ChatTemplate = ChatTemplate.model,
    batch_size: int = 8,
    on_batch: Callable[[int], object] | None = None,
) -> TurnReads:
    """One forward per arm; the tail's residual at the directions' layer, averaged over its tokens."""
    examples = [arm for s in sets for arm in s.arms]
    reads = read_spans(
        lm,
        examples,
        layer=dirs.layer,
        site=site,
        labels=[TAIL_LABEL],
        chat_template=chat_template,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    hidden = np.stack([reads.hidden[reads.rows(i, TAIL_LABEL)].mean(axis=0) for i in range(len(examples))])
    hidden = hidden.reshape(len(sets), len(ARMS), -1)
    return TurnReads(
        sets=tuple(sets),
        tail=dirs.in_reference(hidden.reshape(-1, hidden.shape[-1])).reshape(len(sets), len(ARMS), -1),
        hidden=hidden,
        n_tokens=int(reads.n_tokens.sum()),
    )


def contrasts(reads: TurnReads) -> dict[str, np.ndarray]:
    """Per-conversation effects [conversations, 1 + k] by name (see the module doc)."""
    hn, hf, ln, lf = (reads.arm(v, e) for v, e in ARMS)
    return {
        "value": (hn + hf - ln - lf) / 2,
        "end": (hn + ln - hf - lf) / 2,
        "interaction": (hn - ln) - (hf - lf),
        "value_near": hn - ln,
        "value_far": hf - lf,
        "conflict": ln - hf,
    }


def _cells(reads: TurnReads, per_conv: np.ndarray) -> tuple[int, int]:
    """(cells where the axis's mean effect is positive, cells): cells are phrasing × tail."""
    by: dict[tuple, list[float]] = defaultdict(list)
    for s, x in zip(reads.sets, per_conv[:, 0], strict=True):
        m = s.arms[0].meta
        by[(m.get("value_phrasing"), m.get("end_phrasing"), m.get("tail_phrasing"))].append(float(x))
    return sum(bool(np.mean(v) > 0) for v in by.values()), len(by)


def _padding_note(reads: TurnReads) -> str:
    pads = {a: np.mean([s.arms[i].meta.get("pad_tokens", 0) for s in reads.sets]) for i, a in enumerate(ARMS)}
    return "mean padding tokens per arm: " + ", ".join(f"{v}/{e} {pads[v, e]:.2f}" for v, e in ARMS)


def _curves(reads: TurnReads, factor: float) -> tuple[Curve, ...]:
    out = []
    for value in ("high", "low"):
        ys = [reads.arm(value, end)[:, 0] * factor for end in ("near", "far")]
        out.append(
            Curve(
                name=f"value {value}",
                x=(0.0, 1.0),
                y=tuple(float(y.mean()) for y in ys),
                lo=tuple(float(y.mean() - 1.96 * y.std(ddof=1) / np.sqrt(len(y))) for y in ys),
                hi=tuple(float(y.mean() + 1.96 * y.std(ddof=1) / np.sqrt(len(y))) for y in ys),
                x_label="end of turn (0 near, 1 far)",
                y_label="mean tail reading (σ)",
            )
        )
    return tuple(out)


def two_by_two(
    reads: TurnReads, dirs: Directions, *, dropped: int, seconds: float, seed: int = 0
) -> AuditTest:
    """Test a's effects, null, cells and verdict from the tails read."""
    c = contrasts(reads)
    value = mean_effect("value main effect (high − low)", "value", "+", c["value"], dirs=dirs, seed=seed)
    end = mean_effect("end of turn (near − far)", "rival", "±", c["end"], dirs=dirs, seed=seed)
    near = mean_effect("value effect, end near only", "context", "+", c["value_near"], dirs=dirs, seed=seed)
    far = mean_effect("value effect, end far only", "context", "+", c["value_far"], dirs=dirs, seed=seed)
    held = bool(all(e.excludes_neutral and e.estimate > 0 for e in (near, far)))
    effects = (
        value,
        end,
        mean_effect("interaction", "context", "±", c["interaction"], dirs=dirs, seed=seed),
        near,
        far,
        mean_effect(
            "conflict cell: (low, near) − (high, far)", "context", "±", c["conflict"], dirs=dirs, seed=seed
        ),
    )
    verdict, why = verdict_of(value, end, held)
    cells_v, n_cells = _cells(reads, c["value"])
    cells_e, _ = _cells(reads, c["end"])
    cells_c, _ = _cells(reads, c["conflict"])
    factor = dirs.axis_units() if np.isfinite(dirs.axis_units()) else 1.0
    notes = (
        f"{len(reads.sets)} conversations kept, {dropped} dropped (arms that could not be padded to one length"
        " or tails that did not tokenize alike)",
        f"phrasing × tail cells with a positive mean: value {cells_v} of {n_cells}, end of turn {cells_e} of"
        f" {n_cells}, conflict {cells_c} of {n_cells}",
        _padding_note(reads),
    )
    return AuditTest(
        key="a",
        title="End of turn vs value, a 2×2",
        design=DESIGN,
        effects=effects,
        verdict=verdict,
        why=why,
        held_fixed=held,
        cost=f"{4 * len(reads.sets)} sequences, {reads.n_tokens} tokens forwarded",
        seconds=seconds,
        notes=notes,
        curves=_curves(reads, factor),
    )
