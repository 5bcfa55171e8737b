"""A sharded attribution: each job runs its block of items into a part; ``merge`` joins and summarizes.

    valueprobe attribute --probe P --data data/icrl_pairs.jsonl --method patch --shard 0/2 --out runs/attr.part0
    valueprobe attribute --probe P --data data/icrl_pairs.jsonl --method patch --shard 1/2 --out runs/attr.part1
    valueprobe merge runs/attr runs/attr.part0 runs/attr.part1

A part is a run folder (`valueprobe.attribute.folder`) whose run file names its shard; shard I
holds the contiguous block of items `ShardSpec.examples` gives it (whole batches of examples for
direct attribution, pairs for patching), so each part computes what the one-process run computes
for those items. The merge checks that the parts belong together (one identity: settings, model,
probe, data; each shard once; each finished), links their chunks in shard order into the folder
one process writes, and summarizes it: the same ``attribution.json`` and ``components.csv``. The
circuit ablation needs the model and every item's ranking, so it is not part of a merge: rerun the
same command, unsharded with ``--ablate-top k``, on the merged folder (every item is done; only
the ablation runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from valueprobe.attribute.folder import RUN, ChunkFile, RunFile, read_run
from valueprobe.attribute.records import Attribution
from valueprobe.attribute.run import summarize_run, write_result
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir
from valueprobe.sharded import Part, PartKind, declare, link_or_copy, partial

__all__ = ["ATTRIBUTION_PARTS"]


def _read(path: Path) -> Part[RunFile]:
    if not (path / RUN).is_file():
        raise ValueprobeError(
            f"part {path} holds no {RUN}: pass the folders `valueprobe attribute --shard` wrote"
        )
    run = read_run(path)
    if run.part is None:
        raise ValueprobeError(
            f"part {path} is a whole run, not a part of a sharded one (made without --shard)"
        )
    part = Part(path, run.part, run, settings=run.identity, other=(("number of items", run.n_items),))
    if not run.complete:
        raise partial(part, ATTRIBUTION_PARTS, f"{run.done - run.lo} of {run.hi - run.lo} items")
    return part


def _join(out: Path, parts: Sequence[Part[RunFile]]) -> Attribution:
    """The parts' chunks linked in shard order into the folder one process writes, summarized."""
    chunks: list[tuple[Path, ChunkFile]] = [(p.path / c.file, c) for p in parts for c in p.body.chunks]
    first = parts[0].body
    merged = RunFile(
        first.identity, first.n_items, 0, first.n_items, None,
        tuple(replace(c, file=f"items-{i:05d}.safetensors") for i, (_, c) in enumerate(chunks)),
    )  # fmt: skip

    done: list[Attribution] = []

    def write(tmp: Path) -> None:
        for (src, _), chunk in zip(chunks, merged.chunks, strict=True):
            link_or_copy(src, tmp / chunk.file)
        merged.write(tmp)
        done.append(summarize_run(tmp, merged))
        write_result(tmp, done[0])

    atomic_write_dir(out, write)
    return done[0]


ATTRIBUTION_PARTS = declare(
    PartKind(
        command="attribute",
        marker=RUN,
        read=_read,
        join=_join,
        did="was run",
        source="was run on",
        result="run",
    )
)
