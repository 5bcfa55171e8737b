"""The three guided-decoding policies as checked, frozen settings: best-of-n, prune, rollback.

    >>> from valueprobe.guided.policy import Prune, as_policy
    >>> as_policy("prune", n=8, every=8, quantile=0.5)      # the CLI's way, by name
    Prune(n=8, last_k=None, every=8, quantile=0.5, name='prune')
    >>> as_policy(Prune(n=4))                               # a policy as is, checked

Every policy samples ``n`` rows per prompt in one batch and ends by picking one of them by its
score (`valueprobe.guided.run.pick`); they differ in what happens while the rows are sampled:
- `BestOfN`: nothing: every row runs to EOS or ``max_new_tokens``.
- `Prune`: every ``every`` tokens, a row whose running score (its mean so far) is below the
  ``quantile`` of its live siblings' is dropped and stops costing tokens.
- `Rollback`: a row whose value, as an EMA (weight ``beta`` on the past), falls ``tau`` σ below its
  first reading loses its last ``k`` tokens (the KV cache is cropped) and resamples them, steered by
  ``alpha`` for the next ``steer_tokens`` tokens; at most ``max_rollbacks`` times a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

from valueprobe.errors import ValueprobeError

__all__ = ["POLICIES", "BestOfN", "Policy", "PolicyName", "Prune", "Rollback", "as_policy"]

PolicyName = Literal["best-of-n", "prune", "rollback"]


def _check_n(n: int, last_k: int | None) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueprobeError(f"N (samples per prompt) must be a whole number >= 1, got {n!r}")
    if last_k is not None and (not isinstance(last_k, int) or last_k < 1):
        raise ValueprobeError(
            f"last_k must be a whole number >= 1 (or None: the whole response), got {last_k!r}"
        )


def _check_number(name: str, value: object) -> float:
    """A finite real number, or one clear line naming the option."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueprobeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class BestOfN:
    """N samples per prompt, the best by its score. ``last_k``: score the last k read tokens only."""

    n: int = 8
    last_k: int | None = None
    name: PolicyName = "best-of-n"

    def check(self) -> None:
        _check_n(self.n, self.last_k)


@dataclass(frozen=True)
class Prune:
    """Best-of-N that drops, at every ``every`` generated tokens, the rows below the ``quantile`` of their
    live siblings' running score (0 < quantile < 1)."""

    n: int = 8
    last_k: int | None = None
    every: int = 8
    quantile: float = 0.5
    name: PolicyName = "prune"

    def check(self) -> None:
        _check_n(self.n, self.last_k)
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueprobeError(
                f"the checkpoint interval (every) must be a whole number >= 1, got {self.every!r}"
            )
        q = _check_number("quantile", self.quantile)
        if not 0 < q < 1:
            raise ValueprobeError(f"quantile must be strictly between 0 and 1, got {self.quantile!r}")


@dataclass(frozen=True)
class Rollback:
    """Roll back and resample when the value's EMA drops ``tau`` σ below its first reading."""

    n: int = 1
    last_k: int | None = None
    k: int = 8
    tau: float = 1.0
    beta: float = 0.8
    max_rollbacks: int = 2
    alpha: float = 0.0
    steer_tokens: int = 8
    name: PolicyName = "rollback"

    def check(self) -> None:
        _check_n(self.n, self.last_k)
        for name in ("k", "max_rollbacks", "steer_tokens"):
            value = getattr(self, name)
            least = 1 if name == "k" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueprobeError(f"rollback {name} must be a whole number >= {least}, got {value!r}")
        tau = _check_number("tau (τ)", self.tau)
        if tau <= 0:
            raise ValueprobeError(f"tau (τ) must be > 0 σ, got {self.tau!r}")
        beta = _check_number("beta (the EMA's weight on the past)", self.beta)
        if not 0 <= beta < 1:
            raise ValueprobeError(f"beta must be in [0, 1), got {self.beta!r}")
        _check_number("alpha", self.alpha)


Policy = BestOfN | Prune | Rollback
POLICIES: dict[str, type[BestOfN] | type[Prune] | type[Rollback]] = {
    "best-of-n": BestOfN,
    "prune": Prune,
    "rollback": Rollback,
}


def as_policy(policy: Policy | str, **options: Any) -> Policy:
    """The policy named (with ``options`` for its fields), or the one given; checked either way.

    Raises:
        ValueprobeError: an unknown name, an option the policy does not take, or a bad value.
    """
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueprobeError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
        cls = POLICIES[policy]
        known = {f.name for f in fields(cls)} - {"name"}
        extra = sorted(set(options) - known)
        if extra:
            raise ValueprobeError(
                f"policy {policy} takes no option {extra[0]!r} (it takes {', '.join(sorted(known))})"
            )
        policy = cls(**options)
    elif options:
        raise ValueprobeError("give options with a policy name, not with a policy object")
    policy.check()
    return policy
