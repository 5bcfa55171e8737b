"""Circuit ablation with a null: mean-ablate the top-k components, compare with k random ones.

    >>> from valueprobe.attribute.ablation import ablate, split_units
    >>> fit, held = split_units(examples, seed=0)          # by group: whole rules held out
    >>> res = ablate(lm, read, held, top=["L12H3", "L20.mlp"], means=means, n_draws=32, ...)

A component set counts as necessary only when ablating it removes more of the axis's separation
on held-out examples than ablating as many random heads and MLPs does, over many draws: its drop
must pass the 97.5th percentile of the random sets' drops. Mean ablation replaces a head's slice
of ``attn_z`` (or an MLP's output) at every position by its mean over the fit half's tokens.
Measured on the held-out half: the AUROC of the read σ between the classes (within units when
paired), the class gap in σ, and, where the data has a yes/no behaviour, the steering effect:
the slope of the yes/no logit difference when α = ±``steer_sigma`` σ of the axis is added at the
read layer to the last token, the one whose logits are read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from valueprobe.activations.capture import Rows, iter_batches, make_batch
from valueprobe.activations.encode import Encoded
from valueprobe.attribute.components import Component, kind_counts, patchable
from valueprobe.attribute.contrast import Classes
from valueprobe.attribute.readout import Readout, cache_kwargs
from valueprobe.attribute.records import AblatedMetric, Ablation
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.forward import position_ids_from_mask
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.hooks.patch import Point, StopForward, intervene, record
from valueprobe.model.load import LoadedModel
from valueprobe.model.parts import head_weights
from valueprobe.stats.null import random_subsets
from valueprobe.vocab import HookSite, PaddingSide, PartSite

__all__ = ["Means", "ablate", "mean_outputs", "split_units"]


def split_units(examples: Sequence[Example], *, seed: int = 0) -> tuple[set[str], set[str]]:
    """Example ids of the fit half and of the held-out half, whole groups to each side (a rule's
    conversations all fit or all held out): a random half of the groups, drawn by `random_subsets`."""
    groups = sorted({ex.group for ex in examples})
    if len(groups) < 2:
        raise ValueprobeError(
            f"circuit ablation holds out whole groups, but the data has {len(groups)} group: give data"
            " with several groups (icrl_pairs has one per rule)"
        )
    (picked,) = random_subsets([(len(groups), len(groups) // 2)], 1, seed=seed)[0]
    fit_groups = {groups[i] for i in picked}
    fit = {ex.id for ex in examples if ex.group in fit_groups}
    return fit, {ex.id for ex in examples} - fit


@dataclass(frozen=True)
class Means:
    """Each block's mean ``attn_z`` and MLP output over the fit half's tokens (mean ablation's values)."""

    z: dict[int, Tensor]
    mlp: dict[int, Tensor]


def mean_outputs(lm: LoadedModel, encoded: Sequence[Encoded], *, layer: int, batch_size: int = 8) -> Means:
    """Mean ``attn_z`` and ``mlp_out`` of blocks 0..``layer`` over every real token of ``encoded``."""
    points = [Point(b, s) for b in range(layer + 1) for s in (PartSite.attn_z, HookSite.mlp_out)]
    sums: dict[Point, Tensor] = {}
    count = 0
    device = lm.device
    for batch in iter_batches(
        encoded, batch_size=batch_size, padding_side=PaddingSide.right, pad_id=pad_id_for(lm.tokenizer)
    ):
        mask = batch.attention_mask.to(device)
        keep = lambda h, m=mask: (h.float() * m[..., None]).sum((0, 1)).cpu()  # noqa: E731
        with record(lm, points, reduce=keep, stop=True) as rec, torch.no_grad(), suppress(StopForward):
            lm.model(
                input_ids=batch.input_ids.to(device),
                attention_mask=mask,
                position_ids=batch.position_ids.to(device),
                use_cache=False,
            )
        for p in points:
            sums[p] = sums.get(p, 0) + rec[p]
        count += int(batch.attention_mask.sum())
    return Means(
        z={p.layer: sums[p] / count for p in points if p.site == PartSite.attn_z},
        mlp={p.layer: sums[p] / count for p in points if p.site == HookSite.mlp_out},
    )


def _fill(h: Tensor, step: object, *, cols: Tensor, value: Tensor) -> Tensor:
    """``h`` with the ``cols`` mask [width] replaced by ``value`` [width] at every position."""
    return torch.where(cols.to(h.device), value.to(h), h)


def ablation_hooks(lm: LoadedModel, components: Sequence[Component], means: Means) -> ExitStack:
    """Mean-ablate ``components`` (heads and MLPs) until the returned stack closes."""
    d_head = int(head_weights(lm, 0)[0].shape[1])
    heads: dict[int, Tensor] = {}
    mlps: list[int] = []
    for c in components:
        if c.kind == "head":
            cols = heads.setdefault(c.layer, torch.zeros(means.z[c.layer].shape[0], dtype=torch.bool))
            cols[c.head * d_head : (c.head + 1) * d_head] = True
        elif c.kind == "mlp":
            mlps.append(c.layer)
        else:
            raise ValueprobeError(f"cannot mean-ablate {c.name}: ablation takes heads and MLPs")
    with ExitStack() as stack:  # a failure while attaching takes off what was attached
        for block in mlps:
            every = torch.ones(means.mlp[block].shape[0], dtype=torch.bool)
            fn = partial(_fill, cols=every, value=means.mlp[block])
            stack.enter_context(intervene(lm, Point(block, HookSite.mlp_out), fn))
        for block, cols in heads.items():
            fn = partial(_fill, cols=cols, value=means.z[block])
            stack.enter_context(intervene(lm, Point(block, PartSite.attn_z), fn))
        return stack.pop_all()


def _steer_last(h: Tensor, step: object, *, delta: Tensor) -> Tensor:
    return h + delta.to(h)[:, None, :]


def _prefix(
    lm: LoadedModel,
    at: Point,
    ids: Tensor,
    mask: Tensor,
    *,
    stop: bool,
    cache: DynamicCache | None,
    past: Tensor | None = None,
) -> Tensor:
    """``resid_post`` at ``at`` of a left-padded batch [batch, pos, d_model]; with a cache, it is filled.
    ``past``: the mask of what the cache already holds (its rows' tokens come first)."""
    device = lm.device
    kwargs = {"use_cache": False} if cache is None else cache_kwargs(lm, cache)
    full = mask if past is None else torch.cat([past, mask], dim=1)
    with record(lm, [at], stop=stop) as rec, torch.no_grad(), suppress(StopForward):
        lm.model(
            input_ids=ids.to(device), attention_mask=full.to(device),
            position_ids=position_ids_from_mask(full)[:, -ids.shape[1] :].to(device), logits_to_keep=1, **kwargs,
        )  # fmt: skip
    return rec[at].double().cpu()


def _last_token(
    lm: LoadedModel,
    read: Readout,
    at: Point,
    ids: Tensor,
    mask: Tensor,
    cache: DynamicCache,
    steer_sigma: float,
) -> tuple[Tensor, Tensor]:
    """Each row's last token three times over the cache of the rest, with α = 0, −s, +s σ of the axis
    added there: the unsteered rows' ``resid_post`` [batch, d_model] and the slopes [batch]."""
    b, device = ids.shape[0], lm.device
    cache.batch_repeat_interleave(3)  # rows 3i, 3i+1, 3i+2 are row i's α = 0, −s, +s
    alphas = torch.tensor([0.0, -steer_sigma, steer_sigma]).repeat(b) * read.sigma
    full = torch.cat([mask.repeat_interleave(3, 0), torch.ones(3 * b, 1, dtype=mask.dtype)], dim=1)
    with (
        intervene(lm, at, partial(_steer_last, delta=alphas[:, None] * read.direction[None, :])),
        record(lm, [at]) as rec,
        torch.no_grad(),
    ):
        out = lm.model(
            input_ids=ids.repeat_interleave(3, 0).to(device), attention_mask=full.to(device),
            position_ids=mask.sum(1, keepdim=True).repeat_interleave(3, 0).to(device), logits_to_keep=1,
            **cache_kwargs(lm, cache),
        )  # fmt: skip
    yes_no = read.yes_no(out.logits[:, -1].float().cpu()).reshape(b, 3)
    return rec[at][::3, 0].double().cpu(), (yes_no[:, 2] - yes_no[:, 1]) / (2 * steer_sigma)


def _shared(group: Sequence[Encoded], keep: int) -> int:
    """How many leading tokens every row of ``group`` shares, leaving each row ``keep`` tokens after."""
    ids = [e.input_ids for e in group]
    n = min(len(r) for r in ids) - keep
    return next((i for i in range(n) if any(r[i] != ids[0][i] for r in ids)), n)


def _read_batch(
    lm: LoadedModel, read: Readout, groups: Sequence[Sequence[Encoded]], steer_sigma: float
) -> tuple[Tensor, Tensor]:
    """Per-row read σ of a batch of examples and, with a behaviour, each example's steering slope at
    its last token (NaN without one), the rows in ``groups`` order. A group (a matched pair) shares
    its first tokens: they run once, left-padded, into a KV cache (mean ablation changes them alike
    in every row of the group), then each row's own tokens, then each last token three times."""
    at, behaviour = Point(read.layer, HookSite.resid_post), read.behaviour
    pad, v = pad_id_for(lm.tokenizer), read.direction.double()
    cut = [_shared(g, 1 + behaviour) for g in groups]  # each row keeps >= 1 token of its own
    if min(cut) == 0:  # a group whose rows differ from the first token shares nothing: one row a group
        return _read_batch(lm, read, [[e] for g in groups for e in g], steer_sigma)
    rows = [e for g in groups for e in g]
    which = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    ids, mask = pad_rows(
        [g[0].input_ids[:c] for g, c in zip(groups, cut, strict=True)], pad_id=pad, side="left"
    )
    cache = DynamicCache(config=lm.model.config)
    # without a behaviour nothing past the read layer is needed, by the prefix or the rows after it
    shared = _prefix(lm, at, ids, mask, stop=not behaviour, cache=cache) @ v  # [groups, width]
    # each group's prefix once per row of the group (an index repeated is a row copied)
    cache.batch_select_indices(which.to(lm.device))
    own = [
        e.input_ids[cut[g] : len(e.input_ids) - behaviour] for e, g in zip(rows, which.tolist(), strict=True)
    ]
    own_ids, own_mask = pad_rows(own, pad_id=pad, side="left")
    mine = _prefix(lm, at, own_ids, own_mask, stop=not behaviour, cache=cache, past=mask[which]) @ v
    slopes = torch.full((len(rows),), float("nan"), dtype=torch.float64)
    last = torch.zeros(len(rows), 0, dtype=torch.float64)
    if behaviour:
        past = torch.cat([mask[which], own_mask], dim=1)
        ends = torch.tensor([[e.input_ids[-1]] for e in rows])
        last_h, slopes = _last_token(lm, read, at, ends, past, cache, steer_sigma)
        last = (last_h @ v)[:, None]
    sigmas = []
    for i, e in enumerate(rows):
        # left padding: a row's tokens in each part are that part's last columns
        c, n = cut[int(which[i])], len(own[i])
        p = torch.cat([shared[which[i], shared.shape[1] - c :], mine[i, mine.shape[1] - n :], last[i]])
        sigmas += [read.sigma_of(p[toks].mean()) for _, toks in e.selections]
    return torch.stack(sigmas), slopes


@dataclass(frozen=True)
class HeldOut:
    """The held-out examples, tokenized, their read rows' classes, and the groups of examples that
    share a unit (a matched pair: one prefix run for both)."""

    encoded: tuple[Encoded, ...]
    rows: Rows
    keep: np.ndarray
    classes: Classes
    groups: tuple[tuple[int, ...], ...]


def _measure(
    lm: LoadedModel, read: Readout, held: HeldOut, steer_sigma: float, batch_size: int
) -> tuple[float, float, float]:
    """AUROC, gap and mean steering slope on the held-out half under the hooks now attached.
    Batches hold whole groups, about ``batch_size`` rows, similar lengths together (less padding)."""
    enc = held.encoded
    order = sorted(held.groups, key=lambda g: len(enc[g[0]].input_ids))
    per_batch = max(1, batch_size // max(len(g) for g in order))
    sigmas: list[Tensor] = [torch.empty(0)] * len(enc)
    slopes = torch.empty(len(enc), dtype=torch.float64)
    for lo in range(0, len(order), per_batch):
        batch = order[lo : lo + per_batch]
        got, slope = _read_batch(lm, read, [[enc[i] for i in g] for g in batch], steer_sigma)
        at = 0
        for j, i in enumerate(i for g in batch for i in g):
            n = len(enc[i].selections)
            sigmas[i], slopes[i], at = got[at : at + n], slope[j], at + n
    s = torch.cat(sigmas).numpy()[held.keep]
    return held.classes.auroc(s), float(held.classes.gap(s[:, None])[0]), float(slopes.mean())


def held_out(
    lm: LoadedModel,
    encoded: Sequence[Encoded],
    units: Sequence[str],
    classify: Callable[[Rows, Sequence[str]], tuple[np.ndarray, Classes]],
) -> HeldOut:
    """The held-out half's rows (as capture selects them) and their classes (``classify``)."""
    rows = Rows.concat([make_batch([e], padding_side=PaddingSide.right, pad_id=0).rows for e in encoded])
    per_row = [u for e, u in zip(encoded, units, strict=True) for _ in e.selections]
    keep, classes = classify(rows, per_row)
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(units):
        groups.setdefault(u, []).append(i)
    return HeldOut(tuple(encoded), rows, keep, classes, tuple(tuple(g) for g in groups.values()))


def _metric(name: str, values: list[float], center: float) -> AblatedMetric:
    """Drops relative to the unablated run (``values[0]``); ``values[1]`` the top-k, then the draws."""
    none, top, null = values[0], values[1], np.asarray(values[2:], dtype=np.float64)
    sign = 1.0 if none >= center else -1.0
    drops = sign * (none - null)
    hi = float(np.percentile(drops, 97.5)) if drops.size else float("nan")
    drop = sign * (none - top)
    band = (float(np.percentile(drops, 2.5)), hi) if drops.size else (float("nan"), float("nan"))
    return AblatedMetric(
        name, none, top, tuple(float(v) for v in null), drop, band, bool(drops.size and drop > hi)
    )


def ablate(
    lm: LoadedModel,
    read: Readout,
    held: HeldOut,
    top: Sequence[Component],
    means: Means,
    *,
    n_draws: int = 32,
    seed: int = 0,
    steer_sigma: float = 2.0,
    batch_size: int = 8,
    progress: Callable[[int], object] | None = None,
) -> Ablation:
    """Ablate nothing, the ``top`` components, then ``n_draws`` random sets of as many heads and
    MLPs (blocks 0..read layer), measuring each on the held-out half."""
    pool = patchable(lm, read.layer)
    heads, mlps = [c for c in pool if c.kind == "head"], [c for c in pool if c.kind == "mlp"]
    want = kind_counts(top)
    draws = random_subsets(
        [(len(heads), want.get("head", 0)), (len(mlps), want.get("mlp", 0))], n_draws, seed=seed
    )
    sets: list[list[Component]] = [[], list(top)] + [
        [heads[i] for i in h] + [mlps[i] for i in m] for h, m in draws
    ]
    results = []
    for components in sets:
        with ablation_hooks(lm, components, means):
            results.append(_measure(lm, read, held, steer_sigma, batch_size))
        if progress is not None:
            progress(1)
    cols = list(zip(*results, strict=True))
    steer = _metric("steering slope (yes-no per σ)", list(cols[2]), 0.0) if read.behaviour else None
    return Ablation(
        k=len(top), components=tuple(c.name for c in top), n_draws=n_draws, n_units=held.classes.n_units,
        steer_sigma=steer_sigma, auroc=_metric("AUROC", list(cols[0]), 0.5), gap=_metric("gap σ", list(cols[1]), 0.0),
        steer=steer,
    )  # fmt: skip
