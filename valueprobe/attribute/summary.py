"""From per-item results (rows' terms, pairs' effects) to the `Attribution` record: statistics, no model.

    >>> res = summarize_direct(header, direct, units, target=Target.span, n_boot=1000)
    >>> res = summarize_patch(header, pairs)

`valueprobe.attribute.run` calls these when every item is done, and ``valueprobe merge`` on the
joined parts of a sharded run: the same numbers either way.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from valueprobe.activations.capture import Rows
from valueprobe.attribute.components import Component
from valueprobe.attribute.contrast import Classes
from valueprobe.attribute.direct import DirectRows
from valueprobe.attribute.records import Attribution, Baselines, DirectTerm, GridView, PatchTerm, ResidGrid
from valueprobe.errors import ValueprobeError
from valueprobe.stats.null import mean_cis, null_range
from valueprobe.vocab import Target

__all__ = ["Header", "PairResult", "row_classes", "summarize_direct", "summarize_patch"]


@dataclass(frozen=True)
class Header:
    """What every `Attribution` of a run carries besides its statistics."""

    method: str
    model_id: str
    fingerprint: str
    probe: str
    layer: int
    sigma: float
    data: tuple[str, ...]
    read: str
    n_random: int = 0


@dataclass(frozen=True)
class PairResult:
    """One pair's patching (exact or estimated), direction 0 denoising, 1 noising.

    ``effects`` ``[2, components, 2]`` and ``grid`` ``[2, resid_layers, suffix, 2]`` (Δ read σ,
    Δ behaviour), ``base`` ``[2, 2]`` the unpatched destinations, ``runs`` ``[2, 2]`` the whole
    rows (read σ, behaviour) × (clean, corrupt); ``tokens`` the pair's tokens from the first difference.
    """

    name: str
    first_diff: int
    read_start: int  # the first token read, counted from the first difference
    tokens: tuple[str, ...]
    effects: torch.Tensor
    grid: torch.Tensor
    base: torch.Tensor
    runs: torch.Tensor


def row_classes(rows: Rows, units: Sequence[str], target: Target) -> tuple[np.ndarray, Classes]:
    """The rows a contrast keeps and their classes: ``span`` keeps ``pre``/``post`` rows (post is
    class 1), ``label`` every row by its label, ``auto`` spans where the rows have both."""
    span = np.asarray(rows.span, dtype=str)
    is_span = np.isin(span, ["pre", "post"])
    both = {"pre", "post"} <= set(span.tolist())
    mode = (Target.span if both else Target.label) if target == Target.auto else target
    if mode == Target.span:
        if not is_span.any():
            raise ValueprobeError("--target span needs rows read on pre/post spans: pass --positions spans")
        keep, y = is_span, span == "post"
    else:
        keep, y = np.ones(len(span), dtype=bool), rows.label >= 0.5
    return keep, Classes.of(y[keep], [units[int(i)] for i in np.flatnonzero(keep)])


def summarize_direct(
    header: Header,
    got: DirectRows,
    units: Sequence[str],
    terms: Sequence[Component],
    *,
    target: Target,
    n_boot: int = 1000,
    seed: int = 0,
) -> Attribution:
    """Each term's class means, gap with its CI, random-direction null and position correlation."""
    keep, cls = row_classes(got.rows, units, target)
    sigma = header.sigma
    x = got.contributions[keep].double().numpy() / sigma  # [rows, terms, 1 + R]
    total = got.total[keep].double().numpy() / sigma
    n, t, k = x.shape
    axis = x[..., 0]
    pos, neg = cls.class_means(axis)
    gap = cls.gap(axis)
    lo, hi = cls.gap_ci(axis, n_boot=n_boot, seed=seed)
    nulls = (
        cls.gap(x[..., 1:].reshape(n, t * (k - 1))).reshape(t, k - 1) if k > 1 else np.full((t, 1), np.nan)
    )
    r = cls.within_unit_r(axis, got.rows.token_index[keep])
    stats = []
    for i, c in enumerate(terms):
        band = null_range(nulls[i])
        stats.append(
            DirectTerm(
                c.name, c.kind, c.layer, c.head, float(pos[i]), float(neg[i]), float(gap[i]),
                (float(lo[i]), float(hi[i])), band, bool(gap[i] < band[0] or gap[i] > band[1]), float(r[i]),
            )
        )  # fmt: skip
    a_lo, a_hi = cls.gap_ci(total[:, :1], n_boot=n_boot, seed=seed)
    return Attribution(
        **_header(header),
        n_units=cls.n_units,
        n_rows=n,
        paired=cls.paired,
        axis_gap=float(cls.gap(total[:, :1])[0]),
        axis_gap_ci=(float(a_lo[0]), float(a_hi[0])),
        axis_auroc=cls.auroc(total[:, 0]),
        closure=float(np.abs(axis.sum(1) - total[:, 0]).max()),
        terms=tuple(stats),
    )


def _header(h: Header) -> dict:
    return dict(
        method=h.method, model_id=h.model_id, fingerprint=h.fingerprint, probe=h.probe, layer=h.layer,
        sigma=h.sigma, data=h.data, read=h.read, n_random=h.n_random,
    )  # fmt: skip


# (anchor, columns before it, columns from it): after the first difference, around the read, the end
VIEWS = (("first difference", 0, 8), ("read", 4, 16), ("end", 12, 0))


def _view(pairs: Sequence[PairResult], anchor: str, before: int, after: int) -> GridView:
    """The pairs' grids aligned at ``anchor``; column j is suffix position ``anchor − before + j``."""
    width, layers = before + after, pairs[0].grid.shape[1]
    acc = np.full((2, len(pairs), layers, width), np.nan)
    tokens: list[Counter] = [Counter() for _ in range(width)]
    for i, p in enumerate(pairs):
        n = p.grid.shape[2]
        at = {"first difference": 0, "read": p.read_start, "end": n}[anchor] - before
        for j in range(width):
            if 0 <= at + j < n:
                acc[:, i, :, j] = p.grid[:, :, at + j, 0].numpy()
                tokens[j][p.tokens[at + j]] += 1
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column no pair has is NaN, as it should be
        mean = np.nanmean(acc, axis=1)
    as_grid = lambda a: tuple(tuple(float(v) for v in row) for row in a)  # noqa: E731
    names = tuple(c.most_common(1)[0][0] if c else "" for c in tokens)
    return GridView(anchor, -before, names, as_grid(mean[0]), as_grid(mean[1]))


def _grid(pairs: Sequence[PairResult], resid_layers: Sequence[int]) -> ResidGrid | None:
    if not resid_layers:
        return None
    return ResidGrid(tuple(resid_layers), tuple(_view(pairs, *v) for v in VIEWS))


def summarize_patch(
    header: Header,
    pairs: Sequence[PairResult],
    components: Sequence[Component],
    resid_layers: Sequence[int],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> Attribution:
    """Mean effects over pairs with 95% CIs (pairs resampled), baselines, and the residual grid."""
    if not pairs:
        raise ValueprobeError("no pairs to summarize: the data holds no matched pair")
    eff = torch.stack([p.effects for p in pairs]).double().numpy()  # [pairs, 2, C, 2]
    d_lo, d_hi = mean_cis(eff[:, 0, :, 0], n_boot=n_boot, seed=seed)
    n_lo, n_hi = mean_cis(eff[:, 1, :, 0], n_boot=n_boot, seed=seed)
    mean = eff.mean(axis=0)
    terms = tuple(
        PatchTerm(
            c.name, c.kind, c.layer, c.head, float(mean[0, i, 0]), (float(d_lo[i]), float(d_hi[i])),
            float(mean[1, i, 0]), (float(n_lo[i]), float(n_hi[i])), float(mean[0, i, 1]), float(mean[1, i, 1]),
        )
        for i, c in enumerate(components)
    )  # fmt: skip
    runs = torch.stack([p.runs for p in pairs]).double().numpy()  # [pairs, metric, row]
    gaps = runs[:, 0, 0] - runs[:, 0, 1]
    g_lo, g_hi = mean_cis(gaps[:, None], n_boot=n_boot, seed=seed)
    cls = Classes.of([1, 0] * len(pairs), [p.name for p in pairs for _ in range(2)])
    return Attribution(
        **_header(header),
        n_units=len(pairs),
        n_rows=2 * len(pairs),
        paired=True,
        axis_gap=float(gaps.mean()),
        axis_gap_ci=(float(g_lo[0]), float(g_hi[0])),
        axis_auroc=cls.auroc(runs[:, 0, :].reshape(-1)),
        patches=terms,
        baselines=Baselines(*(float(v) for v in runs.mean(axis=0).reshape(-1))),
        grid=_grid(pairs, resid_layers),
    )
