"""The components an attribution names: the embedding, each head, each output bias and MLP, a residual cell.

    >>> from valueprobe.attribute.components import Component, direct_terms, patchable
    >>> [c.name for c in direct_terms(lm, 1)][:3]       # a tiny llama with 4 heads
    ['embed', 'L0H0', 'L0H1']
    >>> Component.parse("L3.mlp"), Component.parse("L2H5").head
    (Component(kind='mlp', layer=3, head=-1, position=-1), 5)

At layer L the residual (``resid_post[L]``) is exactly the sum of `direct_terms`: the embedding
output, and for every block 0..L each head's ``z_h @ W_O[h]``, the attention's output bias (where
the family has one) and the MLP's output. Patching reaches the heads, the MLPs and residual cells
(a layer at one position). Names follow TransformerLens (``L3H5``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.model.parts import head_weights, n_heads

__all__ = ["KINDS", "Component", "Kind", "direct_terms", "patchable"]

Kind = Literal["embed", "head", "attn_bias", "mlp", "resid"]
KINDS: tuple[Kind, ...] = ("embed", "head", "attn_bias", "mlp", "resid")
_NAME = re.compile(r"^(?:embed|L(\d+)(?:H(\d+)|\.attn_bias|\.mlp|\.resid@(\d+)))$")


@dataclass(frozen=True, order=True)
class Component:
    """One component: its ``kind``, block ``layer`` (-1 for the embedding), ``head`` (heads only)
    and sequence ``position`` (residual cells only; counted from the first token)."""

    kind: Kind
    layer: int = -1
    head: int = -1
    position: int = -1

    @property
    def name(self) -> str:
        if self.kind == "embed":
            return "embed"
        if self.kind == "head":
            return f"L{self.layer}H{self.head}"
        if self.kind == "resid":
            return f"L{self.layer}.resid@{self.position}"
        return f"L{self.layer}.{self.kind}"

    @classmethod
    def parse(cls, name: str) -> Component:
        """The component a name stands for (the inverse of `name`)."""
        m = _NAME.match(name)
        if m is None:
            raise ValueprobeError(
                f"{name!r} is not a component name: use embed, L3H5, L3.attn_bias, L3.mlp or L3.resid@12"
            )
        if name == "embed":
            return cls("embed")
        layer = int(m.group(1))
        if m.group(2) is not None:
            return cls("head", layer, head=int(m.group(2)))
        if m.group(3) is not None:
            return cls("resid", layer, position=int(m.group(3)))
        return cls("attn_bias" if name.endswith("attn_bias") else "mlp", layer)


def direct_terms(lm: LoadedModel, layer: int) -> tuple[Component, ...]:
    """The terms whose sum is ``resid_post[layer]``, in the order a forward writes them."""
    heads = n_heads(lm)
    out: list[Component] = [Component("embed")]
    for block in range(layer + 1):
        out += [Component("head", block, head=h) for h in range(heads)]
        if head_weights(lm, block)[1] is not None:
            out.append(Component("attn_bias", block))
        out.append(Component("mlp", block))
    return tuple(out)


def patchable(lm: LoadedModel, layer: int) -> tuple[Component, ...]:
    """The heads and MLPs of blocks 0..``layer``: what patching and ablation replace."""
    return tuple(c for c in direct_terms(lm, layer) if c.kind in ("head", "mlp"))


def kind_counts(components: Sequence[Component]) -> dict[str, int]:
    """How many components of each kind (an ablation's random sets match these counts)."""
    counts: dict[str, int] = {}
    for c in components:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    return counts
