"""``valueprobe attribute``: run a method over a dataset into a resumable folder, summarize, ablate.

    valueprobe attribute --probe probes/smollm2-135m-reward-history --data data/icrl_pairs.jsonl \\
        --method patch --positions spans --span-labels post --out runs/attr-patch

    >>> res = run_attribution(lm, axis, examples, "runs/attr", AttributeSettings(method="direct"), source=src)

The folder (`valueprobe.attribute.folder`) holds the finished items; a rerun with the same options
resumes after the last chunk, a run with ``shard`` writes a part, and once every item is done the
summary (`valueprobe.attribute.work.summarize`) is written as ``attribution.json`` and
``components.csv``. With ``ablate_top`` the top components, ranked on the fit half of the groups,
are mean-ablated on the held-out half against random sets (`valueprobe.attribute.ablation`).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from valueprobe.activations.encode import encode
from valueprobe.activations.manifest import DatasetInfo
from valueprobe.attribute.ablation import ablate, held_out, mean_outputs, split_units
from valueprobe.attribute.components import Component, direct_terms, patchable
from valueprobe.attribute.direct import Projector
from valueprobe.attribute.folder import RunFile, open_run, read_chunk, write_chunk
from valueprobe.attribute.pairs import read_patch_pairs
from valueprobe.attribute.patching import PatchPlan
from valueprobe.attribute.readout import Readout, wants_behaviour
from valueprobe.attribute.records import Ablation, Attribution
from valueprobe.attribute.summary import row_classes
from valueprobe.attribute.work import DirectWork, PairWork, Work, summarize
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.model.parts import block_parts
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.vocab import ChatTemplate, LayerSelection, Positions, ShardSpec, Target, layer_out_of_range

__all__ = [
    "METHODS",
    "AttributeSettings",
    "Behaviour",
    "Method",
    "Provenance",
    "attribution",
    "limited",
    "run_attribution",
    "summarize_run",
    "write_result",
]

Method = Literal["direct", "patch", "attrib-patch"]
Behaviour = Literal["auto", "yes-no", "none"]
METHODS: tuple[Method, ...] = ("direct", "patch", "attrib-patch")
RESULT, CSV = "attribution.json", "components.csv"


@dataclass(frozen=True)
class AttributeSettings:
    """The options of one attribution run (what changes its numbers; ``limit`` keeps the first items)."""

    method: Method = "direct"
    layer: int | None = None
    positions: Positions = Positions.last
    span_labels: tuple[str, ...] | None = None
    target: Target = Target.auto
    behaviour: Behaviour = "auto"
    resid_layers: str = "all"
    n_random: int = 32
    seed: int = 0
    batch_size: int = 8
    bootstrap: int = 1000
    max_length: int | None = None
    chat_template: ChatTemplate = ChatTemplate.model
    limit: int | None = None

    def check(self) -> AttributeSettings:
        """Refuse bad options in one line, before a model loads."""
        if self.method not in METHODS:
            raise ValueprobeError(f"unknown --method {self.method!r}: use one of {', '.join(METHODS)}")
        for name, value, least in (
            ("--random", self.n_random, 1),
            ("--batch-size", self.batch_size, 1),
            ("--limit", self.limit, 1),
        ):
            if value is not None and value < least:
                raise ValueprobeError(f"{name} {value} is too small: it must be >= {least}")
        if self.resid_layers != "none":
            LayerSelection.parse(self.resid_layers)
        return self


@dataclass(frozen=True)
class Provenance:
    """Where the axis and data came from (recorded, and checked when a run resumes)."""

    probe: str
    probe_sha256: str
    data: tuple[DatasetInfo, ...]


def _layer(axis: ValueAxis, settings: AttributeSettings, lm: LoadedModel) -> int:
    n = lm.n_layers
    if settings.layer is not None and not -n <= settings.layer < n:
        raise layer_out_of_range(settings.layer, n)
    layer = axis.best_layer if settings.layer is None else settings.layer % n
    if layer not in axis.layers:
        raise ValueprobeError(
            f"--layer {settings.layer}: the axis has no direction there (it has {axis.layers[0]}..{axis.layers[-1]})"
        )
    return layer


def _read_text(s: AttributeSettings) -> str:
    spans = f" ({', '.join(s.span_labels)})" if s.span_labels else ""
    return f"{s.positions}{spans}"


def _resid_layers(s: AttributeSettings, layer: int) -> list[int]:
    return [] if s.resid_layers == "none" else LayerSelection.parse(s.resid_layers).resolve(layer + 1)


def _units(examples: Sequence[Example]) -> tuple[str, ...]:
    return tuple(str(ex.meta.get("pair") or ex.id) for ex in examples)


def limited(examples: Sequence[Example], s: AttributeSettings) -> list[Example]:
    """The examples a run covers: the first ``limit`` examples (direct) or pairs (patching)."""
    if s.limit is None:
        return list(examples)
    if s.method == "direct":
        return list(examples[: s.limit])
    names = list(dict.fromkeys(str(ex.meta.get("pair")) for ex in examples))[: s.limit]
    return [ex for ex in examples if str(ex.meta.get("pair")) in set(names)]


def prepare(
    lm: LoadedModel,
    axis: ValueAxis,
    examples: Sequence[Example],
    s: AttributeSettings,
    source: Provenance,
    *,
    progress: bool = False,
) -> tuple[Work, dict[str, Any], Readout]:
    """The run's work and its identity (settings, model, sources, what the summary needs)."""
    block_parts(lm)  # a family without a per-head split is refused here, naming those that have one
    layer = _layer(axis, s, lm)
    examples = limited(examples, s)
    read = Readout.of(lm, axis, layer=layer, behaviour=wants_behaviour(examples, s.behaviour))
    enc_kw: dict[str, Any] = dict(
        positions=s.positions,
        span_labels=s.span_labels,
        max_length=s.max_length,
        chat_template=s.chat_template,
    )
    components: Sequence[Component]
    work: Work
    if s.method == "direct":
        projector = Projector.build(
            lm, read.direction, layer=layer, random=random_directions(lm.d_model, s.n_random, seed=s.seed)
        )
        work = DirectWork(
            lm, projector, tuple(encode(lm, examples, **enc_kw)), _units(examples), s.batch_size
        )
        components, resid = direct_terms(lm, layer), []
    else:
        resid = _resid_layers(s, layer)
        plan = PatchPlan.of(lm, layer=layer, resid_layers=resid)
        # a patched row runs only the tokens after the shared prefix (a few dozen): 4 x the batch of whole examples
        pairs = tuple(read_patch_pairs(lm, examples, **enc_kw))
        work = PairWork(lm, read, pairs, plan, s.method == "patch", 4 * s.batch_size, progress)
        components = patchable(lm, layer)
    header = dict(
        method=s.method, model_id=lm.model_id, fingerprint=lm.fingerprint, probe=source.probe, layer=layer,
        sigma=read.sigma, data=[d.path for d in source.data], read=_read_text(s), n_random=s.n_random if s.method == "direct" else 0,
    )  # fmt: skip
    identity = {
        **json.loads(json.dumps(asdict(s), default=str)),
        "layer": layer,
        "behaviour": read.behaviour,
        "model_fingerprint": lm.fingerprint,
        "probe_sha256": source.probe_sha256,
        "data": [asdict(d) for d in source.data],
        "header": header,
        "components": [c.name for c in components],
        "resid_layers": resid,
    }
    return work, json.loads(json.dumps(identity)), read


def _announce(work: Work, s: AttributeSettings) -> str:
    if isinstance(work, PairWork):
        cells = sum(len(work.plan.resid_layers) * (p.n_tokens - p.first_diff) for p in work.pairs)
        per = len(work.plan.components)
        if s.method == "patch":
            runs = 2 * (len(work.pairs) * (per + 1) + cells)
            return f"exact patching: {len(work.pairs)} pairs x ({per} heads and MLPs + their residual cells) x 2 directions = {runs} patched runs"
        return f"attribution patching: {len(work.pairs)} pairs x 2 directions, one forward and backward each ({per} components, {cells} residual cells)"
    return f"direct attribution: {work.n_items} examples, one forward per batch of {s.batch_size}"


def run_items(out: Path, work: Work, run: RunFile, *, checkpoint_seconds: float, progress: bool) -> RunFile:
    """Compute the run's remaining items, a chunk every ``checkpoint_seconds`` (at item-block ends)."""
    with tqdm(
        total=run.hi - run.lo,
        initial=run.done - run.lo,
        desc=f"attribute -> {out.name}",
        unit="item",
        disable=not progress,
    ) as bar:
        start = run.done
        while start < run.hi:
            deadline, hi = time.monotonic() + checkpoint_seconds, start
            parts: list[tuple[dict[str, torch.Tensor], dict[str, Any]]] = []
            while hi < run.hi and (not parts or time.monotonic() < deadline):
                step = min(run.hi, (hi // work.block + 1) * work.block)
                parts.append(work.run(hi, step))
                bar.update(step - hi)
                hi = step
            tensors, meta = _join([t for t, _ in parts]), _join_meta([m for _, m in parts])
            run = write_chunk(out, run, start, hi, tensors, meta)
            start = hi
    return run


def _join(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One chunk's tensors from several blocks': rows' tensors concatenated, pairs' keys are unique."""
    keys = dict.fromkeys(k for t in parts for k in t)
    return {k: torch.cat([t[k] for t in parts if k in t]) for k in keys}


def _join_meta(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if "pairs" in metas[0]:
        return {"pairs": [p for m in metas for p in m["pairs"]]}
    keys = metas[0]["rows"].keys()
    return {"rows": {k: [x for m in metas for x in m["rows"][k]] for k in keys}}


def summarize_run(out: Path, run: RunFile, *, keep: Callable[[str], bool] = lambda _: True) -> Attribution:
    """The summary of a finished run folder (no model)."""
    return summarize(run.identity, [read_chunk(out / c.file) for c in run.chunks], keep=keep)


def write_result(out: Path, res: Attribution) -> None:
    """attribution.json and components.csv (attribution.html is the report's: `valueprobe.report.attribution`)."""
    write_json(out / RESULT, res.to_dict(), indent=1, allow_nan=False)
    atomic_write_text(out / CSV, res.csv())


# a direct run writes a chunk at least this often (seconds of work), so Ctrl-C loses at most that
CHECKPOINT_SECONDS = 60.0


def run_attribution(
    lm: LoadedModel,
    axis: ValueAxis,
    examples: Sequence[Example],
    out: str | Path,
    settings: AttributeSettings,
    *,
    source: Provenance,
    shard: ShardSpec | None = None,
    ablate_top: int | None = None,
    n_draws: int | None = None,
    steer_sigma: float = 2.0,
    progress: bool = True,
    announce: Callable[[str], object] = lambda line: None,
) -> Attribution | None:
    """Run (or resume) ``settings.method`` over ``examples`` into ``out``; the summary, or None for a part.

    Raises:
        ValueprobeError: a family without a per-head split, pairs that cannot be patched, ``ablate_top``
            beyond the components, or an ``out`` holding another run.
    """
    out = Path(out)
    work, identity, read = prepare(lm, axis, examples, settings.check(), source, progress=progress)
    n_components = len(patchable(lm, read.layer))
    if ablate_top is not None and not 1 <= ablate_top <= n_components:
        raise ValueprobeError(
            f"--ablate-top {ablate_top}: the read layer {read.layer} has {n_components} heads and MLPs to ablate; use 1..{n_components}"
        )
    todo = range(work.n_items) if shard is None else shard.examples(work.n_items, block=work.block)
    run = open_run(out, RunFile(identity, work.n_items, todo.start, todo.stop, shard))
    if not run.complete:
        announce(_announce(work, settings))
    # a pair takes minutes: each is its own chunk, so an interruption loses at most the pair under way
    every = CHECKPOINT_SECONDS if settings.method == "direct" else 0.0
    run = run_items(out, work, run, checkpoint_seconds=every, progress=progress)
    if shard is not None:
        return None
    res = summarize_run(out, run)
    if ablate_top is not None:
        draws = settings.n_random if n_draws is None else n_draws
        ablation = _saved_ablation(out, res, ablate_top, draws, steer_sigma) or _ablation(
            lm, read, examples, out, run, settings, ablate_top, draws, steer_sigma, progress
        )
        res = res.with_ablation(ablation)
    write_result(out, res)
    return res


def _saved_ablation(out: Path, res: Attribution, k: int, draws: int, steer_sigma: float) -> Ablation | None:
    """The ablation a finished run already saved with these sizes (a rerun does not redo an hour of it)."""
    try:
        saved = Attribution.from_dict(json.loads((out / RESULT).read_text(encoding="utf-8")))
    except (OSError, ValueError, ValueprobeError):
        return None
    ab = saved.ablation
    same = (
        replace(saved, ablation=None, agreement=None).to_dict()
        == replace(res, ablation=None, agreement=None).to_dict()
    )
    if ab is None or not same or (ab.k, ab.n_draws, ab.steer_sigma) != (k, draws, steer_sigma):
        return None
    return ab


def _ablation(
    lm: LoadedModel,
    read: Readout,
    examples: Sequence[Example],
    out: Path,
    run: RunFile,
    s: AttributeSettings,
    k: int,
    n_draws: int,
    steer_sigma: float,
    progress: bool,
):
    """Rank on the fit half, mean-ablate on the held-out half, against ``n_draws`` random sets."""
    examples = limited(examples, s)
    fit, held = split_units(examples, seed=s.seed)
    ranked = summarize_run(out, run, keep=lambda i: i in fit).top(k)
    kw: dict[str, Any] = dict(
        positions=s.positions,
        span_labels=s.span_labels,
        max_length=s.max_length,
        chat_template=s.chat_template,
    )
    means = mean_outputs(
        lm, encode(lm, [e for e in examples if e.id in fit], **kw), layer=read.layer, batch_size=s.batch_size
    )
    held_ex = [e for e in examples if e.id in held]
    target = Target.label if s.method != "direct" else s.target
    half = held_out(
        lm, encode(lm, held_ex, **kw), _units(held_ex), lambda rows, units: row_classes(rows, units, target)
    )
    with tqdm(total=n_draws + 2, desc="ablate", unit="set", disable=not progress) as bar:
        return ablate(
            lm,
            read,
            half,
            [Component.parse(n) for n in ranked],
            means,
            n_draws=n_draws,
            seed=s.seed,
            steer_sigma=steer_sigma,
            batch_size=s.batch_size,
            progress=bar.update,
        )


def attribution(
    lm: LoadedModel,
    axis: ValueAxis,
    examples: Sequence[Example],
    settings: AttributeSettings | None = None,
    *,
    out: str | Path | None = None,
    ablate_top: int | None = None,
    n_draws: int | None = None,
    progress: bool = True,
) -> Attribution:
    """Where the axis's value comes from on ``examples``: `run_attribution` into ``out`` (a temporary
    folder when None, so nothing is kept), with its summary returned.

    >>> res = vp.attribution(lm, axis, vp.read_jsonl("data/icrl_pairs.jsonl")[:16],
    ...                      vp.AttributeSettings(positions="spans", span_labels=("post",)))
    >>> res.top(5), vp.attribution_figures(res)[0].show()
    """
    settings = settings or AttributeSettings()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "attribution" if out is None else Path(out)
        res = run_attribution(
            lm, axis, examples, folder, settings, source=Provenance("(in memory)", "", ()), ablate_top=ablate_top,
            n_draws=n_draws, progress=progress,
        )  # fmt: skip
    assert res is not None
    return res
