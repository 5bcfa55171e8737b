"""A job under torchrun: each rank runs its part, they meet, and rank 0 merges.

    torchrun --nproc-per-node 8 -m valueprobe capture --model Qwen/Qwen3-8B --data data/icrl.jsonl \
        --positions spans --device cuda --out runs/icrl

The same holds for ``score``, ``steer`` and ``shift`` (:func:`run_ranks` takes the part's job and
the kind's merge); the capture's words below stand for theirs.

Rank R of N (torchrun's ``RANK``/``WORLD_SIZE``, when WORLD_SIZE > 1) is shard R/N, on GPU
``LOCAL_RANK`` when the device is ``cuda``: it captures
into ``runs/icrl.parts/part-R-of-N`` (a store that resumes, like any other), then every rank
reports how its part went in one ``all_gather`` over gloo (CPU; no GPU collective is needed).
If a rank failed, the job ends with one line naming it; otherwise rank 0 merges the parts into
``runs/icrl``. Rerunning the same command resumes every rank from its own part. A rank killed
outright (kill -9, out of memory) never reports: torchrun then stops the others and names it.
Parts on disk from a run with another world size are refused before any work: a rank's part is
only its own under the N it was written with.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import torch.distributed as dist

from valueprobe.activations.parts import merge_stores
from valueprobe.activations.store import ActivationStore
from valueprobe.errors import ValueprobeError
from valueprobe.vocab import ShardSpec

__all__ = ["capture_ranks", "check_world", "part_dir", "rank_device", "run_ranks"]

T = TypeVar("T")


def rank_device(device: str, env: Mapping[str, str] = os.environ) -> str:
    """``--device cuda`` on a torchrun rank means this node's GPU number ``LOCAL_RANK``; an explicit
    ``cuda:K`` or ``cpu`` is kept.

    >>> rank_device("cuda", {"LOCAL_RANK": "3"})
    'cuda:3'
    """
    local = env.get("LOCAL_RANK")
    return f"cuda:{int(local)}" if device == "cuda" and local is not None and local.isdigit() else device


def part_dir(out: str | Path, shard: ShardSpec) -> Path:
    """Where rank ``shard.index`` of a torchrun capture into ``out`` keeps its part."""
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
    merge: Callable[[Path, Sequence[Path]], T],
) -> T | None:
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


def capture_ranks(
    out: str | Path, shard: ShardSpec, capture_part: Callable[[Path], object]
) -> ActivationStore | None:
    """:func:`run_ranks` for a capture: the merged store on rank 0, None on the others."""
    return run_ranks(out, shard, capture_part, merge_stores)
