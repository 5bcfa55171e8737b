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

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from valueprobe.attribute.folder import RUN, Chunk, RunFile, read_run
from valueprobe.attribute.records import Attribution
from valueprobe.attribute.run import summarize_run, write_result
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir
from valueprobe.vocab import check_split

__all__ = ["merge_runs"]


def _read_part(path: Path) -> RunFile:
    if not (path / RUN).is_file():
        raise ValueprobeError(
            f"part {path} holds no {RUN}: pass the folders `valueprobe attribute --shard` wrote"
        )
    run = read_run(path)
    if run.part is None:
        raise ValueprobeError(
            f"part {path} is a whole run, not a part of a sharded one (made without --shard)"
        )
    if not run.complete:
        raise ValueprobeError(
            f"part {path} (shard {run.part}) is partial: {run.done - run.lo} of {run.hi - run.lo} items;"
            f" rerun its `valueprobe attribute --shard {run.part}` to finish it"
        )
    return run


def _check_together(paths: Sequence[Path], runs: Sequence[RunFile]) -> None:
    first = runs[0]
    for path, run in zip(paths, runs, strict=True):
        keys = {**first.identity, **run.identity}
        differ = next((k for k in keys if run.identity.get(k) != first.identity.get(k)), None)
        if differ is not None or run.n_items != first.n_items:
            what = f"{differ}={run.identity.get(differ)!r}" if differ else f"{run.n_items} items"
            raise ValueprobeError(
                f"part {path} was run with {what}, unlike {paths[0]}: run every part with the same options"
            )
    check_split([(path, run.part) for path, run in zip(paths, runs, strict=True) if run.part is not None])


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def merge_runs(out: str | Path, parts: Sequence[str | Path]) -> Attribution:
    """Join the N parts of a sharded attribution into the folder one process writes, and summarize it.

    Raises:
        ValueprobeError: parts that do not belong together or are unfinished, or an ``out`` that is
            a part or holds something else.
    """
    out, paths = Path(out), [Path(p) for p in parts]
    if any(out.resolve() == p.resolve() for p in paths):
        raise ValueprobeError(f"merge OUT {out} is one of its parts: write the merged run to a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueprobeError(f"merge OUT {out} exists and is not empty: choose a new folder")
    runs = [_read_part(p) for p in paths]
    _check_together(paths, runs)
    ordered = sorted(zip(paths, runs, strict=True), key=lambda pr: pr[1].part.index if pr[1].part else 0)
    chunks: list[tuple[Path, Chunk]] = [(path / c.file, c) for path, run in ordered for c in run.chunks]
    merged = RunFile(
        runs[0].identity, runs[0].n_items, 0, runs[0].n_items, None,
        tuple(replace(c, file=f"items-{i:05d}.safetensors") for i, (_, c) in enumerate(chunks)),
    )  # fmt: skip

    done: list[Attribution] = []

    def write(tmp: Path) -> None:
        for (src, _), chunk in zip(chunks, merged.chunks, strict=True):
            _link_or_copy(src, tmp / chunk.file)
        merged.write(tmp)
        done.append(summarize_run(tmp, merged))
        write_result(tmp, done[0])

    atomic_write_dir(out, write)
    return done[0]
