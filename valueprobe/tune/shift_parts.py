"""A sharded ``shift``: each job reads its shard's examples in both models; ``merge`` computes the shift.

    valueprobe shift --probe probes/value --base smollm2-135m --tuned runs/dpo --data d.jsonl --shard 0/2 --out runs/shift.part0
    valueprobe shift --probe probes/value --base smollm2-135m --tuned runs/dpo --data d.jsonl --shard 1/2 --out runs/shift.part1
    valueprobe merge runs/shift runs/shift.part0 runs/shift.part1

A part folder holds ``shift-part.json`` (shard, both models' ids and fingerprints, the dataset's
path, sha256 and size, the settings), ``reads.safetensors`` (each of its examples' mean residual
at each read layer, base and tuned, float64 as the one-process run holds them) and ``probe/`` (the
axis it read, so the merge needs no other file). Shard I takes contiguous blocks of ``batch_size``
examples (:meth:`ShardSpec.examples`): each part runs the batches of the one-process run, so the
merged residuals are the same numbers and :func:`valueprobe.tune.shift.shift_of_reads` gives the
same figures. Every statistic (groups, quartiles, nulls, bootstrap) needs all examples, so only the
merge computes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from valueprobe.activations.manifest import DatasetInfo
from valueprobe.datasets.io import Example, read_jsonl, sha256_file
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, mmap_safetensors, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.tune.shift import (
    Models,
    ShiftResult,
    ShiftSettings,
    check_groups,
    group_by,
    read_both,
    shift_of_reads,
)
from valueprobe.vocab import Positions, ShardSpec, check_split

__all__ = ["MARKER", "merge_shifts", "shift_part"]

MARKER = "shift-part.json"
READS = "reads.safetensors"
FORMAT = "valueprobe.shift.part"


def shift_part(
    axis: ValueAxis,
    base: LoadedModel,
    tuned: LoadedModel,
    examples: Sequence[Example],
    out: str | Path,
    *,
    shard: ShardSpec,
    dataset: DatasetInfo,
    settings: ShiftSettings,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Read shard ``shard`` of ``examples`` (already grouped by ``settings.by``) in both models and
    write its part into ``out``; :func:`merge_shifts` joins the N parts."""
    s = settings
    check_groups(examples, targeted=s.targeted, contrast=s.contrast, refit=s.refit)  # on all examples
    todo = shard.examples(len(examples), block=s.batch_size)
    layer, h_base, h_tuned = read_both(
        axis, base, tuned, examples[todo.start : todo.stop], layers=s.layers, layer=s.layer,
        tokens=Positions(s.tokens), batch_size=s.batch_size, force=force, progress=progress,
    )  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    axis.save(out / "probe")
    tensors = {
        f"{kind}.{x}": torch.from_numpy(np.ascontiguousarray(h[x]))
        for kind, h in (("base", h_base), ("tuned", h_tuned))
        for x in h
    }
    meta = {"ids": json.dumps([examples[i].id for i in todo])}
    atomic_write(out / READS, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
    head = {
        "format": FORMAT,
        "version": 1,
        "shard": {"index": shard.index, "count": shard.count},
        "models": asdict(Models(base.model_id, tuned.model_id, base.fingerprint, tuned.fingerprint)),
        "dataset": asdict(dataset),
        "settings": {
            **asdict(s),
            "layers": s.layers if s.layers is None else str(s.layers),
            "targeted": list(s.targeted),
        },
        "layer": layer,
        "probe_sha256": sha256_file(out / "probe" / "axis.safetensors"),
    }
    write_json(out / MARKER, head, indent=1, allow_nan=False)
    return out


@dataclass(frozen=True)
class _Part:
    path: Path
    shard: ShardSpec
    head: dict

    @classmethod
    def read(cls, path: Path) -> _Part:
        try:
            head = json.loads((path / MARKER).read_text(encoding="utf-8"))
            if head.get("format") != FORMAT:
                raise ValueError(f"format {head.get('format')!r}")
            shard = ShardSpec.parse(f"{int(head['shard']['index'])}/{int(head['shard']['count'])}")
            if not (path / READS).is_file():
                raise ValueError(f"no {READS}")
        except (OSError, ValueError, KeyError, TypeError, ValueprobeError) as exc:
            raise ValueprobeError(
                f"part {path} is not a readable shift part ({MARKER}: {exc}); rerun its `valueprobe shift --shard`"
            ) from None
        return cls(path, shard, head)


def _check_together(parts: Sequence[_Part]) -> None:
    """Every part read the first part's dataset with its models, probe and settings; each shard once."""
    first = parts[0]
    for p in parts:
        for key, what in (
            ("models", "models (ids, fingerprints)"),
            ("probe_sha256", "probe"),
            ("dataset", "dataset (path, sha256, examples)"),
            ("layer", "headline layer"),
        ):
            if p.head[key] != first.head[key]:
                raise ValueprobeError(
                    f"part {p.path} read another {what} than {first.path}: run every part alike"
                )
        mine, want = p.head["settings"], first.head["settings"]
        if (differ := next((k for k in want if mine.get(k) != want[k]), None)) is not None:
            raise ValueprobeError(
                f"part {p.path} ran with {differ}={mine.get(differ)!r}, not {want[differ]!r} as {first.path}:"
                " run every part alike"
            )
    check_split([(p.path, p.shard) for p in parts])


def _examples(first: _Part) -> list[Example]:
    d, by = DatasetInfo(**first.head["dataset"]), first.head["settings"]["by"]
    if d.path is None or not Path(d.path).is_file() or sha256_file(d.path) != d.sha256:
        raise ValueprobeError(
            f"part {first.path} read {d.path} (sha256 {str(d.sha256)[:12]}), which is not there or has changed:"
            " merge where that file is, from the folder the shift ran in"
        )
    return group_by(read_jsonl(d.path), by)


def merge_shifts(parts: Sequence[str | Path]) -> ShiftResult:
    """The shift one process computes, from the N parts of a sharded one (in any order).

    Raises:
        ValueprobeError: parts that do not belong together, or the dataset gone or changed.
    """
    loaded = sorted((_Part.read(Path(p)) for p in parts), key=lambda p: p.shard.index)
    _check_together(loaded)
    first = loaded[0]
    examples = _examples(first)
    reads: dict[str, list[np.ndarray]] = {}
    ids: list[str] = []
    for p in loaded:
        arrays, meta = mmap_safetensors(p.path / READS)
        ids += json.loads(meta["ids"])
        for name, a in arrays.items():
            reads.setdefault(name, []).append(np.array(a))
    if ids != [ex.id for ex in examples]:
        raise ValueprobeError(
            f"the parts' examples are not those of {first.head['dataset']['path']}: run every part again"
        )
    h = {
        kind: {int(k.split(".")[1]): np.concatenate(v) for k, v in reads.items() if k.startswith(kind + ".")}
        for kind in ("base", "tuned")
    }
    s = first.head["settings"]
    settings = ShiftSettings(
        tokens=s["tokens"], targeted=tuple(s["targeted"]), contrast=s["contrast"], n_random=s["n_random"],
        refit=s["refit"], n_boot=s["n_boot"], seed=s["seed"],
    )  # fmt: skip
    axis, models = ValueAxis.load(first.path / "probe"), Models(**first.head["models"])
    return shift_of_reads(axis, models, examples, int(first.head["layer"]), h["base"], h["tuned"], settings)
