"""``valueprobe merge``: join the parts of a sharded run into the result one process makes.

valueprobe capture --data data/icrl.jsonl --shard 0/2 --out runs/icrl.part0
valueprobe capture --data data/icrl.jsonl --shard 1/2 --out runs/icrl.part1
valueprobe merge runs/icrl runs/icrl.part0 runs/icrl.part1

The same for `score --shard` (scores.csv), `steer --shard` (generations.jsonl), `shift --shard`
(shift-part.json) and `attribute --shard` (attribution-run.json) parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from valueprobe.activations.parts import merge_stores
from valueprobe.activations.store import MANIFEST
from valueprobe.attribute.folder import RUN as ATTRIBUTION_RUN
from valueprobe.cli.app import app, console
from valueprobe.cli.attribute import print_merged_attribution
from valueprobe.cli.capture_fit import print_merged_scores, print_store
from valueprobe.cli.steer import print_merged_sweeps
from valueprobe.cli.tune import print_merged_shifts
from valueprobe.errors import ValueprobeError
from valueprobe.steering.experiment.sweep import GENERATIONS
from valueprobe.tune.shift_parts import MARKER as SHIFT_PART


def _merge_store(out: Path, parts: list[Path]) -> None:
    print_store(out, merge_stores(out, parts))


# What a part is recognised by (its marker file) -> how its kind is merged and summarised.
MERGERS = {
    MANIFEST: _merge_store,
    "scores.csv": print_merged_scores,
    GENERATIONS: print_merged_sweeps,
    SHIFT_PART: print_merged_shifts,
    ATTRIBUTION_RUN: print_merged_attribution,
}


@app.command()
def merge(
    out: Annotated[Path, typer.Argument(help="folder for the merged result (written whole, then renamed)")],
    parts: Annotated[list[Path], typer.Argument(help="the N part folders, in any order")],
) -> None:
    """Join the parts of a sharded run (`--shard I/N`, torchrun) into one result; refuse parts that
    do not belong together."""
    marker = next((m for m in MERGERS if (parts[0] / m).exists()), None)
    if marker is None:
        raise ValueprobeError(
            f"part {parts[0]} holds no sharded result ({', '.join(MERGERS)}): pass the folders that"
            " `valueprobe capture --shard I/N` wrote"
        )
    MERGERS[marker](out, parts)
    console.print(f"merged {len(parts)} parts into {out}")
