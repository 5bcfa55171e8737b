"""``valueprobe merge``: join the parts of a sharded run into the result one process makes.

valueprobe capture --data data/icrl.jsonl --shard 0/2 --out runs/icrl.part0
valueprobe capture --data data/icrl.jsonl --shard 1/2 --out runs/icrl.part1
valueprobe merge runs/icrl runs/icrl.part0 runs/icrl.part1

The same for the parts of every other command run with ``--shard I/N`` (score, steer, shift,
attribute, eval): the kind of part is found by its marker file (`valueprobe.sharded`, where each kind is
declared), and the merged result's page and table are drawn alike (`print_merged`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from valueprobe.cli.app import app, console, print_merged


@app.command("merge")
def merge_command(
    out: Annotated[Path, typer.Argument(help="folder for the merged result (written whole, then renamed)")],
    parts: Annotated[list[Path], typer.Argument(help="the N part folders, in any order")],
) -> None:
    """Join the parts of a sharded run (`--shard I/N`, torchrun) into one result; refuse parts that
    do not belong together."""
    print_merged(out, parts)
    console.print(f"merged {len(parts)} parts into {out}")
