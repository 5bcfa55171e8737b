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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from valueprobe.cli.app import (
    AllowLargeOpt,
    ForceOpt,
    LoadOptions,
    ModelOpt,
    app,
    console,
    data_option,
    table,
)
from valueprobe.cli.boundary import check_at_least
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.cli.spec import DecodingOptions, SpecOptions
from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import check_output_dir
from valueprobe.guided.policy import POLICIES, Policy, as_policy
from valueprobe.guided.records import SCORES, Guided, write_guided

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel
    from valueprobe.steering.decode.sampling import Decoding
    from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["PolicyOptions", "guide_command", "parse_number"]


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


@dataclass(frozen=True)
class PolicyOptions(OptionGroup):
    """The policy and its settings (`valueprobe.guided.policy`): an option a policy does not take is
    refused in one line."""

    panel = "Policy"

    policy: Annotated[str, typer.Option(help=f"{' | '.join(POLICIES)}")] = "best-of-n"
    n: Annotated[int | None, typer.Option("--n", help="samples per prompt (N >= 1)")] = None
    last_k: Annotated[int | None, typer.Option(help="pick by the last k tokens' value")] = None
    every: Annotated[int | None, typer.Option(help="prune: checkpoint every c tokens")] = None
    quantile: Annotated[str | None, typer.Option(help="prune: drop rows below this quantile, in (0, 1)")] = (
        None
    )
    k: Annotated[int | None, typer.Option("--k", help="rollback: tokens rolled back")] = None
    tau: Annotated[str | None, typer.Option(help="rollback: the EMA's drop, in σ, that triggers it")] = None
    beta: Annotated[str | None, typer.Option(help="rollback: the EMA's weight on the past, in [0, 1)")] = None
    max_rollbacks: Annotated[int | None, typer.Option(help="rollback: at most this many per row")] = None
    alpha: Annotated[str | None, typer.Option(help="rollback: steer +α after a rollback")] = None
    steer_tokens: Annotated[int | None, typer.Option(help="rollback: for this many tokens")] = None
    allow_large: AllowLargeOpt = False

    def to_policy(self) -> Policy:
        """The policy these options say (an option it does not take: one line)."""
        if self.n is not None:
            check_at_least("--n", self.n, 1, " (samples per prompt)")
        given = {
            "n": self.n,
            "last_k": self.last_k,
            "every": self.every,
            "quantile": parse_number("--quantile", self.quantile),
            "k": self.k,
            "tau": parse_number("--tau", self.tau),
            "beta": parse_number("--beta", self.beta),
            "max_rollbacks": self.max_rollbacks,
            "alpha": parse_number("--alpha", self.alpha),
            "steer_tokens": self.steer_tokens,
        }
        return as_policy(self.policy, **{key: v for key, v in given.items() if v is not None})


@app.command("guide")
@grouped
def guide_command(
    prompts: Annotated[Path, data_option("prompts (text or chat rows)")],
    out: Annotated[Path, typer.Option(help="output folder: guide.jsonl and summary.json")],
    model: ModelOpt = "smollm2-135m",
    policy: PolicyOptions = PolicyOptions(),
    score: Annotated[str, typer.Option(help=" | ".join(SCORES))] = "sigma",
    steering: SpecOptions = SpecOptions(),
    decoding: DecodingOptions = DecodingOptions(),
    random_directions_: Annotated[
        int, typer.Option("--random-directions", help="also run this many random directions (the null)")
    ] = 0,
    limit: Annotated[int | None, typer.Option(help="only the first N prompts")] = None,
    batch_size: int = 32,
    force: ForceOpt = False,
    load: LoadOptions = LoadOptions(),
) -> None:
    """Best-of-N, prune or rollback by the value read while generating; tokens spent per prompt."""
    from valueprobe.steering.hook.strength import (
        check_strengths,  # loads the library: when the command runs (cli/app.py)
    )

    chosen = policy.to_policy()
    _check_numbers(score, decoding, batch_size, random_directions_)
    spec = _spec(steering)
    alpha = getattr(chosen, "alpha", None)
    if alpha:
        check_strengths(spec, [alpha], allow_large=policy.allow_large, option="--alpha")
    rows = _prompts(prompts, limit)
    check_output_dir(out, holds="guide")
    how = load.check()
    lm = how.load(model)
    spec.first_axis().check(lm, force=force)
    run = decoding.decoding()
    records = _run(
        lm, spec, rows, chosen, random_directions_, score=score, decoding=run, batch_size=batch_size
    )
    settings: dict[str, Any] = {"probe": str(spec.probe), "prompts": str(prompts), "model": model}
    settings["policy"] = chosen.name
    settings |= {key: v for key, v in asdict(chosen).items() if key != "name"}
    settings |= {"score": score, "read_layer": steering.read_layer, "steer_layer": _steer_layer(steering)}
    settings |= {"unit": spec.unit, "seed": run.seed, "max_new_tokens": run.max_new_tokens}
    settings |= {
        "greedy": run.greedy,
        "temperature": run.temperature,
        "top_p": run.top_p,
        "batch_size": batch_size,
    }
    settings |= {"unit": spec.unit.value, "random_directions": random_directions_, "limit": limit}
    summary = write_guided(out, records, settings)
    table(f"guide {chosen.name} by {score}: {Path(str(spec.probe)).name} on {prompts.name}", *summary.table())
    console.print(f"wrote {out}/guide.jsonl, summary.json")


def _steer_layer(steering: SpecOptions) -> int | str | None:
    """The steer layer(s) as given, as ``summary.json`` has always recorded it (None: the read layer)."""
    if steering.steer_layer is not None:
        return steering.steer_layer
    layers = steering.layers
    return int(layers) if layers is not None and layers.strip().lstrip("-").isdigit() else layers


def _spec(steering: SpecOptions) -> SteeringSpec:
    """The spec guide reads and pushes with: the probe's best layer unless --read-layer says."""
    spec = steering.to_spec().check()
    return spec if spec.read_layer is not None else replace(spec, read_layer=spec.first_axis().best_layer)


def _check_numbers(score: str, decoding: DecodingOptions, batch_size: int, n_random: int) -> None:
    """The options besides the policy's, refused in one line before any work."""
    if score not in SCORES:
        raise ValueprobeError(f"--score {score!r}: use one of {', '.join(SCORES)}")
    decoding.check()
    check_at_least("--batch-size", batch_size, 1)
    check_at_least("--random-directions", n_random, 0)


def _run(
    lm: LoadedModel,
    spec: SteeringSpec,
    rows: list[Any],
    policy: Policy,
    n_random: int,
    *,
    score: str,
    decoding: Decoding,
    batch_size: int,
) -> list[Guided]:
    """The axis, then each random direction (`valueprobe.stats.null.random_directions`, by --seed)."""
    import torch  # loads the library: when the command runs (cli/app.py)

    from valueprobe.guided.run import guide
    from valueprobe.stats.null import random_directions

    records = guide(lm, spec, rows, policy, score=score, decoding=decoding, batch_size=batch_size, chat=False)
    if n_random:
        nulls = torch.from_numpy(
            random_directions(spec.first_axis().d_model, n_random, seed=decoding.seed)
        ).float()
        for i in range(n_random):
            null = replace(spec, direction=nulls[i], direction_name=f"random-{i}")
            records += guide(
                lm, null, rows, policy, score=score, decoding=decoding, batch_size=batch_size, chat=False
            )
    return records
