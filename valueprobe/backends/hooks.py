"""The reference route: plain PyTorch forward hooks on the decoder blocks.

The nnsight and TransformerLens routes are tested against this one (and this one against
``output_hidden_states``). Selected with ``backend="hooks"``:

>>> from valueprobe.backends import residuals
>>> acts = residuals(lm, ids, mask, layers=[3, -1], site="resid_post", backend="hooks")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.backends._shared import Read, as_output, forward_kwargs
from valueprobe.vocab import Site

if TYPE_CHECKING:
    from valueprobe.models import LoadedModel


class _StopForward(Exception):
    """Raised by the last capture hook so blocks (and the unembed) past it never run."""


def _first(value: Any) -> Tensor:
    # Decoder blocks return a tensor in transformers 5 but a tuple (hidden, ...) in some
    # architectures and older releases; the residual stream is always the first element.
    return value[0] if isinstance(value, tuple) else value


def _block_input(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _save_input(store: dict, key: Any, stop: bool, reduce: Callable[[Tensor], Tensor]) -> Callable:
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        store[key] = reduce(_block_input(args, kwargs))
        if stop:
            raise _StopForward

    return hook


def _save_output(store: dict, key: Any, stop: bool, reduce: Callable[[Tensor], Tensor]) -> Callable:
    def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
        store[key] = reduce(_first(output))
        if stop:
            raise _StopForward

    return hook


def _add_to_input(delta: Tensor) -> Callable:
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (args[0] + delta, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta}

    return hook


def _add_to_output(delta: Tensor) -> Callable:
    def hook(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        if isinstance(output, tuple):
            return (output[0] + delta, *output[1:])
        return output + delta

    return hook


@contextmanager
def _hooked(handles: list[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def read(
    lm: LoadedModel,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    *,
    reads: Sequence[Read],
    position_ids: Int[Tensor, "batch pos"],
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> dict[Read, Tensor]:
    """The residual at each read, by forward hooks; the last read stops the forward.

    ``reduce`` runs inside the hook (capture's token selection), so only its result is kept.
    """
    keep = reduce or (lambda h: h)
    store: dict[Read, Tensor] = {}
    handles = []
    for i, (block, is_input) in enumerate(reads):
        last = i == len(reads) - 1
        module = lm.layers[block]
        if is_input:
            hook = _save_input(store, (block, True), last, keep)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        else:
            handles.append(module.register_forward_hook(_save_output(store, (block, False), last, keep)))
    device = lm.device
    with _hooked(handles), torch.no_grad(), suppress(_StopForward):
        lm.model(input_ids=input_ids.to(device), **forward_kwargs(attention_mask, position_ids, device))
    return store


def steered_logits(
    lm: LoadedModel,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    *,
    block: int,
    site: Site,
    delta: Float[Tensor, "batch pos d_model"],
    position_ids: Int[Tensor, "batch pos"],
) -> Float[Tensor, "batch pos vocab"]:
    """Logits with ``delta`` added to the residual at (block, site). See `backends.steered_logits`."""
    module = lm.layers[block]
    param = next(lm.model.parameters())
    delta = delta.to(device=param.device, dtype=param.dtype)
    if site == "resid_pre":
        handle = module.register_forward_pre_hook(_add_to_input(delta), with_kwargs=True)
    else:
        handle = module.register_forward_hook(_add_to_output(delta))
    with _hooked([handle]), torch.no_grad():
        output = lm.model(
            input_ids=input_ids.to(param.device), **forward_kwargs(attention_mask, position_ids, param.device)
        )
    return as_output(output.logits)
