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

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.backends import position_ids_from_mask, residuals
from valueprobe.datasets.io import Example, linked_groups
from valueprobe.errors import ValueprobeError
from valueprobe.models import LoadedModel

__all__ = [
    "Rows",
    "CaptureResult",
    "Encoded",
    "ChatTemplate",
    "CHAT_TEMPLATES",
    "context_length",
    "capture",
    "encode",
    "iter_batches",
    "Positions",
    "Site",
    "LayerKey",
]

ChatTemplate = Literal["model", "plain"]
CHAT_TEMPLATES: tuple[str, ...] = ("model", "plain")
Positions = Literal["last", "mean", "all", "spans", "span_tokens"]
Site = Literal["resid_pre", "resid_post"]
LayerKey = int | Literal["embed"]
POSITIONS: tuple[str, ...] = ("last", "mean", "all", "spans", "span_tokens")


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
class Encoded:
    """One tokenized example and the token rows it contributes."""

    example: Example
    input_ids: list[int]
    # (span label, token indices) for every row this example yields under the chosen positions
    selections: list[tuple[str, list[int]]]


# ---------------------------------------------------------------- rendering and token selection


def regroup(examples: Sequence[Example], group_by: str | None) -> list[Example]:
    """Re-key each example's ``group`` by the rows it is linked to through ``meta.KEY``.

    Held-out splits hold out whole groups; ``"meta.pair"`` keeps an original and its corrupted
    variants (or two matched rollouts) in one group, so each group holds both classes. See
    :func:`valueprobe.datasets.io.linked_groups`.

    >>> regroup(examples, "meta.pair")[0].group   # doctest: +SKIP
    'code-0000'
    """
    if group_by is None:
        return list(examples)
    if not group_by.startswith("meta."):
        raise ValueprobeError(f"group_by {group_by!r} must name a meta key, like 'meta.pair'")
    key = group_by[len("meta.") :]
    groups = linked_groups(examples, key)
    if len(set(groups.values())) == len(groups):
        # Every example alone in its group would silently undo the held-out pairing.
        seen = sorted({k for ex in examples for k in ex.meta})
        have = sum(key in ex.meta for ex in examples)
        raise ValueprobeError(
            f"--group-by {group_by} links no two examples ({have} of {len(groups)} have meta.{key}); "
            f"meta keys in this dataset: {', '.join(seen) or 'none'}"
        )
    return [replace(ex, group=groups[ex.id]) for ex in examples]


def render(tokenizer: object, ex: Example, *, chat_template: ChatTemplate = "model") -> tuple[str, list[int]]:
    """Text the model reads, and the character offset of each message's content in it.

    Chat examples go through the model's chat template: a final assistant message is continued
    (so the last token is the assistant's, e.g. a prefilled "Yes"); otherwise the generation
    prompt is added (the last token is where the assistant is about to answer). With
    ``chat_template="plain"`` (base models) they become a transcript, see :func:`render_plain`.
    """
    if ex.messages is None:
        return ex.text or "", []
    messages = [dict(m) for m in ex.messages]
    if chat_template == "plain":
        return render_plain(messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueprobeError(
            f"example {ex.id!r} is a chat (messages) but the tokenizer has no chat template: pass "
            "--chat-template plain (a 'User: ...' / 'Assistant: ...' transcript), use a chat model, or give text"
        )
    final_assistant = messages[-1].get("role") == "assistant"
    text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages,
        tokenize=False,
        add_generation_prompt=not final_assistant,
        continue_final_message=final_assistant,
    )
    starts: list[int] = []
    cursor = 0
    for i, m in enumerate(messages):
        content = m.get("content", "")
        at = text.find(content, cursor)
        if at < 0:  # templates may strip a message's surrounding whitespace
            stripped = content.strip()
            at = text.find(stripped, cursor)
            if at < 0:
                raise ValueprobeError(
                    f"example {ex.id!r}: message {i} not found in the rendered chat template"
                )
            at -= len(content) - len(content.lstrip())
        starts.append(at)
        cursor = max(at, 0) + len(content.strip())
    return text, starts


def render_plain(messages: Sequence[dict]) -> tuple[str, list[int]]:
    """A chat as a plain transcript for base models: ``"User: ...\\nAssistant: ..."``.

    Each message is ``Role: content`` on its own line; a chat not ending with the assistant gets
    ``"\\nAssistant:"`` appended, the plain form of a generation prompt. Returns the text and the
    offset of each message's content, so spans map exactly as with a chat template.

    >>> render_plain([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}])
    ('User: Hi\\nAssistant: Yes', [6, 20])
    """
    text, starts = "", []
    for i, m in enumerate(messages):
        text += ("\n" if i else "") + f"{str(m.get('role', 'user')).capitalize()}: "
        starts.append(len(text))
        text += str(m.get("content", ""))
    if messages and messages[-1].get("role") != "assistant":
        text += "\nAssistant:"
    return text, starts


def context_length(lm: LoadedModel) -> int | None:
    """Positions the model was built for (``max_position_embeddings``), if its config says."""
    cfg = getattr(lm.model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def encode(
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    positions: Positions,
    max_length: int | None = None,
    span_labels: Sequence[str] | None = None,
    chat_template: ChatTemplate = "model",
    warn: bool = True,
) -> list[Encoded]:
    """Tokenize examples and pick, for each, the token indices of every row it yields.

    ``span_labels`` keeps only spans with those labels (e.g. only ``prefix``, so a probe never
    reads the text that admits an error). A text longer than the model's context is an error
    naming the example; with ``max_length`` it is truncated instead, with one warning (``warn``).
    """
    if positions not in POSITIONS:
        raise ValueprobeError(f"unknown positions {positions!r}: use one of {', '.join(POSITIONS)}")
    if chat_template not in CHAT_TEMPLATES:
        raise ValueprobeError(
            f"unknown chat template {chat_template!r}: use one of {', '.join(CHAT_TEMPLATES)}"
        )
    limit = context_length(lm)
    if max_length is not None and limit is not None and max_length > limit:
        raise ValueprobeError(
            f"max_length {max_length} is over the model's context of {limit} tokens: use --max-length {limit}"
        )
    tok = lm.tokenizer
    out: list[Encoded] = []
    truncated: list[tuple[str, int]] = []
    for ex in examples:
        text, starts = render(tok, ex, chat_template=chat_template)
        special = ex.messages is None or chat_template == "plain"  # a chat template adds its own
        enc = tok(text, add_special_tokens=special, return_offsets_mapping=True)  # type: ignore[operator]
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if max_length is None and limit is not None and len(ids) > limit:
            raise ValueprobeError(
                f"example {ex.id!r} is {len(ids)} tokens, over the model's context of {limit}: shorten it,"
                f" or pass --max-length {limit} to truncate it"
            )
        if max_length is not None and len(ids) > max_length:
            truncated.append((ex.id, len(ids)))
            ids, offsets = ids[:max_length], offsets[:max_length]
        n = len(ids)
        if n == 0:
            raise ValueprobeError(f"example {ex.id!r} tokenizes to no tokens: give it some text")
        selections: list[tuple[str, list[int]]]
        if positions == "last":
            selections = [("", [n - 1])]
        elif positions == "mean":
            selections = [("", list(range(n)))]
        elif positions == "all":
            selections = [("", [t]) for t in range(n)]
        else:
            if not ex.spans:
                raise ValueprobeError(
                    f"example {ex.id!r} has no spans but positions={positions!r}: use last or all instead"
                )
            spans = [sp for sp in ex.spans if span_labels is None or sp.label in span_labels]
            if not spans:
                have = sorted({sp.label for sp in ex.spans})
                raise ValueprobeError(
                    f"example {ex.id!r} has no span labelled {' or '.join(span_labels or [])} (it has {have})"
                )
            selections = []
            for span in spans:
                base = 0 if span.message is None else starts[span.message]
                lo, hi = base + span.start, base + span.end
                # A token belongs to the span holding its first character.
                toks = [t for t, (a, b) in enumerate(offsets) if b > a and lo <= a < hi]
                if not toks:
                    raise ValueprobeError(
                        f"example {ex.id!r}: span {span.label!r} [{span.start}, {span.end}) covers no token"
                        + (f" (truncated at max_length={max_length})" if max_length else "")
                    )
                if positions == "spans":
                    selections.append((span.label, toks))
                else:
                    selections.extend((span.label, [t]) for t in toks)
        out.append(Encoded(example=ex, input_ids=ids, selections=selections))
    if truncated and warn:
        first, n = truncated[0]
        logging.getLogger("valueprobe").warning(
            f"truncated {len(truncated)} of {len(examples)} examples to max_length {max_length} tokens"
            f" (first: {first!r}, {n} tokens)"
        )
    return out


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


def make_batch(items: Sequence[Encoded], *, padding_side: Literal["left", "right"], pad_id: int) -> Batch:
    """Pad a batch, with explicit position ids so a left-padded row sees the same positions as alone."""
    width = max(len(e.input_ids) for e in items)
    b = len(items)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    shifts = []
    for i, e in enumerate(items):
        n = len(e.input_ids)
        shift = width - n if padding_side == "left" else 0
        ids[i, shift : shift + n] = torch.tensor(e.input_ids)
        mask[i, shift : shift + n] = 1
        shifts.append(shift)
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


def iter_batches(encoded: Sequence[Encoded], *, batch_size: int, padding_side: Literal["left", "right"],
                 pad_id: int) -> Iterator[Batch]:  # fmt: skip
    for i in range(0, len(encoded), batch_size):
        yield make_batch(encoded[i : i + batch_size], padding_side=padding_side, pad_id=pad_id)


def _backend_run(
    lm: LoadedModel,
    batch: Batch,
    *,
    layers: list[int],
    site: Site,
    include_embed: bool,
    backend: str = "hooks",
    remote: bool = False,
) -> dict[LayerKey, Tensor]:
    """One forward pass of a batch; returns the selected rows per layer key.

    With the default ``hooks`` backend the token selection runs inside the forward hook, and the
    forward stops after the last block needed (so the unembedding never runs).
    """
    if not remote:
        batch = batch.selection_on(lm.device)
    got = residuals(lm, batch.input_ids, batch.attention_mask, layers=layers, site=site,
                    include_embed=include_embed, backend=backend, position_ids=batch.position_ids,
                    remote=remote, reduce=partial(reduce_batch, batch=batch))  # fmt: skip
    return {("embed" if k == "embed" else int(k)): v for k, v in got.items()}


def capture(
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    layers: str | int | Sequence[int] | None = "all",
    site: Site = "resid_post",
    positions: Positions = "last",
    batch_size: int = 8,
    padding_side: Literal["left", "right"] = "right",
    include_embed: bool = False,
    max_length: int | None = None,
    span_labels: Sequence[str] | None = None,
    group_by: str | None = None,
    backend: Literal["hooks", "nnsight", "tlens"] = "hooks",
    remote: bool = False,
    chat_template: ChatTemplate = "model",
    progress: bool = True,
) -> CaptureResult:
    """Capture residual activations of ``examples`` in memory.

    Args:
        lm: from :func:`valueprobe.load`.
        examples: dataset examples (:func:`valueprobe.read_jsonl`).
        layers: ``"all"``, an int, a list, or ``"0:10"``; negative indices count from the end.
        site: ``"resid_post"`` (block output) or ``"resid_pre"`` (block input).
        positions: ``last`` token, ``mean`` over tokens, ``all`` tokens, ``spans`` (mean per labelled
            span), or ``span_tokens`` (every token inside a span, labelled).
        span_labels: with span positions, keep only spans with these labels.
        group_by: ``"meta.KEY"`` to take each row's group from the example's meta (see :func:`regroup`).
        include_embed: also capture the embedding output under the key ``"embed"``.
        backend: ``hooks`` (plain PyTorch), ``nnsight`` (``remote=True`` runs on NDIF) or ``tlens``.
        max_length: truncate longer texts (with a warning); without it a text over the model's
            context is an error.
        chat_template: ``model`` (the tokenizer's) or ``plain`` (a transcript, for base models).

    Returns:
        rows (metadata) and one float32 ``[rows, d_model]`` tensor per layer.
    """
    if not examples:
        raise ValueprobeError("no examples to capture: the dataset is empty")
    if site not in ("resid_pre", "resid_post"):
        raise ValueprobeError(f"unknown site {site!r}: use resid_pre or resid_post")
    if batch_size < 1:
        raise ValueprobeError(f"batch_size must be >= 1, got {batch_size}")
    layer_list = lm.resolve_layers(layers)
    examples = regroup(examples, group_by)
    encoded = encode(lm, examples, positions=positions, max_length=max_length, span_labels=span_labels,
                     chat_template=chat_template)  # fmt: skip
    from tqdm.auto import tqdm

    with tqdm(total=len(encoded), desc="capture", unit="ex", disable=not progress) as bar:
        return run_encoded(lm, encoded, layers=layer_list, site=site, include_embed=include_embed,
                           batch_size=batch_size, padding_side=padding_side, backend=backend, remote=remote,
                           on_batch=bar.update)  # fmt: skip


def run_encoded(
    lm: LoadedModel,
    encoded: Sequence[Encoded],
    *,
    layers: list[int],
    site: Site,
    include_embed: bool,
    batch_size: int,
    padding_side: Literal["left", "right"],
    backend: str = "hooks",
    remote: bool = False,
    on_batch: Callable[[int], object] | None = None,
) -> CaptureResult:
    """Batch, run and concatenate already-encoded examples; ``on_batch(n)`` reports progress."""
    parts: dict[LayerKey, list[Tensor]] = {}
    rows: list[Rows] = []
    for batch in iter_batches(encoded, batch_size=batch_size, padding_side=padding_side, pad_id=_pad_id(lm)):
        got = _backend_run(lm, batch, layers=layers, site=site, include_embed=include_embed,
                           backend=backend, remote=remote)  # fmt: skip
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
        rows.append(batch.rows)
        if on_batch is not None:
            on_batch(batch.input_ids.shape[0])
    return CaptureResult(rows=Rows.concat(rows), acts={k: torch.cat(v) for k, v in parts.items()})


def _pad_id(lm: LoadedModel) -> int:
    tok = lm.tokenizer
    pad = getattr(tok, "pad_token_id", None)
    if pad is None:
        pad = getattr(tok, "eos_token_id", None)
    return int(pad) if pad is not None else 0
