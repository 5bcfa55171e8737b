"""Join the parts of a sharded capture into the store a one-process capture makes.

    valueprobe capture --data data/icrl.jsonl --positions spans --shard 0/2 --out runs/icrl.part0
    valueprobe capture --data data/icrl.jsonl --positions spans --shard 1/2 --out runs/icrl.part1
    valueprobe merge runs/icrl runs/icrl.part0 runs/icrl.part1

A part is a store whose manifest names its shard (``part: {index, count}``) and the whole
dataset (sha256, number of examples). Its shard files cover whole blocks of
``examples_per_shard`` examples with absolute example indices, so the merged store is the
parts' shard files in shard order, renumbered: the same bytes a one-process capture writes, not
a re-encoding (`valueprobe.sharded.merge` joins them; its checks are every kind's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from valueprobe.activations.manifest import Shard, StoreManifest
from valueprobe.activations.store import MANIFEST, ActivationStore, check_store_out
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir, write_json
from valueprobe.model.fingerprint import Fingerprint
from valueprobe.sharded import Part, PartKind, declare, link_or_copy, partial

__all__ = ["STORE_PARTS", "read_part"]


def read_part(path: str | Path) -> Part[StoreManifest]:
    """One finished part and its manifest, verified like :meth:`ActivationStore.open`.

    Raises:
        ValueprobeError: not a store, a whole store, an unreadable fingerprint, a bad or missing
            shard file, or an unfinished part; the line names the part.
    """
    path = Path(path)
    store = ActivationStore._read(path)
    m = store.manifest
    try:
        Fingerprint.parse(m.fingerprint)
    except ValueprobeError as exc:
        raise ValueprobeError(f"part {path}: {exc}") from None
    if m.part is None:
        raise ValueprobeError(
            f"part {path} is a whole store, not a part of a sharded capture (made without --shard): nothing to merge"
        )
    if (problem := store._first_bad_shard()) is not None:
        raise ValueprobeError(f"part {path}: {problem}; rerun its `valueprobe capture --shard {m.part}`")
    settings, unrecorded = m.identity()
    part = Part(
        path, m.part, m, model=m.fingerprint, dataset=(m.dataset.path, m.dataset.sha256, m.dataset.n_examples),
        settings=settings, unrecorded=unrecorded,
    )  # fmt: skip
    if not m.complete:
        raise partial(part, STORE_PARTS, f"{m.n_examples_done} of {len(m.example_range)} examples")
    return part


def _check_out(out: Path) -> None:
    check_store_out(out)
    if (out / MANIFEST).exists() and ActivationStore._read(out).manifest.part is not None:
        raise ValueprobeError(f"merge OUT {out} holds a part (shard): write the merged store to a new folder")


def _join(out: Path, parts: Sequence[Part[StoreManifest]]) -> ActivationStore:
    """The parts' shard files in shard order, renumbered, under the parts' manifest without ``part``."""

    def write(tmp: Path) -> None:
        shards: list[Shard] = []
        for p in parts:
            for shard in p.body.shards:
                name = f"shard-{len(shards):05d}.safetensors"
                link_or_copy(p.path / shard.file, tmp / name)
                shards.append(replace(shard, file=name))
        merged = replace(parts[0].body, part=None, shards=tuple(shards), complete=True)
        write_json(tmp / MANIFEST, merged.to_dict(), indent=1, newline=False)

    atomic_write_dir(out, write)
    return ActivationStore.open(out)


STORE_PARTS = declare(
    PartKind(
        command="capture",
        marker=MANIFEST,
        read=read_part,
        join=_join,
        did="was captured",
        source="was captured from",
        result="store",
        check_out=_check_out,
    )
)
