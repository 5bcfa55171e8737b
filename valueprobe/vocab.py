"""The words valueprobe's modules share: hook sites, layer keys, token positions, backends, units.

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

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal, TypeVar

from valueprobe.errors import ValueprobeError

__all__ = [
    "Backend",
    "ChatTemplate",
    "Dtype",
    "LayerKey",
    "LayerSpec",
    "PaddingSide",
    "Positions",
    "Site",
    "Target",
    "Tokens",
    "Unit",
    "choice",
    "layer_ranges",
    "parse_layers",
]


E = TypeVar("E", bound=StrEnum)


class Site(StrEnum):
    """Where in a decoder block the residual stream is read or written."""

    resid_pre = "resid_pre"  # the block's input
    resid_post = "resid_post"  # the block's output


class Positions(StrEnum):
    """Which tokens of an example capture keeps (one row each, or one row per token)."""

    last = "last"
    mean = "mean"
    all = "all"
    spans = "spans"
    span_tokens = "span_tokens"


class Backend(StrEnum):
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
# What a user may write for a set of layers: "all", 12, "10:20", "-4:", "::2", "3,5,-1" or a list.
LayerSpec = str | int | Sequence[int] | None


def parse_layers(spec: LayerSpec, *, n_layers: int) -> list[int]:
    """The one parser of layer specs: sorted, unique, 0-based block indices.

    Accepts ``"all"`` or None, an int, a list of ints, ``"3,5,-1"``, and Python slices
    ``"0:10"``, ``"10:"``, ``"-4:"``, ``"::2"`` (end exclusive), alone or mixed with commas.
    Negative indices count from the end.

    Args:
        spec: the layer spec.
        n_layers: how many decoder blocks the model has.

    >>> parse_layers("0:10,-1", n_layers=30)[-3:]
    [8, 9, 29]
    """
    n = n_layers
    valid = f"this model has {n} layers: use 0..{n - 1} or -{n}..-1"
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return list(range(n))
    if isinstance(spec, bool):
        raise ValueprobeError(f"bad layer spec {spec!r}: {valid}")
    if isinstance(spec, int):
        parts: list[str | int] = [spec]
    elif isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
    else:
        parts = list(spec)
    if not parts:
        raise ValueprobeError(f"empty layer spec {spec!r}: {valid}")
    out: list[int] = []
    for part in parts:
        if isinstance(part, str) and ":" in part:
            out.extend(_parse_slice(part, n, valid))
            continue
        try:
            i = int(part)
        except (TypeError, ValueError):
            raise ValueprobeError(f"bad layer {part!r}: {valid}, or 'all', or a range like '0:10'") from None
        if not -n <= i < n:
            raise ValueprobeError(f"layer {i} out of range: {valid}")
        out.append(i % n)
    return sorted(set(out))


def _parse_slice(part: str, n: int, valid: str) -> list[int]:
    bits = part.split(":")
    if len(bits) > 3:
        raise ValueprobeError(f"bad layer range {part!r}: {valid}, e.g. '0:10', '-4:' or '::2'")
    try:
        bounds = [int(b) if b.strip() else None for b in bits]
    except ValueError:
        raise ValueprobeError(f"bad layer range {part!r}: {valid}, e.g. '0:10', '-4:' or '::2'") from None
    for b in bounds[:2]:
        if b is not None and not -n <= b <= n:
            raise ValueprobeError(f"layer range {part!r} out of range: {valid}")
    if len(bounds) == 3 and bounds[2] is not None and bounds[2] <= 0:
        raise ValueprobeError(f"layer range {part!r}: the step must be positive")
    picked = list(range(n))[slice(*bounds)]
    if not picked:
        raise ValueprobeError(f"layer range {part!r} selects no layer: {valid}")
    return picked


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
