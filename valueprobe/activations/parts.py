"""Join the parts of a sharded capture into the store a one-process capture makes.

    valueprobe capture --data data/icrl.jsonl --positions spans --shard 0/2 --out runs/icrl.part0
    valueprobe capture --data data/icrl.jsonl --positions spans --shard 1/2 --out runs/icrl.part1
    valueprobe merge runs/icrl runs/icrl.part0 runs/icrl.part1

A part is a store whose manifest names its shard (``part: {index, count}``) and the whole
dataset (sha256, number of examples). Its shard files cover whole blocks of
``examples_per_shard`` examples with absolute example indices, so the merged store is the
parts' shard files in shard order, renumbered: the same bytes a one-process capture writes, not
a re-encoding. Parts that do not belong together (another model, other settings or dataset, a
missing or repeated shard, an unfinished part) are refused with one line naming the part.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from valueprobe.activations.manifest import Shard, StoreManifest
from valueprobe.activations.store import MANIFEST, ActivationStore, check_store_out
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir, write_json
from valueprobe.model.fingerprint import Fingerprint
from valueprobe.vocab import check_split

__all__ = ["merge_stores", "read_part"]


def read_part(path: str | Path) -> StoreManifest:
    """The manifest of one finished part, verified like :meth:`ActivationStore.open`.

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
    if not m.complete:
        raise ValueprobeError(
            f"part {path} (shard {m.part}) is partial: {m.n_examples_done} of {len(m.example_range)} examples;"
            f" rerun its `valueprobe capture --shard {m.part}` to finish it"
        )
    return m


def _check_together(parts: Sequence[Path], manifests: Sequence[StoreManifest]) -> None:
    """Every part from the first part's model, settings and dataset; each shard 0..N-1 once."""
    first, ref = manifests[0], parts[0]
    for path, m in zip(parts, manifests, strict=True):
        if m.fingerprint != first.fingerprint:
            raise ValueprobeError(
                f"part {path} was captured from another model (fingerprint {m.fingerprint}, not"
                f" {first.fingerprint} as {ref}): capture every part with the same --model"
            )
        if (differ := first.settings_differ(m, ignore=("part",))) is not None:
            key, want, have = differ
            raise ValueprobeError(
                f"part {path} was captured with {key}={have!r}, not {want!r} as {ref}: capture every part alike"
            )
        if (m.dataset.sha256, m.dataset.n_examples) != (first.dataset.sha256, first.dataset.n_examples):
            raise ValueprobeError(
                f"part {path} was captured from another dataset ({m.dataset.path}, {m.dataset.n_examples} examples)"
                f" than {ref} ({first.dataset.path}, {first.dataset.n_examples}): capture every part from one file"
            )
    check_split([(path, m.part) for path, m in zip(parts, manifests, strict=True) if m.part is not None])


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the file system allows one (a merge of terabytes costs no space), else a copy.
    Shard files are never rewritten in place (a resume renames a new file over an old one), so a
    link never changes under the merged store."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def merge_stores(out: str | Path, parts: Sequence[str | Path]) -> ActivationStore:
    """Join the N parts of a sharded capture (in any order) into one store at ``out``.

    The store appears at ``out`` only when complete (a temporary folder, then a rename). Its
    manifest is the parts' without the ``part`` entry, its shards theirs in dataset order.

    Raises:
        ValueprobeError: parts that do not belong together, or an ``out`` that is a part or
            holds something other than a store.
    """
    out, paths = Path(out), [Path(p) for p in parts]
    if not paths:
        raise ValueprobeError("merge needs the part folders: valueprobe merge OUT PART...")
    check_store_out(out)
    if any(out.resolve() == p.resolve() for p in paths):
        raise ValueprobeError(f"merge OUT {out} is one of its parts: write the merged store to a new folder")
    if (out / MANIFEST).exists() and ActivationStore._read(out).manifest.part is not None:
        raise ValueprobeError(f"merge OUT {out} holds a part (shard): write the merged store to a new folder")
    manifests = [read_part(p) for p in paths]
    _check_together(paths, manifests)
    ordered = sorted(zip(paths, manifests, strict=True), key=lambda pm: _part_index(pm[1]))

    def write(tmp: Path) -> None:
        shards: list[Shard] = []
        for path, m in ordered:
            for shard in m.shards:
                name = f"shard-{len(shards):05d}.safetensors"
                _link_or_copy(path / shard.file, tmp / name)
                shards.append(replace(shard, file=name))
        merged = replace(manifests[0], part=None, shards=tuple(shards), complete=True)
        write_json(tmp / MANIFEST, merged.to_dict(), indent=1, newline=False)

    atomic_write_dir(out, write)
    return ActivationStore.open(out)


def _part_index(manifest: StoreManifest) -> int:
    """A part's shard index (`read_part` has refused every store that is not a part)."""
    assert manifest.part is not None
    return manifest.part.index
