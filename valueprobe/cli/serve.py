"""``valueprobe serve``: an OpenAI-compatible server whose requests steer and whose tokens carry the value.

    valueprobe serve --probe probes/smollm2-135m-value                  # hf engine, 127.0.0.1:8000
    valueprobe serve --probe probes/smollm2-135m-value --host 0.0.0.0 --api-key "$KEY" --max-alpha 8
    valueprobe serve --probe probes/smollm2-135m-value --engine vllm    # pip install 'valueprobe[vllm]'

Checked before any model loads, each in one line: the host (beyond this machine only with
``--api-key``), the port (bound here, so a port in use fails at once), the probe, ``--max-alpha``,
and that the engine's packages are installed. Then the probe is checked against the model (its
fingerprint, as ``score`` does) and the server runs until Ctrl-C.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from valueprobe.cli.app import (
    DeviceMapOpt,
    DeviceOpt,
    LayersPathOpt,
    LoadOptions,
    ModelDtypeOpt,
    ModelOpt,
    OffloadFolderOpt,
    TrustOpt,
    app,
    console,
    probe_option,
    table,
)
from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.serve.engine import ServeOptions
from valueprobe.vocab import ModelDtype

if TYPE_CHECKING:
    from valueprobe.serve.engine import Engine

__all__ = ["ENGINES", "serve_cmd"]


def _need(module: str, install: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueprobeError(f"{what} needs {module}, which is not installed: pip install '{install}'")


def _hf(opts: ServeOptions) -> Engine:
    from valueprobe.serve.hf_engine import HFEngine  # the serve extra: imported once it is checked

    lm = opts.load(opts.model)
    opts.axis.check(lm)  # a probe of another model: one line, as score does
    return HFEngine(lm, opts.axis, model=opts.model)


def _vllm(opts: ServeOptions) -> Engine:
    _need("vllm", "valueprobe[vllm]", "--engine vllm")
    # The vLLM engine lives in its own module (its own extra and environment): it provides
    # make_engine(opts: ServeOptions) -> Engine and plugs into the same HTTP layer.
    module = importlib.import_module("valueprobe.serve.vllm_engine")
    make: Callable[[ServeOptions], Engine] = module.make_engine
    return make(opts)


# engine name -> (what must be importable before anything loads, the factory)
ENGINES: dict[str, tuple[tuple[tuple[str, str], ...], Callable[[ServeOptions], Engine]]] = {
    "hf": ((("starlette", "valueprobe[serve]"), ("uvicorn", "valueprobe[serve]")), _hf),
    "vllm": (
        (("vllm", "valueprobe[vllm]"), ("starlette", "valueprobe[serve]"), ("uvicorn", "valueprobe[serve]")),
        _vllm,
    ),
}


@app.command("serve")
def serve_cmd(
    probe: Annotated[Path, probe_option("the axis requests steer along")],
    model: ModelOpt = "smollm2-135m",
    engine: Annotated[str, typer.Option(help="hf (transformers, batched per-row α) or vllm")] = "hf",
    host: Annotated[
        str, typer.Option(help="address to listen on; beyond 127.0.0.1 needs --api-key")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    api_key: Annotated[
        str | None, typer.Option(help="require 'Authorization: Bearer KEY' on every request")
    ] = None,
    max_alpha: Annotated[
        float | None, typer.Option(help="refuse (HTTP 400) any request with |alpha| above this")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="refuse requests for more new tokens than this")] = 4096,
    layers_path: LayersPathOpt = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    device_map: DeviceMapOpt = None,
    model_dtype: ModelDtypeOpt = ModelDtype.float32,
    offload_folder: OffloadFolderOpt = None,
) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models) with steering and values."""
    if engine not in ENGINES:
        raise ValueprobeError(f"unknown --engine {engine!r}: use one of {', '.join(ENGINES)}")
    needs, factory = ENGINES[engine]
    for module, install in needs:
        _need(module, install, f"valueprobe serve --engine {engine}")
    # the serve extra (starlette, uvicorn): imported only once it is known to be installed
    from valueprobe.serve.app import bind, build_app, check_host, serve
    from valueprobe.serve.protocol import Limits

    if max_alpha is not None and not (math.isfinite(max_alpha) and max_alpha > 0):
        raise ValueprobeError(f"--max-alpha {max_alpha}: give a finite cap > 0, or leave it out")
    if max_tokens < 1:
        raise ValueprobeError(f"--max-tokens {max_tokens}: give at least 1")
    check_host(host, api_key)
    how = LoadOptions(device, device_map, model_dtype, offload_folder, layers_path, trust_remote_code).check()
    if engine == "vllm" and how.device_map is not None:
        raise ValueprobeError("--engine vllm places the model itself: leave out --device-map")
    axis = ValueAxis.load(probe)  # a bad probe fails before the model loads
    with bind(host, port) as sock:  # a port in use fails before the model loads
        served = factory(ServeOptions(probe, axis, model, how.load, how.dtype.value))
        limits = Limits(model=served.model, axis=axis, max_alpha=max_alpha, max_tokens=max_tokens)
        cap = "none" if max_alpha is None else f"{max_alpha:g}"
        layers = f"{min(axis.layers)}..{max(axis.layers)}"
        url = f"http://{host}:{port}/v1"
        table(
            "serve",
            ["model", "probe", "layers", "best layer", "max |alpha|", "url"],
            [[served.model, probe.name, layers, axis.best_layer, cap, url]],
        )
        console.print("Ctrl-C stops it.")
        serve(build_app(served, limits, api_key=api_key), sock)
