"""A sharded ``valueprobe eval``: each job runs its share of the (direction, α) settings; ``merge``
joins the points.

    valueprobe eval --harness lm-eval --task arithmetic --probe smollm2-135m-value --alphas -30,0,30 \\
        --random-directions 8 --shard 0/2 --out runs/eval.part0
    valueprobe eval ... --shard 1/2 --out runs/eval.part1
    valueprobe merge runs/eval runs/eval.part0 runs/eval.part1

A part folder holds ``eval-part.json``: its shard, the model's fingerprint, the settings, the
spec, and the points it has scored so far (rewritten whole after each one, so a rerun resumes).
Settings are independent harness runs, so the merged points, in shard order, are the points one
process scores, and the merge writes the folder a one-process run writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from valueprobe.errors import ValueprobeError
from valueprobe.evals.records import EvalPoint, EvalResult, EvalSettings
from valueprobe.files import atomic_write_dir, jsonable
from valueprobe.records import Record
from valueprobe.sharded import Part, PartKind, declare, new_folder, partial, read_head, reading, write_head
from valueprobe.vocab import ShardSpec

__all__ = ["EVAL_PARTS", "PART", "EvalPart", "read_part"]

PART = "eval-part.json"


@dataclass(frozen=True)
class EvalPart(Record):
    """One shard's points, and what must match across the shards (`EvalResult`'s fields but points)."""

    model: str
    fingerprint: str
    spec: dict[str, Any]
    unit: str
    other_unit: str
    metric: str
    settings: EvalSettings
    todo: int  # settings this shard runs
    points: tuple[EvalPoint, ...] = ()

    def write(self, out: Path, shard: ShardSpec) -> None:
        write_head(out, EVAL_PARTS, shard, jsonable(self.to_dict()))

    def result(self, points: Sequence[EvalPoint]) -> EvalResult:
        fields = {k: v for k, v in self.__dict__.items() if k not in ("todo", "points")}
        return EvalResult(**fields, points=tuple(points))


def read_part(path: Path) -> tuple[EvalPart, ShardSpec]:
    """A part folder's record and shard; one line naming it when it is not one."""
    head, shard = read_head(path, EVAL_PARTS)
    with reading(path, EVAL_PARTS):
        return EvalPart.from_dict(head), shard


def _read(path: Path) -> Part[EvalPart]:
    body, shard = read_part(path)
    settings = body.settings.to_dict()
    return Part(
        path,
        shard,
        body,
        model=body.fingerprint,
        settings=settings,
        other=(("steering spec", body.spec), ("unit", body.unit)),
    )


def _check_out(out: Path) -> None:
    if (out / PART).exists():
        raise ValueprobeError(f"merge OUT {out} is a part: write the merged evaluation to a new folder")
    new_folder(out)


def _join(out: Path, parts: Sequence[Part[EvalPart]]) -> EvalResult:
    for p in parts:
        if len(p.body.points) < p.body.todo:
            raise partial(p, EVAL_PARTS, f"{len(p.body.points)} of {p.body.todo} settings scored")
    result = parts[0].body.result([pt for p in parts for pt in p.body.points])
    atomic_write_dir(out, result.write)
    return result


EVAL_PARTS = declare(
    PartKind(
        command="eval",
        marker=PART,
        read=_read,
        join=_join,
        did="was evaluated",
        source="was evaluated on",
        result="evaluation",
        check_out=_check_out,
        head=PART,
    )
)
