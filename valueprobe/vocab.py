"""The words valueprobe's modules share: hook sites, layer keys, token positions, routes, units.

Each is defined here once, and every module and the CLI use these definitions. Choices are
``str`` enums, so typer checks them and lists them in ``--help``, and a plain string still
compares equal (``Site.resid_post == "resid_post"``):

    >>> from valueprobe.vocab import Site, parse_layers
    >>> parse_layers("::2", n_layers=6)
    [0, 2, 4]
    >>> parse_layers("-2:", n_layers=30)
    [28, 29]

Layers are 0-based decoder blocks (TransformerLens's naming): ``resid_pre[L]`` is the input of
block L, ``resid_post[L]`` its output, so ``resid_post[L] == resid_pre[L+1]``. Negative indices
count from the end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, TypeVar

from valueprobe.errors import ValueprobeError

__all__ = [
    "ALL_LAYERS",
    "VALUE_AT",
    "ValueAt",
    "RouteName",
    "ChatTemplate",
    "Dtype",
    "HookSite",
    "LayerKey",
    "LayerSelection",
    "LayerSpec",
    "ModelDtype",
    "Op",
    "PaddingSide",
    "PartSite",
    "Positions",
    "ShardSpec",
    "Site",
    "Target",
    "Tokens",
    "Unit",
    "choice",
    "layer_out_of_range",
    "layer_ranges",
    "parse_layers",
]


E = TypeVar("E", bound=StrEnum)


class Site(StrEnum):
    """Where in a decoder block the residual stream is read or written."""

    resid_pre = "resid_pre"  # the block's input
    resid_post = "resid_post"  # the block's output


class HookSite(StrEnum):
    """Every place a hook can read or write in a decoder block: the residual stream (`Site`) and
    the outputs of the block's attention and MLP submodules (what they add to the residual, before
    any post-norm a family applies, as steering-vectors' ``layer_type`` reads them)."""

    resid_pre = "resid_pre"
    resid_post = "resid_post"
    attn_out = "attn_out"
    mlp_out = "mlp_out"


class PartSite(StrEnum):
    """A place inside a block that attribution reads and patches, never a steering site: ``attn_z``
    is the input of the attention's output projection, every head's output side by side
    (TransformerLens's ``hook_z``: head h holds columns ``h*d_head .. (h+1)*d_head``)."""

    attn_z = "attn_z"


class Op(StrEnum):
    """What steering does to the hidden state h at a cell, with p = h·v̂ (see
    `valueprobe.steering.hook.operators`): ``add`` α·u·v̂; ``ablate`` removes p; ``set`` moves the
    σ-score to a target; ``clamp`` holds it in [lo, hi]; ``add-norm`` adds, then rescales to ‖h‖."""

    add = "add"
    ablate = "ablate"
    set = "set"
    clamp = "clamp"
    add_norm = "add-norm"


# Where a steered generation reads the value at the steered layer: after the addition (the default
# everywhere: vp.generate, trace, serve) or before it (`valueprobe.steering.decode.reading`).
ValueAt = Literal["before", "after"]
VALUE_AT: tuple[str, ...] = ("after", "before")


class Positions(StrEnum):
    """Which tokens of an example capture keeps (one row each, or one row per token)."""

    last = "last"
    mean = "mean"
    all = "all"
    spans = "spans"
    span_tokens = "span_tokens"


class RouteName(StrEnum):
    """The route into the model: plain forward hooks, nnsight (and so NDIF), or TransformerLens 4."""

    hooks = "hooks"
    nnsight = "nnsight"
    tlens = "tlens"


class Unit(StrEnum):
    """Units of a steering strength α. Positive α always means value up.

    ``sigma``: the projection on the axis moves by α standard deviations of its reference set;
    ``norm``: α % of the layer's mean residual norm (the paper's unit); ``raw``: α as given.
    """

    sigma = "sigma"
    norm = "norm"
    raw = "raw"


class ChatTemplate(StrEnum):
    """How chat examples become text: the tokenizer's own template (``model``), or a plain
    transcript (``plain``, for base models without one)."""

    model = "model"
    plain = "plain"


class Tokens(StrEnum):
    """Which tokens of an example make up s when a probe reads it (``valueprobe score --tokens``)."""

    all = "all"
    span_tokens = "span_tokens"
    last = "last"


TuneMethod = Literal[
    "dpo", "sft"
]  # DPO on chosen/rejected pairs, or SFT on prompt + chosen (valueprobe tune)


class Target(StrEnum):
    """What a probe is fitted to separate: ``span`` post vs pre rows (ICRL), ``label`` the example
    label (``>= 0.5`` = success), ``auto`` spans where a store has them, else labels."""

    auto = "auto"
    span = "span"
    label = "label"


class PaddingSide(StrEnum):
    """Which side of a batch is padded."""

    right = "right"
    left = "left"


class Dtype(StrEnum):
    """The dtype an activation store keeps."""

    float16 = "float16"
    float32 = "float32"
    bfloat16 = "bfloat16"  # float32's range in 2 bytes; read back as float32 (probes fit in float32)


class ModelDtype(StrEnum):
    """The dtype a model's weights load and run in (not :class:`Dtype`, what a store keeps)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    auto = "auto"  # the checkpoint's own, as its config.json names it


def choice(kind: type[E], value: str, *, what: str) -> E:
    """``value`` as a member of ``kind``, or one clear error naming the allowed values.

    >>> choice(Site, "resid_pre", what="site")
    <Site.resid_pre: 'resid_pre'>
    """
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ValueprobeError(f"unknown {what} {value!r}: use one of {allowed}") from None


# A stored layer: a decoder block index, or the embedding output ("embed" == resid_pre[0]).
LayerKey = int | Literal["embed"]
# One part of a layer spec: a block index, or the (start, stop, step) of a Python slice.
LayerPart = int | tuple[int | None, int | None, int | None]
_SPEC_HELP = "use 'all', an index like '-1', a range like '0:10', '-4:' or '::2', or a list like '3,5,-2'"


@dataclass(frozen=True)
class LayerSelection:
    """A layer spec parsed for syntax, not yet tied to a model: ``parts`` None means all layers.

    ``valueprobe capture --layers`` parses its text into one of these as typer reads the command
    line, so bad syntax fails before the model loads; :meth:`resolve` turns it into block indices
    once, where the model's layer count is known. Parsing a selection again returns it unchanged.

    >>> LayerSelection.parse("0:10,-1").resolve(30)[-3:]
    [8, 9, 29]
    """

    text: str
    parts: tuple[LayerPart, ...] | None

    def __str__(self) -> str:  # as written: `--help` shows a default of ``all``
        return self.text

    @classmethod
    def parse(cls, spec: LayerSpec) -> LayerSelection:
        """The one parser of layer specs: ``"all"`` or None, an int, a list of ints, ``"3,5,-1"``,
        and Python slices ``"0:10"``, ``"10:"``, ``"-4:"``, ``"::2"`` (end exclusive), alone or
        mixed with commas. Negative indices count from the end."""
        if isinstance(spec, LayerSelection):
            return spec
        if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
            return cls("all", None)
        if isinstance(spec, bool):
            raise ValueprobeError(f"{spec!r} is not a layer spec: {_SPEC_HELP}")
        if isinstance(spec, int):
            items: list[str | int] = [spec]
        elif isinstance(spec, str):
            items = [p.strip() for p in spec.split(",") if p.strip()]
        else:
            items = list(spec)
        if not items:
            raise ValueprobeError(f"{spec!r} is not a layer spec (it is empty): {_SPEC_HELP}")
        try:
            return cls(str(spec), tuple(_parse_part(item) for item in items))
        except ValueprobeError as exc:
            raise ValueprobeError(f"{spec!r} is not a layer spec: {exc}") from None

    def resolve(self, n_layers: int) -> list[int]:
        """Sorted, unique, 0-based block indices of a model with ``n_layers`` blocks."""
        n = n_layers
        if self.parts is None:
            return list(range(n))
        out: list[int] = []
        for part in self.parts:
            if isinstance(part, int):
                if not -n <= part < n:
                    raise layer_out_of_range(part, n)
                out.append(part % n)
                continue
            text = ":".join("" if b is None else str(b) for b in part)
            if any(b is not None and not -n <= b <= n for b in part[:2]):
                raise ValueprobeError(f"layer range {text!r} out of range: {_valid(n)}")
            picked = list(range(n))[slice(*part)]
            if not picked:
                raise ValueprobeError(f"layer range {text!r} selects no layer: {_valid(n)}")
            out.extend(picked)
        return sorted(set(out))


ALL_LAYERS = LayerSelection("all", None)
# What a user may write for a set of layers: "all", 12, "10:20", "-4:", "::2", "3,5,-1" or a list.
LayerSpec = str | int | Sequence[int] | LayerSelection | None


def _parse_part(item: str | int) -> LayerPart:
    if isinstance(item, str) and ":" in item:
        bits = item.split(":")
        bad = f"bad layer range {item!r}: {_SPEC_HELP}"
        if len(bits) > 3:
            raise ValueprobeError(bad)
        try:
            bounds = [int(b) if b.strip() else None for b in bits]
        except ValueError:
            raise ValueprobeError(bad) from None
        start, stop, step = [*bounds, None][:3]
        if step is not None and step <= 0:
            raise ValueprobeError(f"layer range {item!r}: the step must be positive")
        return (start, stop, step)
    try:
        return int(item)
    except (TypeError, ValueError):
        raise ValueprobeError(f"bad layer {item!r}: {_SPEC_HELP}") from None


def _valid(n: int) -> str:
    return f"this model has {n} layers: use 0..{n - 1} or -{n}..-1"


def layer_out_of_range(layer: int, n_layers: int) -> ValueprobeError:
    """The one error for a layer index outside the model (indices follow Python: -n..n-1)."""
    return ValueprobeError(f"layer {layer} out of range: {_valid(n_layers)}")


def parse_layers(spec: LayerSpec, *, n_layers: int) -> list[int]:
    """Sorted, unique, 0-based block indices named by ``spec``: `LayerSelection.parse` then
    `LayerSelection.resolve`, for callers that know the model.

    Args:
        spec: the layer spec.
        n_layers: how many decoder blocks the model has.

    >>> parse_layers("0:10,-1", n_layers=30)[-3:]
    [8, 9, 29]
    """
    return LayerSelection.parse(spec).resolve(n_layers)


def layer_ranges(layers: Sequence[int]) -> str:
    """Compact layer list for messages, the inverse of a spec.

    >>> layer_ranges([0, 1, 2, 5])
    '0..2, 5'
    """
    out, layers = [], sorted(layers)
    start = prev = layers[0]
    for layer in [*layers[1:], None]:
        if layer is not None and layer == prev + 1:
            prev = layer
            continue
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
        if layer is not None:
            start = prev = layer
    return ", ".join(out)


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` of ``count``: which slice of a dataset one job of a sharded run takes.

    The dataset is cut into blocks of ``block`` examples (a capture's ``--examples-per-shard``;
    1 for score and steer), and shard I takes the contiguous run of blocks ``[I*B//N, (I+1)*B//N)``
    of the B blocks. The slice depends only on (I, N, dataset size, block): not on the batch size,
    the device count or how often a job was resumed, so a rerun finds its own checkpoints and the
    parts concatenate, in shard order, into the rows of a one-process run. Because the slices are
    whole blocks, each part runs exactly the batches the one-process run would.

    >>> ShardSpec.parse("1/4").examples(10, block=1)
    range(2, 5)
    """

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str | ShardSpec) -> ShardSpec:
        """``"I/N"`` with 0 <= I < N (``--shard 0/8`` ... ``--shard 7/8``)."""
        if isinstance(text, ShardSpec):
            return text
        index, slash, count = str(text).strip().partition("/")
        if not (slash and index.strip().isdigit() and count.strip().isdigit()):
            raise ValueprobeError(f"--shard {text!r} is not I/N (e.g. 0/4): two whole numbers, 0 <= I < N")
        i, n = int(index), int(count)
        if n < 1 or i >= n:
            raise ValueprobeError(
                f"--shard {text!r}: the index must be in 0..N-1 and N >= 1, e.g. 0/{max(n, 2)}"
            )
        return cls(i, n)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ShardSpec | None:
        """torchrun's ``RANK``/``WORLD_SIZE`` as a shard, when both are set and WORLD_SIZE > 1."""
        rank, world = env.get("RANK"), env.get("WORLD_SIZE")
        if rank is None or world is None or not world.strip().isdigit() or int(world) <= 1:
            return None
        return cls.parse(f"{rank}/{world}")

    def examples(self, n: int, *, block: int) -> range:
        """The example indices of this shard in a dataset of ``n`` examples cut in ``block``s."""
        blocks = -(-n // block)
        lo, hi = self.index * blocks // self.count, (self.index + 1) * blocks // self.count
        return range(min(lo * block, n), min(hi * block, n))
