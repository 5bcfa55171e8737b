"""What guided decoding returns: one `Guided` record per prompt, holding every `Candidate` it sampled.

    >>> out = vp.guide(lm, axis, ["What is 12 * 7?"], "best-of-n", n=8)
    >>> out[0].text, out[0].tokens_spent                    # the pick, and what all rows cost
    >>> [c.sigma_mean for c in out[0].candidates]           # each sample's value, read in its forward
    >>> Guided.from_dict(json.loads(line))                  # a guide.jsonl line back

A candidate's value readings are per generated token that was fed back to the model (a token is
read when it is the input of a forward; the last token of a row cut at ``max_new_tokens`` is never
fed, and neither is an EOS), so ``values`` has ``len(token_ids)`` or ``len(token_ids) - 1`` entries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from valueprobe.files import atomic_write_text, jsonable, write_json
from valueprobe.records import Record

__all__ = ["SCORES", "Candidate", "GuideSummary", "Guided", "tail_mean", "write_guided"]

SCORES: tuple[str, ...] = ("sigma", "cos", "logprob")  # what a pick reads: the axis's σ, cos, or log-prob


def tail_mean(values: Sequence[float], last_k: int | None) -> float:
    """Mean of the last ``last_k`` values (all of them for None); NaN for none."""
    kept = list(values) if last_k is None else list(values)[-last_k:]
    return math.fsum(kept) / len(kept) if kept else math.nan


@dataclass(frozen=True)
class Candidate(Record):
    """One sampled row of a prompt.

    Attributes:
        sample: its index among the prompt's N; seed: its common-random-numbers seed (None: greedy).
        text, token_ids: the response (no prompt, no EOS); finished: stopped on EOS.
        sigma: per fed token, the σ-score (h·d̂ − μ)/σ at the read layer; cos: cos(h, d̂) there.
        logprobs: per sampled token (EOS included), its log-probability under the model (T = 1).
        sigma_mean, sigma_last, cos_mean, logprob: means over the response / its last ``last_k``.
        tokens_spent: every token this row sampled, rolled-back ones included.
        rollbacks: how many times it rolled back; pruned_at: the response length it was dropped at.
    """

    sample: int
    seed: int | None
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    sigma: tuple[float, ...] = field(repr=False)
    cos: tuple[float, ...] = field(repr=False)
    logprobs: tuple[float, ...] = field(repr=False)
    sigma_mean: float
    sigma_last: float
    cos_mean: float
    logprob: float
    tokens_spent: int
    rollbacks: int = 0
    pruned_at: int | None = None


@dataclass(frozen=True)
class Guided(Record):
    """One prompt's guided decoding: the pick and all candidates.

    Attributes:
        prompt: index into the prompts given. policy: its name; score: what picked (``sigma``,
            ``cos`` or ``logprob``); direction: ``axis`` or the name of a null direction.
        read_layer, steer_layer: where the value was read and (rollback's α) where it steered.
        chosen: the index in ``candidates`` of the pick; text, token_ids: its response.
        tokens_spent: all tokens sampled for this prompt; rollbacks: all rollbacks done.
        settings: the policy's fields (``n``, ``quantile``, ``tau``...).
    """

    prompt: int
    policy: str
    score: str
    direction: str
    read_layer: int
    steer_layer: int
    chosen: int
    text: str
    token_ids: tuple[int, ...]
    tokens_spent: int
    rollbacks: int
    candidates: tuple[Candidate, ...]
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GuideSummary(Record):
    """Per direction (``axis``, ``random-0``...): what a guided run cost and what it picked.

    Attributes:
        rows: one ``(direction, prompts, tokens per prompt, rollbacks per prompt, pruned share,
            chosen mean σ, chosen mean log-probability)`` tuple per direction, in first-seen order.
    """

    policy: str
    score: str
    rows: tuple[tuple[str, int, float, float, float, float, float], ...]

    @classmethod
    def of(cls, records: Sequence[Guided]) -> GuideSummary:
        by: dict[str, list[Guided]] = {}
        for g in records:
            by.setdefault(g.direction, []).append(g)
        rows = []
        for name, gs in by.items():
            cands = [c for g in gs for c in g.candidates]
            picks = [g.candidates[g.chosen] for g in gs]
            rows.append(
                (
                    name,
                    len(gs),
                    math.fsum(g.tokens_spent for g in gs) / len(gs),
                    math.fsum(g.rollbacks for g in gs) / len(gs),
                    sum(c.pruned_at is not None for c in cands) / max(len(cands), 1),
                    tail_mean([c.sigma_mean for c in picks if c.sigma_mean == c.sigma_mean], None),
                    tail_mean([c.logprob for c in picks if c.logprob == c.logprob], None),
                )
            )
        first = records[0] if records else None
        return cls(policy=first.policy if first else "", score=first.score if first else "", rows=tuple(rows))

    def table(self) -> tuple[list[str], list[tuple]]:
        columns = [
            "direction",
            "prompts",
            "tokens/prompt",
            "rollbacks/prompt",
            "pruned",
            "chosen σ",
            "chosen logp",
        ]
        return columns, [tuple(r) for r in self.rows]


def write_guided(out: Path, records: Sequence[Guided], settings: Mapping[str, Any]) -> GuideSummary:
    """``out/guide.jsonl`` (one `Guided` per line) and ``out/summary.json`` (the settings and the
    `GuideSummary`), each written whole to a temporary name and renamed into place."""
    out.mkdir(parents=True, exist_ok=True)
    lines = "".join(
        json.dumps(jsonable(g.to_dict()), ensure_ascii=False, allow_nan=False) + "\n" for g in records
    )
    atomic_write_text(out / "guide.jsonl", lines)
    summary = GuideSummary.of(records)
    body = {"settings": dict(settings), "summary": summary.to_dict()}
    write_json(out / "summary.json", jsonable(body), allow_nan=False)
    return summary
