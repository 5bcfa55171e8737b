"""A sharded steering sweep: each job steers its shard's prompts; ``merge`` joins the rows and summarises.

    valueprobe steer --probe probes/value --prompts data/steer_code.jsonl --shard 0/2 --out runs/steer.part0
    valueprobe steer --probe probes/value --prompts data/steer_code.jsonl --shard 1/2 --out runs/steer.part1
    valueprobe merge runs/steer runs/steer.part0 runs/steer.part1

A part folder is a sweep folder (``settings.json``, ``generations.jsonl``, resumable the same
way) plus ``part.json`` (shard, the steered model's fingerprint, the steered directions in order,
the bootstrap size for the summary). Shard I takes a contiguous run of whole blocks of
``chunk_prompts`` prompts (:meth:`ShardSpec.examples`), keeping each block's global index, and a
block's sampling seed depends only on (seed, block index) and each row's on (block seed, prompt,
sample) (`valueprobe.steering.decode.sampling.row_seed`): a row draws the same random numbers, so gives
the same tokens, whichever shard and batch run it. The merge puts the rows in the order one
process writes them (prompt condition, direction, then prompt, sample and α) and writes the summary one process
writes; a part has no summary, since the dose slopes need every prompt. The merged folder is the one
process's whole: ``settings.json``, ``generations.jsonl`` (the same rows in the same order) and
the summary (``metrics.json``, ``metrics.csv``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir, write_json
from valueprobe.model.fingerprint import Fingerprint
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.sharded import (
    Part,
    PartKind,
    declare,
    new_folder,
    partial,
    read_head,
    reading,
    reread,
    write_head,
)
from valueprobe.steering.experiment.dose import SteerSweep, SweepRow
from valueprobe.steering.experiment.prompting import NONE
from valueprobe.steering.experiment.sweep import (
    GENERATIONS,
    PART,
    SETTINGS,
    SweepSettings,
    check_settings,
    read_rows,
    start_sweep,
    summarize_sweep,
    sweep_blocks,
    sweep_directions,
    sweep_rows,
)
from valueprobe.vocab import ShardSpec

__all__ = ["SWEEP_PARTS", "SweepPart", "check_part_out", "run_sweep_part"]


@dataclass(frozen=True)
class SweepPart:
    """What ``part.json`` records: which shard, from which model, along which directions."""

    shard: ShardSpec
    fingerprint: str  # the steered model's
    directions: tuple[str, ...]  # in the order the sweep steers them
    bootstrap: int  # the summary's resamples, used by the merge

    def write(self, folder: Path) -> None:
        body = {
            "fingerprint": self.fingerprint,
            "directions": list(self.directions),
            "bootstrap": self.bootstrap,
        }
        write_head(folder, SWEEP_PARTS, self.shard, body)

    @classmethod
    def read(cls, path: Path) -> SweepPart:
        """``path/part.json`` again; one error line naming the part if it is not one."""
        head, shard = read_head(path, SWEEP_PARTS)
        with reading(path, SWEEP_PARTS):
            Fingerprint.parse(str(head["fingerprint"]))
            return cls(
                shard, str(head["fingerprint"]), tuple(map(str, head["directions"])), int(head["bootstrap"])
            )


def check_part_out(out: Path, shard: ShardSpec) -> None:
    """``out`` is new, empty, or this shard's part of a sweep (to resume): checked before a model loads."""
    if (out / PART).is_file():
        have = SweepPart.read(out).shard
        if have != shard:
            raise ValueprobeError(
                f"--out {out} holds shard {have} of a sharded sweep, not {shard}: give each shard its own folder"
            )
    elif (out / SETTINGS).is_file():
        raise ValueprobeError(f"--out {out} holds a whole (unsharded) sweep: give shard {shard} a new folder")


def run_sweep_part(
    lm: LoadedModel,
    examples: Sequence[Example],
    out: str | Path,
    settings: SweepSettings,
    *,
    shard: ShardSpec,
    other: ValueAxis | None = None,
    batch_size: int = 32,
    n_boot: int = 1000,
    force: bool = False,
    progress: bool = True,
) -> int:
    """Run (or resume) shard ``shard`` of the sweep into ``out``; the rows it holds when done.

    Arguments as `valueprobe.steering.experiment.sweep.run_sweep`; `valueprobe.sharded.merge` joins the N parts.
    """
    out = Path(out)
    check_settings(settings, out, examples, part=True)
    check_part_out(out, shard)
    if (out / PART).is_file() and (had := SweepPart.read(out).fingerprint) != lm.fingerprint:
        raise ValueprobeError(
            f"--out {out} holds rows steered on another model (fingerprint {had}, not {lm.fingerprint}):"
            " give this model a new folder"
        )
    start_sweep(lm, out, settings, force=force)
    directions = sweep_directions(settings, other, lm.n_layers)
    names = tuple(name for name, _ in directions)
    SweepPart(shard, lm.fingerprint, names, n_boot).write(out)
    size = settings.chunk_prompts
    blocks = sweep_blocks(len(examples), size, shard.examples(len(examples), block=size))
    sweep_rows(lm, examples, out, settings, directions, blocks, batch_size=batch_size, progress=progress)
    return len(read_rows(out / GENERATIONS))


@dataclass(frozen=True)
class _Loaded:
    part: SweepPart
    settings: SweepSettings
    lines: tuple[tuple[SweepRow, str], ...]  # each row with its line as written (merged byte for byte)


def _read(path: Path) -> Part[_Loaded]:
    part = SweepPart.read(path)
    with reading(path, SWEEP_PARTS, f"{SETTINGS}, {GENERATIONS}"):
        settings = SweepSettings.from_dict(json.loads((path / SETTINGS).read_text(encoding="utf-8")))
        read_rows(path / GENERATIONS)  # drops a line cut by an interruption
        text = (path / GENERATIONS).read_text(encoding="utf-8") if (path / GENERATIONS).is_file() else ""
        lines = tuple((SweepRow.from_dict(json.loads(line)), line) for line in text.splitlines() if line)
    return Part(
        path, part.shard, _Loaded(part, settings, lines), model=part.fingerprint, settings=settings.to_dict(),
        other=(("directions", part.directions), ("--bootstrap", part.bootstrap)),
    )  # fmt: skip


def _prompts(first: Part[_Loaded]) -> list[Example]:
    """The sweep's prompts again (groups for the summary, ids for the order), checked by sha256."""
    s = first.body.settings
    examples = reread(first.path, s.prompts, s.prompts_sha256, SWEEP_PARTS)
    return examples[: s.limit] if s.limit else examples


def _in_order(loaded: Sequence[Part[_Loaded]], examples: Sequence[Example]) -> list[str]:
    """Every part's lines in one process's order, after checking each part holds exactly its rows."""
    s, names = loaded[0].body.settings, loaded[0].body.part.directions
    prompt = {ex.id: i for i, ex in enumerate(examples)}
    alpha = {float(a): i for i, a in enumerate(s.alphas)}
    direction = {name: i for i, name in enumerate(names)}
    condition = {c: i for i, c in enumerate((NONE, *s.conditions))}
    keyed: list[tuple[tuple[int, int, int, int, int], str]] = []
    for p in loaded:
        todo = p.shard.examples(len(examples), block=s.chunk_prompts)
        want = {
            (examples[i].id, float(a), d, k, c)
            for i in todo
            for a in s.alphas
            for d in names
            for k in range(s.samples)
            for c in condition
        }
        have = {row.key() for row, _ in p.body.lines}
        if have != want or len(p.body.lines) != len(want):
            other = "" if have <= want else ", and rows not its own"
            raise partial(p, SWEEP_PARTS, f"{len(have & want)} of its {len(want)} rows{other}")
        for r, line in p.body.lines:
            key = (
                condition[r.condition],
                direction[r.direction],
                prompt[r.prompt_id],
                r.sample,
                alpha[r.alpha],
            )
            keyed.append((key, line))
    return [line for _, line in sorted(keyed, key=lambda kl: kl[0])]


def _check_out(out: Path) -> None:
    if (out / PART).exists():
        raise ValueprobeError(f"merge OUT {out} is a part: write the merged sweep to a new folder")
    new_folder(out)


def _join(out: Path, parts: Sequence[Part[_Loaded]]) -> SteerSweep:
    first = parts[0].body
    examples = _prompts(parts[0])
    lines = _in_order(parts, examples)
    got: list[SteerSweep] = []

    def write(tmp: Path) -> None:
        write_json(tmp / SETTINGS, first.settings.to_dict())
        (tmp / GENERATIONS).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        got.append(summarize_sweep(tmp, first.settings, examples, n_boot=first.part.bootstrap))

    atomic_write_dir(out, write)
    return got[0]


SWEEP_PARTS = declare(
    PartKind(
        command="steer",
        marker=GENERATIONS,
        read=_read,
        join=_join,
        did="was steered",
        source="was steered on",
        result="sweep",
        check_out=_check_out,
        head=PART,
    )
)
