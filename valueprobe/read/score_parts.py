"""A sharded ``score``: each job reads its shard's examples; ``merge`` joins the rows and computes the groups.

    valueprobe score --probe probes/value --data data/code.jsonl --shard 0/2 --out runs/score.part0
    valueprobe score --probe probes/value --data data/code.jsonl --shard 1/2 --out runs/score.part1
    valueprobe merge runs/score runs/score.part0 runs/score.part1

A part folder holds ``scores.csv`` (its examples' rows, in dataset order), ``part.json`` (shard,
model fingerprint, dataset sha256 and size, settings, probe) and, with ``--null``,
``null.safetensors`` (each example's mean projection on the random directions). The per-group
metrics need every example, so a part has no ``summary.json``: merge concatenates the rows in
shard order (floats travel as the shortest text that reads back exact), reads the dataset again
(checked by sha256, for the ``meta.pair`` links), and computes the summary one process computes.
Shard I takes contiguous blocks of ``batch_size`` examples (:meth:`ShardSpec.examples`), so each
part runs the batches of the one-process run.
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
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_dir, check_output_dir, mmap_safetensors
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import ScoreSettings, axis_record, read_scored, summarize_scores
from valueprobe.read.scores import ScoreResult, read_scores_csv, write_scores_csv
from valueprobe.sharded import Part, PartKind, declare, read_head, reading, reread, write_head
from valueprobe.vocab import ShardSpec, Tokens

__all__ = ["SCORE_PARTS", "ScorePart", "score_part"]

NULL = "null.safetensors"


@dataclass(frozen=True)
class ScorePart:
    """One shard's rows of a score, and what must match across the shards to merge them."""

    shard: ShardSpec
    dataset: DatasetInfo
    fingerprint: str  # the scored model's
    settings: dict  # layer, tokens, batch_size, bootstrap, seed, null, max_length, chat_template
    probe: dict
    records: tuple[dict, ...]
    random: dict[str, np.ndarray] | None  # example id -> mean projection on each null direction [k]

    def write(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_scores_csv(out / "scores.csv", self.records)
        if self.random is not None:
            ids = list(self.random)
            k = int(self.settings["null"])
            means = torch.from_numpy(np.stack([self.random[i] for i in ids]) if ids else np.zeros((0, k)))
            meta = {"ids": json.dumps(ids)}
            atomic_write(
                out / NULL, lambda tmp: save_file({"mean_projection": means}, str(tmp), metadata=meta)
            )
        head = {"dataset": asdict(self.dataset), "fingerprint": self.fingerprint, "settings": self.settings}
        write_head(out, SCORE_PARTS, self.shard, {**head, "probe": self.probe})
        return out


def score_part(
    axis: ValueAxis,
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    shard: ShardSpec,
    dataset: DatasetInfo,
    settings: ScoreSettings,
    progress: bool = True,
) -> ScorePart:
    """Score shard ``shard`` of ``examples`` as `valueprobe.read.readout.score_dataset` reads them;
    `valueprobe.sharded.merge` joins the N parts (and computes the groups)."""
    todo = shard.examples(len(examples), block=settings.batch_size)
    mine = examples[todo.start : todo.stop]
    layer, tokens, records, random = read_scored(axis, lm, mine, settings, progress=progress)
    recorded = {**asdict(settings), "layer": layer, "tokens": str(tokens)}
    recorded["chat_template"] = str(settings.chat_template)
    del recorded["force"]  # how a probe was allowed to load does not change the rows
    return ScorePart(
        shard, dataset, lm.fingerprint, recorded, axis_record(axis, layer), tuple(records), random
    )


def _read(path: Path) -> Part[ScorePart]:
    head, shard = read_head(path, SCORE_PARTS)
    with reading(path, SCORE_PARTS):
        dataset = DatasetInfo(**head["dataset"])
        random = None
        if head["settings"]["null"]:
            arrays, meta = mmap_safetensors(path / NULL)
            random = dict(zip(json.loads(meta["ids"]), np.array(arrays["mean_projection"]), strict=True))
    records = tuple(read_scores_csv(path / "scores.csv"))
    p = ScorePart(shard, dataset, head["fingerprint"], head["settings"], head["probe"], records, random)
    d = (dataset.path, dataset.sha256, dataset.n_examples)
    return Part(
        path, shard, p, model=p.fingerprint, dataset=d, settings=p.settings, other=(("probe", p.probe),)
    )


def _check_out(out: Path) -> None:
    check_output_dir(out, holds="scores")
    if (out / "part.json").exists():
        raise ValueprobeError(f"merge OUT {out} is a part: write the merged scores to a new folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "scores.csv").exists():
        raise ValueprobeError(f"merge OUT {out} exists and holds other files: choose an empty or new folder")


def _join(out: Path, parts: Sequence[Part[ScorePart]]) -> ScoreResult:
    """The rows in shard order, and the summary one process computes from them."""
    first = parts[0].body
    examples = reread(parts[0].path, first.dataset.path, first.dataset.sha256, SCORE_PARTS)
    records = [r for p in parts for r in p.body.records]
    if [r["id"] for r in records] != [e.id for e in examples]:
        raise ValueprobeError(
            f"the parts' rows are not the examples of {first.dataset.path}: score every part again"
        )
    random = None if first.random is None else {k: v for p in parts for k, v in (p.body.random or {}).items()}
    s = first.settings
    res = summarize_scores(
        first.probe,
        records,
        examples,
        layer=s["layer"],
        tokens=Tokens(s["tokens"]),
        bootstrap=s["bootstrap"],
        seed=s["seed"],
        random=random,
    )
    atomic_write_dir(out, res.write)
    return res


SCORE_PARTS = declare(
    PartKind(
        command="score",
        marker="scores.csv",
        read=_read,
        join=_join,
        did="was scored",
        source="was scored on",
        result="scores",
        check_out=_check_out,
        head="part.json",
    )
)
