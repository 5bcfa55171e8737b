"""A capture under torchrun: each rank captures its part, they meet, and rank 0 merges.

    torchrun --nproc-per-node 8 -m valueprobe capture --model Qwen/Qwen3-8B --data data/icrl.jsonl \
        --positions spans --device cuda --out runs/icrl

Rank R of N (torchrun's ``RANK``/``WORLD_SIZE``, when WORLD_SIZE > 1) is shard R/N, on GPU
``LOCAL_RANK`` when the device is ``cuda``: it captures
into ``runs/icrl.parts/part-R-of-N`` (a store that resumes, like any other), then every rank
reports how its part went in one ``all_gather`` over gloo (CPU; no GPU collective is needed).
If a rank failed, the job ends with one line naming it; otherwise rank 0 merges the parts into
``runs/icrl``. Rerunning the same command resumes every rank from its own part. A rank killed
outright (kill -9, out of memory) never reports: torchrun then stops the others and names it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch.distributed as dist

from valueprobe.activations.parts import merge_stores
from valueprobe.activations.store import ActivationStore
from valueprobe.errors import ValueprobeError
from valueprobe.vocab import ShardSpec

__all__ = ["capture_ranks", "part_dir", "rank_device"]


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


def capture_ranks(
    out: str | Path, shard: ShardSpec, capture_part: Callable[[Path], object]
) -> ActivationStore | None:
    """Run ``capture_part(part_dir)`` on this rank, meet the other ranks, and on rank 0 merge.

    Returns:
        the merged store on rank 0, None on the others.

    Raises:
        ValueprobeError: on rank 0, one line naming the first rank that failed and why;
            SystemExit(2) on the other ranks then (rank 0 speaks for the job).
    """
    failure = None
    try:
        capture_part(part_dir(out, shard))
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
        merged = merge_stores(out, parts) if shard.index == 0 else None
        dist.barrier()  # no rank leaves before the merged store is in place
        return merged
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
