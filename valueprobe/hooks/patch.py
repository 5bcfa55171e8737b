"""The public hook layer: `record` what the residual stream carries, `intervene` to change it.

Both return a handle that is also a context manager (like steering-vectors' patch handle):
hooks come off in ``finally`` on leaving the ``with`` block, or on ``.remove()``, so the model
is bit-identical afterwards, even when the forward raised.

    >>> from valueprobe.hooks.route import Point, intervene, record
    >>> v = torch.randn(lm.d_model)
    >>> with intervene(lm, Point(12, "resid_post"), lambda h, step: h + 4.0 * v), record(lm, [Point(20)]) as rec:
    ...     out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=8)
    >>> rec.trace(Point(20)).shape          # [batch, prompt + 8 - 1, d_model]: every column once

``fn(h, step)`` and the recorder run at every forward of the model, each step of ``generate``
included. With the KV cache on (generate's default) a forward carries only the new columns:
``step.offset`` says how many columns the cache already holds, ``step.pad`` which of the new
cells are padding, so a column is seen exactly once over a whole generation. Without a cache
every forward re-runs every column, and ``fn`` sees them all again, as the model does.

Works on any module tree ``valueprobe.model.load`` can load (Llama, Qwen, GPT-2, Gemma, NeoX...):
the step is read by a pre-hook on the module that owns the decoder blocks, which receives the
2-D ``attention_mask`` and the cache whichever causal-LM head called it.

`valueprobe.hooks.hooks_route.HooksRoute`, the reference route (``route="hooks"``), is this
layer behind the `Route` protocol; the nnsight and TransformerLens routes are tested against it,
and it against ``output_hidden_states``. A handle can `Handle.join` others, so that one
``finally`` takes all of their hooks off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Self

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.forward import Reduce
from valueprobe.model.parts import BLOCK_PARTS, out_proj
from valueprobe.vocab import HookSite, PartSite, Site, layer_out_of_range

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = [
    "SUBMODULES",
    "Handle",
    "Intervention",
    "Point",
    "Recording",
    "Step",
    "StopForward",
    "hook_module",
    "intervene",
    "record",
]


class Point(NamedTuple):
    """A place in decoder block ``layer`` (negative counts from the end), at ``site``: the residual
    stream (``resid_pre``, ``resid_post``), the output of the block's attention (``attn_out``) or
    MLP (``mlp_out``) submodule, found by name per family (`SUBMODULES`), or the input of the
    attention's output projection (``attn_z``: every head's output, for families with a row in
    `valueprobe.model.parts.BLOCK_PARTS`)."""

    layer: int
    site: Site | HookSite | PartSite = Site.resid_post


@dataclass(frozen=True)
class Step:
    """What one forward pass carries, as seen by a hook.

    Attributes:
        index: forwards seen by this handle before this one (0: the first; under ``generate``,
            the prompt pass), a 0-dim tensor on the forward's device.
        offset: columns already in the KV cache; the hidden state's column ``j`` is column
            ``offset + j`` of the full (left-padded) sequence. A Python int where the forward's
            shapes or a host-side cache say it; a 0-dim tensor on the device where the cache counts
            there (transformers' static cache), never read on the host.
        pad: ``[batch, new]``, True where a new cell is padding (never steer or read those).

    Nothing here is a Python number that changes from one decode step to the next under a static
    cache, so a compiled forward with hooks on traces once: dynamo guards a Python int as a
    constant, and one that moved every step recompiled every step.
    """

    index: Int[Tensor, ""]
    offset: int | Int[Tensor, ""]
    pad: Bool[Tensor, "batch new"]

    @property
    def n_new(self) -> int:
        return int(self.pad.shape[1])

    def columns(self) -> torch.Tensor:
        """Full-sequence column of each new cell, ``[new]`` (on the device, whatever the offset is)."""
        return torch.arange(self.n_new, device=self.pad.device) + self.offset


class StopForward(Exception):
    """Raised by a recorder with ``stop=True`` after its last point: blocks past it never run."""


def _first(value: Any) -> Tensor:
    # Decoder blocks return a tensor in transformers 5 but a tuple (hidden, ...) in some
    # architectures and older releases; the residual stream is always the first element.
    return value[0] if isinstance(value, tuple) else value


def _owner(lm: LoadedModel) -> torch.nn.Module:
    """The module whose forward runs the decoder blocks (``model`` in ``model.layers``)."""
    parent = lm.layers_path.rpartition(".")[0]
    return lm.model.get_submodule(parent) if parent else lm.model


def _cache_length(kwargs: dict) -> int | Tensor | None:
    """Columns the forward's cache holds before it: a host int (a dynamic cache), or a copy of a
    static cache's device counter (which the cache adds to in place during this forward), never
    read on the host: ``int()`` of it would sync a GPU at every decode step."""
    for key in ("past_key_values", "cache", "past_key_value"):
        cache = kwargs.get(key)
        if cache is not None and hasattr(cache, "get_seq_length"):
            length = cache.get_seq_length()
            return length.clone() if isinstance(length, Tensor) else int(length)
    return None


class _StepReader:
    """Pre-hook on the blocks' owner: turns each forward's inputs into a `Step`.

    Its state (the forward count) is a tensor on the model's device made here and added to in
    place, not a Python int, and not made at the first forward: a compiled forward reuses its graph
    from step to step and from call to call (tests/test_compiled.py counts the compiles)."""

    def __init__(self, device: torch.device) -> None:
        device = torch.device("cpu") if device.type == "meta" else device  # weights offloaded
        with torch.inference_mode(False):  # a normal tensor, which any later forward may add to
            self.count = torch.zeros((), dtype=torch.long, device=device)
        self.current: Step | None = None

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("input_ids")
        if ids is None:
            ids = kwargs["inputs_embeds"]
        batch, new = int(ids.shape[0]), int(ids.shape[1])
        mask = kwargs.get("attention_mask")
        cached = _cache_length(kwargs)
        offset: int | Tensor
        if isinstance(mask, Tensor) and mask.ndim == 2:
            offset = int(mask.shape[1]) - new if cached is None else cached
            if isinstance(offset, Tensor):  # a device offset: gather the columns, no host read
                pad = mask.index_select(1, torch.arange(new, device=mask.device) + offset) == 0
            else:
                pad = mask[:, offset : offset + new] == 0
        else:
            offset = 0 if cached is None else cached
            pad = torch.zeros(batch, new, dtype=torch.bool, device=ids.device)
        if self.count.device != ids.device:  # the inputs are elsewhere than the first weights
            self.count = self.count.to(ids.device)
        self.current = Step(index=self.count.clone(), offset=offset, pad=pad)
        self.count.add_(1)

    def step(self) -> Step:
        if self.current is None:  # the blocks' owner was bypassed: nothing to say about padding
            raise ValueprobeError("a decoder block ran outside its model's forward: call lm.model(...)")
        return self.current


class Handle:
    """Hooks on a model, removed by ``.remove()`` or on leaving ``with`` (exception or not)."""

    def __init__(self) -> None:
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _add(self, handle: torch.utils.hooks.RemovableHandle) -> None:
        self._handles.append(handle)

    @property
    def n_hooks(self) -> int:
        """How many module hooks this handle holds (0 once removed)."""
        return len(self._handles)

    def join(self, *others: Handle) -> Self:
        """Adopt the hooks of ``others``: removing this handle then removes theirs too.

        Each other handle is left empty (its ``.remove()`` becomes a no-op) but keeps what it
        recorded, so a `Recording` joined into a steering handle is still read as before. Returns
        this handle, so one ``with`` (one ``finally``) takes every hook off, exception or not.

        >>> with intervene(lm, Point(3), fn).join(record(lm, [Point(5)])) as both:
        ...     lm.model(ids, attention_mask=mask)
        """
        for other in others:
            if other is not self:
                self._handles.extend(other._handles)
                other._handles = []
        return self

    def remove(self) -> None:
        """Take every hook off; safe to call twice."""
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# Where a site sits in a block's forward, for running reads in execution order.
_ORDER = {
    HookSite.resid_pre: 0,
    PartSite.attn_z: 1,
    HookSite.attn_out: 2,
    HookSite.mlp_out: 3,
    HookSite.resid_post: 4,
}
# The names a decoder block gives its attention and MLP submodules: those of the families with a
# per-head split (`BLOCK_PARTS`: Llama, Qwen, Mistral self_attn; GPT-2 attn; GPT-NeoX attention),
# then other families' (Gemma's self_attn, Falcon's self_attention, feed_forward, ffn), first match wins.
SUBMODULES: dict[HookSite, tuple[str, ...]] = {
    HookSite.attn_out: (*dict.fromkeys(p.attn for p in BLOCK_PARTS.values()), "self_attention"),
    HookSite.mlp_out: (*dict.fromkeys(p.mlp for p in BLOCK_PARTS.values()), "feed_forward", "ffn"),
}
Hooked = tuple[int, HookSite | PartSite]  # (0-based block, site): one hook serves every point at it


def _resolve(lm: LoadedModel, point: Point) -> Hooked:
    """(block, site) for a point; checks the layer and that the site is one the hook layer has."""
    site: HookSite | PartSite
    if str(point.site) == PartSite.attn_z:
        site = PartSite.attn_z
    else:
        try:
            site = HookSite(str(point.site))
        except ValueError:
            raise ValueprobeError(
                f"unknown site {point.site!r}: use one of {', '.join(s.value for s in HookSite)}"
            ) from None
    n = lm.n_layers
    if not -n <= int(point.layer) < n:  # negative counts from the end, as Python indexes the blocks
        raise layer_out_of_range(int(point.layer), n)
    block = int(point.layer) % n
    if site != HookSite.resid_pre and site != HookSite.resid_post:
        _module(lm, (block, site))  # a family without the submodule is refused here, before any hook
    return block, site


def _module(lm: LoadedModel, hooked: Hooked) -> tuple[torch.nn.Module, bool]:
    """The module a hook goes on and whether it hooks the module's input (resid_pre) or output."""
    block, site = hooked
    module = lm.layers[block]
    if site == PartSite.attn_z:  # the heads side by side: the input of the output projection
        return out_proj(lm, block), True
    if site not in SUBMODULES:
        return module, site == HookSite.resid_pre
    for name in SUBMODULES[site]:
        sub = getattr(module, name, None)
        if isinstance(sub, torch.nn.Module):
            return sub, False
    raise ValueprobeError(
        f"{type(module).__name__} blocks of {lm.model_id} expose no {site.value} submodule (none of"
        f" {', '.join(SUBMODULES[site])}): use site resid_post or resid_pre"
    )


def hook_module(
    module: torch.nn.Module,
    fn: Callable[..., Any],
    *,
    pre: bool = False,
    with_kwargs: bool = False,
    first: bool = False,
    into: Handle | None = None,
) -> Handle:
    """Put ``fn`` on ``module`` as a forward hook (``pre``: a forward pre-hook), with torch's own
    calling convention: the one place valueprobe registers ``nn.Module`` hooks (`record`,
    `intervene`, and the vLLM plugin's hooks on vLLM's own blocks all come through here).

    Args:
        pre: a pre-hook ``fn(module, args[, kwargs])`` instead of ``fn(module, args, output)``.
        with_kwargs: the pre-hook also gets (and may return) the keyword arguments.
        first: run before the hooks already there.
        into: the handle that takes the hook (default a new one); returned.

    >>> with hook_module(block, lambda module, args, output: None):
    ...     lm.model(ids)
    """
    handle = Handle() if into is None else into
    if pre:
        handle._add(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs, prepend=first))
    else:
        handle._add(module.register_forward_hook(fn, prepend=first))
    return handle


def _attach(
    handle: Handle,
    module: torch.nn.Module,
    on_input: bool,
    body: Callable[[Tensor], Tensor | None],
    *,
    first: bool = False,
) -> None:
    """Hook ``body(h)`` on a block's input or output; a tensor it returns replaces h.

    ``first`` puts the hook ahead of those already there: an intervention is part of the block's
    output, so recorders and transformers' own output capture (``output_hidden_states`` runs on
    hooks of its own in transformers 5) must see the changed residual.
    """
    if on_input:

        def pre(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            h = args[0] if args else kwargs["hidden_states"]
            new = body(h)
            if new is None:
                return None
            if args:
                return (new, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        hook_module(module, pre, pre=True, with_kwargs=True, first=first, into=handle)
    else:

        def post(module: torch.nn.Module, args: tuple, output: Any) -> Any:
            new = body(_first(output))
            if new is None:
                return None
            return (new, *output[1:]) if isinstance(output, tuple) else new

        hook_module(module, post, first=first, into=handle)


class Intervention(Handle):
    """The handle `intervene` returns."""


def intervene(
    lm: LoadedModel, point: Point, fn: Callable[[Float[Tensor, "batch new d_model"], Step], Tensor | None]
) -> Intervention:
    """Replace the residual at ``point`` by ``fn(h, step)`` at every forward, until removed.

    Args:
        lm: the loaded model.
        point: where (``Point(layer, site)``).
        fn: gets the hidden state of the new columns and their `Step`; returns the new hidden
            state (same shape) or None to leave it. It must not write into ``h`` in place.

    >>> with intervene(lm, Point(-3), lambda h, step: h + alpha * v):
    ...     steered = lm.model.generate(ids, attention_mask=mask, max_new_tokens=20)

    Interventions run before any other hook on the block (so every recorder sees their result);
    two on one point run newest first.
    """
    module, on_input = _module(lm, _resolve(lm, point))
    reader = _StepReader(lm.device)
    handle = Intervention()
    hook_module(_owner(lm), reader, pre=True, with_kwargs=True, into=handle)
    try:
        _attach(handle, module, on_input, lambda h: fn(h, reader.step()), first=True)
    except BaseException:
        handle.remove()
        raise
    return handle


class Recording(Handle):
    """The handle `record` returns: ``.values[point]`` holds one entry per forward, ``.steps`` the steps."""

    def __init__(self, points: Sequence[Point]) -> None:
        super().__init__()
        self.points = list(points)
        self.values: dict[Point, list[Tensor]] = {p: [] for p in self.points}
        self.steps: list[Step] = []

    def __getitem__(self, point: Point) -> Tensor:
        """The value at ``point`` from the latest forward."""
        return self.values[point][-1]

    def trace(self, point: Point) -> Tensor:
        """Every forward's value at ``point`` joined along the column axis (dim 1): a whole generation."""
        return torch.cat(self.values[point], dim=1)

    def __enter__(self) -> Recording:
        return self


def record(
    lm: LoadedModel,
    points: Sequence[Point],
    *,
    reduce: Reduce | None = None,
    stop: bool = False,
) -> Recording:
    """Keep the residual at each of ``points`` at every forward, until removed.

    Args:
        lm: the loaded model.
        points: where to read; reads of the same block input/output are shared.
        reduce: applied inside the hook (e.g. a token selection or a projection), so only its
            result is kept; default keeps ``h.detach()``.
        stop: raise `StopForward` after the last point of the forward, skipping the rest of the
            model (capture's one-pass reads; the caller catches it).

    >>> with record(lm, [Point(0, "resid_pre"), Point(-1)]) as rec:
    ...     lm.model(ids, attention_mask=mask)
    >>> rec[Point(-1)].shape
    """
    keep = reduce or (lambda h: h.detach())
    rec = Recording(points)
    reader = _StepReader(lm.device)
    hook_module(_owner(lm), reader, pre=True, with_kwargs=True, into=rec)
    try:
        by_hook: dict[Hooked, list[Point]] = {}
        for point in rec.points:
            by_hook.setdefault(_resolve(lm, point), []).append(point)
        order = sorted(by_hook, key=lambda k: (k[0], _ORDER[k[1]]))  # execution order
        for i, key in enumerate(order):
            module, on_input = _module(lm, key)
            _attach(
                rec, module, on_input, _saver(rec, reader, by_hook[key], keep, stop and i == len(order) - 1)
            )
    except BaseException:
        rec.remove()
        raise
    return rec


def _saver(
    rec: Recording, reader: _StepReader, points: list[Point], keep: Callable[[Tensor], Tensor], stop: bool
) -> Callable[[Tensor], None]:
    def body(h: Tensor) -> None:
        _keep(rec, points, reader.step(), keep(h))
        if stop:
            raise StopForward

    return body


@torch.compiler.disable
def _keep(rec: Recording, points: list[Point], step: Step, value: Tensor) -> None:
    """Append one forward's value (and its step, once) to the recording's lists. Outside any
    compiled graph: dynamo guards a list it appends to on its length, which grows every step, so
    a traced append recompiled the forward at every decode step (a graph break here instead)."""
    if not rec.steps or rec.steps[-1] is not step:
        rec.steps.append(step)
    for point in points:
        rec.values[point].append(value)
