"""One sampled row of guided decoding while it runs, and what each policy does to the rows.

`valueprobe.guided.run` owns the loop; this module owns a row's state (its tokens, what was fed,
its value readings, its costs) and the two policies that act mid-run: `prune_rows` at checkpoints
and `rollback_due` / `Row.roll_back` after each reading. A row feeds ``seq = [last prompt token,
*tokens]``: ``fed`` counts the cells of ``seq`` in the cache, so after a rollback the last kept
token (or the prompt's last token) is fed again and its logits give the resampled token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from valueprobe.guided.policy import Prune, Rollback
from valueprobe.guided.records import Candidate, tail_mean

__all__ = ["Row", "prune_rows", "rollback_due"]


@dataclass
class Row:
    """A live row: mutable while the loop runs, frozen into a `Candidate` at the end."""

    prompt: int
    sample: int
    seed: int | None
    tail: int  # the prompt's last token
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # per sampled token, EOS included
    sigma: list[float] = field(default_factory=list)  # per fed response token
    cos: list[float] = field(default_factory=list)
    ema: list[float] = field(default_factory=list)
    fed: int = 1  # cells of seq in the cache: the prompt pass fed the tail
    spent: int = 0
    rollbacks: int = 0
    armed_at: int = 2  # readings needed before rollback may fire (the first is the start)
    steer_left: int = 0
    finished: bool = False
    pruned_at: int | None = None
    done: bool = False

    @property
    def seq(self) -> list[int]:
        return [self.tail, *self.tokens]

    def needs_token(self) -> bool:
        return self.fed == len(self.tokens) + 1

    def read(self, sigma: float, cos: float, beta: float) -> None:
        """The reading of the cell just fed (a response token; the prompt's tail is not read)."""
        if self.fed - 1 < 1:
            return
        self.sigma.append(sigma)
        self.cos.append(cos)
        last = self.ema[-1] if self.ema else sigma
        self.ema.append(beta * last + (1 - beta) * sigma)

    def take(self, token: int, logprob: float, *, eos: int | None, max_new_tokens: int) -> None:
        """A sampled token: EOS ends the row unfed; the ``max_new_tokens``-th ends it too."""
        self.spent += 1
        self.logprobs.append(logprob)
        self.steer_left = max(self.steer_left - 1, 0)
        if eos is not None and token == eos:
            self.finished = self.done = True
            return
        self.tokens.append(token)
        self.done = len(self.tokens) >= max_new_tokens

    def roll_back(self, k: int, policy: Rollback) -> int:
        """Drop the last ``k`` tokens (fewer if the row is shorter); how many cache cells to unfeed."""
        keep = max(len(self.tokens) - k, 0)
        cells = self.fed - keep  # the dropped tokens in the cache, and the tail that is fed again
        del self.tokens[keep:], self.logprobs[keep:]
        readings = max(keep - 1, 0)
        del self.sigma[readings:], self.cos[readings:], self.ema[readings:]
        self.fed = keep
        self.rollbacks += 1
        self.armed_at = max(readings + policy.k, 2)
        self.steer_left = policy.steer_tokens if policy.alpha != 0 else 0
        return cells

    def scores(self, score: str) -> list[float]:
        return {"sigma": self.sigma, "cos": self.cos, "logprob": self.logprobs}[score]

    def candidate(self, text: str, last_k: int | None) -> Candidate:
        return Candidate(
            sample=self.sample,
            seed=self.seed,
            text=text,
            token_ids=tuple(self.tokens),
            finished=self.finished,
            sigma=tuple(self.sigma),
            cos=tuple(self.cos),
            logprobs=tuple(self.logprobs),
            sigma_mean=tail_mean(self.sigma, None),
            sigma_last=tail_mean(self.sigma, last_k),
            cos_mean=tail_mean(self.cos, None),
            logprob=tail_mean(self.logprobs, None),
            tokens_spent=self.spent,
            rollbacks=self.rollbacks,
            pruned_at=self.pruned_at,
        )


def prune_rows(rows: Sequence[Row], policy: Prune, score: str) -> list[Row]:
    """At a checkpoint, the live rows whose running score (mean so far) is below the ``quantile`` of
    their live siblings' (numpy's linear quantile); a prompt's best live row always stays."""
    by_prompt: dict[int, list[Row]] = {}
    for r in rows:
        if not r.done:
            by_prompt.setdefault(r.prompt, []).append(r)
    out: list[Row] = []
    for siblings in by_prompt.values():
        running = np.array([tail_mean(r.scores(score), None) for r in siblings])
        if len(siblings) < 2 or np.isnan(running).all():
            continue
        cut = float(np.nanquantile(running, policy.quantile))
        out.extend(r for r, v in zip(siblings, running, strict=True) if v < cut)  # NaN: kept
    return out


def rollback_due(row: Row, policy: Rollback) -> bool:
    """The EMA of the row's σ reading fell ``tau`` below its first reading, and it may still roll back:
    under ``max_rollbacks``, with ``k`` tokens to take back, ``k`` tokens after its last rollback."""
    # k tokens must exist to take back: a rollback always costs exactly k tokens
    if row.done or row.rollbacks >= policy.max_rollbacks or len(row.ema) < max(row.armed_at, policy.k):
        return False
    start, now = row.ema[0], row.ema[-1]
    return math.isfinite(start) and math.isfinite(now) and now < start - policy.tau
