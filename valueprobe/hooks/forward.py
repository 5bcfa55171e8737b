"""Pieces the three routes share: the `Forward` record, input checks, the twin.

Used by :mod:`valueprobe.hooks.route`; nothing here is public API.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.vocab import Site

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

SITES: tuple[str, ...] = tuple(Site)


def check_inputs(
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    position_ids: Int[Tensor, "batch pos"] | None,
    site: str,
) -> None:
    """Raise ValueprobeError on malformed token batches or an unknown site."""
    if site not in SITES:
        raise ValueprobeError(f"unknown site {site!r}: use one of {', '.join(SITES)}")
    if input_ids.ndim != 2 or input_ids.is_floating_point():
        raise ValueprobeError(
            f"input_ids must be an integer tensor [batch, pos], got {input_ids.dtype} {tuple(input_ids.shape)}"
        )
    if attention_mask.shape != input_ids.shape:
        raise ValueprobeError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}: "
            "pass the mask the tokenizer returned with these ids"
        )
    if position_ids is not None and position_ids.shape != input_ids.shape:
        raise ValueprobeError(
            f"position_ids shape {tuple(position_ids.shape)} != input_ids shape {tuple(input_ids.shape)}"
        )


Read = tuple[int, bool]  # (block, reads the block's input?): input is resid_pre, output resid_post
Reduce = Callable[[Tensor], Tensor]  # applied to each [batch, pos, d_model] read, e.g. a token selection


@dataclass(frozen=True)
class Forward:
    """One forward pass as every route receives it: the batch, explicit positions, and where it runs
    (``remote``: NDIF through nnsight; the other routes are never given it)."""

    lm: LoadedModel
    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    position_ids: Int[Tensor, "batch pos"]
    remote: bool | str = False

    def kwargs(self, device: torch.device) -> dict[str, Any]:
        """Keyword arguments of the model's forward: the mask, explicit positions, no KV cache.

        Positions are always given: an HF forward counts 0..pos-1 whatever the mask, while nnsight
        and TransformerBridge derive their own from a left-padded mask.
        """
        return {
            "attention_mask": self.attention_mask.to(device),
            "position_ids": self.position_ids.to(device),
            "use_cache": False,
        }


def position_ids_from_mask(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Positions counted from each row's first real token: the default of every route.

    An HF forward given no positions uses 0..pos-1, so left padding shifts every real token
    of a short row (changing activations of absolute-position models such as GPT-2); nnsight
    and TransformerBridge each derive their own positions from a left-padded mask instead.
    Passing these explicitly to all three routes keeps them on one definition, the one
    ``generate`` and ``capture.make_batch`` use, under which a padded row's activations equal
    the unpadded row's. Real tokens of right-padded or unpadded rows keep 0..n-1; pad cells
    get arbitrary in-range positions (their activations are never read).

    >>> position_ids_from_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]]))
    tensor([[0, 0, 0, 1],
            [0, 1, 2, 2]])
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def as_output(t: Tensor) -> Tensor:
    """The contract's output form: float32, detached, on the CPU."""
    return t.detach().to(device="cpu", dtype=torch.float32)


def module_path(root: torch.nn.Module, module: torch.nn.Module) -> str:
    """The dotted name of ``module`` inside ``root`` (e.g. ``model.layers.3``)."""
    for name, candidate in root.named_modules():
        if candidate is module:
            return name
    raise ValueprobeError(
        f"decoder block {type(module).__name__} is not a submodule of {type(root).__name__}: "
        "load the model with valueprobe.model.load.load or pass layers_path= to wrap()"
    )


def state_signature(model: torch.nn.Module) -> tuple[tuple[int, str, str], ...]:
    """Identity, device and dtype of every parameter and buffer: a twin is stale when this changes."""
    tensors = [*model.parameters(), *model.buffers()]
    return tuple((id(t), str(t.device), str(t.dtype)) for t in tensors)


def twin(model: torch.nn.Module) -> torch.nn.Module:
    """A structural copy of ``model`` that shares every parameter and buffer with it.

    nnsight swaps each module's ``forward`` for its own dispatcher and TransformerBridge
    replaces submodules and switches attention to eager, both in place. Wrapping a twin
    leaves the caller's model exactly as it was, while costing no weight memory: only the
    module objects and configs are copied.
    """
    shared: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, shared)


def reduced(got: dict[Read, Tensor], reduce: Reduce | None) -> dict[Read, Tensor]:
    """``reduce`` applied after the forward, by the routes that cannot run it inside a hook."""
    return got if reduce is None else {r: reduce(h) for r, h in got.items()}
