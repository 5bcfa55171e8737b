"""What ``valueprobe attribute`` saves: one `Attribution` record (attribution.json, components.csv).

    >>> res = Attribution.from_dict(json.load(open("runs/attr/attribution.json")))
    >>> res.top(5)                       # the five components that move the read most (heads and MLPs)
    >>> headers, rows = res.table()

Direct attribution fills ``terms`` (`DirectTerm`: each term's class means, the gap between classes
with its bootstrap CI over units, the same gap along random directions); patching fills
``patches`` (`PatchTerm`: mean effect over pairs, denoising and noising) with the ``baselines``
and the residual ``grid``; ``ablation`` holds the circuit ablation against its random-set null.
Every value in σ is in units of the axis's σ at the read layer.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from valueprobe.files import jsonable
from valueprobe.records import Record

__all__ = [
    "AblatedMetric",
    "Ablation",
    "Agreement",
    "Attribution",
    "Baselines",
    "DirectTerm",
    "GridView",
    "PatchTerm",
    "ResidGrid",
]

Pair2 = tuple[float, float]
Grid = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class DirectTerm:
    """One term of ``h_L·v̂`` (σ units): its mean in class 1 and class 0, the gap (class 1 − 0, within
    units when paired) with a 95% CI over units, the central 95% of the same gap along random
    directions, whether the gap leaves it, and its within-text correlation with token position."""

    name: str
    kind: str
    layer: int
    head: int
    mean_1: float
    mean_0: float
    gap: float
    gap_ci: Pair2
    null: Pair2
    beyond_null: bool
    position_r: float

    @property
    def score(self) -> float:
        return self.gap


@dataclass(frozen=True)
class PatchTerm:
    """One component's patching effect, mean over pairs: on the read (σ) when denoising (source clean,
    destination corrupt) and noising, with 95% CIs over pairs, and on the yes/no behaviour."""

    name: str
    kind: str
    layer: int
    head: int
    denoise: float
    denoise_ci: Pair2
    noise: float
    noise_ci: Pair2
    denoise_behaviour: float = math.nan
    noise_behaviour: float = math.nan

    @property
    def score(self) -> float:
        return self.denoise


@dataclass(frozen=True)
class Baselines:
    """Mean read σ and behaviour of the clean (class 1) and corrupt (class 0) rows, unpatched."""

    clean_read: float
    corrupt_read: float
    clean_behaviour: float
    corrupt_behaviour: float


@dataclass(frozen=True)
class GridView:
    """The residual grid over pairs aligned at one ``anchor``: the first differing token, the first
    token read, or the end. Column 0 sits ``offset`` tokens from the anchor; ``tokens`` are the
    commonest token at each column; effects (read σ) are ``[layers][columns]``, mean over the pairs
    that have the column (NaN where none has)."""

    anchor: str
    offset: int
    tokens: tuple[str, ...]
    denoise: Grid
    noise: Grid


@dataclass(frozen=True)
class ResidGrid:
    """Mean effect (read σ) of patching ``resid_post[layer]`` at one position, over pairs, in three
    views: after the first difference, around the read, and before the end (pairs differ in length
    between those anchors, so no single alignment lines all of them up)."""

    layers: tuple[int, ...]
    views: tuple[GridView, ...]


@dataclass(frozen=True)
class AblatedMetric:
    """One measure under ablation: with nothing ablated, with the top-k ablated, and under each
    random set of the same kinds. ``drop`` is how much of the separation the top-k removes (toward
    0.5 for an AUROC, toward 0 otherwise); ``necessary`` when it exceeds the 97.5th percentile of the
    random sets' drops."""

    name: str
    none: float
    top: float
    null: tuple[float, ...]
    drop: float
    null_drops: Pair2
    necessary: bool


@dataclass(frozen=True)
class Ablation:
    """Mean ablation of the top ``k`` components (ranked on the fit half) on the held-out half,
    against ``n_draws`` random sets of as many heads and MLPs."""

    k: int
    components: tuple[str, ...]
    n_draws: int
    n_units: int
    steer_sigma: float
    auroc: AblatedMetric
    gap: AblatedMetric
    steer: AblatedMetric | None = None

    @property
    def metrics(self) -> tuple[AblatedMetric, ...]:
        return (self.auroc, self.gap) + (() if self.steer is None else (self.steer,))


@dataclass(frozen=True)
class Agreement:
    """How well attribution patching (``approx``) matches exact patching on the same pairs: Spearman
    ρ over the heads and MLPs and over the residual cells (denoising, read σ), the overlap of their
    top ``k`` by |effect|, and where they disagree (exact top-k components the estimate ranks outside
    its top k, or gives the other sign)."""

    n_pairs: int
    spearman_components: float
    spearman_cells: float
    k: int
    top_k_overlap: float
    missed: tuple[str, ...]
    sign_flips: tuple[str, ...]


@dataclass(frozen=True)
class Attribution(Record):
    """The result of one ``valueprobe attribute`` run (see the module doc).

    ``read`` says which token rows the axis is read on; ``axis_gap`` is the axis's own class gap
    (the sum of the terms) with its CI, ``axis_auroc`` its AUROC (within units when ``paired``);
    ``closure`` the largest |Σ terms − h_L·v̂| over rows, in σ (direct attribution only).
    """

    method: str
    model_id: str
    fingerprint: str
    probe: str
    layer: int
    sigma: float
    data: tuple[str, ...]
    read: str
    n_units: int
    n_rows: int
    paired: bool
    axis_gap: float
    axis_gap_ci: Pair2
    axis_auroc: float
    n_random: int = 0
    closure: float | None = None
    terms: tuple[DirectTerm, ...] = ()
    patches: tuple[PatchTerm, ...] = ()
    baselines: Baselines | None = None
    grid: ResidGrid | None = None
    ablation: Ablation | None = None
    agreement: Agreement | None = None
    notes: tuple[str, ...] = ()

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        return jsonable(d)  # strict JSON already (NaN as null): the report and the parts read it as is

    def with_ablation(self, ablation: Ablation) -> Attribution:
        return replace(self, ablation=ablation)

    def with_agreement(self, agreement: Agreement) -> Attribution:
        return replace(self, agreement=agreement)

    @property
    def components(self) -> tuple[DirectTerm | PatchTerm, ...]:
        return self.terms or self.patches

    def ranked(self) -> list[DirectTerm | PatchTerm]:
        """Heads and MLPs, largest |score| first (direct: the gap; patching: the denoising effect)."""
        pool = [c for c in self.components if c.kind in ("head", "mlp") and math.isfinite(c.score)]
        return sorted(pool, key=lambda c: -abs(c.score))

    def top(self, k: int) -> list[str]:
        return [c.name for c in self.ranked()[:k]]

    def position_share(self, *, threshold: float = 0.5) -> float:
        """Of the direct terms' summed |gap|, the share written by terms that track token position
        (|``position_r``| >= ``threshold``); NaN when no term's correlation was measured."""
        terms = [t for t in self.terms if math.isfinite(t.position_r)]
        total = sum(abs(t.gap) for t in terms)
        if not terms or total == 0:
            return math.nan
        return sum(abs(t.gap) for t in terms if abs(t.position_r) >= threshold) / total

    def table(self, n: int = 12) -> tuple[list[str], list[list[str]]]:
        """The ``n`` components that move the read most, as printed by the CLI."""
        if self.terms:
            headers = ["component", "gap σ", "95% CI", "random null", "beyond", "position r"]
            rows = [
                [t.name, f"{t.gap:+.3f}", _pair(t.gap_ci), _pair(t.null), "yes" if t.beyond_null else "no",
                 f"{t.position_r:+.2f}"]
                for t in self.ranked()[:n]
                if isinstance(t, DirectTerm)
            ]  # fmt: skip
            return headers, rows
        headers = ["component", "denoise Δσ", "95% CI", "noise Δσ", "denoise Δ yes-no", "noise Δ yes-no"]
        rows = [
            [p.name, f"{p.denoise:+.3f}", _pair(p.denoise_ci), f"{p.noise:+.3f}", f"{p.denoise_behaviour:+.3f}",
             f"{p.noise_behaviour:+.3f}"]
            for p in self.ranked()[:n]
            if isinstance(p, PatchTerm)
        ]  # fmt: skip
        return headers, rows

    def csv(self) -> str:
        """components.csv: one row per component, every field of its record."""
        rows = [_flat(asdict(c)) for c in self.components]
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        return out.getvalue()


def _pair(p: Pair2) -> str:
    return f"[{p[0]:+.3f}, {p[1]:+.3f}]"


def _flat(d: dict[str, Any]) -> dict[str, Any]:
    """A record's fields for a CSV row: a (lo, hi) pair becomes two columns, floats shortest-exact."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, tuple | list) and len(v) == 2:
            out[f"{k}_lo"], out[f"{k}_hi"] = (repr(float(x)) for x in v)
        else:
            out[k] = repr(v) if isinstance(v, float) else v
    return out
