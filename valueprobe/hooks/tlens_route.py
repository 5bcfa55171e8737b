"""Capture and steering through TransformerLens 4's ``TransformerBridge`` (single forwards: no steered generation).

The bridge wraps a twin of the loaded model (sharing its weights; see `forward.twin`), built
offline with ``build_bridge_from_module`` rather than ``boot_transformers``, which would
re-download the checkpoint and tokenizer. No weight processing is applied (no
``enable_compatibility_mode``, so no LayerNorm folding or centering): the bridge's
``blocks.{L}.hook_resid_pre`` / ``hook_resid_post`` are the raw HF block input and output.

>>> from valueprobe.hooks.route import residuals
>>> acts = residuals(lm, ids, mask, layers=[3, -1], site="resid_pre", route="tlens")
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.decode import Decode
from valueprobe.hooks.forward import (
    Forward,
    Read,
    Reduce,
    as_output,
    module_path,
    reduced,
    state_signature,
    twin,
)

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

# model -> (signature of its weights when bridged, bridge); rebuilt when the weights move.
_BRIDGES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def bridge(lm: LoadedModel) -> Any:
    """The ``TransformerBridge`` over a twin of ``lm.model`` (cached per model).

    Raises ValueprobeError when TransformerLens has no adapter for the architecture, or when
    its block list is not ``lm.layers`` (e.g. a custom ``layers_path``).
    """
    signature = state_signature(lm.model)
    cached = _BRIDGES.get(lm.model)
    if cached is not None and cached[0] == signature:
        return cached[1]
    from transformer_lens.model_bridge.sources import build_bridge_from_module
    from transformer_lens.model_bridge.sources._hf_format import determine_architecture_from_hf_config

    try:
        architecture = determine_architecture_from_hf_config(lm.model.config)
    except ValueError:
        names = getattr(lm.model.config, "architectures", None) or [type(lm.model).__name__]
        raise ValueprobeError(
            f"TransformerLens has no TransformerBridge adapter for {', '.join(names)}: "
            "use route='hooks' or route='nnsight'"
        ) from None
    copy_ = twin(lm.model)
    paths = [module_path(lm.model, block) for block in lm.layers]
    twin_blocks = [copy_.get_submodule(path) for path in paths]  # before the bridge swaps them
    # tokenizer=None: the bridge's tokenizer setup reloads the tokenizer from the Hub by name
    # (get_tokenizer_with_bos); we hand the bridge token ids, so it never needs one.
    built = build_bridge_from_module(
        copy_, architecture, hf_config=copy_.config, tokenizer=None, model_name=lm.model_id or "valueprobe"
    )
    bridged = [getattr(block, "original_component", None) for block in getattr(built, "blocks", [])]
    if len(bridged) != len(twin_blocks) or any(
        a is not b for a, b in zip(bridged, twin_blocks, strict=False)
    ):
        raise ValueprobeError(
            f"TransformerBridge's blocks are not the model's decoder layers ({paths[0]}, ...): "
            "use route='hooks' or route='nnsight'"
        )
    _BRIDGES[lm.model] = (signature, built)
    return built


def _hook_name(block: int, is_input: bool) -> str:
    return f"blocks.{block}.hook_resid_{'pre' if is_input else 'post'}"


class TlensRoute:
    """TransformerLens 4's ``TransformerBridge`` over a twin of the model (`valueprobe.hooks.route.Route`)."""

    name = "tlens"

    def read(self, fwd: Forward, reads: Sequence[Read], reduce: Reduce | None) -> dict[Read, Tensor]:
        """The residual at each read, from the bridge's ``blocks.{L}.hook_resid_{pre,post}`` points."""
        names = {r: _hook_name(*r) for r in reads}
        model = bridge(fwd.lm)
        device = fwd.lm.device
        last = max(b for b, _ in reads)
        # Stop before the first block not needed: skips the rest of the stack and the unembed.
        stop = last + 1 if last + 1 < int(fwd.lm.n_layers) else None
        with torch.no_grad():
            _, cache = model.run_with_cache(
                fwd.input_ids.to(device),
                names_filter=sorted(set(names.values())),
                stop_at_layer=stop,
                **fwd.kwargs(device),
            )
        return reduced({r: cache[name] for r, name in names.items()}, reduce)

    def steered_logits(
        self, fwd: Forward, at: Read, delta: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos vocab"]:
        """Logits with ``delta`` added at the bridge's ``blocks.{L}.hook_resid_{pre,post}``."""
        model = bridge(fwd.lm)
        device = next(fwd.lm.model.parameters()).device
        with torch.no_grad():
            logits = model.run_with_hooks(
                fwd.input_ids.to(device), fwd_hooks=[(_hook_name(*at), _add(delta))], **fwd.kwargs(device)
            )
        return as_output(logits)

    def generate(self, run: Decode) -> Int[Tensor, "batch seq"]:
        """Refused with one clear line: steered generation runs on the hooks and nnsight routes.

        The bridge runs its twin with eager attention, so its tokens could part from the model's
        own ``generate`` on a near tie; and its hook points see no step (cache offset, padding).
        """
        raise ValueprobeError(
            "steered generation runs through route 'hooks' or 'nnsight', not 'tlens': "
            "TransformerLens's bridge reads and steers single forwards only"
        )


def _add(delta: Tensor) -> Callable[..., Tensor]:
    def hook(resid: Tensor, hook: Any) -> Tensor:
        return resid + delta.to(device=resid.device, dtype=resid.dtype)

    return hook
