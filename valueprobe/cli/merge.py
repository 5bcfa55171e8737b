"""``valueprobe merge``: join the parts of a sharded run into the result one process makes.

valueprobe capture --data data/icrl.jsonl --shard 0/2 --out runs/icrl.part0
valueprobe capture --data data/icrl.jsonl --shard 1/2 --out runs/icrl.part1
valueprobe merge runs/icrl runs/icrl.part0 runs/icrl.part1

The same for `score --shard` (scores.csv), `steer --shard` (generations.jsonl), `shift --shard`
(shift-part.json), `attribute --shard` (attribution-run.json) and `eval --shard` (eval-part.json) parts: the kind of part is found
by its marker file (`valueprobe.sharded.kind_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from valueprobe.cli.app import app, console
from valueprobe.cli.attribute import print_merged_attribution
from valueprobe.cli.capture_fit import print_merged_scores, print_merged_store
from valueprobe.cli.evals import print_merged_evals
from valueprobe.cli.steer import print_merged_sweeps
from valueprobe.cli.tune import print_merged_shifts
from valueprobe.errors import ValueprobeError

if TYPE_CHECKING:
    from valueprobe.sharded import PartKind


def mergers() -> dict[PartKind[Any, Any], Callable[[Path, Sequence[Path]], None]]:
    """Each kind of part (found by its marker file, in this order) -> how its merge is printed."""
    from valueprobe.activations.parts import (
        STORE_PARTS,  # loads the library: when the command runs (cli/app.py)
    )
    from valueprobe.attribute.parts import ATTRIBUTION_PARTS
    from valueprobe.evals.parts import EVAL_PARTS
    from valueprobe.read.score_parts import SCORE_PARTS
    from valueprobe.steering.experiment.sweep_parts import SWEEP_PARTS
    from valueprobe.tune.shift_parts import SHIFT_PARTS

    return {
        STORE_PARTS: print_merged_store,
        SCORE_PARTS: print_merged_scores,
        SWEEP_PARTS: print_merged_sweeps,
        SHIFT_PARTS: print_merged_shifts,
        ATTRIBUTION_PARTS: print_merged_attribution,
        EVAL_PARTS: print_merged_evals,
    }


@app.command("merge")
def merge_command(
    out: Annotated[Path, typer.Argument(help="folder for the merged result (written whole, then renamed)")],
    parts: Annotated[list[Path], typer.Argument(help="the N part folders, in any order")],
) -> None:
    """Join the parts of a sharded run (`--shard I/N`, torchrun) into one result; refuse parts that
    do not belong together."""
    from valueprobe.sharded import kind_of  # loads the library: when the command runs (cli/app.py)

    table = mergers()
    kind = kind_of(parts[0], list(table))
    if kind is None:
        raise ValueprobeError(
            f"part {parts[0]} holds no sharded result ({', '.join(k.marker for k in table)}): pass the"
            " folders that `valueprobe capture --shard I/N` wrote"
        )
    table[kind](out, parts)
    console.print(f"merged {len(parts)} parts into {out}")
