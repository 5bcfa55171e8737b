"""Exact activation patching: one component's output moved from one row of a pair into the other.

    >>> from valueprobe.attribute.patching import PatchPlan, pair_runs, patch_pair
    >>> plan = PatchPlan.of(lm, layer=22, resid_layers=[0, 8, 16, 22])
    >>> runs = pair_runs(lm, read, pair, plan)                # both rows whole: baselines, sources
    >>> effects, grid, base = patch_pair(lm, read, pair, plan, runs, dest=1)   # denoising

``dest`` is the row patched (1: the corrupt row, denoising; 0: the clean row, noising); the other
row is the source. Components are each head (columns ``h*d_head..`` of ``attn_z``), each MLP
output and each residual cell ``resid_post[l]`` at one position. Each patched run is one batch row,
measured by the read σ at the axis layer and, where asked, the yes/no behaviour; an effect is the
change from the unpatched destination run.

Every position before the pair's first differing token holds the same activations in both rows
and under every patch (the model is causal), so that prefix runs once into a KV cache and each
batch of patched rows runs only the tokens from the first difference on: the same numbers as
patching whole sequences (tests/test_attribute_patching.py checks it), in a fraction of the work.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from functools import partial

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm
from transformers import DynamicCache

from valueprobe.attribute.components import Component, patchable
from valueprobe.attribute.pairs import PatchPair
from valueprobe.attribute.readout import Readout, cache_kwargs
from valueprobe.hooks.patch import Point, StopForward, intervene, record
from valueprobe.model.load import LoadedModel
from valueprobe.model.parts import head_weights
from valueprobe.vocab import HookSite, PartSite

__all__ = ["PairRuns", "PatchPlan", "pair_runs", "patch_pair"]


@dataclass(frozen=True)
class PatchPlan:
    """What is patched: the heads and MLPs of blocks 0..``layer`` (``components``) and the residual
    cells of ``resid_layers`` at every position from a pair's first difference on."""

    layer: int
    components: tuple[Component, ...]
    resid_layers: tuple[int, ...]
    d_head: int

    @classmethod
    def of(cls, lm: LoadedModel, *, layer: int, resid_layers: Sequence[int]) -> PatchPlan:
        return cls(layer, patchable(lm, layer), tuple(resid_layers), int(head_weights(lm, 0)[0].shape[1]))

    @property
    def blocks(self) -> range:
        return range(self.layer + 1)


@dataclass(frozen=True)
class PairRuns:
    """Both rows of a pair run whole (row 0 clean, 1 corrupt): what patching moves, from the first
    difference on (``z``, ``mlp``, ``resid`` by block, ``[2, suffix, width]``), each row's read σ
    and behaviour, and the read's part over the shared prefix (a constant under every patch)."""

    z: dict[int, Tensor]
    mlp: dict[int, Tensor]
    resid: dict[int, Tensor]
    read: Float[Tensor, " 2"]
    behaviour: Float[Tensor, " 2"] | None
    prefix_read: float  # Σ_{t < first_diff} w_t h_t·v̂, the same in both rows


def _ids(pair: PatchPair) -> Tensor:
    return torch.tensor([pair.clean.input_ids, pair.corrupt.input_ids])


def _forward(
    lm: LoadedModel, ids: Tensor, *, start: int = 0, cache: DynamicCache | None = None
) -> Tensor | None:
    """Run ``ids`` (columns ``start..``) after a cache of the first ``start`` columns; the last
    position's logits, or None when a recorder stopped the forward early."""
    b, s = ids.shape
    device = lm.device
    kwargs = cache_kwargs(lm, cache) if cache is not None else {"use_cache": False}
    out = None
    with suppress(StopForward):
        out = lm.model(
            input_ids=ids.to(device),
            attention_mask=torch.ones(b, start + s, dtype=torch.long, device=device),
            position_ids=torch.arange(start, start + s, device=device).expand(b, s),
            logits_to_keep=1,
            **kwargs,
        )
    return None if out is None else out.logits[:, -1].float().cpu()


def pair_runs(lm: LoadedModel, read: Readout, pair: PatchPair, plan: PatchPlan) -> PairRuns:
    """Run both rows of ``pair`` whole, keeping what `patch_pair` moves and the baselines."""
    f, L = pair.first_diff, plan.layer
    points = {
        **{("z", b): Point(b, PartSite.attn_z) for b in plan.blocks},
        **{("mlp", b): Point(b, HookSite.mlp_out) for b in plan.blocks},
        **{("resid", b): Point(b, HookSite.resid_post) for b in {*plan.resid_layers, L}},
    }
    with record(lm, list(points.values()), stop=not read.behaviour) as rec, torch.no_grad():
        logits = _forward(lm, _ids(pair))
    got = {key: rec[p].float().cpu() for key, p in points.items()}
    w = read.weights(pair.clean)
    proj = got[("resid", L)].double() @ read.direction.double()  # [2, pos]
    return PairRuns(
        z={b: got[("z", b)][:, f:] for b in plan.blocks},
        mlp={b: got[("mlp", b)][:, f:] for b in plan.blocks},
        resid={b: got[("resid", b)][:, f:] for b in plan.resid_layers},
        read=read.sigma_of(proj @ w),
        behaviour=None if logits is None else read.yes_no(logits),
        prefix_read=float(proj[0, :f] @ w[:f]),
    )


def _prefix_cache(lm: LoadedModel, pair: PatchPair, read: Readout) -> DynamicCache | None:
    """The KV cache of the tokens both rows share (None when they differ from the first token)."""
    if pair.first_diff == 0:
        return None
    cache = DynamicCache(config=lm.model.config)
    stop = [] if read.behaviour else [Point(read.layer, HookSite.resid_post)]
    with record(lm, stop, stop=bool(stop)), torch.no_grad():
        _forward(lm, _ids(pair)[:1, : pair.first_diff], cache=cache)
    return cache


def _swap(h: Tensor, step: object, *, mask: Tensor, src: Tensor) -> Tensor:
    """``h`` with the masked cells taken from ``src`` (the source row's activations, same columns)."""
    return torch.where(mask.to(h.device), src.to(h)[None], h)


def _patch_hooks(
    lm: LoadedModel, plan: PatchPlan, rows: Sequence[Component | None], runs: PairRuns, src: int, f: int
) -> ExitStack:
    """One intervention per (block, site) that any row patches, each swapping that row's cells."""
    stack = ExitStack()
    n, width = len(rows), plan.d_head
    masks: dict[tuple[str, int], Tensor] = {}
    for i, c in enumerate(rows):
        if c is None:
            continue
        if c.kind == "head":
            key, cols = ("z", c.layer), slice(c.head * width, (c.head + 1) * width)
            m = masks.setdefault(key, torch.zeros(n, 1, runs.z[c.layer].shape[-1], dtype=torch.bool))
            m[i, 0, cols] = True
        elif c.kind == "mlp":
            masks.setdefault(("mlp", c.layer), torch.zeros(n, 1, 1, dtype=torch.bool))[i] = True
        else:
            m = masks.setdefault(
                ("resid", c.layer), torch.zeros(n, runs.resid[c.layer].shape[1], 1, dtype=torch.bool)
            )
            m[i, c.position - f] = True
    sites: dict[str, tuple[HookSite | PartSite, dict[int, Tensor]]] = {
        "z": (PartSite.attn_z, runs.z),
        "mlp": (HookSite.mlp_out, runs.mlp),
        "resid": (HookSite.resid_post, runs.resid),
    }
    with stack:  # a failure while attaching takes off what was attached
        for (kind, block), mask in masks.items():
            site, acts = sites[kind]
            stack.enter_context(
                intervene(lm, Point(block, site), partial(_swap, mask=mask, src=acts[block][src]))
            )
        return stack.pop_all()


def _run_rows(
    lm: LoadedModel,
    read: Readout,
    pair: PatchPair,
    plan: PatchPlan,
    runs: PairRuns,
    rows: Sequence[Component | None],
    *,
    dest: int,
    cache: DynamicCache | None,
) -> tuple[Tensor, Tensor | None]:
    """Read σ and behaviour of the destination row under each of ``rows``' patches (None: unpatched)."""
    f = pair.first_diff
    suffix = _ids(pair)[dest : dest + 1, f:].expand(len(rows), -1)
    batch_cache = None
    if cache is not None:
        batch_cache = copy.deepcopy(cache)
        batch_cache.batch_repeat_interleave(len(rows))
    at = Point(read.layer, HookSite.resid_post)
    w = read.weights(pair.clean)[f:]
    with (
        _patch_hooks(lm, plan, rows, runs, 1 - dest, f),
        torch.no_grad(),
        record(lm, [at], stop=not read.behaviour) as rec,
    ):
        logits = _forward(lm, suffix, start=f, cache=batch_cache)
    proj = rec[at].double().cpu() @ read.direction.double()  # [rows, suffix]
    sigma = read.sigma_of(runs.prefix_read + proj @ w)
    return sigma, None if logits is None else read.yes_no(logits)


def patch_pair(
    lm: LoadedModel,
    read: Readout,
    pair: PatchPair,
    plan: PatchPlan,
    runs: PairRuns,
    *,
    dest: int,
    batch_size: int = 16,
    progress: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Patch every component and residual cell of ``plan`` from the other row into row ``dest``.

    Returns ``effects`` ``[components, 2]`` (Δ read σ, Δ behaviour; NaN without a behaviour),
    ``grid`` ``[resid_layers, suffix, 2]`` for the residual cells from the first difference on,
    and ``base`` ``[2]``: the unpatched destination run (read σ, behaviour) they are measured from.
    """
    f, n = pair.first_diff, pair.n_tokens
    cells = [Component("resid", layer, position=p) for layer in plan.resid_layers for p in range(f, n)]
    rows: list[Component | None] = [None, *plan.components, *cells]
    cache = _prefix_cache(lm, pair, read)
    reads, behaviours = [], []
    what = f"{pair.name} {'denoising' if dest else 'noising'}"
    with tqdm(total=len(rows), desc=what, unit="run", leave=False, disable=not progress) as bar:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            sigma, beh = _run_rows(lm, read, pair, plan, runs, chunk, dest=dest, cache=cache)
            reads.append(sigma)
            behaviours.append(torch.full_like(sigma, float("nan")) if beh is None else beh)
            bar.update(len(chunk))
    value = torch.stack([torch.cat(reads), torch.cat(behaviours)], dim=1)  # [rows, 2]
    effect = value[1:] - value[0]
    k = len(plan.components)
    grid = effect[k:].reshape(len(plan.resid_layers), n - f, 2)
    return effect[:k], grid, value[0]
