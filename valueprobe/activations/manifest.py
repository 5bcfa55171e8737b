"""The manifest of an activation store: what was captured, from which model and dataset, in which shards.

Read and written by :mod:`valueprobe.activations.store` as ``manifest.json``; a typed, frozen record in memory::

    store = ActivationStore.open("runs/icrl")
    m = store.manifest                      # StoreManifest
    m.model_id, m.layers, m.n_rows, m.keys  # typed fields, no string keys

The JSON layout is unchanged from stores written before this record existed (format version 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from valueprobe.errors import ValueprobeError
from valueprobe.version import __version__
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
class StoreManifest:
    """What a store holds. The capture settings (model, layers, site, ...) fix a store's identity:
    resuming with other settings is refused (:meth:`settings_differ`)."""

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

    def to_dict(self) -> dict:
        """The ``manifest.json`` object (format, version, then the fields)."""
        body = asdict(self)
        body["layers"] = list(self.layers)
        body["span_labels"] = list(self.span_labels) if self.span_labels is not None else None
        body["shards"] = [{**asdict(s), "examples": list(s.examples)} for s in self.shards]
        for name in ("site", "positions", "dtype", "chat_template"):
            body[name] = str(body[name])
        if self.part is None:  # a whole store's manifest is the one valueprobe always wrote
            del body["part"]
        if self.model_dtype is None:
            del body["model_dtype"]
        # "version" is the key stores were first written with (readers before 0.1.0 check it);
        # "format_version" is the name every valueprobe artifact uses (probe.json too).
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "version": FORMAT_VERSION, **body}

    @classmethod
    def from_dict(cls, raw: Mapping, *, where: Path) -> StoreManifest:
        """Parse ``manifest.json``; unknown keys are ignored, missing or malformed ones are one error."""
        version = raw.get("format_version", raw.get("version"))
        if raw.get("format") == FORMAT and isinstance(version, int) and version > FORMAT_VERSION:
            raise ValueprobeError(
                f"{where}: store format_version {version} is newer than this valueprobe"
                f" {__version__} reads ({FORMAT_VERSION}): upgrade valueprobe (pip install -U valueprobe)"
            )
        if raw.get("format") != FORMAT or version != FORMAT_VERSION:
            raise ValueprobeError(
                f"{where}: store format {raw.get('format')!r} v{version} is not "
                f"{FORMAT} v{FORMAT_VERSION}: capture it again with this valueprobe"
            )
        try:
            dataset = raw.get("dataset") or {}
            span_labels = raw.get("span_labels")
            return cls(
                model_id=str(raw["model_id"]),
                fingerprint=str(raw["fingerprint"]),
                layers=tuple(int(x) for x in raw["layers"]),
                include_embed=bool(raw["include_embed"]),
                site=Site(raw["site"]),
                positions=Positions(raw["positions"]),
                span_labels=tuple(span_labels) if span_labels is not None else None,
                group_by=raw.get("group_by"),
                dtype=Dtype(raw.get("dtype", "float16")),
                examples_per_shard=int(raw.get("examples_per_shard", 0)),
                # added after format v1 stores were made; those were rendered with the model's template
                chat_template=ChatTemplate(raw.get("chat_template", "model")),
                d_model=int(raw["d_model"]),
                n_layers=int(raw.get("n_layers") or max(raw["layers"], default=-1) + 1),
                dataset=DatasetInfo(dataset.get("path"), dataset.get("sha256"), dataset.get("n_examples")),
                valueprobe_version=str(raw.get("valueprobe_version", "unknown")),
                part=None if raw.get("part") is None else ShardSpec.parse(_part_text(raw["part"])),
                model_dtype=None if raw.get("model_dtype") is None else str(raw["model_dtype"]),
                shards=tuple(
                    Shard(str(s["file"]), (int(s["examples"][0]), int(s["examples"][1])), int(s["rows"]))
                    for s in raw.get("shards", [])
                ),
                complete=bool(raw.get("complete")),
            )
        except (KeyError, TypeError, ValueError, IndexError, ValueprobeError) as exc:
            what = f"lacks the field {exc}" if isinstance(exc, KeyError) else f"has a bad value ({exc})"
            raise ValueprobeError(f"{where}: manifest {what}; capture the store again") from None


def _part_text(raw: Mapping) -> str:
    return f"{int(raw['index'])}/{int(raw['count'])}"


# The capture settings that fix a store's identity (dataset identity is checked apart).
_SETTINGS: tuple[str, ...] = tuple(
    f.name
    for f in fields(StoreManifest)
    if f.name not in ("d_model", "n_layers", "dataset", "valueprobe_version", "shards", "complete")
)
# Settings a store written before they were recorded lacks: such a store matches any value of them.
_RECORDED_LATER = ("model_dtype",)
