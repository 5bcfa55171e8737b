"""The ``valueprobe`` command line: thin wrappers, each calling one library function.

    valueprobe demo
    valueprobe datasets build --family all --out data --seed 0
    valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl
    valueprobe fit --store runs/icrl --method span_diff --out probes/smollm2-135m-value
    valueprobe score --probe probes/smollm2-135m-value --model smollm2-135m --data data/code.jsonl --out runs/score-code

Every command prints a short summary table and writes JSON/CSV next to any HTML. Bad input ends
in one line on stderr (``error: ...``) and exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from valueprobe.errors import ValueprobeError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find, read and steer the value axis of language models.")  # fmt: skip
datasets_app = typer.Typer(no_args_is_help=True, help="Build the contrast datasets.")
app.add_typer(datasets_app, name="datasets")
console = Console(stderr=False)

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="alias (smollm2-135m), model folder, .gguf, or hub id")
]


def table(title: str, columns: list[str], rows: list[list[object]]) -> None:
    """Print one summary table."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r])
    console.print(t)


def write_json(path: Path, obj: object) -> None:
    """Atomic JSON write."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=float) + "\n")
    os.replace(tmp, path)


def _load_model(model: str, *, layers_path: str | None = None, trust_remote_code: bool = False, device: str = "cpu",
                dtype: str = "float32"):  # fmt: skip
    from valueprobe.models import load

    return load(
        model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device, dtype=dtype
    )


# --- capture commands ---


@app.command()
def capture(
    data: Annotated[Path, typer.Option(help="dataset JSONL (see DESIGN.md)")],
    out: Annotated[Path, typer.Option(help="store folder; rerun the same command to resume")],
    model: ModelOpt = "smollm2-135m",
    layers: Annotated[str, typer.Option(help="'all', '0:10', '-1', '3,5,-2'")] = "all",
    positions: Annotated[str, typer.Option(help="last | mean | all | spans | span_tokens")] = "last",
    site: Annotated[str, typer.Option(help="resid_post | resid_pre")] = "resid_post",
    batch_size: int = 8,
    examples_per_shard: int = 256,
    dtype: Annotated[str, typer.Option(help="stored dtype: float16 | float32")] = "float16",
    padding_side: Annotated[str, typer.Option(help="right | left")] = "right",
    max_length: int | None = None,
    backend: Annotated[str, typer.Option(help="hooks | nnsight | tlens")] = "hooks",
    remote: Annotated[
        bool, typer.Option(help="nnsight only: run on NDIF (needs an NDIF key and network)")
    ] = False,
    layers_path: Annotated[
        str | None, typer.Option(help="dotted path of the decoder blocks, if not detected")
    ] = None,
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> None:
    """Capture residual-stream activations of a dataset into a sharded store."""
    from valueprobe.datasets.io import read_jsonl, sha256_file
    from valueprobe.store import capture_to_store

    _choice("positions", positions, ("last", "mean", "all", "spans", "span_tokens"))
    _choice("site", site, ("resid_post", "resid_pre"))
    _choice("backend", backend, ("hooks", "nnsight", "tlens"))
    _choice("padding-side", padding_side, ("right", "left"))
    examples = read_jsonl(data)
    lm = _load_model(model, layers_path=layers_path, trust_remote_code=trust_remote_code, device=device)
    store = capture_to_store(
        lm, examples, out, layers=layers, site=site, positions=positions, batch_size=batch_size,  # type: ignore[arg-type]
        examples_per_shard=examples_per_shard, dtype=dtype, padding_side=padding_side,  # type: ignore[arg-type]
        max_length=max_length, dataset_path=str(data), dataset_sha256=sha256_file(data),
        backend=backend, remote=remote,  # type: ignore[arg-type]
    )  # fmt: skip
    rows = store.rows()
    table(
        f"capture -> {out}",
        ["model", "fingerprint", "layers", "site", "positions", "examples", "rows", "shards", "dtype"],
        [[store.model_id, store.fingerprint, _layers_str(store.layers), store.site, store.positions,
          len(set(rows.example_id)), store.n_rows, len(store.manifest["shards"]), store.manifest["dtype"]]],
    )  # fmt: skip


def _layers_str(layers: list[int]) -> str:
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueprobeError(f"--{name} {value!r} is not one of: {', '.join(allowed)}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning a ValueprobeError into one line and exit 2."""
    try:
        app(args=argv, standalone_mode=False)
    except ValueprobeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume where supported", file=sys.stderr)
        raise SystemExit(130) from None
    except typer.Exit as exc:  # --help and friends
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except typer.TyperException as exc:  # usage errors: unknown command, missing or bad option
        msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        print(f"error: {msg} (see valueprobe --help)", file=sys.stderr)
        raise SystemExit(2) from None
