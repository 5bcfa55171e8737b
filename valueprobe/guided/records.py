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

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from valueprobe.files import record_from_dict

__all__ = ["Candidate", "Guided", "tail_mean"]


def tail_mean(values: Sequence[float], last_k: int | None) -> float:
    """Mean of the last ``last_k`` values (all of them for None); NaN for none."""
    kept = list(values) if last_k is None else list(values)[-last_k:]
    return math.fsum(kept) / len(kept) if kept else math.nan


@dataclass(frozen=True)
class Candidate:
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        """The record again from its ``to_dict()`` (or the JSON of it)."""
        return record_from_dict(cls, d)


@dataclass(frozen=True)
class Guided:
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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["candidates"] = [c.to_dict() for c in self.candidates]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Guided:
        """The record again from its ``to_dict()`` (or the JSON of it)."""
        return record_from_dict(cls, d)
