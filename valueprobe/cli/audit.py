"""``valueprobe audit``: is the axis value, or the end of the turn? Tests a–e, each beside its null.

    valueprobe audit --probe smollm2-135m-value --out runs/audit-value
    valueprobe audit --probe runs/my-axis --layer 18 --tests ab --construction mine.jsonl --out runs/audit-mine

Writes audit.json, audit.html and turns.jsonl (the 2×2 rows read) into OUT, and the stages that let
a rerun of the same command resume after Ctrl-C (OUT/stages). `valueprobe report --from OUT` draws
the same "Is it value?" section.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.audit.records import TESTS, Audit, AuditSettings
from valueprobe.cli.app import (
    ForceOpt,
    LoadOptions,
    ModelOpt,
    app,
    console,
    data_option,
    probe_option,
    replicate_app,
    table,
)
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.cli.steer import parse_alphas
from valueprobe.datasets.io import read_jsonl
from valueprobe.datasets.shipped import resolve_dataset_name, shipped_datasets
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, check_output_dir, markdown_table, write_json
from valueprobe.probe.registry import portable_name, resolve_axis_name
from valueprobe.vocab import layer_ranges

if TYPE_CHECKING:  # the library loads when a command runs (cli/app.py), not for --help
    from valueprobe.probe.axis import ValueAxis

__all__ = ["AuditOptions", "recorded_layer"]


def recorded_layer(axis: ValueAxis) -> int | None:
    """The layer the axis's fit chose (a layer sweep, or a recorded rule), else None: an axis made
    by arithmetic inherits a best layer nobody chose, and a hand-saved one may record none."""
    if len(axis.layers) == 1:
        return axis.layers[0]
    if axis.made:
        return None
    sweep = axis.metrics.get("sweep")
    if (isinstance(sweep, dict) and "best_layer" in sweep) or "best_layer_rule" in axis.metrics:
        return axis.best_layer
    return None


@dataclass(frozen=True)
class AuditOptions(OptionGroup):
    """What ``valueprobe audit`` runs, and how big (an option group, `grouped`)."""

    panel = "Audit"

    layer: Annotated[int | None, typer.Option(help="layer read and steered (default: the axis's best)")] = (
        None
    )
    tests: Annotated[str, typer.Option(help=f"which tests to run, letters of {TESTS}")] = TESTS
    turns: Annotated[int, typer.Option(help="2×2 conversations built from the ICRL generator (a)")] = 40
    turns_data: Annotated[
        Path | None,
        typer.Option(help="your own 2×2 JSONL instead (meta: conversation, value, end; a tail span)"),
    ] = None
    construction: Annotated[Path, data_option("construction with pre/post spans (b)")] = Path("icrl")
    n_construction: Annotated[int, typer.Option("--conversations", help="construction conversations (b)")] = (
        48
    )
    prompts: Annotated[Path, data_option("neutral one-turn prompts (c, d)")] = Path("steer_open")
    answers: Annotated[int, typer.Option(help="answers sampled for the distance to the end (c)")] = 48
    steer_prompts: Annotated[int, typer.Option(help="prompts steered (d)")] = 8
    alphas: Annotated[str, typer.Option(help="non-zero strengths in % of the mean norm (d)")] = "-30,30"
    steer_random: Annotated[int, typer.Option(help="random directions steered as the null (d)")] = 4
    random: Annotated[int, typer.Option("--random", help="random directions read on the same tokens")] = 64
    k: Annotated[int, typer.Option(help="top-k promoted tokens of the logit lens (e)")] = 50
    seed: int = 0
    batch_size: Annotated[int, typer.Option(help="sequences per forward")] = 8

    def settings(self) -> AuditSettings:
        try:
            values = tuple(a for a in parse_alphas(f"{self.alphas},0") if a != 0.0)
        except ValueprobeError:
            raise ValueprobeError(
                f"--alphas {self.alphas!r}: give non-zero strengths in % of the mean norm, e.g. -30,30"
            ) from None
        return AuditSettings(
            tests=self.tests, layer=self.layer, turns=self.turns,
            turns_data=None if self.turns_data is None else str(self.turns_data),
            construction=str(self.construction), n_construction=self.n_construction, prompts=str(self.prompts),
            n_answers=self.answers, n_steer=self.steer_prompts, alphas=values, n_steer_random=self.steer_random,
            n_random=self.random, k_lens=self.k, seed=self.seed, batch_size=self.batch_size,
        ).check()  # fmt: skip

    def flags(self) -> str:
        """The options that differ from the defaults, as typed (the command that reproduces a run)."""
        default = AuditOptions()
        names = {"n_construction": "--conversations", "random": "--random"}
        out = []
        for f in fields(self):
            value, was = getattr(self, f.name), getattr(default, f.name)
            if f.name in ("construction", "prompts"):  # a shipped name reaches here as its installed path
                value, was = _shown(value), _shown(was)
            if value != was:
                out.append(f"{names.get(f.name, '--' + f.name.replace('_', '-'))}={value}")
        return " ".join(out)


def _shown(path: Path) -> str:
    """A dataset as a command names it: a shipped one by its name, any other by its path."""
    here = resolve_dataset_name(str(path)).resolve()
    return next((name for name, p in shipped_datasets().items() if p.resolve() == here), str(path))


def _layer(axis: ValueAxis, probe: Path, layer: int | None) -> int:
    if layer is None:
        chosen = recorded_layer(axis)
        if chosen is None:
            raise ValueprobeError(
                f"{probe}: the axis records no best layer (no layer sweep chose one"
                f"{'; it was made by axis arithmetic' if axis.made else ''}): pass --layer L, one of"
                f" {layer_ranges(axis.layers)}"
            )
        return chosen
    if layer not in axis.layers:
        raise ValueprobeError(f"--layer {layer}: the axis has layers {layer_ranges(axis.layers)}")
    return layer


def print_audit(res: Audit, out: Path) -> None:
    """The verdict table, each test's cost, and what was written."""
    headers, rows = res.table()
    table(f"Is it value? {res.probe}, layer {res.layer} ({res.model_id})", headers, rows)
    console.print(f"chats: {res.rendering}")
    for t in res.tests:
        console.print(f"  {t.key}. {t.verdict}: {t.why}")
    console.print(f"wrote {out}/audit.json, summary.md, audit.html, turns.jsonl  (reproduce: {res.command})")


@app.command("audit")
@grouped
def audit_command(
    probe: Annotated[Path, probe_option("the axis audited")],
    out: Annotated[Path, typer.Option(help="output folder: audit.json, audit.html (rerun to resume)")],
    model: ModelOpt = "smollm2-135m",
    force: ForceOpt = False,
    audit: AuditOptions = AuditOptions(),
    load: LoadOptions = LoadOptions(),
) -> None:
    """Is it value? Test the axis against the end of the turn and its other rivals, each beside a random null."""
    from valueprobe.audit.run import run_audit
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.report.page import Results, write_report

    check_output_dir(out, holds="audit")
    settings = audit.settings()
    axis = ValueAxis.load(probe)  # a bad probe or layer fails before the model loads
    layer = _layer(axis, probe, audit.layer)
    for data in (settings.construction, settings.prompts, settings.turns_data):
        if data is not None:
            read_jsonl(data)
    how = load.check()
    name = portable_name(probe)
    command = f"valueprobe audit --probe {name} --out {out}" + (
        f" --model {model}" if model != "smollm2-135m" else ""
    )
    command += f" {audit.flags()}" if audit.flags() else ""
    lm = how.load(model)
    checked = ValueAxis.load(probe, lm=lm, force=force)
    res = run_audit(
        lm, checked, out, _with_layer(settings, layer), probe=name, command=command, console=console
    )
    write_json(out / "audit.json", res.to_dict(), indent=1)
    atomic_write_text(out / "summary.md", "\n".join(res.summary_lines()) + "\n")
    write_report(Results(sections={"audit": res}, model=res.model_id), out / "audit.html",
                 title=f"Is it value? {res.probe}, layer {res.layer}")  # fmt: skip
    print_audit(res, out)


def _with_layer(settings: AuditSettings, layer: int) -> AuditSettings:
    return AuditSettings.from_dict({**settings.to_dict(), "layer": layer})


@replicate_app.command("eot")
def replicate_eot_command(
    out: Annotated[
        Path, typer.Option(help="results folder: results.json, summary.md (rerun to resume)")
    ] = Path("runs/replicate-eot"),
    probe: Annotated[Path, probe_option("the pre/post axis")] = Path("smollm2-135m-value"),
    model: ModelOpt = "smollm2-135m",
    turns: Annotated[int, typer.Option(help="2×2 conversations (1a)")] = 40,
    steer_prompts: Annotated[int, typer.Option(help="prompts steered at each α (1d)")] = 8,
    load: LoadOptions = LoadOptions(),
) -> None:
    """The replication's designs 1a, 1b, 1d (Qwen3-8B) on this model, in the paper's units, beside its figures."""
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.replicate.eot import paper_layer, replicate_eot

    check_output_dir(out, holds="audit")
    settings = AuditSettings(turns=turns, n_steer=steer_prompts).check()
    axis = ValueAxis.load(probe)
    name = portable_name(probe)
    command = f"valueprobe replicate eot --out {out}" + (
        f" --probe {name}" if name != "smollm2-135m-value" else ""
    )
    command += "".join(f" --{k} {v}" for k, v in (("model", model), ("turns", turns), ("steer-prompts", steer_prompts))
                       if v != {"model": "smollm2-135m", "turns": 40, "steer-prompts": 8}[k])  # fmt: skip
    lm = load.check().load(model)
    checked = ValueAxis.load(probe, lm=lm)
    if paper_layer(lm.n_layers) not in axis.layers:
        raise ValueprobeError(
            f"{probe}: the axis has no layer {paper_layer(lm.n_layers)}, the paper's depth (21/36)"
        )
    res = replicate_eot(lm, checked, out, probe=name, settings=settings, command=command, console=console)
    headers, rows = res.table()
    table(
        f"replicate eot -> {out} (a different, smaller model than the replication's Qwen3-8B)", headers, rows
    )
    console.print(f"wrote {out}/results.json, summary.md")


@replicate_app.command("orthogonal")
def replicate_orthogonal_command(
    out: Annotated[Path, typer.Option(help="results folder: results.json, summary.md")] = Path(
        "runs/replicate-orthogonal"
    ),
    probes: Annotated[
        list[Path] | None, probe_option("an axis to start from (repeat); default: both shipped axes")
    ] = None,
    model: ModelOpt = "smollm2-135m",
    load: LoadOptions = LoadOptions(),
) -> None:
    """An axis orthogonal to the end of the turn by construction, scored on held-out value contrasts beside the axes."""
    from valueprobe.audit.orthogonal import ROUTE_ONE, as_axis, evaluate
    from valueprobe.probe.axis import ValueAxis

    check_output_dir(out, holds="orthogonal fit")
    paths = probes or [resolve_axis_name(n) for n in ("smollm2-135m-value", "smollm2-135m-reward-history")]
    for p in paths:
        ValueAxis.load(p)
    lm = load.check().load(model)
    axes = [(portable_name(p), ValueAxis.load(p, lm=lm)) for p in paths]
    res, fitted = evaluate(lm, axes)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", res.to_dict(), indent=1)
    headers, rows = res.table()
    notes = [
        "An AUROC above 0.5 reads the contrast's value-up side higher. Random directions: central 95% of 64.",
        "holds: held-out ICRL AUROC CI above 0.5 and beyond the random directions, and on a held-out 2×2 the value"
        " effect holds while the end-of-turn effect does not.",
    ]
    for name, axis in axes:
        score = next(s for s in res.scores if s.name.startswith(ROUTE_ONE) and name in s.name)
        if score.holds:
            one = as_axis(fitted[name], axis, lm, method=ROUTE_ONE, metrics={"orthogonal": score.to_dict()})
            one.save(out / f"axis-{name}")
            notes.append(f"{score.name} holds its controls: saved as {out / f'axis-{name}'}")
        else:
            notes.append(f"{score.name} does not hold its controls: not shipped")
    md = [
        f"# An axis orthogonal to the end of the turn ({res.model_id})",
        "",
        *markdown_table(headers, rows),
        "",
    ]
    atomic_write_text(out / "summary.md", "\n".join([*md, *(f"- {n}" for n in notes)]) + "\n")
    table(f"replicate orthogonal -> {out}", headers, rows)
    for n in notes:
        console.print(n)
