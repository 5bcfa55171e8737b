"""``valueprobe tune-steer``: the largest move toward a target at a KL bound, beside random directions.

    valueprobe tune-steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl \\
        --layers 18,20 --alphas 15,30 --unit norm --positions all,generated --ops add,add-norm --max-kl 0.5 \\
        --out runs/tune-open
    valueprobe steer --spec runs/tune-open/spec.json --alphas=0,30 --prompts data/steer_open.jsonl --out runs/steer-chosen

Chooses on the validation half of the prompts, reports on the test half (`valueprobe.steering.experiment.search`),
prints the random directions' front next to the chosen setting, and writes ``spec.json`` (the chosen
setting as a `valueprobe.steering.hook.spec.SteeringSpec`, which ``steer --spec`` and ``serve --spec``
read; the chosen α, which a spec does not hold, is printed and kept in ``results.json``),
``results.json`` and ``front.html``. An empty search space or a KL bound that is not positive is one line, before any work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from valueprobe.cli.app import (
    LoadOptions,
    ModelOpt,
    RandomDirectionsOpt,
    app,
    console,
    data_option,
    probe_option,
    table,
    write_figure,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir, jsonable, sha256_file, write_json
from valueprobe.steering.experiment.prompting import Goal, conditions_path, read_target
from valueprobe.vocab import Op, Unit

if TYPE_CHECKING:
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.steering.experiment.search import SearchSpace, SteerSearch
    from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["tune_steer_command"]


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueprobeError(f"{name} {text!r} does not parse: give numbers separated by commas") from None


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _target(text: str | None, prompts: Path) -> Goal:
    """``--target metric[:subset[:sign]]``, or the target the conditions file states for the set."""
    if text is None:
        stated = read_target(conditions_path(prompts), prompts.stem)
        if stated is None:
            raise ValueprobeError(
                f"no target is stated for {prompts.stem} in {conditions_path(prompts)}: give --target METRIC[:SUBSET[:SIGN]]"
            )
        return stated
    parts = text.split(":")
    sign = parts[2] if len(parts) > 2 else "1"
    if len(parts) > 3 or sign not in ("1", "-1", "+1"):
        raise ValueprobeError(f"--target {text!r}: give METRIC[:SUBSET[:SIGN]], SIGN 1 or -1")
    return Goal(parts[0], parts[1] if len(parts) > 1 else "all", int(sign))


@dataclass(frozen=True)
class SearchOptions(OptionGroup):
    """What ``tune-steer`` searches (layer × α × positions × operator) and under which KL bound."""

    panel = "Search"

    max_kl: Annotated[float, typer.Option(help="the KL bound: nats per token on neutral text")] = 0.5
    layers: Annotated[str | None, typer.Option(help="comma list; default the probe's best layer")] = None
    alphas: Annotated[str, typer.Option(help="strengths, comma separated; each is tried as ±α")] = "1,2,4"
    unit: Annotated[Unit, typer.Option(help="sigma | norm | raw")] = Unit.sigma
    positions: Annotated[str, typer.Option(help="comma list of all, prompt, generated")] = "all,generated"
    ops: Annotated[str, typer.Option(help="comma list of add, add-norm")] = "add,add-norm"
    target: Annotated[
        str | None, typer.Option(help="METRIC[:SUBSET[:SIGN]]; default: stated in steer_conditions.jsonl")
    ] = None

    def space(self, axis: ValueAxis) -> SearchSpace:
        """The search space, checked (one line when empty or the bound is not positive)."""
        from valueprobe.steering.experiment.search import (  # loads the library: when the command runs (cli/app.py)
            SearchSpace,
            check_space,
        )

        layers = (
            tuple(int(x) for x in _floats(self.layers, "--layers")) if self.layers else (axis.best_layer,)
        )
        space = SearchSpace(layers, _floats(self.alphas, "--alphas"), _words(self.positions), _words(self.ops),
                            self.max_kl)  # fmt: skip
        check_space(space)
        if bad := [x for x in space.layers if x not in axis.layers]:
            raise ValueprobeError(f"--layers: the probe has no layer {bad[0]}; it has {list(axis.layers)}")
        return space


@dataclass(frozen=True)
class TuneSweepOptions(OptionGroup):
    """How each searched setting's sweep runs: its prompts, decoding, random directions and corpus."""

    panel = "Sweep"

    random_directions: RandomDirectionsOpt = 4
    limit: Annotated[int | None, typer.Option(help="only the first N prompts")] = 16
    max_new_tokens: int = 32
    samples: int = 1
    temperature: float = 1.0
    seed: int = 0
    neutral: Annotated[
        Path | None,
        data_option("the neutral corpus the KL is read on (default: neutral_text beside --prompts)"),
    ] = None


@app.command("tune-steer")
@grouped
def tune_steer_command(
    probe: Annotated[Path, probe_option("the axis steered")],
    prompts: Annotated[Path, data_option("prompts, e.g. steer_open")],
    out: Annotated[Path, typer.Option(help="output folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    search: SearchOptions = SearchOptions(),
    sweep: TuneSweepOptions = TuneSweepOptions(),
    batch_size: int = 32,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Search layer × α × positions × operator for the largest move toward the target at KL ≤ --max-kl."""  # fmt: skip
    from valueprobe.probe.axis import ValueAxis  # loads the library: when the command runs (cli/app.py)
    from valueprobe.steering.experiment.search import tune_steer
    from valueprobe.steering.experiment.sweep import SweepSettings, metrics_for
    from valueprobe.steering.hook.spec import SteeringSpec

    axis = ValueAxis.load(probe)
    space = search.space(axis)
    check_at_least("--random-directions", sweep.random_directions, 1)
    neutral = sweep.neutral or prompts.parent / "neutral_text.jsonl"
    if not neutral.is_file():
        raise ValueprobeError(
            f"--neutral {neutral} does not exist: build it with `valueprobe datasets build --family steering`"
        )
    if not prompts.is_file():
        raise ValueprobeError(
            f"--prompts {prompts} does not exist: give a dataset JSONL (e.g. data/steer_open.jsonl)"
        )
    check_at_least("--limit", sweep.limit, 2)
    examples = read_jsonl(prompts)[: sweep.limit]
    goal = _target(search.target, prompts)
    metrics = metrics_for(prompts, examples)
    if goal.metric not in (*metrics, "length", "degenerate"):
        raise ValueprobeError(
            f"--target {goal.metric!r} is not read on {prompts.name}: choose from {', '.join(metrics)}"
        )
    check_output_dir(out, holds="steering search")
    t = sweep.temperature
    base = SweepSettings(spec=SteeringSpec(axis, probe=str(probe), unit=search.unit), probe_fingerprint=axis.fingerprint,
                         model=model, prompts=str(prompts), prompts_sha256=sha256_file(prompts), alphas=(0.0, 1.0),
                         samples=sweep.samples, max_new_tokens=sweep.max_new_tokens, controls=sweep.random_directions,
                         seed=sweep.seed, greedy=not math.isfinite(t) or t <= 0, temperature=t, metrics=metrics,
                         limit=sweep.limit)  # fmt: skip
    lm = load.check().load(model)
    found = tune_steer(lm, examples, base, space, goal, out=out, neutral=neutral, batch_size=batch_size)
    _print(found, out, base.spec)


def _print(found: SteerSearch, out: Path, base: SteeringSpec) -> None:
    """The candidates, the random front beside the chosen setting, and the files."""
    from valueprobe.report.steering_eval import (
        front_figure,  # loads the library: when the command runs (cli/app.py)
    )
    from valueprobe.steering.experiment.front import envelope
    from valueprobe.steering.hook.operators import Operator
    from valueprobe.steering.hook.spec import Where

    goal = found.target
    table(f"tune-steer: {goal.metric} on {goal.subset} (sign {goal.sign:+d}), KL ≤ {found.space.max_kl:g}; "
          f"{found.n_val} validation / {found.n_test} test prompts", *found.table())  # fmt: skip
    write_json(out / "results.json", jsonable(found.to_dict()), allow_nan=False)
    c, front = found.chosen, found.test_front
    if c is None or front is None:
        console.print(
            f"no setting moves the target within KL ≤ {found.space.max_kl:g}: no spec written (results.json)"
        )
        return
    null = envelope(front.random, c.kl)
    useful = (
        "useful"
        if c.alpha in front.useful
        else "not useful (inside the random front, or at a KL they do not reach)"
    )
    table("chosen (validation) and reported on test, beside the random directions' front at the same setting",
          ["setting", "KL", "move (test)", "95% CI", "random front at that KL (test)", "random directions reach"],
          [[c.name, c.kl, c.test_effect, f"[{c.test_ci[0]:+.3f}, {c.test_ci[1]:+.3f}]", null, f"KL ≤ {front.max_random_kl:.3g}"]])  # fmt: skip
    console.print(f"on test the chosen α is {useful}")
    # the chosen setting as the one steering spec steer and serve read; α is not part of a spec
    spec = replace(base, layers=[c.layer], op=Operator(Op(c.op)), positions=cast(Where, c.positions))
    spec.save(out / "spec.json")
    write_figure(
        front_figure([front], titles=[f"{goal.metric} ({goal.subset}), test prompts: {c.name}"]),
        out / "front.html",
    )
    console.print(f"wrote {out}/spec.json, results.json, front.html (sweeps in {out}/configs/); steer it with"
                  f" `valueprobe steer --spec {out}/spec.json --alphas=0,{c.alpha:g} --prompts ... --out ...`")  # fmt: skip
