"""``valueprobe serve``: an OpenAI-compatible server whose requests steer and whose tokens carry the value.

    valueprobe serve --probe probes/smollm2-135m-value                  # hf engine, 127.0.0.1:8000
    valueprobe serve --probe probes/smollm2-135m-value --host 0.0.0.0 --api-key "$KEY" --max-alpha 8
    valueprobe serve --probe probes/smollm2-135m-value --engine vllm    # pip install 'valueprobe[vllm]'
    valueprobe serve --spec runs/tuned/spec.json        # the server's steering: every request's defaults
    valueprobe explore --probe smollm2-135m-value       # the same on 127.0.0.1, and the workbench's URL

The server steers with one `valueprobe.steering.hook.spec.SteeringSpec` (``--spec FILE``, or
``--probe`` and the steering options): a request's ``steering`` gives its α and may change its
layer, unit and positions; everything else (operator, site, window, condition) is the server's.

Checked before any model loads, each in one line: the host (beyond this machine only with
``--api-key``), the port (bound here, so a port in use fails at once), the probe, ``--max-alpha``,
and that the engine's packages are installed. Then the probe is checked against the model (its
fingerprint, as ``score`` does) and the server runs until Ctrl-C, or SIGTERM, which drains it
(`valueprobe.serve.ops`: --max-queue, --request-timeout, --drain-seconds, --log-prompts).
With no ``--max-alpha`` the α cap is the probe's (`valueprobe.serve.protocol.Limits.alpha_cap`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import quote

import typer

from valueprobe.cli.app import LoadOptions, ModelOpt, app, console, table
from valueprobe.cli.groups import OptionGroup, grouped
from valueprobe.cli.spec import SpecOptions
from valueprobe.errors import ValueprobeError

if TYPE_CHECKING:
    from valueprobe.serve.engine import Engine, ServeOptions

__all__ = ["ENGINES", "explore_command", "serve_command"]


def _need(module: str, install: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueprobeError(f"{what} needs {module}, which is not installed: pip install '{install}'")


def _hf(opts: ServeOptions) -> Engine:
    from valueprobe.serve.hf_engine import HFEngine  # the serve extra: imported once it is checked

    lm = opts.load(opts.model)
    opts.spec.first_axis().check(lm)  # a probe of another model: one line, as score does
    opts.spec.points(lm)  # the spec on this model (layers, sites), before any request
    return HFEngine(lm, model=opts.model)


def _vllm(opts: ServeOptions) -> Engine:
    _need("vllm", "valueprobe[vllm]", "--engine vllm")
    # The vLLM engine lives in its own module (its own extra and environment): it provides
    # make_engine(opts: ServeOptions) -> Engine and plugs into the same HTTP layer.
    module = importlib.import_module("valueprobe.serve.vllm_engine")
    make: Callable[[ServeOptions], Engine] = module.make_engine
    return make(opts)


@dataclass(frozen=True)
class OperatorOptions(OptionGroup):
    """How the server behaves under load and on shutdown (`valueprobe.serve.ops`)."""

    panel = "Operating the server"

    max_queue: Annotated[
        int | None, typer.Option(help="requests admitted at once; one more gets 429 with Retry-After")
    ] = None
    request_timeout: Annotated[
        float | None, typer.Option(help="seconds a request may take; longer gets 504")
    ] = None
    drain_seconds: Annotated[
        float, typer.Option(help="on SIGTERM, seconds in-flight requests get to finish (new ones: 503)")
    ] = 30.0
    log_prompts: Annotated[bool, typer.Option(help="put each request's prompt in its log line")] = False

    def check(self) -> OperatorOptions:
        """Refuse, in one line, a setting that cannot work; returns these options."""
        if self.max_queue is not None and self.max_queue < 1:
            raise ValueprobeError(f"--max-queue {self.max_queue}: give at least 1, or leave it out")
        if self.request_timeout is not None and not (
            math.isfinite(self.request_timeout) and self.request_timeout > 0
        ):
            raise ValueprobeError(
                f"--request-timeout {self.request_timeout}: give seconds > 0, or leave it out"
            )
        if not (math.isfinite(self.drain_seconds) and self.drain_seconds >= 0):
            raise ValueprobeError(f"--drain-seconds {self.drain_seconds}: give seconds >= 0")
        return self


MaxAlphaOpt = Annotated[
    float | None,
    typer.Option(help="refuse (HTTP 400) |alpha| above this; default: the probe's cap (see /v1/models)"),
]
MaxTokensOpt = Annotated[int, typer.Option(help="refuse requests for more new tokens than this")]

# engine name -> (what must be importable before anything loads, the factory)
ENGINES: dict[str, tuple[tuple[tuple[str, str], ...], Callable[[ServeOptions], Engine]]] = {
    "hf": ((("starlette", "valueprobe[serve]"), ("uvicorn", "valueprobe[serve]")), _hf),
    "vllm": (
        (("vllm", "valueprobe[vllm]"), ("starlette", "valueprobe[serve]"), ("uvicorn", "valueprobe[serve]")),
        _vllm,
    ),
}


@app.command("serve")
@grouped
def serve_command(
    model: ModelOpt = "smollm2-135m",
    engine: Annotated[str, typer.Option(help="hf (transformers, batched per-row α) or vllm")] = "hf",
    host: Annotated[
        str, typer.Option(help="address to listen on; beyond 127.0.0.1 needs --api-key")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    api_key: Annotated[
        str | None, typer.Option(help="require 'Authorization: Bearer KEY' on every request")
    ] = None,
    max_alpha: MaxAlphaOpt = None,
    max_tokens: MaxTokensOpt = 4096,
    steering: SpecOptions = SpecOptions(),
    load: LoadOptions = LoadOptions(),
    operate: OperatorOptions = OperatorOptions(),
) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models) with steering and values,
    and the workbench page at /."""
    _run(
        _Server(model, engine, host, port, api_key, max_alpha, max_tokens),
        steering=steering,
        load=load,
        operate=operate,
    )


@app.command("explore")
@grouped
def explore_command(
    model: ModelOpt = "smollm2-135m",
    port: Annotated[int, typer.Option(help="port to listen on (127.0.0.1 only)")] = 8000,
    api_key: Annotated[str | None, typer.Option(help="also ask this key of the page and every call")] = None,
    max_alpha: MaxAlphaOpt = None,
    max_tokens: MaxTokensOpt = 4096,
    steering: SpecOptions = SpecOptions(),
    load: LoadOptions = LoadOptions(),
) -> None:
    """The workbench: serve on 127.0.0.1 and print the page's URL (tokens coloured by value as they
    stream, an α slider, steered beside unsteered and a random direction, a click per token)."""
    _run(
        _Server(model, "hf", "127.0.0.1", port, api_key, max_alpha, max_tokens),
        steering=steering,
        load=load,
        operate=OperatorOptions(),
    )


@dataclass(frozen=True)
class _Server:
    """What `serve` and `explore` share beside the option groups."""

    model: str
    engine: str
    host: str
    port: int
    api_key: str | None
    max_alpha: float | None
    max_tokens: int


def _run(s: _Server, *, steering: SpecOptions, load: LoadOptions, operate: OperatorOptions) -> None:
    """Check everything before the model loads, bind, load, then serve until Ctrl-C."""
    if s.engine not in ENGINES:
        raise ValueprobeError(f"unknown --engine {s.engine!r}: use one of {', '.join(ENGINES)}")
    needs, factory = ENGINES[s.engine]
    for module, install in needs:
        _need(module, install, f"valueprobe serve --engine {s.engine}")
    # the serve extra (starlette, uvicorn): imported only once it is known to be installed
    from valueprobe.serve.app import bind, build_app, check_host, serve
    from valueprobe.serve.guard import LOCAL_HOSTS
    from valueprobe.serve.limits import Limits
    from valueprobe.serve.ops import Operations

    if s.max_alpha is not None and not (math.isfinite(s.max_alpha) and s.max_alpha > 0):
        raise ValueprobeError(f"--max-alpha {s.max_alpha}: give a finite cap > 0, or leave it out")
    if s.max_tokens < 1:
        raise ValueprobeError(f"--max-tokens {s.max_tokens}: give at least 1")
    check_host(s.host, s.api_key)
    operate.check()
    how = load.check()
    if s.engine == "vllm" and how.device_map is not None:
        raise ValueprobeError("--engine vllm places the model itself: leave out --device-map")
    from valueprobe.serve.engine import ServeOptions  # loads the library: when the command runs (cli/app.py)

    spec = steering.to_spec().check()  # a bad probe or spec fails before the model loads
    axis = spec.first_axis()
    with bind(s.host, s.port) as sock:  # a port in use fails before the model loads
        served = factory(ServeOptions(spec, s.model, how.load, how.dtype.value))
        limits = Limits(model=served.model, spec=spec, max_alpha=s.max_alpha, max_tokens=s.max_tokens)
        cap = f"{limits.alpha_cap(axis.best_layer, spec.unit.value):g}" + (
            " (probe)" if s.max_alpha is None else ""
        )
        layers = f"{min(axis.layers)}..{max(axis.layers)}"
        port = sock.getsockname()[1]
        url = f"http://{s.host}:{port}/v1"
        table(
            "serve",
            ["model", "probe", "layers", "best layer", "max |alpha|", "url"],
            [[served.model, Path(str(spec.probe)).name, layers, axis.best_layer, cap, url]],
        )
        page = f"http://{'127.0.0.1' if s.host in ('0.0.0.0', '::') else s.host}:{port}/"
        key = f"?key={quote(s.api_key)}" if s.api_key else ""
        console.print(f"workbench: {page}{key}", soft_wrap=True)
        console.print("Ctrl-C stops it.")
        ops = Operations(
            operate.max_queue, operate.request_timeout, operate.drain_seconds, operate.log_prompts
        )
        _log_to_stderr()
        local = s.host in LOCAL_HOSTS
        serve(build_app(served, limits, api_key=s.api_key, ops=ops, local=local), sock)


def _log_to_stderr() -> None:
    """The server's one line per request, on stderr beside uvicorn's own."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("valueprobe.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
