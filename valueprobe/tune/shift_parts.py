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
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from valueprobe.activations.manifest import DatasetInfo
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, check_output_dir, mmap_safetensors, sha256_file
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.sharded import Part, PartKind, declare, read_head, reading, reread, write_head
from valueprobe.tune.shift import (
    Models,
    ShiftResult,
    ShiftSettings,
    check_groups,
    group_by,
    read_both,
    shift_of_reads,
)
from valueprobe.vocab import Positions, ShardSpec

__all__ = ["MARKER", "SHIFT_PARTS", "shift_part"]

MARKER = "shift-part.json"
READS = "reads.safetensors"


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
    write its part into ``out``; `valueprobe.sharded.merge` joins the N parts."""
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
    write_head(out, SHIFT_PARTS, shard, head)
    return out


def _read(path: Path) -> Part[dict]:
    head, shard = read_head(path, SHIFT_PARTS)
    with reading(path, SHIFT_PARTS):
        if not (path / READS).is_file():
            raise ValueError(f"no {READS}")
        d, models = head["dataset"], head["models"]
        model = f"{models['base_fingerprint']} → {models['tuned_fingerprint']}"
        dataset = (d["path"], d["sha256"], d["n_examples"])
    return Part(
        path, shard, head, model=model, dataset=dataset, settings=head["settings"],
        other=(("models", models), ("probe", head["probe_sha256"]), ("dataset path", d["path"]),
               ("headline layer", head["layer"])),
    )  # fmt: skip


def _check_out(out: Path) -> None:
    check_output_dir(out, holds="shift")
    if out.exists():  # `ShiftResult.write` writes a new folder only (no --overwrite on merge)
        raise ValueprobeError(f"merge OUT {out} already exists: write the merged shift to a new folder")


def _join(out: Path, parts: Sequence[Part[dict]]) -> ShiftResult:
    """The shift one process computes, written to ``out`` (its page is drawn beside it)."""
    first = parts[0]
    d = first.body["dataset"]
    examples = group_by(reread(first.path, d["path"], d["sha256"], SHIFT_PARTS), first.body["settings"]["by"])
    reads: dict[str, list[np.ndarray]] = {}
    ids: list[str] = []
    for p in parts:
        arrays, meta = mmap_safetensors(p.path / READS)
        ids += json.loads(meta["ids"])
        for name, a in arrays.items():
            reads.setdefault(name, []).append(np.array(a))
    if ids != [ex.id for ex in examples]:
        raise ValueprobeError(f"the parts' examples are not those of {d['path']}: run every part again")
    h = {
        kind: {int(k.split(".")[1]): np.concatenate(v) for k, v in reads.items() if k.startswith(kind + ".")}
        for kind in ("base", "tuned")
    }
    s = first.body["settings"]
    settings = ShiftSettings(
        tokens=s["tokens"], targeted=tuple(s["targeted"]), contrast=s["contrast"], n_random=s["n_random"],
        refit=s["refit"], n_boot=s["n_boot"], seed=s["seed"],
    )  # fmt: skip
    axis, models = ValueAxis.load(first.path / "probe"), Models(**first.body["models"])
    res = shift_of_reads(axis, models, examples, int(first.body["layer"]), h["base"], h["tuned"], settings)
    res.write(out)
    return res


SHIFT_PARTS = declare(
    PartKind(
        command="shift",
        marker=MARKER,
        read=_read,
        join=_join,
        did="ran",
        source="read",
        result="shift",
        check_out=_check_out,
        head=MARKER,
    )
)
