"""What an audit writes (``audit.json``): each test's design, effects, null and verdict.

    >>> audit = Audit.from_dict(json.load(open("runs/audit/audit.json")))
    >>> [(t.key, t.verdict) for t in audit.tests]
    [('a', 'the rival'), ('b', 'neither'), ...]

An `Effect` is one number a test estimates for the axis (its value effect, or its rival's), with
a 95% CI over the test's units (conversations, prompts, answers), the same number for each random
direction on the same tokens (their central 95% range and where the axis falls among them), and
the sign count. `verdict_of` applies the one rule every test shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from valueprobe.errors import ValueprobeError
from valueprobe.files import markdown_table
from valueprobe.records import Record

__all__ = [
    "TESTS",
    "VERDICTS",
    "Audit",
    "AuditSettings",
    "AuditTest",
    "Curve",
    "Effect",
    "Role",
    "Sign",
    "effect_text",
    "verdict_of",
]

Role = Literal["value", "rival", "context"]
Sign = Literal["+", "-", "±"]
VERDICTS = ("value", "the rival", "both", "neither")
TESTS = "abcde"


@dataclass(frozen=True)
class AuditSettings(Record):
    """What an audit runs, and how big (the defaults run in about 10 minutes on 2 CPU cores).

    Attributes:
        tests: which of a–e to run. layer: the layer read and steered (default: the axis's best).
        turns: 2×2 conversations (test a); turns_data: a JSONL of your own 2×2 rows instead
            (``meta.conversation``, ``meta.value`` high|low, ``meta.end`` near|far, a ``tail`` span).
        construction, n_construction: the construction dataset and how many conversations (test b).
        prompts, n_answers: the neutral prompt set and how many answers to sample (test c).
        n_steer, alphas, n_steer_random: prompts, strengths (% norm) and random directions steered (d).
        n_random: random directions read on the same tokens (a, b, c, e); k_lens: top-k tokens (e).
    """

    tests: str = TESTS
    layer: int | None = None
    turns: int = 40
    turns_data: str | None = None
    construction: str = "icrl"
    n_construction: int = 48
    prompts: str = "steer_open"
    n_answers: int = 48
    n_steer: int = 8
    alphas: tuple[float, ...] = (-30.0, 30.0)
    n_steer_random: int = 4
    n_random: int = 64
    k_lens: int = 50
    seed: int = 0
    batch_size: int = 8

    def check(self) -> AuditSettings:
        """One line for settings that cannot run; returns them."""
        if not self.tests or set(self.tests) - set(TESTS):
            raise ValueprobeError(f"--tests {self.tests!r}: give letters of {TESTS} (e.g. --tests ab)")
        for name in ("turns", "n_construction", "n_answers", "n_steer", "n_random", "k_lens", "batch_size"):
            if getattr(self, name) < 2:
                raise ValueprobeError(f"{name} {getattr(self, name)} is too small: give at least 2")
        if 0.0 in self.alphas or not self.alphas:
            raise ValueprobeError("--alphas are the non-zero strengths (α = 0 is always run): e.g. -30,30")
        return self


@dataclass(frozen=True)
class Effect(Record):
    """One estimate of a test, beside its random-direction null.

    Attributes:
        name: what it is ("value main effect", "end of turn: near − far", ...).
        role: ``value`` (what a value reading predicts), ``rival`` (what the rival predicts) or
            ``context`` (reported, not voted).
        expected: the sign that counts for the role: ``+``, ``-``, or ``±`` (either way counts).
        estimate, ci: the axis's figure in ``unit`` and its 95% bootstrap CI.
        reference: the axis's figure in the unit its null is in (its neutral σ; the same number
            where the unit is scale-free: a correlation, an AUROC, a share).
        null: the central 95% range of the random directions' figures (NaN: no null).
        null_percentile: where ``reference`` falls among them (0–100).
        n, n_positive: units the CI resamples, and how many of them have a positive effect (-1:
            not a per-unit effect).
        neutral: the value of no effect (0, or 0.5 for an AUROC).
    """

    name: str
    role: Role
    expected: Sign
    estimate: float
    ci: tuple[float, float]
    unit: str
    reference: float
    null: tuple[float, float]
    null_percentile: float
    n: int
    n_positive: int = -1
    neutral: float = 0.0

    def _direction(self) -> int:
        return 1 if self.reference > self.neutral else -1

    @property
    def excludes_neutral(self) -> bool:
        """The CI lies wholly on one side of no effect."""
        lo, hi = self.ci
        return (lo > self.neutral or hi < self.neutral) if math.isfinite(lo) and math.isfinite(hi) else False

    @property
    def beyond_null(self) -> bool:
        """The axis's figure lies outside the random directions' central 95% range."""
        lo, hi = self.null
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return False
        return self.reference > hi or self.reference < lo

    def __str__(self) -> str:
        return effect_text(self)

    @property
    def holds(self) -> bool:
        """CI excludes no effect, beyond the null, and in the expected direction."""
        signed = self.expected == "±" or (self._direction() > 0) == (self.expected == "+")
        return self.excludes_neutral and self.beyond_null and signed


@dataclass(frozen=True)
class Curve(Record):
    """One line of a test's figure: x, y and its 95% band (NaN where none)."""

    name: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    lo: tuple[float, ...] = ()
    hi: tuple[float, ...] = ()
    x_label: str = ""
    y_label: str = ""


@dataclass(frozen=True)
class AuditTest(Record):
    """One test of the battery: what it does, what it found and what it cost.

    ``held_fixed`` says whether the value effect stayed when the rival was held fixed (None: the
    design has no such check, or measures no value effect); ``cost`` is what the test ran
    (sequences, tokens forwarded or generated) and ``seconds`` its wall time."""

    key: str
    title: str
    design: str
    effects: tuple[Effect, ...]
    verdict: str
    why: str
    held_fixed: bool | None
    cost: str
    seconds: float
    notes: tuple[str, ...] = ()
    curves: tuple[Curve, ...] = ()

    def effect(self, role: Role) -> Effect | None:
        """The first effect with ``role`` (the one its verdict reads), if any."""
        return next((e for e in self.effects if e.role == role), None)


def verdict_of(value: Effect | None, rival: Effect | None, held_fixed: bool | None) -> tuple[str, str]:
    """The verdict and its reason, by the one rule: value needs its CI to exclude no effect, to lie
    beyond the random null in the expected direction, and to stay when the rival is held fixed; the
    rival needs its CI and null the same way. Both, one, or neither."""
    v = value is not None and value.holds and held_fixed is not False
    r = rival is not None and rival.holds
    verdict = {(True, True): "both", (True, False): "value", (False, True): "the rival"}.get(
        (v, r), "neither"
    )
    parts = []
    for label, eff, ok in (("value", value, v), ("rival", rival, r)):
        if eff is None:
            parts.append(f"{label}: not measured by this design")
            continue
        why = []
        if not eff.excludes_neutral:
            why.append("CI includes no effect")
        if not eff.beyond_null:
            why.append(f"inside the random null ({ordinal(eff.null_percentile)} percentile)")
        elif not ok and not why:
            why.append("the wrong direction")
        if label == "value" and held_fixed is False:
            why.append("gone when the rival is held fixed")
        parts.append(f"{label}: {'holds' if ok else 'fails (' + '; '.join(why) + ')'}")
    return verdict, "; ".join(parts)


@dataclass(frozen=True)
class Audit(Record):
    """A whole audit: the axis, the layer, the units, how chats were rendered, and each test.

    ``axis_sigma`` is the axis's recorded σ at the layer (its ``sigma_reference``), in which
    effects are given; ``reference_sigma`` its spread over the neutral reference, the unit its
    null is compared in; ``command`` reproduces the file."""

    FORMAT: ClassVar[str] = "valueprobe.audit"

    probe: str
    model_id: str
    layer: int
    site: str
    axis_sigma: float
    sigma_reference: str
    reference_sigma: float
    reference_tokens: int
    n_random: int
    rendering: str
    tests: tuple[AuditTest, ...]
    command: str
    seconds: float

    def test(self, key: str) -> AuditTest | None:
        return next((t for t in self.tests if t.key == key), None)

    def summary_lines(self) -> list[str]:
        """summary.md: the verdict table, then each test's design, effects and notes, and the command."""
        lines = [f"# Is it value? {self.probe}, layer {self.layer} ({self.model_id})", ""]
        lines += markdown_table(*self.table())
        lines += [
            "",
            f"Effects in the axis's recorded σ ({self.axis_sigma:.4g}; {self.sigma_reference}); the null: {self.n_random}"
            f" random directions on the same tokens, each in its own σ over neutral_text ({self.reference_tokens}"
            f" tokens; the axis's: {self.reference_sigma:.4g}). Chats: {self.rendering}.",
            "",
            f"Reproduce: `{self.command}`",
        ]
        for t in self.tests:
            lines += ["", f"## {t.key}. {t.title}: {t.verdict}", "", t.design, "", f"Why: {t.why}.", ""]
            lines += markdown_table(
                ["effect", "role", "axis [95% CI] (random null)", "holds"],
                [[e.name, e.role, effect_text(e), "yes" if e.holds else "no"] for e in t.effects],
            )
            lines += ["", *(f"- {n}" for n in t.notes), f"- cost: {t.cost}, {t.seconds:.0f} s"]
        return lines

    def table(self) -> tuple[list[str], list[list[str]]]:
        """One row per test: its verdict, both effects with CI and null, and its cost."""
        headers = ["test", "verdict", "value effect [95% CI] (null)", "rival effect [95% CI] (null)", "cost"]
        rows = []
        roles: tuple[Role, Role] = ("value", "rival")
        for t in self.tests:
            cells = []
            for role in roles:
                e = t.effect(role)
                cells.append("—" if e is None else effect_text(e))
            rows.append([f"{t.key}. {t.title}", t.verdict, *cells, f"{t.cost}, {t.seconds:.0f} s"])
        return headers, rows


def effect_text(e: Effect) -> str:
    """``+0.486 σ [+0.441, +0.530] (null [−0.05, +0.05], 100th pct)``."""
    lo, hi = e.null
    null = (
        f"null [{lo:+.3g}, {hi:+.3g}], {ordinal(e.null_percentile)} pct" if math.isfinite(lo) else "no null"
    )
    signs = f", {e.n_positive}/{e.n} positive" if e.n_positive >= 0 else ""
    return f"{e.estimate:+.3g} {e.unit} [{e.ci[0]:+.3g}, {e.ci[1]:+.3g}] ({null}{signs})"


def ordinal(x: float) -> str:
    """``97`` -> ``"97th"``, ``1`` -> ``"1st"``; NaN -> ``"n/a"``."""
    if not math.isfinite(x):
        return "n/a"
    n = round(x)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
