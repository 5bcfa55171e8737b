"""What a decoder block holds, per family: its attention, the attention's output projection, its MLP.

    >>> from valueprobe.model.parts import block_parts, head_weights
    >>> parts = block_parts(lm)                 # llama: self_attn, o_proj, mlp; 9 heads of 64 on SmolLM2
    >>> W_O, b_O = head_weights(lm, 12)         # [heads, d_head, d_model], [d_model] or None

The one table of block layouts. ``valueprobe.hooks.patch.SUBMODULES`` (the ``attn_out`` and ``mlp_out``
sites) reads its submodule names from here, and the per-head split (``attn_z``, the output
projection's input: every head's output side by side, TransformerLens's ``hook_z``) needs a row of
it. A family has a row only where its attention and MLP outputs are added to the residual stream as
they come out: then the residual at layer L is exactly the embedding plus every head's
``z_h @ W_O[h]``, output bias and MLP output of blocks 0..L. Gemma 2 normalises them first
(``post_attention_layernorm``), so its heads do not sum to its residual and it has no row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from jaxtyping import Float
from torch import Tensor, nn

from valueprobe.errors import ValueprobeError

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["BLOCK_PARTS", "BlockParts", "block_parts", "head_weights", "n_heads", "out_proj"]


@dataclass(frozen=True)
class BlockParts:
    """Names inside one family's decoder block: ``attn`` and ``mlp`` are the block's submodules,
    ``out_proj`` the attention's output projection (a ``Linear``, or GPT-2's ``Conv1D``), and
    ``heads`` the config field giving the number of attention heads."""

    attn: str
    out_proj: str
    mlp: str
    heads: str


_LLAMA = BlockParts("self_attn", "o_proj", "mlp", "num_attention_heads")
# config.model_type -> its block layout. Llama, Mistral and Qwen 2/3 share one (Qwen 3's q/k norms sit
# inside the attention, before the heads' outputs); GPT-2 and GPT-NeoX (parallel residual or not) differ.
BLOCK_PARTS: dict[str, BlockParts] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gpt2": BlockParts("attn", "c_proj", "mlp", "n_head"),
    "gpt_neox": BlockParts("attention", "dense", "mlp", "num_attention_heads"),
}
FAMILY_NAMES = "llama, mistral, qwen2, qwen3, gpt2, gpt_neox"


def block_parts(lm: LoadedModel) -> BlockParts:
    """The block layout of ``lm``'s family.

    Raises:
        ValueprobeError: a family without a per-head split (one line naming those that have one).
    """
    kind = str(getattr(lm.model.config, "model_type", type(lm.model).__name__))
    parts = BLOCK_PARTS.get(kind)
    if parts is None:
        raise ValueprobeError(
            f"{lm.model_id} is a {kind} model, which has no per-head split of its attention (its outputs"
            f" do not add to the residual as they are): use a model of the families {FAMILY_NAMES}"
        )
    return parts


def n_heads(lm: LoadedModel) -> int:
    """How many attention heads each block of ``lm`` has."""
    return int(getattr(lm.model.config, block_parts(lm).heads))


def out_proj(lm: LoadedModel, layer: int) -> nn.Module:
    """Block ``layer``'s attention output projection."""
    parts = block_parts(lm)
    return lm.layers[layer].get_submodule(f"{parts.attn}.{parts.out_proj}")


def head_weights(
    lm: LoadedModel, layer: int
) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, " d_model"] | None]:
    """Block ``layer``'s W_O split by head, and its output bias (None where the family has none).

    Head h writes ``z[..., h*d_head:(h+1)*d_head] @ W_O[h]`` into the residual (TransformerLens's
    ``W_O`` layout). A ``Linear`` keeps its weight as [d_model, heads*d_head], GPT-2's ``Conv1D``
    as [heads*d_head, d_model]; both come back in the first layout.
    """
    proj = out_proj(lm, layer)
    weight = cast(Tensor, proj.weight).detach()
    w = weight.T if isinstance(proj, nn.Linear) else weight  # [heads*d_head, d_model]
    heads = n_heads(lm)
    if w.shape[0] % heads:
        raise ValueprobeError(
            f"{lm.model_id}: block {layer}'s output projection takes {w.shape[0]} inputs, not a multiple"
            f" of its {heads} heads"
        )
    bias = getattr(proj, "bias", None)
    b = None if bias is None else bias.detach()
    return w.reshape(heads, w.shape[0] // heads, w.shape[1]), b
