"""An attribution run on disk: ``attribution-run.json`` and the chunks of finished items, resumable.

    runs/attr/attribution-run.json     settings, model, probe and data hashes, item range, chunks, part
    runs/attr/items-00000.safetensors  the results of items [lo, hi): rows' terms, or pairs' effects
    runs/attr/attribution.json         the summary, once every item is done (not in a part)

Like an activation store (`valueprobe.activations.store`): a chunk is written under a temporary
name and renamed, then the run file listing it is rewritten (also atomically), so a kill at any
point (Ctrl-C included) leaves a folder that the same command resumes from its last chunk. A part of
a sharded run (``--shard I/N``) names its shard and covers its contiguous block of items;
``valueprobe merge`` joins the parts' chunks into the folder one process writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from valueprobe.errors import ValueprobeError
from valueprobe.files import (
    atomic_write,
    mmap_safetensors,
    read_safetensors_header,
    write_json,
)
from valueprobe.vocab import ShardSpec

__all__ = ["RUN", "ChunkFile", "RunFile", "check_run_out", "open_run", "read_chunk", "write_chunk"]

RUN = "attribution-run.json"
FORMAT = "valueprobe.attribute.run"


@dataclass(frozen=True)
class ChunkFile:
    """One chunk file and the items ``[lo, hi)`` it holds."""

    file: str
    lo: int
    hi: int


@dataclass(frozen=True)
class RunFile:
    """What ``attribution-run.json`` records: the run's identity (everything that changes its
    numbers), its item range (all items, or a part's block) and the chunks finished so far."""

    identity: dict[str, Any]
    n_items: int
    lo: int
    hi: int
    part: ShardSpec | None = None
    chunks: tuple[ChunkFile, ...] = field(default_factory=tuple)

    @property
    def done(self) -> int:
        """The first item no chunk holds (chunks are contiguous from ``lo``)."""
        return self.chunks[-1].hi if self.chunks else self.lo

    @property
    def complete(self) -> bool:
        return self.done >= self.hi

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": 1,
            "identity": self.identity,
            "n_items": self.n_items,
            "items": [self.lo, self.hi],
            "part": None if self.part is None else {"index": self.part.index, "count": self.part.count},
            "chunks": [{"file": c.file, "items": [c.lo, c.hi]} for c in self.chunks],
            "complete": self.complete,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: Path) -> RunFile:
        try:
            if d.get("format") != FORMAT:
                raise ValueError(f"format {d.get('format')!r}")
            part = d.get("part")
            return cls(
                identity=dict(d["identity"]),
                n_items=int(d["n_items"]),
                lo=int(d["items"][0]),
                hi=int(d["items"][1]),
                part=None if part is None else ShardSpec.parse(f"{int(part['index'])}/{int(part['count'])}"),
                chunks=tuple(
                    ChunkFile(str(c["file"]), int(c["items"][0]), int(c["items"][1])) for c in d["chunks"]
                ),
            )
        except (KeyError, TypeError, ValueError, IndexError, ValueprobeError) as exc:
            raise ValueprobeError(
                f"{where} is not an attribution run file ({exc}): use a new --out"
            ) from None

    def write(self, folder: Path) -> None:
        write_json(folder / RUN, self.to_dict(), indent=1)

    def with_chunk(self, chunk: ChunkFile) -> RunFile:
        return replace(self, chunks=(*self.chunks, chunk))


def read_run(folder: Path) -> RunFile:
    path = folder / RUN
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueprobeError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); use a new --out") from None
    return RunFile.from_dict(raw, path)


def check_run_out(out: Path) -> None:
    """``out`` is new, empty, or an attribution run (to resume or re-summarize): before a model loads."""
    if out.exists() and not out.is_dir():
        raise ValueprobeError(f"--out {out} is a file: give a folder")
    if (out / RUN).is_file():
        read_run(out)
    elif out.is_dir() and any(out.iterdir()):
        raise ValueprobeError(
            f"--out {out} exists and holds no attribution run: choose an empty or new folder"
        )


def open_run(out: Path, wanted: RunFile) -> RunFile:
    """The run at ``out`` to resume (it must have ``wanted``'s identity and range), else ``wanted``, new.

    Chunks whose file is missing or cut short are dropped from the first bad one on (redone).
    """
    if not (out / RUN).is_file():
        out.mkdir(parents=True, exist_ok=True)
        wanted.write(out)
        return wanted
    have = read_run(out)
    if have.part != wanted.part:
        raise ValueprobeError(
            f"--out {out} holds {'shard ' + str(have.part) if have.part else 'a whole run'}, not"
            f" {'shard ' + str(wanted.part) if wanted.part else 'a whole run'}: give each its own folder"
        )
    differ = next(
        (k for k in {**wanted.identity, **have.identity} if have.identity.get(k) != wanted.identity.get(k)),
        None,
    )
    if differ is not None or (have.lo, have.hi, have.n_items) != (wanted.lo, wanted.hi, wanted.n_items):
        what = (
            f"{differ}={have.identity.get(differ)!r}, not {wanted.identity.get(differ)!r}"
            if differ
            else "other items"
        )
        raise ValueprobeError(
            f"--out {out} holds a run made with {what}: resume with the same options, or use a new --out"
        )
    for stray in out.glob("*.tmp"):
        stray.unlink()
    good: list[ChunkFile] = []
    for chunk in have.chunks:
        try:
            read_safetensors_header(out / chunk.file)
        except ValueprobeError:
            break
        good.append(chunk)
    return replace(have, chunks=tuple(good))


def write_chunk(
    out: Path, run: RunFile, lo: int, hi: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> RunFile:
    """Write items ``[lo, hi)`` as the next chunk, then the run file listing it; the updated run."""
    name = f"items-{len(run.chunks):05d}.safetensors"
    text = {k: json.dumps(v, ensure_ascii=False) for k, v in meta.items()}
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    atomic_write(out / name, lambda tmp: save_file(tensors, str(tmp), metadata=text))
    run = run.with_chunk(ChunkFile(name, lo, hi))
    run.write(out)
    return run


def read_chunk(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A chunk's tensors (copied into memory) and its metadata, parsed."""
    arrays, meta = mmap_safetensors(path)
    return {k: torch.from_numpy(a.copy()) for k, a in arrays.items()}, {
        k: json.loads(v) for k, v in meta.items()
    }
