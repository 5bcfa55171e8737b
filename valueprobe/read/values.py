"""The value of every token of a text, as one small record: ``vp.values``.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")
    >>> axis = vp.ValueAxis.load("smollm2-135m-value", lm=lm)
    >>> v = vp.values(lm, axis, "Is 91 prime? It is 7 × 13.")      # a user turn (chat=False: raw text)
    >>> v.sigma[:3], v.tokens[:3]
    >>> v.to_pandas()                                                 # token, σ, projection, cos
    >>> v                                                             # in a notebook: a coloured strip

Each token's value is read at its own position, at one layer (default the axis's best) and the
axis's site, in one forward: the σ-score ``(h·v̂ − μ)/σ``, the raw projection ``h·v̂`` and the
paper's per-token readout ``cos(h, v̂)`` (val(s) is its mean, `valueprobe.read.readout.val`).
Inside ``with vp.steer(...)`` the forward is steered and each value is read after the addition.

``vp.generate(..., trace=True)`` gives the same record for the generated tokens (``g.values``),
each value read in the forward that produced its token (the server's convention, like a
log-probability): ``produced`` says which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from valueprobe.activations.prompts import Prompt, prompt_ids
from valueprobe.hooks.route import Point, position_ids_from_mask, record
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.strip import token_strip
from valueprobe.records import Record

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["Reader", "Values", "layer_values", "read_context", "values"]


class Reader:
    """A `valueprobe.hooks.patch.record` reduction: per column, the σ-score at ``layer`` and ‖h‖,
    ``[..., 2]`` float32, on h's device (the direction copied to a device once)."""

    def __init__(self, axis: ValueAxis, layer: int) -> None:
        self.sigma = axis.sigma_at(layer)  # refuses an uncalibrated layer in one line
        i = axis.layers.index(layer)
        self.mu = float(axis.mu[i])
        self._direction = {torch.device("cpu"): axis.directions[i].float()}

    def __call__(self, h: Tensor) -> Tensor:
        h = h.detach().float()
        v = self._direction.get(h.device)
        if v is None:
            v = self._direction[h.device] = self._direction[torch.device("cpu")].to(h.device)
        return torch.stack([(h @ v - self.mu) / self.sigma, h.norm(dim=-1)], dim=-1)


@dataclass(frozen=True)
class Values(Record):
    """Tokens and the axis read at each.

    Attributes:
        tokens: each token's text; token_ids: its id.
        sigma: the σ-score ``(h·v̂ − μ)/σ``; projection: ``h·v̂`` (``μ + σ·score``); cos: cos(h, v̂)
            (NaN where ‖h‖ was not read: a read before the addition).
        layer, site: where it is read; read: the read point in words (``resid_post[20], after the addition``).
        produced: False: each value is read at its own token; True: in the forward that produced
            the token, i.e. at the token before it (generated tokens, as the server streams them).
    """

    tokens: tuple[str, ...]
    token_ids: tuple[int, ...]
    sigma: tuple[float, ...]
    projection: tuple[float, ...]
    cos: tuple[float, ...]
    layer: int
    site: str
    read: str
    produced: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def of(
        cls,
        axis: ValueAxis,
        ids: Sequence[int],
        tokens: Sequence[str],
        reads: Tensor,
        *,
        layer: int,
        read: str,
        produced: bool = False,
    ) -> Values:
        """The record from ``reads`` ``[tokens, 2]`` (σ-score, ‖h‖), as `Reader` keeps them."""
        i = axis.layers.index(layer)
        mu, sigma = float(axis.mu[i]), float(axis.sigma[i])
        rows = reads.double().cpu().tolist()
        score = tuple(float(s) for s, _ in rows)
        proj = tuple(mu + sigma * s for s in score)
        cos = tuple(
            p / n if n > 0 else (0.0 if n == 0 else math.nan) for p, (_, n) in zip(proj, rows, strict=True)
        )
        return cls(
            tokens=tuple(tokens),
            token_ids=tuple(int(t) for t in ids),
            sigma=score,
            projection=proj,
            cos=cos,
            layer=layer,
            site=str(axis.site),
            read=read,
            produced=produced,
        )

    def caption(self) -> str:
        """What the strip's caption says: the read point, and where each value was read."""
        where = "in the forward that produced each token" if self.produced else "at each token"
        return f"value (σ) at {self.read}, read {where}"

    def to_pandas(self) -> Any:
        """One row per token: token, token_id, sigma, projection, cos (needs pandas)."""
        import pandas as pd  # optional: only this method needs it

        return pd.DataFrame(
            {
                "token": list(self.tokens),
                "token_id": list(self.token_ids),
                "sigma": list(self.sigma),
                "projection": list(self.projection),
                "cos": list(self.cos),
            }
        )

    def _repr_html_(self) -> str:
        details = [
            f"{t!r}: {s:+.3f} σ, h·v̂ {p:.3f}, cos {c:+.4f}"
            for t, s, p, c in zip(self.tokens, self.sigma, self.projection, self.cos, strict=True)
        ]
        return token_strip(self.tokens, self.sigma, title=self.caption(), details=details)


def _decode_each(lm: LoadedModel, ids: Sequence[int]) -> list[str]:
    return [lm.tokenizer.decode([t]) for t in ids]


@torch.no_grad()
def read_context(
    lm: LoadedModel, axis: ValueAxis, ids: Sequence[int], layers: Sequence[int]
) -> tuple[dict[int, Values], Tensor]:
    """`values` of the token ids ``ids`` at each of ``layers``, and the log-probabilities of the
    next token after the last one (``[vocab]``, float32), from one forward."""
    axis.check(lm)
    points = {layer: Point(layer, axis.site) for layer in layers}
    readers = {layer: Reader(axis, layer) for layer in layers}
    seq = torch.tensor([list(ids)], device=lm.device)
    mask = torch.ones_like(seq)
    recs = [record(lm, [points[layer]], reduce=readers[layer]) for layer in layers]
    try:
        out = lm.model(input_ids=seq, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    finally:
        for rec in recs:
            rec.remove()
    tokens = _decode_each(lm, ids)
    read = "after any steering on the model"
    by_layer = {
        layer: Values.of(
            axis, ids, tokens, rec[points[layer]][0], layer=layer, read=f"{axis.site}[{layer}], {read}"
        )
        for layer, rec in zip(layers, recs, strict=True)
    }
    return by_layer, torch.log_softmax(out.logits[0, -1].float(), dim=-1).cpu()


def layer_values(
    lm: LoadedModel, axis: ValueAxis, ids: Sequence[int], layers: Sequence[int]
) -> dict[int, Values]:
    """`values` of the token ids ``ids`` at each of ``layers``, from one forward."""
    return read_context(lm, axis, ids, layers)[0]


def values(
    lm: LoadedModel, axis: ValueAxis, prompt: Prompt, *, layer: int | None = None, chat: bool = True
) -> Values:
    """Every token of ``prompt`` and the axis read at it (see the module doc).

    Args:
        lm: the loaded model; axis: the value axis (checked against the model).
        prompt: a string (a user turn through the chat template; ``chat=False``: the text as is),
            a chat list (``[{"role": ..., "content": ...}]``; a final assistant turn is continued),
            or token ids (a list or a tensor) of this tokenizer.
        layer: the layer to read (default the axis's best).
        chat: render a string with the chat template.

    >>> v = values(lm, axis, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])
    """
    ids = prompt_ids(lm, prompt, chat=chat)
    layer = axis.best_layer if layer is None else layer
    axis.sigma_at(layer)  # an unknown or uncalibrated layer: one line, before the forward
    return layer_values(lm, axis, ids, [layer])[layer]
