"""Read the residual stream: hooks on the decoder blocks, token selection, batching, padding.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")
    >>> ex = vp.read_jsonl("data/icrl.jsonl")[:8]
    >>> res = vp.capture(lm, ex, layers="-10:", positions="spans")
    >>> res.acts[20].shape, res.rows.span[:2]
    (torch.Size([16, 576]), ['pre', 'post'])

CLI: ``valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl``

Vocabulary (TransformerLens): ``resid_pre[L]`` is the input of block L, ``resid_post[L]`` its output,
``"embed"`` the embedding output (``resid_pre[0]``). Reductions (last token, means, span means) run
inside the hook, so memory is one ``[rows, d_model]`` tensor per layer per batch, not per token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from valueprobe.activations.encode import Encoded, encode
from valueprobe.datasets.io import Example, regroup
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.hooks.route import position_ids_from_mask, residuals
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import (
    ChatTemplate,
    LayerKey,
    LayerSpec,
    PaddingSide,
    Positions,
    RouteName,
    Site,
    choice,
    parse_layers,
)

__all__ = [
    "CaptureResult",
    "CaptureSettings",
    "Rows",
    "capture",
    "iter_batches",
    "run_captured",
    "run_encoded",
    "run_until",
]


@dataclass(frozen=True)
class CaptureSettings:
    """What a capture reads and how it runs: `capture` and
    `valueprobe.activations.store.capture_to_store` take one (a store's manifest records each).

    Attributes:
        layers: ``"all"``, an int, a list, or ``"0:10"``; negative indices count from the end.
        site: ``"resid_post"`` (block output) or ``"resid_pre"`` (block input).
        positions: ``last`` token, ``mean`` over tokens, ``all`` tokens, ``spans`` (mean per labelled
            span), or ``span_tokens`` (every token inside a span, labelled).
        include_embed: also capture the embedding output under the key ``"embed"``.
        max_length: truncate longer texts (with a warning); without it a text over the model's
            context is an error.
        span_labels: with span positions, keep only spans with these labels.
        group_by: ``"meta.KEY"`` to take each row's group from the example's meta (see :func:`regroup`).
        chat_template: ``model`` (the tokenizer's) or ``plain`` (a transcript, for base models).
        batch_size: examples per forward; padding_side: the side a batch is padded on.
        route: ``hooks`` (plain PyTorch), ``nnsight`` (``remote=True`` runs on NDIF) or ``tlens``.

    >>> res = vp.capture(lm, examples, vp.CaptureSettings(layers=[12, 18], positions="mean"))
    """

    layers: LayerSpec = "all"
    site: Site = Site.resid_post
    positions: Positions = Positions.last
    include_embed: bool = False
    max_length: int | None = None
    span_labels: Sequence[str] | None = None
    group_by: str | None = None
    chat_template: ChatTemplate = ChatTemplate.model
    batch_size: int = 8
    padding_side: PaddingSide = PaddingSide.right
    route: RouteName = RouteName.hooks
    remote: bool = False


@dataclass(frozen=True)
class Rows:
    """Per-row metadata of a capture: one row per example (``last``, ``mean``), per
    (example, span) (``spans``), per token (``all``) or per token inside a span (``span_tokens``)."""

    example_id: list[str]
    label: np.ndarray  # float64 [n]
    group: list[str]
    span: list[str]  # the row's span label, "" when not span-based
    token_index: (
        np.ndarray
    )  # int64 [n]: token position (mean/spans: mean index of the reduced tokens, rounded)
    n_tokens: np.ndarray  # int64 [n]: non-pad tokens in the example's sequence

    def __len__(self) -> int:
        return len(self.example_id)

    def select(self, idx: np.ndarray | Sequence[int]) -> Rows:
        idx = np.asarray(idx, dtype=np.int64)
        return Rows(
            example_id=[self.example_id[i] for i in idx],
            label=self.label[idx],
            group=[self.group[i] for i in idx],
            span=[self.span[i] for i in idx],
            token_index=self.token_index[idx],
            n_tokens=self.n_tokens[idx],
        )

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        return Rows(
            example_id=[x for p in parts for x in p.example_id],
            label=np.concatenate([p.label for p in parts]) if parts else np.zeros(0),
            group=[x for p in parts for x in p.group],
            span=[x for p in parts for x in p.span],
            token_index=np.concatenate([p.token_index for p in parts]) if parts else np.zeros(0, np.int64),
            n_tokens=np.concatenate([p.n_tokens for p in parts]) if parts else np.zeros(0, np.int64),
        )


@dataclass(frozen=True)
class CaptureResult:
    rows: Rows
    acts: dict[LayerKey, Float[Tensor, "row d_model"]]


@dataclass(frozen=True)
class Batch:
    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    position_ids: Int[Tensor, "batch pos"]
    weights: Float[Tensor, "batch row pos"]  # row r of example b = weights[b, r] @ h[b]
    gather: tuple[Tensor, Tensor] | None  # (batch idx, pos idx) per row, for one-token selections
    row_slots: tuple[Tensor, Tensor]  # (batch idx, row idx) of the valid rows, in output order
    rows: Rows

    def selection_on(self, device: torch.device) -> Batch:
        """The token selection moved to ``device`` once, not once per layer inside the hook."""
        slots = (self.row_slots[0].to(device), self.row_slots[1].to(device))
        gather = None if self.gather is None else (self.gather[0].to(device), self.gather[1].to(device))
        return replace(self, weights=self.weights.to(device), gather=gather, row_slots=slots)


def make_batch(items: Sequence[Encoded], *, padding_side: PaddingSide, pad_id: int) -> Batch:
    """Pad a batch, with explicit position ids so a left-padded row sees the same positions as alone."""
    ids, mask = pad_rows([e.input_ids for e in items], pad_id=pad_id, side=padding_side)
    b, width = ids.shape
    shifts = [width - len(e.input_ids) if padding_side == "left" else 0 for e in items]
    position_ids = position_ids_from_mask(mask)
    one_token = all(len(toks) == 1 for e in items for _, toks in e.selections)
    max_rows = max(len(e.selections) for e in items)
    weights = torch.zeros((b, 0 if one_token else max_rows, width))
    gb, gp, sb, sr = [], [], [], []
    ex_id, label, group, span, tindex, ntok = [], [], [], [], [], []
    for i, e in enumerate(items):
        for r, (span_label, toks) in enumerate(e.selections):
            if one_token:
                gb.append(i)
                gp.append(toks[0] + shifts[i])
            else:
                weights[i, r, [t + shifts[i] for t in toks]] = 1.0 / len(toks)
            sb.append(i)
            sr.append(r)
            ex_id.append(e.example.id)
            label.append(float(e.example.label))
            group.append(e.example.group)
            span.append(span_label)
            tindex.append(int(round(sum(toks) / len(toks))))
            ntok.append(len(e.input_ids))
    rows = Rows(
        ex_id, np.array(label, np.float64), group, span, np.array(tindex, np.int64), np.array(ntok, np.int64)
    )
    gather = (torch.tensor(gb), torch.tensor(gp)) if one_token else None
    return Batch(ids, mask, position_ids, weights, gather, (torch.tensor(sb), torch.tensor(sr)), rows)


def reduce_batch(h: Float[Tensor, "batch pos d_model"], batch: Batch) -> Float[Tensor, "row d_model"]:
    """Apply a batch's token selection to one layer's hidden states, in fp32 on the CPU.

    Runs inside the forward hook: the selection is already on the model's device
    (:meth:`Batch.selection_on`), so the ``.to`` calls below are no-ops there.
    """
    if batch.gather is not None:
        return h[batch.gather[0].to(h.device), batch.gather[1].to(h.device)].float().cpu()
    pooled = torch.bmm(batch.weights.to(h.device, torch.float32), h.float())  # [batch, row, d]
    return pooled[batch.row_slots[0].to(h.device), batch.row_slots[1].to(h.device)].cpu()


def iter_batches(
    encoded: Sequence[Encoded], *, batch_size: int, padding_side: PaddingSide, pad_id: int
) -> Iterator[Batch]:
    for i in range(0, len(encoded), batch_size):
        yield make_batch(encoded[i : i + batch_size], padding_side=padding_side, pad_id=pad_id)


def _route_run(
    lm: LoadedModel,
    batch: Batch,
    *,
    layers: list[int],
    site: Site,
    include_embed: bool,
    route: RouteName = RouteName.hooks,
    remote: bool = False,
) -> dict[LayerKey, Tensor]:
    """One forward pass of a batch; returns the selected rows per layer key.

    With the default ``hooks`` route the token selection runs inside the forward hook, and the
    forward stops after the last block needed (so the unembedding never runs).
    """
    if not remote:
        batch = batch.selection_on(lm.device)
    try:
        got = residuals(
            lm,
            batch.input_ids,
            batch.attention_mask,
            layers=layers,
            site=site,
            include_embed=include_embed,
            route=route,
            position_ids=batch.position_ids,
            remote=remote,
            reduce=partial(reduce_batch, batch=batch),
        )
    except Exception as exc:
        if not remote or isinstance(exc, ValueprobeError):
            raise
        # NDIF failures arrive as connection errors, HTTP errors or nnsight's own, often multi-line.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueprobeError(
            f"remote run on NDIF failed ({type(exc).__name__}: {first}): check the network, NDIF_API_KEY,"
            f" and that NDIF serves {lm.model_id!r} (a hub id); or drop --remote to run locally"
        ) from None
    return {("embed" if k == "embed" else int(k)): v for k, v in got.items()}


def capture(
    lm: LoadedModel,
    examples: Sequence[Example],
    settings: CaptureSettings = CaptureSettings(),
    *,
    progress: bool = True,
) -> CaptureResult:
    """Capture residual activations of ``examples`` in memory.

    Args:
        lm: from :func:`valueprobe.load`.
        examples: dataset examples (:func:`valueprobe.read_jsonl`).
        settings: what to read and how (`CaptureSettings`: layers, site, positions...).

    Returns:
        rows (metadata) and one float32 ``[rows, d_model]`` tensor per layer.
    """
    s = settings
    if not examples:
        raise ValueprobeError("no examples to capture: the dataset is empty")
    choice(Site, s.site, what="site")  # refused before the examples are encoded
    if s.batch_size < 1:
        raise ValueprobeError(f"batch_size must be >= 1, got {s.batch_size}")
    layer_list = parse_layers(s.layers, n_layers=lm.n_layers)
    examples = regroup(examples, s.group_by)
    encoded = encode(
        lm,
        examples,
        positions=s.positions,
        max_length=s.max_length,
        span_labels=s.span_labels,
        chat_template=s.chat_template,
    )
    with tqdm(total=len(encoded), desc="capture", unit="ex", disable=not progress) as bar:
        return run_captured(lm, encoded, s, layers=layer_list, on_batch=bar.update)


def run_captured(
    lm: LoadedModel,
    encoded: Sequence[Encoded],
    settings: CaptureSettings,
    *,
    layers: list[int],
    on_batch: Callable[[int], object] | None = None,
) -> CaptureResult:
    """`run_encoded` as ``settings`` say (``layers`` resolved on ``lm``): what `capture` and each
    checkpoint of `valueprobe.activations.store.capture_to_store` run."""
    s = settings
    return run_encoded(
        lm,
        encoded,
        layers=layers,
        site=choice(Site, s.site, what="site"),
        include_embed=s.include_embed,
        batch_size=s.batch_size,
        padding_side=s.padding_side,
        route=s.route,
        remote=s.remote,
        on_batch=on_batch,
    )


def run_encoded(
    lm: LoadedModel,
    encoded: Sequence[Encoded],
    *,
    layers: list[int],
    site: Site,
    include_embed: bool,
    batch_size: int,
    padding_side: PaddingSide,
    route: RouteName = RouteName.hooks,
    remote: bool = False,
    on_batch: Callable[[int], object] | None = None,
) -> CaptureResult:
    """Batch, run and concatenate already-encoded examples; ``on_batch(n)`` reports progress."""
    parts: dict[LayerKey, list[Tensor]] = {}
    rows: list[Rows] = []
    for batch in iter_batches(
        encoded, batch_size=batch_size, padding_side=padding_side, pad_id=pad_id_for(lm.tokenizer)
    ):
        got = _route_run(
            lm, batch, layers=layers, site=site, include_embed=include_embed, route=route, remote=remote
        )
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
        rows.append(batch.rows)
        if on_batch is not None:
            on_batch(batch.input_ids.shape[0])
    return CaptureResult(rows=Rows.concat(rows), acts={k: torch.cat(v) for k, v in parts.items()})


def run_until(
    lm: LoadedModel,
    chunk: list[Encoded],
    settings: CaptureSettings,
    *,
    layers: list[int],
    deadline: float,
    on_batch: Callable[[int], object],
) -> tuple[CaptureResult, int]:
    """Run ``chunk`` batch by batch (the same batches as one pass), stopping at the first batch
    boundary past ``deadline``; returns the result and how many examples of ``chunk`` it covers."""
    parts, done = [], 0
    while done < len(chunk):
        batch = chunk[done : done + settings.batch_size]
        parts.append(run_captured(lm, batch, settings, layers=layers, on_batch=on_batch))
        done += len(batch)
        if time.monotonic() >= deadline:
            break
    acts = {k: torch.cat([p.acts[k] for p in parts]) for k in parts[0].acts}
    return CaptureResult(rows=Rows.concat([p.rows for p in parts]), acts=acts), done
