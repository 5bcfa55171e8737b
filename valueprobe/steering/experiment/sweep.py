"""A steering sweep with its controls: prompts × strengths × samples × directions, resumable.

    valueprobe steer --probe probes/smollm2-135m-value --model smollm2-135m \\
        --prompts data/steer_confidence.jsonl --alphas -2,-1,0,1,2 --samples 2 --random-directions 8 \\
        --other-probe probes/smollm2-135m-reward-history --out runs/steer-confidence

Directions, all at the same strengths: ``axis`` (the probe's direction at its layer), ``other:NAME``
(the other shipped axis's direction at the same layer) and ``random-K`` (row K of
`valueprobe.stats.null.random_directions` with the sweep's seed, the null every command shares). Every direction uses the probe's σ or mean norm to size one unit of α, so the
vector added has the same length in every direction and only its orientation differs; a random
direction's slopes form the null a value effect must leave.

The folder holds ``settings.json`` (the sweep's definition; a rerun with other settings is refused),
``generations.jsonl`` (one row per (prompt, α, direction, sample), appended chunk by chunk, so an
interrupted sweep resumes where it stopped), and, when every row is done, ``metrics.json``,
``metrics.csv`` and ``dose.html``.

Prompts ending in a yes/no question also get ``p_yes``: P(yes) / (P(yes) + P(no)) at the first
answer token under the same steering, read from one forward pass (no sampling).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable, sha256_file, write_json
from valueprobe.model.load import LoadedModel, cache_dir
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.steering.decode.generation import Generation, generate
from valueprobe.steering.experiment.behaviour import text_metrics
from valueprobe.steering.experiment.dose import (
    AXIS,
    OTHER_PREFIX,
    RANDOM_PREFIX,
    SteerSweep,
    SweepRow,
    summarize_rows,
)
from valueprobe.steering.experiment.prompting import NONE, PromptCondition, read_conditions
from valueprobe.steering.experiment.settings import DEFAULT_METRICS, SweepSettings
from valueprobe.steering.experiment.yes_no import p_yes
from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["SweepSettings", "check_settings", "run_sweep", "start_sweep", "sweep_blocks", "sweep_rows"]

SETTINGS = "settings.json"
GENERATIONS = "generations.jsonl"
PART = "part.json"  # in the folder of one shard of a sharded sweep (`valueprobe.steering.experiment.sweep_parts`)
# Metrics tabled for each steering prompt set (data/steer_*.jsonl); other files get DEFAULT_METRICS.
SET_METRICS: dict[str, tuple[str, ...]] = {
    "steer_confidence": ("yes", "p_yes"),
    "steer_backtracking": ("backtrack", "length"),
    "steer_code": ("code_lines", "code_comments", "code_hints"),
    "steer_refusal": ("refusal",),
    "steer_open": ("length", "degenerate"),
}
# Sets whose groups are conditions to compare (the question and its inverted control; harmful and
# benign requests): their effects are reported per group. Other files pool their groups.
BY_GROUP = ("steer_confidence", "steer_refusal")


def _model_shape(model: str) -> tuple[int, int] | None:
    """(d_model, n_layers) from a model's config.json without loading weights; None if not local."""
    for folder in (Path(model).expanduser(), cache_dir() / "models" / model):
        cfg = folder / "config.json"
        if cfg.is_file():
            try:
                info = json.loads(cfg.read_text(encoding="utf-8"))
                info = info.get("text_config", info)
                return int(info["hidden_size"]), int(info["num_hidden_layers"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None


def check_settings(
    settings: SweepSettings, out: Path, examples: Sequence[Example], *, part: bool = False
) -> None:
    """Every check that needs no model: run it before loading one (``part``: ``out`` is to hold one
    shard's part, `valueprobe.steering.experiment.sweep_parts`). Raises `ValueprobeError`."""
    if settings.max_new_tokens < 1:
        raise ValueprobeError(f"--max-new-tokens {settings.max_new_tokens} must be at least 1")
    if settings.samples < 1 or settings.controls < 0 or settings.chunk_prompts < 1:
        raise ValueprobeError("--samples and --chunk-prompts must be >= 1 and --random-directions >= 0")
    axis = settings.spec.check().first_axis()
    sweep_conditions(settings)
    shape = _model_shape(settings.model)
    if shape is not None and (shape[0] != axis.d_model or max(axis.layers) >= shape[1]):
        raise ValueprobeError(
            f"the probe is from {axis.model_id} (d_model {axis.d_model}, layers up to {max(axis.layers)}) but"
            f" {settings.model} has d_model {shape[0]} and {shape[1]} layers: use a probe fitted on this model"
        )
    if not examples:
        raise ValueprobeError(f"--prompts {settings.prompts} holds no prompts")
    for ex in examples:
        if ex.messages is not None and ex.messages[-1].get("role") == "assistant":
            raise ValueprobeError(
                f"--prompts {settings.prompts}: row {ex.id!r} ends on an assistant message; steering prompts end"
                " on the user's turn (see data/steer_*.jsonl)"
            )
    _check_out(settings, out, part=part)


def _check_out(settings: SweepSettings, out: Path, *, part: bool) -> None:
    """``out`` is new, empty, or this very sweep (to resume)."""
    recorded = out / SETTINGS
    if out.exists() and not out.is_dir():
        raise ValueprobeError(f"--out {out} is a file: give a folder")
    if not part and (out / PART).is_file():
        raise ValueprobeError(
            f"--out {out} holds one part of a sharded sweep ({PART}): resume it with its --shard I/N,"
            " or `valueprobe merge` the parts into a new folder"
        )
    if recorded.is_file():
        try:
            before = json.loads(recorded.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        if before != json.loads(json.dumps(settings.to_dict())):
            raise ValueprobeError(
                f"--out {out} holds a different sweep (see {recorded}): use a new folder, or the same settings to resume"
            )
    elif out.is_dir() and any(out.iterdir()):
        raise ValueprobeError(f"--out {out} is not empty and holds no {SETTINGS}: give a new or empty folder")


def sweep_conditions(settings: SweepSettings) -> tuple[PromptCondition | None, ...]:
    """The sweep's prompt conditions in run order: None (the plain prompt), then each named one, as
    its conditions file states them (checked against the sha256 the sweep recorded)."""
    if not settings.conditions:
        return (None,)
    path = Path(settings.conditions_file or "")
    if settings.conditions_file is None:
        raise ValueprobeError("--conditions needs the conditions file that states them (--conditions-file)")
    conds = read_conditions(path, Path(settings.prompts).stem, settings.conditions)
    if settings.conditions_sha256 is not None and sha256_file(path) != settings.conditions_sha256:
        raise ValueprobeError(
            f"the conditions file {path} has changed since this sweep began (sha256 differs): restore it,"
            " or start a new sweep in a new --out folder"
        )
    return (None, *conds)


def _asks_yes_no(examples: Sequence[Example]) -> bool:
    def last(ex: Example) -> str:
        return ex.messages[-1]["content"] if ex.messages else (ex.text or "")

    return all("yes or no" in last(ex).lower() for ex in examples)


def metrics_for(prompts_path: str | Path, examples: Sequence[Example]) -> tuple[str, ...]:
    """The metrics tabled for a prompts file: by its steering set, else length and degeneracy."""
    base = SET_METRICS.get(Path(prompts_path).stem, DEFAULT_METRICS)
    if _asks_yes_no(examples) and "p_yes" not in base:
        base = ("yes", "p_yes", *base)
    return base


def read_rows(path: Path) -> list[SweepRow]:
    """Finished rows; a last line cut by an interruption is dropped (and cut from the file)."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    return [SweepRow.from_dict(json.loads(line)) for line in data[:end].decode("utf-8").splitlines() if line]


def _append(path: Path, rows: Sequence[SweepRow]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r.to_dict(), ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _prompt(ex: Example) -> Sequence[dict[str, str]] | str:
    return list(ex.messages) if ex.messages is not None else (ex.text or "")


def run_sweep(
    lm: LoadedModel,
    examples: Sequence[Example],
    out: str | Path,
    settings: SweepSettings,
    *,
    other: ValueAxis | None = None,
    batch_size: int = 32,
    n_boot: int = 1000,
    force: bool = False,
    progress: bool = True,
    generator: Callable[..., list[Generation]] = generate,
) -> SteerSweep:
    """Run (or resume) the sweep into ``out`` and summarize_rows it; see the module doc for the files.

    Args:
        lm: the model (checked against the spec's axis).
        examples: the prompts, in file order (``settings.prompts`` is their path).
        settings: the sweep's definition, its spec included (check it with `check_settings`
            before loading the model).
        other: the other axis, steered as a control along its direction at the first steered layer.
        batch_size: rows per ``generate`` call; n_boot: bootstrap resamples of each slope.
        force: steer a model of another architecture than the probe's (width and layers still checked).
        generator: what generates each block's rows, called as `generate` is (the HF route by
            default; `valueprobe.vllm.generate.VllmGenerator` for ``--engine vllm``).
    """
    out = Path(out)
    check_settings(settings, out, examples)
    start_sweep(lm, out, settings, force=force)
    blocks = sweep_blocks(len(examples), settings.chunk_prompts)
    directions = sweep_directions(settings, other, lm.n_layers)
    sweep_rows(
        lm,
        examples,
        out,
        settings,
        directions,
        blocks,
        batch_size=batch_size,
        progress=progress,
        generator=generator,
    )
    return summarize_sweep(out, settings, examples, n_boot=n_boot)


def start_sweep(lm: LoadedModel, out: Path, settings: SweepSettings, *, force: bool) -> None:
    """Check the model against the axis and write ``settings.json`` (the sweep's identity) once."""
    settings.spec.first_axis().check(lm, force=force)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / SETTINGS).is_file():
        write_json(out / SETTINGS, settings.to_dict())


def sweep_blocks(n_prompts: int, size: int, prompts: range | None = None) -> list[tuple[int, list[int]]]:
    """The sweep's resumable blocks as (block index, prompt indices): ``size`` prompts each, the
    blocks that lie in ``prompts`` (a shard's run of whole blocks; None: all).

    >>> sweep_blocks(5, 2)
    [(0, [0, 1]), (1, [2, 3]), (2, [4])]
    """
    keep = range(n_prompts) if prompts is None else prompts
    return [
        (i // size, list(range(i, min(i + size, n_prompts)))) for i in range(0, n_prompts, size) if i in keep
    ]


def sweep_rows(
    lm: LoadedModel,
    examples: Sequence[Example],
    out: Path,
    settings: SweepSettings,
    directions: Sequence[tuple[str, torch.Tensor | None]],
    blocks: Sequence[tuple[int, list[int]]],
    *,
    batch_size: int,
    progress: bool,
    generator: Callable[..., list[Generation]] = generate,
) -> None:
    """Generate every row of ``blocks`` along each of ``directions`` not yet in ``generations.jsonl``,
    appending chunk by chunk (prompt condition, then direction, then block: the file's order), with
    ``generator``."""
    path = out / GENERATIONS
    done = {r.key() for r in read_rows(path)}
    chunks = [(c, d, b, block) for c in sweep_conditions(settings) for d in directions for b, block in blocks]
    for c, (name, v), b, block in tqdm(chunks, desc="steer sweep", unit="chunk", disable=not progress):
        keys = [
            (examples[p].id, float(a), name, s, NONE if c is None else c.name)
            for p in block
            for s in range(settings.samples)
            for a in settings.alphas
        ]
        if all(k in done for k in keys):
            continue
        spec = replace(settings.spec, direction=v, direction_name=name)
        got = _run_block(lm, [examples[p] for p in block], b, spec, c, settings, batch_size, generator)
        rows = [r for r in got if r.key() not in done]
        _append(path, rows)
        done.update(r.key() for r in rows)


def sweep_directions(
    settings: SweepSettings, other: ValueAxis | None, n_layers: int
) -> list[tuple[str, torch.Tensor | None]]:
    """The steered directions by name: the axis (None: its own), the other axis (its direction at
    the first steered layer), the random controls."""
    axis = settings.spec.first_axis()
    directions: list[tuple[str, torch.Tensor | None]] = [(AXIS, None)]
    if other is not None:
        layer = settings.spec.steered_layers(n_layers)[0]
        directions.append(
            (f"{OTHER_PREFIX}{Path(settings.other_probe or 'other').name}", other.direction(layer))
        )
    # the one random-direction scheme (stats.null), as float32 rows like the axis's directions
    rand = torch.from_numpy(random_directions(axis.d_model, settings.controls, seed=settings.seed)).float()
    return directions + [(f"{RANDOM_PREFIX}{k}", rand[k]) for k in range(settings.controls)]


def _run_block(
    lm: LoadedModel,
    block: Sequence[Example],
    b: int,
    spec: SteeringSpec,
    condition: PromptCondition | None,
    settings: SweepSettings,
    batch_size: int,
    generator: Callable[..., list[Generation]] = generate,
) -> list[SweepRow]:
    """Every row of one block of prompts (the ``b``-th) along one direction (``spec``), under one
    prompt condition (None: the plain prompt), with its metrics.

    The block's seed depends only on (seed, b), so every direction and condition draws the same samples.
    """
    prompts = [_prompt(ex) if condition is None else condition.apply(_prompt(ex)) for ex in block]
    block_seed = int(np.random.SeedSequence([settings.seed, b]).generate_state(1)[0] >> 1)
    decoding = settings.decoding(block_seed)
    # a dataset's text is the prompt as is (messages are the chat form): chat=False
    gens = generator(
        lm,
        spec,
        prompts,
        alphas=settings.alphas,
        decoding=decoding,
        batch_size=batch_size,
        progress=False,
        chat=False,
    )
    pyes: dict[tuple[int, float], float] = {}
    if "p_yes" in settings.metrics:
        pairs = [(p, float(a)) for p in range(len(block)) for a in settings.alphas]
        got = p_yes(lm, spec, [prompts[p] for p, _ in pairs], [a for _, a in pairs], batch_size=batch_size)
        pyes = dict(zip(pairs, got.tolist(), strict=True))
    label = NONE if condition is None else condition.name
    return [_sweep_row(block[g.prompt], g, spec.name(), pyes, label) for g in gens]


def _sweep_row(
    ex: Example, g: Generation, name: str, pyes: dict[tuple[int, float], float], condition: str
) -> SweepRow:
    metrics = text_metrics(g.text)
    if pyes:
        metrics["p_yes"] = pyes[(g.prompt, g.alpha)]
    return SweepRow(
        prompt_id=ex.id,
        group=ex.group,
        alpha=g.alpha,
        direction=name,
        sample=g.sample,
        seed=g.seed,
        text=g.text,
        metrics=metrics,
        condition=condition,
    )


def summarize_sweep(
    out: Path, settings: SweepSettings, examples: Sequence[Example], *, n_boot: int
) -> SteerSweep:
    """The dose-response summary of every finished row, written to ``metrics.json`` and ``metrics.csv``."""
    yes_no = "p_yes" in settings.metrics
    by_group = Path(settings.prompts).stem in BY_GROUP or (yes_no and len({ex.group for ex in examples}) > 1)
    rows = read_rows(out / GENERATIONS)
    how = partial(
        summarize_rows,
        rows,
        unit=settings.spec.unit.value,
        metrics=settings.metrics,
        by_group=by_group,
        n_boot=n_boot,
    )
    result = how(seed=settings.seed, settings=settings)
    prompted = {c: how(seed=settings.seed, condition=c).effects for c in settings.conditions}
    result = replace(result, prompted=prompted, n_rows=len(rows))
    write_json(out / "metrics.json", jsonable(result.to_dict()), allow_nan=False)
    atomic_write_text(out / "metrics.csv", result.csv())
    return result
