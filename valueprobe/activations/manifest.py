"""The manifest of an activation store: what was captured, from which model and dataset, in which shards.

Read and written by :mod:`valueprobe.activations.store` as ``manifest.json``; a typed, frozen record in memory::

    store = ActivationStore.open("runs/icrl")
    m = store.manifest                      # StoreManifest
    m.model_id, m.layers, m.n_rows, m.keys  # typed fields, no string keys

The JSON layout is unchanged from stores written before this record existed (format version 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from valueprobe.errors import ValueprobeError
from valueprobe.records import Record, refuse_newer
from valueprobe.vocab import ChatTemplate, Dtype, LayerKey, Positions, ShardSpec, Site

FORMAT = "valueprobe.activations.store"
FORMAT_VERSION = 1

__all__ = ["DatasetInfo", "Shard", "StoreManifest"]


@dataclass(frozen=True)
class Shard:
    """One complete shard file: examples ``[start, end)`` of the dataset, ``rows`` activation rows."""

    file: str
    examples: tuple[int, int]
    rows: int


@dataclass(frozen=True)
class DatasetInfo:
    """The dataset a store was captured from (path as given, its sha256, its size)."""

    path: str | None
    sha256: str | None
    n_examples: int | None


@dataclass(frozen=True)
class StoreManifest(Record):
    """What a store holds. The capture settings (model, layers, site, ...) fix a store's identity:
    resuming with other settings is refused (:meth:`settings_differ`).

    ``manifest.json`` is its ``to_dict``: the format keys, then the fields; a whole store has no
    ``part`` key and a store captured before ``--model-dtype`` no ``model_dtype``.
    """

    FORMAT = FORMAT
    FORMAT_VERSION = FORMAT_VERSION
    OMIT = {"part": None, "model_dtype": None}

    model_id: str
    fingerprint: str
    layers: tuple[int, ...]
    include_embed: bool
    site: Site
    positions: Positions
    span_labels: tuple[str, ...] | None
    group_by: str | None
    dtype: Dtype
    examples_per_shard: int
    chat_template: ChatTemplate
    d_model: int
    n_layers: int
    dataset: DatasetInfo
    valueprobe_version: str
    part: ShardSpec | None = None  # a sharded capture's part (``--shard I/N``); None for a whole store
    model_dtype: str | None = None  # what the model ran in (--model-dtype); None: recorded before it was
    shards: tuple[Shard, ...] = ()
    complete: bool = False

    @property
    def has_embed(self) -> bool:
        return self.include_embed

    @property
    def keys(self) -> list[LayerKey]:
        """The stored layer keys: ``"embed"`` first when captured, then the blocks."""
        keys: list[LayerKey] = ["embed"] if self.include_embed else []
        return keys + list(self.layers)

    @property
    def n_rows(self) -> int:
        """Rows in complete shards."""
        return sum(s.rows for s in self.shards)

    @property
    def n_examples_done(self) -> int:
        return sum(s.examples[1] - s.examples[0] for s in self.shards)

    @property
    def example_range(self) -> range:
        """The dataset examples this store covers: all of them, or its part's blocks."""
        n = self.dataset.n_examples or 0
        if self.part is None:
            return range(n)
        return self.part.examples(n, block=self.examples_per_shard)

    def with_shard(self, shard: Shard) -> StoreManifest:
        """This manifest with one more complete shard (kept in dataset order); complete once they
        cover the dataset (a part: its own examples)."""
        shards = tuple(sorted((*self.shards, shard), key=lambda s: s.examples[0]))
        done = sum(s.examples[1] - s.examples[0] for s in shards)
        return replace(self, shards=shards, complete=done == len(self.example_range))

    def settings_differ(
        self, other: StoreManifest, *, ignore: tuple[str, ...] = ()
    ) -> tuple[str, object, object] | None:
        """The first capture setting in which ``other`` differs: (name, ours, theirs) as the manifest
        spells them (lists, strings), or None. ``ignore`` names settings not to compare."""
        ours, theirs = self.to_dict(), other.to_dict()
        for name in _SETTINGS:
            a, b = ours.get(name), theirs.get(name)
            if name in ignore or a == b or (name in _RECORDED_LATER and None in (a, b)):
                continue
            return name, a, b
        return None

    def identity(self) -> tuple[dict[str, object], frozenset[str]]:
        """The capture settings as the manifest spells them, and those it was written before
        recording (they match any value): what the parts of one sharded capture share."""
        body = self.to_dict()
        unrecorded = frozenset(name for name in _RECORDED_LATER if body.get(name) is None)
        return {name: body.get(name) for name in _SETTINGS if name != "part"}, unrecorded

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        # "version" is the key stores were first written with (readers before 0.1.0 check it);
        # "format_version" is the name every valueprobe artifact uses (probe.json too).
        return {"version": FORMAT_VERSION, **d}

    @classmethod
    def _check_format(cls, d: Mapping[str, Any], where: str | Path | None) -> None:
        """A newer store is refused with the way to upgrade; any other format or version (a store of
        before format 1) with the way to capture it again."""
        version = d.get("format_version", d.get("version"))
        if d.get("format") == FORMAT:
            refuse_newer(version, reads=FORMAT_VERSION, where=where or "manifest.json", what="store ")
        if d.get("format") != FORMAT or version != FORMAT_VERSION:
            raise ValueprobeError(
                f"{where}: store format {d.get('format')!r} v{version} is not "
                f"{FORMAT} v{FORMAT_VERSION}: capture it again with this valueprobe"
            )

    @classmethod
    def _read(cls, d: Mapping[str, Any]) -> Mapping[str, Any]:
        """Keys a format-1 store may lack, as they were before they were written."""
        dataset = {"path": None, "sha256": None, "n_examples": None, **(d.get("dataset") or {})}
        n_layers = d.get("n_layers") or max(d.get("layers") or [], default=-1) + 1
        return {**_ADDED_LATER, **d, "dataset": dataset, "n_layers": n_layers}


# Keys added after format-1 stores were made, as such a store reads (its chat was rendered with the
# model's template, its activations kept in float16).
_ADDED_LATER: dict[str, Any] = {
    "span_labels": None,
    "group_by": None,
    "dtype": "float16",
    "examples_per_shard": 0,
    "chat_template": "model",
    "valueprobe_version": "unknown",
}


# The capture settings that fix a store's identity (dataset identity is checked apart).
_SETTINGS: tuple[str, ...] = tuple(
    f.name
    for f in fields(StoreManifest)
    if f.name not in ("d_model", "n_layers", "dataset", "valueprobe_version", "shards", "complete")
)
# Settings a store written before they were recorded lacks: such a store matches any value of them.
_RECORDED_LATER = ("model_dtype",)
