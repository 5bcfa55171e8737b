"""Where value comes from, on the shipped axes: direct attribution, patching and ablation, with nulls.

    valueprobe replicate attribute --out probes/attribution-smollm2-135m --work runs/attribution-smollm2-135m
    valueprobe replicate attribute        # writes runs/replicate-attribute, reads the shipped axes and data

On the reward-flip pairs (``data/icrl_pairs.jsonl``: one conversation, its rule-satisfying round
scored +1 or -1), read on the ``post`` span of the post-discovery paragraph:

* **reward-history axis** (``smollm2-135m-reward-history``): which heads and MLPs write the
  rewarded-vs-flipped gap (direct attribution, random-direction null, ablation of the top k against
  random sets of the same kinds); which carry it from the flipped token to the read (exact patching
  of the first pairs, heads, MLPs and residual cells, both directions); attribution patching of more
  pairs, and its agreement with exact patching on the pairs both ran;
* **pre/post axis** (``smollm2-135m-value``): which components write its post-vs-pre gap,
  read on every token of the paragraph (so each term's correlation with token position is
  measured): do position-tracking components dominate? Attribution patching of the pairs shows
  how much of the reward history reaches it.

Each job runs in ``work/JOB`` (resumable: rerun the command after an interruption) and its
``attribution.json`` and ``components.csv`` are copied to ``out/JOB``; ``out`` also gets
``results.json`` (``valueprobe report --from out`` draws it) and ``summary.md`` (its tables; a
``## Reading`` written by hand at its end is kept when a rerun rewrites them).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from valueprobe.activations.manifest import DatasetInfo
from valueprobe.attribute.agreement import agreement
from valueprobe.attribute.folder import read_run
from valueprobe.attribute.records import Attribution
from valueprobe.attribute.run import (
    CSV,
    RESULT,
    AttributeSettings,
    Provenance,
    limited,
    run_attribution,
    summarize_run,
    write_result,
)
from valueprobe.datasets.io import read_jsonl
from valueprobe.datasets.shipped import DATA_DIR
from valueprobe.files import atomic_write_text, jsonable, sha256_file, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.registry import probe_path
from valueprobe.vocab import Positions, Target

__all__ = ["JOBS", "Job", "replicate_attribute", "attribution_summary_lines"]

PAIRS = "icrl_pairs.jsonl"
# shipped axes by name (`valueprobe.probe.registry`): the same bytes as probes/NAME, from any folder
HISTORY, VALUE = "smollm2-135m-reward-history", "smollm2-135m-value"


@dataclass(frozen=True)
class Job:
    """One attribution run of the replication: its folder name, probe, settings and ablation size
    (the top ``ablate_top`` against ``draws`` random sets)."""

    name: str
    probe: str
    settings: AttributeSettings
    ablate_top: int | None = None
    draws: int = 16


# read on the post span of the post-discovery paragraph; the classes are the rewarded and flipped rows
_POST = AttributeSettings(positions=Positions.spans, span_labels=("post",), target=Target.label)
# Sized for 2 cores shared by four or five engineers (load average 5-12). At load ~6 an exact-patched
# pair took 12 min and one ablated pass over 48 held-out examples 142 s, so: the direct terms of 96
# examples (their random directions cost nothing) and of the pre/post axis on 16; the circuit
# ablation on its own direct run of the first 48 examples (24 pairs: the top 10 ranked on 12 pairs,
# mean-ablated on the other 12 against 16 random sets of as many heads and MLPs) and on the pre/post
# run (4 held-out pairs, 24 random sets); exact and attribution patching of the first 3 pairs.
JOBS: tuple[Job, ...] = (
    Job("reward-history-direct", HISTORY, replace(_POST, method="direct", limit=96, n_random=64)),
    Job(
        "reward-history-ablate",
        HISTORY,
        replace(_POST, method="direct", limit=48, n_random=64),
        ablate_top=10,
        draws=16,
    ),
    Job("reward-history-attrib", HISTORY, replace(_POST, method="attrib-patch", limit=3)),
    Job(
        "value-direct",
        VALUE,
        AttributeSettings(
            method="direct", positions=Positions.span_tokens, target=Target.span, limit=16, n_random=32
        ),
        ablate_top=10,
        draws=24,
    ),
    # exact patching: every head and MLP, and the residual cells of three layers
    Job("reward-history-patch", HISTORY, replace(_POST, method="patch", limit=3, resid_layers="::11")),
)
# the report's first section shows direct attribution beside its ablation: one run holds both
SECTIONS = {
    "attribution": "reward-history-ablate",
    "attribution_patch": "reward-history-patch",
    "attribution_position": "value-direct",
}


def _run(
    lm: LoadedModel, job: Job, data: Path, work: Path, *, progress: bool, announce: Callable[[str], object]
) -> Attribution:
    examples = read_jsonl(data)
    axis = ValueAxis.load(job.probe, lm=lm)
    probe = probe_path(job.probe)
    source = Provenance(
        job.probe,
        sha256_file(probe / "axis.safetensors"),
        (DatasetInfo(str(data), sha256_file(data), len(examples)),),
    )
    res = run_attribution(
        lm, axis, examples, work / job.name, job.settings, source=source, ablate_top=job.ablate_top,
        n_draws=job.draws, progress=progress, announce=announce,
    )  # fmt: skip
    assert res is not None
    return res


def _agree(exact: Attribution, job: Job, data: Path, work: Path) -> Attribution:
    """The exact-patching record with its agreement with attribution patching of the same pairs
    (the first pairs of the file, which both runs cover)."""
    ids = {ex.id for ex in limited(read_jsonl(data), job.settings)}
    folder = work / "reward-history-attrib"
    approx = summarize_run(folder, read_run(folder), keep=lambda i: i in ids)
    return exact.with_agreement(agreement(exact, approx, k=10))


def replicate_attribute(
    lm: LoadedModel,
    out: str | Path,
    *,
    work: str | Path,
    data_dir: str | Path = DATA_DIR,
    jobs: Sequence[Job] = JOBS,
    progress: bool = True,
    announce: Callable[[str], object] = lambda line: None,
) -> dict[str, Attribution]:
    """Run (or resume) every job, then write ``out``: each job's files, results.json, summary.md."""
    out, work, data = Path(out), Path(work), Path(data_dir) / PAIRS
    results: dict[str, Attribution] = {}
    for job in jobs:
        announce(f"[{job.name}] {job.settings.method} on {job.probe}")
        results[job.name] = _run(lm, job, data, work, progress=progress, announce=announce)
    exact = next((j for j in jobs if j.name == "reward-history-patch"), None)
    if exact is not None and "reward-history-attrib" in results:
        results[exact.name] = _agree(results[exact.name], exact, data, work)
        write_result(work / exact.name, results[exact.name])
    for name in results:
        (out / name).mkdir(parents=True, exist_ok=True)
        for f in (RESULT, CSV):
            shutil.copyfile(work / name / f, out / name / f)
    sections = {key: results[name].to_dict() for key, name in SECTIONS.items() if name in results}
    write_json(out / "results.json", jsonable({"model": lm.model_id, "sections": sections}), indent=1)
    atomic_write_text(
        out / "summary.md",
        "\n".join(attribution_summary_lines(results)) + "\n" + _reading(out / "summary.md"),
    )
    return results


READING = "## Reading"


def _reading(summary: Path) -> str:
    """The hand-written reading at the end of an existing summary.md (from its ``## Reading``
    heading on), kept when a rerun rewrites the tables above it: a person reads the numbers."""
    try:
        text = summary.read_text(encoding="utf-8")
    except OSError:
        return ""
    at = text.find("\n" + READING)
    return "" if at < 0 else text[at + 1 :]


def attribution_summary_lines(results: dict[str, Attribution]) -> list[str]:
    """summary.md: each job's headline, top components and ablation, and the agreement."""
    lines = ["# Where value comes from (smollm2-135m)", ""]
    for name, res in results.items():
        lo, hi = res.axis_gap_ci
        lines += [
            f"## {name}: {res.method}, {Path(res.probe).name}, layer {res.layer}",
            "",
            f"{res.n_units} units ({res.n_rows} rows), read: {res.read}; axis gap {res.axis_gap:+.3f}σ [{lo:+.3f}, {hi:+.3f}],"
            f" AUROC {res.axis_auroc:.3f}{' (within pairs)' if res.paired else ''}.",
            "",
        ]
        if res.terms and math.isfinite(res.position_share()):
            lines += [
                f"Terms that track token position (|r| >= 0.5 within a text) write {res.position_share():.0%} of the summed |gap|.",
                "",
            ]
        headers, rows = res.table(10)
        lines += (
            ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(r) + " |" for r in rows]
            + [""]
        )
        if res.ablation is not None:
            ab = res.ablation
            lines.append(
                f"Ablating the top {ab.k} ({', '.join(ab.components)}) on {ab.n_units} held-out units, {ab.n_draws} random sets:"
            )
            lines += [
                f"- {m.name}: {m.none:+.3f} -> {m.top:+.3f}, drop {m.drop:+.3f}; random drops 95% [{m.null_drops[0]:+.3f}, {m.null_drops[1]:+.3f}]:"
                f" {'necessary' if m.necessary else 'not beyond the null'}"
                for m in ab.metrics
            ] + [""]  # fmt: skip
        if res.agreement is not None:
            a = res.agreement
            lines.append(
                f"Attribution patching vs exact on the same {a.n_pairs} pairs: Spearman {a.spearman_components:+.3f} (heads and MLPs),"
                f" {a.spearman_cells:+.3f} (residual cells); top-{a.k} overlap {a.top_k_overlap:.2f}; missed {', '.join(a.missed) or 'none'};"
                f" sign flips {', '.join(a.sign_flips) or 'none'}."
            )
            lines.append("")
    return lines
