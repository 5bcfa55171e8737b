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
from valueprobe.datasets.io import Example, read_jsonl, sha256_file
from valueprobe.errors import ValueprobeError
from valueprobe.files import (
    atomic_write,
    atomic_write_dir,
    check_output_dir,
    mmap_safetensors,
    write_json,
)
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import ScoreSettings, axis_record, read_records, summarize_scores
from valueprobe.read.scores import ScoreResult, read_scores_csv, write_scores_csv
from valueprobe.vocab import ShardSpec, Tokens, check_split, choice

__all__ = ["ScorePart", "merge_scores", "score_part"]

FORMAT = "valueprobe.score.part"
PART = "part.json"
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
        head = {
            "format": FORMAT,
            "version": 1,
            "shard": {"index": self.shard.index, "count": self.shard.count},
            "dataset": asdict(self.dataset),
            "fingerprint": self.fingerprint,
            "settings": self.settings,
            "probe": self.probe,
        }
        write_json(out / PART, head, indent=1, allow_nan=False)
        return out

    @classmethod
    def read(cls, path: str | Path) -> ScorePart:
        """A part folder again; one error line naming it if it is not one."""
        path = Path(path)
        try:
            head = json.loads((path / PART).read_text(encoding="utf-8"))
            if head.get("format") != FORMAT:
                raise ValueError(f"format {head.get('format')!r}")
            shard = ShardSpec.parse(f"{int(head['shard']['index'])}/{int(head['shard']['count'])}")
            dataset = DatasetInfo(**head["dataset"])
            random = None
            if head["settings"]["null"]:
                arrays, meta = mmap_safetensors(path / NULL)
                means = np.array(arrays["mean_projection"])
                random = dict(zip(json.loads(meta["ids"]), means, strict=True))
        except (OSError, ValueError, KeyError, TypeError, ValueprobeError) as exc:
            raise ValueprobeError(
                f"part {path} is not a readable score part ({PART}: {exc}); rerun its `valueprobe score --shard`"
            ) from None
        records = tuple(read_scores_csv(path / "scores.csv"))
        return cls(shard, dataset, head["fingerprint"], head["settings"], head["probe"], records, random)


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
    """Score shard ``shard`` of ``examples``; :func:`merge_scores` joins the N parts (and computes
    the groups, with ``settings.bootstrap``)."""
    s = settings
    tokens = choice(Tokens, s.tokens, what="tokens")
    layer = axis.best_layer if s.layer is None else s.layer
    todo = shard.examples(len(examples), block=s.batch_size)
    records, random = read_records(
        axis,
        lm,
        examples[todo.start : todo.stop],
        layer=layer,
        tokens=tokens,
        batch_size=s.batch_size,
        null=s.null,
        seed=s.seed,
        force=s.force,
        max_length=s.max_length,
        chat_template=s.chat_template,
        progress=progress,
    )
    recorded = {**asdict(s), "layer": layer, "tokens": str(tokens), "chat_template": str(s.chat_template)}
    del recorded["force"]  # how a probe was allowed to load does not change the rows
    return ScorePart(
        shard, dataset, lm.fingerprint, recorded, axis_record(axis, layer), tuple(records), random
    )


def _check_together(paths: Sequence[Path], parts: Sequence[ScorePart]) -> None:
    """Every part scored the first part's dataset, with its model, probe and settings."""
    first, ref = parts[0], paths[0]
    for path, p in zip(paths, parts, strict=True):
        for what, have, want in (
            ("model (fingerprint)", p.fingerprint, first.fingerprint),
            ("probe", p.probe, first.probe),
            (
                "dataset (sha256, examples)",
                (p.dataset.sha256, p.dataset.n_examples),
                (first.dataset.sha256, first.dataset.n_examples),
            ),
        ):
            if have != want:
                raise ValueprobeError(
                    f"part {path} was scored with another {what} than {ref}: score every part alike"
                )
        if (
            differ := next((k for k in first.settings if p.settings.get(k) != first.settings[k]), None)
        ) is not None:
            raise ValueprobeError(
                f"part {path} was scored with {differ}={p.settings.get(differ)!r}, not"
                f" {first.settings[differ]!r} as {ref}: score every part alike"
            )
    check_split([(path, p.shard) for path, p in zip(paths, parts, strict=True)])


def _dataset(part: ScorePart, where: Path) -> list[Example]:
    """The scored dataset again (the groups' ``meta.pair`` links), checked against its sha256."""
    path = part.dataset.path
    if path is None or not Path(path).is_file() or sha256_file(path) != part.dataset.sha256:
        raise ValueprobeError(
            f"part {where} was scored on {path} (sha256 {str(part.dataset.sha256)[:12]}), which is not"
            " there or has changed: merge where that file is, from the folder the score ran in"
        )
    return read_jsonl(path)


def merge_scores(out: str | Path, parts: Sequence[str | Path]) -> ScoreResult:
    """Join the N parts of a sharded score into the ``scores.csv`` and ``summary.json`` of one run.

    Raises:
        ValueprobeError: parts that do not belong together, or the dataset gone or changed.
    """
    out, paths = check_output_dir(out, holds="scores"), [Path(p) for p in parts]
    if any(out.resolve() == p.resolve() for p in paths) or (out / PART).exists():
        raise ValueprobeError(f"merge OUT {out} is a part: write the merged scores to a new folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "scores.csv").exists():
        raise ValueprobeError(f"merge OUT {out} exists and holds other files: choose an empty or new folder")
    loaded = [ScorePart.read(p) for p in paths]
    _check_together(paths, loaded)
    order = sorted(range(len(loaded)), key=lambda i: loaded[i].shard.index)
    first = loaded[order[0]]
    examples = _dataset(first, paths[order[0]])
    records = [r for i in order for r in loaded[i].records]
    if [r["id"] for r in records] != [e.id for e in examples]:
        raise ValueprobeError(
            f"the parts' rows are not the examples of {first.dataset.path}: score every part again"
        )
    random = (
        None if first.random is None else {k: v for i in order for k, v in (loaded[i].random or {}).items()}
    )
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
