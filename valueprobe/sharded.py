"""The parts of a sharded run, one mechanism for every kind: capture, score, steer, shift, attribute.

    valueprobe score --probe probes/value --data d.jsonl --shard 0/2 --out runs/score.part0
    valueprobe score --probe probes/value --data d.jsonl --shard 1/2 --out runs/score.part1
    valueprobe merge runs/score runs/score.part0 runs/score.part1    # merge(out, parts)

A part is the folder one job of ``--shard I/N`` (or one torchrun rank) writes. What every kind
shares is here, once: the kind of a folder is found by its marker file (`kind_of`); parts that
do not belong together are refused in one line naming the part (`check_together`: another model,
dataset or setting, a shard missing or repeated); the parts are read and joined in shard order
into a folder written whole (`merge`); a dataset is read again only while its sha256 matches
(`reread`); a part file is JSON with its format and shard (`write_head`, `read_head`); and under
torchrun each rank writes its part, the ranks meet, and rank 0 merges (`run_ranks`). The merged
summary is generic too: ``valueprobe merge`` prints the joined result's ``table()`` and writes the
page `valueprobe.report.views` draws for it, if any.

**Declaring a kind** is one `declare(PartKind(...))` at module level, beside what writes its parts;
the command that writes them names it to ``valueprobe.cli.app.run_sharded`` (torchrun's rank 0
merges it), which also imports it, so ``valueprobe merge`` knows it by its marker::

    COUNT_PARTS = declare(PartKind(
        command="count",            # `valueprobe count --shard I/N` writes a part; refusals name it
        marker="count.json",        # the file that marks a part of this kind (unique among kinds)
        read=read_count_part,       # Path -> Part: its shard, its body, its identity (below)
        join=join_counts,           # (out, parts in shard order, checked together) -> the result
        did="was counted",          # "part P was counted with seed=3, not 0 as Q"
        source="was counted on",    # "part P was counted on another model / dataset ..."
        result="count",             # "write the merged count to a new folder"
    ))

``read`` returns a `Part`: the kind's own record (``body``) and its identity, what must be
equal across the N parts (``model``: a fingerprint; ``dataset``: path, sha256 and size;
``settings``: compared key by key; ``other``: anything else, by the name a refusal gives), and
raises `partial` for an unfinished part. ``join`` writes ``out`` whole (`valueprobe.files.
atomic_write_dir`) and returns a result with ``table()`` (headers, rows) for the merged summary.
``check_out`` (default `new_folder`) refuses an ``out`` the kind cannot merge into before any part
is read; ``head`` names the kind's JSON part file when it has one (format ``valueprobe.COMMAND.part``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch.distributed as dist

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file, write_json
from valueprobe.vocab import ShardSpec

__all__ = [
    "KINDS",
    "Part",
    "PartKind",
    "check_split",
    "check_together",
    "declare",
    "kind_of",
    "link_or_copy",
    "merge",
    "new_folder",
    "part_dir",
    "partial",
    "rank_device",
    "read_head",
    "reading",
    "reread",
    "run_ranks",
    "write_head",
]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Part(Generic[T]):
    """One part read back: where, which shard, the kind's own record (``body``), and its identity."""

    path: Path
    shard: ShardSpec
    body: T
    model: str | None = None  # the model's fingerprint (a shift: both); None: its settings hold it
    dataset: tuple[str | None, str | None, int | None] | None = None  # path, sha256, examples
    settings: Mapping[str, Any] = field(default_factory=dict)  # compared key by key
    other: tuple[tuple[str, object], ...] = ()  # what else must match, by the name a refusal gives
    unrecorded: frozenset[str] = frozenset()  # settings written before they were recorded: match any


@dataclass(frozen=True, eq=False)
class PartKind(Generic[T, R]):
    """One kind of part, declared once (see the module doc for each field)."""

    command: str
    marker: str
    read: Callable[[Path], Part[T]]
    join: Callable[[Path, Sequence[Part[T]]], R]
    did: str = "ran"
    source: str = "ran on"
    result: str = "result"
    check_out: Callable[[Path], None] = field(default=lambda out: new_folder(out))
    head: str | None = None

    @property
    def format(self) -> str:
        return f"valueprobe.{self.command}.part"


KINDS: list[PartKind[Any, Any]] = []  # every declared kind, in the order declared


def declare(kind: PartKind[T, R]) -> PartKind[T, R]:
    """Add ``kind`` to `KINDS` (its marker must be its own) and return it."""
    if any(k.marker == kind.marker and k is not kind for k in KINDS):
        raise ValueError(f"two kinds of part are marked by {kind.marker}")
    if kind not in KINDS:
        KINDS.append(kind)
    return kind


def kind_of(folder: Path, kinds: Sequence[PartKind[Any, Any]] | None = None) -> PartKind[Any, Any] | None:
    """The kind whose marker ``folder`` holds (among ``kinds``, default every declared one), or None."""
    return next((k for k in (KINDS if kinds is None else kinds) if (folder / k.marker).exists()), None)


def merge(out: str | Path, parts: Sequence[str | Path], kind: PartKind[T, R] | None = None) -> R:
    """Join the N parts of one sharded run (in any order) into ``out`` as their kind joins them
    (``kind``, default the one the first part's marker names).

    Raises:
        ValueprobeError: no parts, a folder of no known kind, an ``out`` that is one of them or
            that the kind refuses, a part that does not read back, or parts that do not belong
            together; ``out`` is left as it was.
    """
    out, paths = Path(out), [Path(p) for p in parts]
    if not paths:
        raise ValueprobeError("merge needs the part folders: valueprobe merge OUT PART...")
    kind = kind or kind_of(paths[0])
    if kind is None:
        raise ValueprobeError(
            f"part {paths[0]} holds no sharded result ({', '.join(k.marker for k in KINDS)}): pass the"
            " folders that a command run with --shard I/N wrote"
        )
    if any(out.resolve() == p.resolve() for p in paths):
        raise ValueprobeError(
            f"merge OUT {out} is one of its parts: write the merged {kind.result} to a new folder"
        )
    kind.check_out(out)
    loaded = [kind.read(p) for p in paths]
    check_together(loaded, kind)
    return kind.join(out, sorted(loaded, key=lambda p: p.shard.index))


def new_folder(out: Path) -> None:
    """Refuse a merge ``out`` that exists and is not an empty folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueprobeError(f"merge OUT {out} exists and is not an empty folder: choose a new folder")


def check_together(parts: Sequence[Part[Any]], kind: PartKind[Any, Any]) -> None:
    """Every part from the first part's model, dataset, settings and the rest; each shard 0..N-1 once.

    Raises:
        ValueprobeError: one line naming the first part that differs, and in what.
    """
    first, ref = parts[0], parts[0].path
    for p in parts:
        if p.model != first.model:
            raise ValueprobeError(
                f"part {p.path} {kind.source} another model (fingerprint {p.model}, not {first.model} as"
                f" {ref}): run every part with the same model"
            )
        if p.dataset is not None and first.dataset is not None and p.dataset[1:] != first.dataset[1:]:
            (path, _, n), (want, _, m) = p.dataset, first.dataset
            raise ValueprobeError(
                f"part {p.path} {kind.source} another dataset ({path}, {n} examples) than {ref} ({want},"
                f" {m}): run every part on one file"
            )
        if (
            what := next((w for (w, a), (_, b) in zip(p.other, first.other, strict=True) if a != b), None)
        ) is not None:
            raise ValueprobeError(f"part {p.path} differs from {ref} in its {what}: run every part alike")
        skip = p.unrecorded | first.unrecorded
        keys = [k for k in {**first.settings, **p.settings} if k not in skip]
        if (key := next((k for k in keys if p.settings.get(k) != first.settings.get(k)), None)) is not None:
            raise ValueprobeError(
                f"part {p.path} {kind.did} with {key}={p.settings.get(key)!r}, not"
                f" {first.settings.get(key)!r} as {ref}: run every part alike"
            )
    check_split([(p.path, p.shard) for p in parts])


def check_split(parts: Sequence[tuple[object, ShardSpec]]) -> None:
    """``parts`` ((name, shard) each) are the N shards of one split: the same N, each index once.

    Raises:
        ValueprobeError: one line naming the part of another split, a repeated shard or a missing one.
    """
    (first, spec), seen = parts[0], dict[int, object]()
    for name, shard in parts:
        if shard.count != spec.count:
            raise ValueprobeError(
                f"part {name} is shard {shard}, of another split than {first} (shard {spec}):"
                " run every part with the same N in --shard I/N"
            )
        if shard.index in seen:
            raise ValueprobeError(
                f"parts {seen[shard.index]} and {name} are both shard {shard}: pass each shard once"
            )
        seen[shard.index] = name
    missing = [i for i in range(spec.count) if i not in seen]
    if missing:
        raise ValueprobeError(
            f"shard {missing[0]}/{spec.count} is missing: run it with --shard {missing[0]}/{spec.count}"
            " and pass its folder too"
        )


def write_head(folder: Path, kind: PartKind[Any, Any], shard: ShardSpec, fields: Mapping[str, Any]) -> None:
    """The kind's part file: its format, version 1 and shard, then ``fields`` (`read_head` reads it)."""
    assert kind.head is not None
    head = {
        "format": kind.format,
        "version": 1,
        "shard": {"index": shard.index, "count": shard.count},
        **fields,
    }
    write_json(folder / kind.head, head, indent=1, allow_nan=False)


@contextmanager
def reading(path: Path, kind: PartKind[Any, Any], what: str | None = None) -> Iterator[None]:
    """Turn a part whose files (``what``, default the part file) do not read back into one line."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError, ValueprobeError) as exc:
        raise ValueprobeError(
            f"part {path} is not a readable {kind.command} part ({what or kind.head}: {exc}); rerun its"
            f" `valueprobe {kind.command} --shard`"
        ) from None


def read_head(path: Path, kind: PartKind[Any, Any]) -> tuple[dict[str, Any], ShardSpec]:
    """The kind's part file and the shard it names, one line naming the part if it does not read."""
    assert kind.head is not None
    with reading(path, kind):
        head = json.loads((path / kind.head).read_text(encoding="utf-8"))
        if head.get("format") != kind.format:
            raise ValueError(f"format {head.get('format')!r}")
        return head, ShardSpec.parse(f"{int(head['shard']['index'])}/{int(head['shard']['count'])}")


def partial(part: Part[Any], kind: PartKind[Any, Any], done: str) -> ValueprobeError:
    """The refusal of an unfinished part; ``done`` says how far it got ("3 of 8 examples")."""
    return ValueprobeError(
        f"part {part.path} (shard {part.shard}) is partial: {done}; rerun its"
        f" `valueprobe {kind.command} --shard {part.shard}` to finish it"
    )


def reread(part: Path, path: str | None, sha256: str | None, kind: PartKind[Any, Any]) -> list[Example]:
    """The dataset a part ran on, read again for the merge, if it is still there with its sha256."""
    if path is None or not Path(path).is_file() or sha256_file(path) != sha256:
        raise ValueprobeError(
            f"part {part} {kind.source} {path} (sha256 {str(sha256)[:12]}), which is not there or has"
            f" changed: merge where that file is, from the folder its `valueprobe {kind.command}` ran in"
        )
    return read_jsonl(path)


def link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the file system allows one (a merge of terabytes costs no space), else a copy.
    Part files are never rewritten in place (a resume renames a new file over an old one), so a
    link never changes under the merged folder."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


# torchrun: rank R of N (``RANK``/``WORLD_SIZE``, WORLD_SIZE > 1) is shard R/N, on GPU ``LOCAL_RANK``
# when the device is ``cuda``. It writes its part into ``OUT.parts/part-R-of-N`` (a part that
# resumes, like any other), then every rank reports how its part went in one ``all_gather`` over
# gloo (CPU; no GPU collective is needed). If a rank failed, the job ends with one line naming it;
# otherwise rank 0 merges the parts into OUT. Rerunning the same command resumes every rank from
# its own part. A rank killed outright (kill -9, out of memory) never reports: torchrun then stops
# the others and names it. Parts on disk from a run with another world size are refused before
# any work: a rank's part is only its own under the N it was written with.


def rank_device(device: str, env: Mapping[str, str] = os.environ) -> str:
    """``--device cuda`` on a torchrun rank means this node's GPU number ``LOCAL_RANK``; an explicit
    ``cuda:K`` or ``cpu`` is kept.

    >>> rank_device("cuda", {"LOCAL_RANK": "3"})
    'cuda:3'
    """
    local = env.get("LOCAL_RANK")
    return f"cuda:{int(local)}" if device == "cuda" and local is not None and local.isdigit() else device


def part_dir(out: str | Path, shard: ShardSpec) -> Path:
    """Where rank ``shard.index`` of a torchrun job into ``out`` keeps its part."""
    out = Path(out)
    return out.parent / f"{out.name}.parts" / f"part-{shard.index}-of-{shard.count}"


def _gather(failure: str | None, shard: ShardSpec) -> list[str | None]:
    """Every rank's failure line (None: its part is complete), in rank order."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=shard.index, world_size=shard.count)
    got: list[str | None] = [None] * shard.count
    dist.all_gather_object(got, failure)
    return got


def check_world(out: str | Path, shard: ShardSpec) -> None:
    """Refuse parts on disk (``OUT.parts/part-I-of-M``) written by a run of another world size M."""
    parts = part_dir(out, shard).parent
    if not parts.is_dir():
        return
    for entry in sorted(parts.iterdir()):
        if (m := re.fullmatch(r"part-\d+-of-(\d+)", entry.name)) and int(m.group(1)) != shard.count:
            raise ValueprobeError(
                f"{parts} holds parts of a {m.group(1)}-rank run ({entry.name}) but torchrun started"
                f" {shard.count} ranks: rerun with --nproc-per-node {m.group(1)} to resume them, or remove"
                f" {parts} to start over"
            )


def run_ranks(
    out: str | Path,
    shard: ShardSpec,
    run_part: Callable[[Path], object],
    merge: Callable[[Path, Sequence[Path]], R],
) -> R | None:
    """Run ``run_part(part_dir)`` on this rank, meet the other ranks, and on rank 0 ``merge(out, parts)``.

    Returns:
        the merged result on rank 0, None on the others.

    Raises:
        ValueprobeError: on rank 0, one line naming the first rank that failed and why;
            SystemExit(2) on the other ranks then (rank 0 speaks for the job).
    """
    failure = None
    try:
        check_world(out, shard)
        run_part(part_dir(out, shard))
    except ValueprobeError as exc:
        failure = str(exc)
    except Exception as exc:  # an internal error still has to reach the other ranks
        failure = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    try:
        failures = _gather(failure, shard)
        bad = [(rank, line) for rank, line in enumerate(failures) if line is not None]
        if bad and shard.index == 0:
            rank, line = bad[0]
            raise ValueprobeError(
                f"rank {rank} of {shard.count} failed: {line} (rerun the same torchrun command to resume every rank)"
            )
        if bad:
            raise SystemExit(2)
        parts = [part_dir(out, ShardSpec(r, shard.count)) for r in range(shard.count)]
        merged, merge_failure = None, None
        if shard.index == 0:
            try:
                merged = merge(Path(out), parts)
            except Exception as exc:  # raised after the barrier, so no rank waits on rank 0 forever
                merge_failure = exc
        dist.barrier()  # no rank leaves before the merged result is in place
        if merge_failure is not None:
            raise merge_failure
        return merged
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
