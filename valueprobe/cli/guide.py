"""The ``valueprobe guide`` command: value-guided decoding of a prompts file (`valueprobe.guided.run.guide`).

    valueprobe guide --probe probes/smollm2-135m-reward-history --prompts data/steer_code.jsonl \\
        --policy prune --n 8 --every 8 --quantile 0.5 --out runs/guide-prune
    valueprobe guide ... --policy rollback --k 8 --tau 1.0 --alpha 2 --read-layer 14 --steer-layer 16
    valueprobe guide ... --policy best-of-n --random-directions 16    # the null beside the axis

Every option is checked (policy settings, probe, layers, prompts, output folder) before the model
loads. Writes ``guide.jsonl`` (one `valueprobe.guided.records.Guided` per prompt and direction) and
``summary.json``, each atomically.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from valueprobe.cli.app import (
    DeviceMapOpt,
    DeviceOpt,
    ForceOpt,
    LoadOptions,
    ModelDtypeOpt,
    ModelOpt,
    OffloadFolderOpt,
    app,
    console,
    data_option,
    probe_option,
    table,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.guided.policy import POLICIES, Policy, as_policy
from valueprobe.guided.records import Guided, write_guided
from valueprobe.guided.run import SCORES, guide
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.vocab import ModelDtype, Unit

__all__ = ["guide_command", "parse_number"]


def parse_number(option: str, text: str | None) -> float | None:
    """A finite number from an option's text (None stays None), or one line naming the option.

    >>> parse_number("--tau", "1.5")
    1.5
    """
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueprobeError(f"{option} {text!r} is not a number: give e.g. {option} 1.0") from None
    if not math.isfinite(value):
        raise ValueprobeError(f"{option} {text!r} is not a finite number")
    return value


def _prompts(path: Path, limit: int | None) -> list[Any]:
    if not path.is_file():
        raise ValueprobeError(
            f"--prompts {path} does not exist: give a dataset JSONL (e.g. data/steer_code.jsonl)"
        )
    check_at_least("--limit", limit, 1)
    examples = read_jsonl(path)[:limit]
    if not examples:
        raise ValueprobeError(f"--prompts {path} holds no prompts")
    return [list(ex.messages) if ex.messages is not None else (ex.text or "") for ex in examples]


PolicyOpt = Annotated[str, typer.Option(help=f"{' | '.join(POLICIES)}")]


@app.command("guide")
def guide_command(
    probe: Annotated[Path, probe_option("the axis that guides")],
    prompts: Annotated[Path, data_option("prompts (text or chat rows)")],
    out: Annotated[Path, typer.Option(help="output folder: guide.jsonl and summary.json")],
    model: ModelOpt = "smollm2-135m",
    policy: PolicyOpt = "best-of-n",
    n: Annotated[int | None, typer.Option("--n", help="samples per prompt (N >= 1)")] = None,
    last_k: Annotated[int | None, typer.Option(help="pick by the last k tokens' value")] = None,
    every: Annotated[int | None, typer.Option(help="prune: checkpoint every c tokens")] = None,
    quantile: Annotated[
        str | None, typer.Option(help="prune: drop rows below this quantile, in (0, 1)")
    ] = None,
    k: Annotated[int | None, typer.Option("--k", help="rollback: tokens rolled back")] = None,
    tau: Annotated[str | None, typer.Option(help="rollback: the EMA's drop, in σ, that triggers it")] = None,
    beta: Annotated[
        str | None, typer.Option(help="rollback: the EMA's weight on the past, in [0, 1)")
    ] = None,
    max_rollbacks: Annotated[int | None, typer.Option(help="rollback: at most this many per row")] = None,
    alpha: Annotated[str | None, typer.Option(help="rollback: steer +α after a rollback")] = None,
    steer_tokens: Annotated[int | None, typer.Option(help="rollback: for this many tokens")] = None,
    score: Annotated[str, typer.Option(help=" | ".join(SCORES))] = "sigma",
    read_layer: Annotated[int | None, typer.Option(help="default: the probe's best layer")] = None,
    steer_layer: Annotated[int | None, typer.Option(help="default: the read layer")] = None,
    unit: Annotated[Unit, typer.Option(help="rollback α unit: sigma | norm | raw")] = Unit.sigma,
    random_directions_: Annotated[
        int, typer.Option("--random-directions", help="also run this many random directions (the null)")
    ] = 0,
    max_new_tokens: int = 48,
    limit: Annotated[int | None, typer.Option(help="only the first N prompts")] = None,
    greedy: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 32,
    force: ForceOpt = False,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    model_dtype: ModelDtypeOpt = ModelDtype.float32,
    offload_folder: OffloadFolderOpt = None,
) -> None:
    """Best-of-N, prune or rollback by the value read while generating; tokens spent per prompt."""
    chosen = _policy(
        policy,
        n=n,
        last_k=last_k,
        every=every,
        quantile=parse_number("--quantile", quantile),
        k=k,
        tau=parse_number("--tau", tau),
        beta=parse_number("--beta", beta),
        max_rollbacks=max_rollbacks,
        alpha=parse_number("--alpha", alpha),
        steer_tokens=steer_tokens,
    )
    _check_numbers(
        score, max_new_tokens, batch_size, random_directions_, greedy=greedy, temperature=temperature
    )
    axis = _axis(probe, read_layer, steer_layer)
    rows = _prompts(prompts, limit)
    check_output_dir(out, holds="guide")
    how = LoadOptions(device, device_map, model_dtype, offload_folder).check()
    lm = how.load(model)
    axis.check(lm, force=force)
    shared: dict[str, Any] = {
        "score": score,
        "read_layer": read_layer,
        "steer_layer": steer_layer,
        "unit": unit,
    }
    shared |= {"seed": seed, "max_new_tokens": max_new_tokens, "greedy": greedy, "temperature": temperature}
    shared |= {"top_p": top_p, "batch_size": batch_size}
    records = _run(lm, axis, rows, chosen, random_directions_, shared)
    settings: dict[str, Any] = {"probe": str(probe), "prompts": str(prompts), "model": model}
    settings["policy"] = chosen.name
    settings |= {key: v for key, v in asdict(chosen).items() if key != "name"} | shared
    settings |= {"unit": unit.value, "random_directions": random_directions_, "limit": limit}
    summary = write_guided(out, records, settings)
    table(f"guide {chosen.name} by {score}: {probe.name} on {prompts.name}", *summary.table())
    console.print(f"wrote {out}/guide.jsonl, summary.json")


def _axis(probe: Path, read_layer: int | None, steer_layer: int | None) -> ValueAxis:
    axis = ValueAxis.load(probe)
    for option, layer in (("--read-layer", read_layer), ("--steer-layer", steer_layer)):
        if layer is not None and layer not in axis.layers:
            raise ValueprobeError(f"{option} {layer}: the probe has layers {list(axis.layers)}")
    return axis


def _check_numbers(
    score: str, max_new_tokens: int, batch_size: int, n_random: int, *, greedy: bool, temperature: float
) -> None:
    """The options besides the policy's, refused in one line before any work."""
    if score not in SCORES:
        raise ValueprobeError(f"--score {score!r}: use one of {', '.join(SCORES)}")
    for option, value in (("--max-new-tokens", max_new_tokens), ("--batch-size", batch_size)):
        check_at_least(option, value, 1)
    check_at_least("--random-directions", n_random, 0)
    if not greedy and not (math.isfinite(temperature) and temperature > 0):
        raise ValueprobeError(f"--temperature {temperature} must be positive (or pass --greedy)")


def _policy(name: str, **given: float | int | None) -> Policy:
    """The policy from the options given on the command line (an option it does not take: one line)."""
    n = given.get("n")
    if n is not None:
        check_at_least("--n", n, 1, " (samples per prompt)")
    return as_policy(name, **{key: v for key, v in given.items() if v is not None})


def _run(
    lm: LoadedModel, axis: ValueAxis, rows: list[Any], policy: Policy, n_random: int, shared: dict[str, Any]
) -> list[Guided]:
    """The axis, then each random direction (`valueprobe.stats.null.random_directions`, by --seed)."""
    records = guide(lm, axis, rows, policy, **shared)
    if n_random:
        nulls = torch.from_numpy(random_directions(axis.d_model, n_random, seed=shared["seed"])).float()
        for i in range(n_random):
            records += guide(
                lm, axis, rows, policy, direction=nulls[i], direction_name=f"random-{i}", **shared
            )
    return records
