"""The workbench page at ``/`` of ``valueprobe serve``, and the three API routes it reads.

    valueprobe explore --probe smollm2-135m-value         # serve on 127.0.0.1, print the page's URL

The page (``serve/page/``: one HTML file, one script, one stylesheet, shipped in the wheel; no CDN,
nothing fetched from elsewhere) is a client of the OpenAI API this server speaks: it streams
``/v1/chat/completions`` (or ``/v1/completions`` for raw text) with ``steering`` per request and
colours each token by the ``values`` the stream carries. Beside it, these routes (under the same
API key and origin rules, `valueprobe.serve.guard`):

- ``POST /v1/inspect``: one generated token in context: the value at every layer of the forward
  that produced it (under the request's steering), the token's log-probability and the likeliest
  alternatives there. Body: a completion request's fields (``model``, ``messages`` or ``prompt``,
  ``steering``, ``value_layer``) plus ``token_ids`` (the generated tokens), ``index`` (which one)
  and ``alternatives`` (how many).
- ``GET /v1/logit_lens?layer=L&k=10``: the tokens the axis promotes and suppresses at layer L.
- ``POST /v1/spec``: the request's steering as a `SteeringSpec` file (what ``steer --spec``,
  ``serve --spec`` and ``vp.SteeringSpec.load`` read), with its α and a command that runs it.

Nothing is kept between requests: the page sends everything each time (the conversation, the
session's random-direction seed).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from importlib import resources
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from valueprobe.activations.prompts import prompt_ids
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.read.readout import logit_lens
from valueprobe.read.values import read_context
from valueprobe.serve.engine import Engine, OnModel
from valueprobe.serve.errors import RequestError, error_body
from valueprobe.serve.limits import Limits, check_layer
from valueprobe.serve.protocol import SteerRequest, parse_request, parse_steering
from valueprobe.steering.hook.handle import steer

__all__ = ["ASSETS", "CSP", "workbench_routes"]

ASSETS = {"workbench.js": "text/javascript", "workbench.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:;"
    " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_TOP = 20


def _asset(name: str) -> bytes:
    return resources.files("valueprobe.serve").joinpath("page", name).read_bytes()


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, param=exc.param), status_code=400)


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        raise RequestError("body", "is not valid JSON") from None


def _ints(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RequestError(name, "must be a list of token ids")
    return value


def _inspect(
    lm: LoadedModel, req: SteerRequest, generated: list[int], index: int, top: int
) -> dict[str, Any]:
    """In the model's worker: the forward that produced ``generated[index]`` after the prompt,
    steered as the request was; the value at every layer and the next-token log-probabilities."""
    prompt = req.prompt if req.messages is None else [dict(m) for m in req.messages]
    assert prompt is not None
    where = "prompt" if req.messages is None else "messages"
    try:
        ids = prompt_ids(lm, prompt, chat=False, where=where)  # as the engine renders it
    except ValueprobeError as exc:
        raise RequestError(where, str(exc)) from None
    try:
        prompt_ids(lm, generated, where="token_ids")  # ids of this tokenizer's vocabulary
    except ValueprobeError as exc:
        raise RequestError("token_ids", str(exc)) from None
    context = ids + generated[:index]
    limit = int(getattr(lm.model.config, "max_position_embeddings", 0) or 0)
    if limit and len(context) > limit:
        raise RequestError("token_ids", f"{len(context)} tokens exceed the model's context {limit}")
    axis = req.spec.first_axis()
    with steer(lm, req.spec, req.alpha, prompt_length=len(ids)):
        by_layer, logprobs = read_context(lm, axis, context, axis.layers)
    token = generated[index]
    best = torch.topk(logprobs, min(top, logprobs.numel()))
    decode = lm.tokenizer.decode
    return {
        "index": index,
        "token_id": token,
        "token": decode([token]),
        "position": len(context) - 1,
        "layers": [{"layer": layer, "value": v.sigma[-1]} for layer, v in by_layer.items()],
        "logprob": float(logprobs[token]),
        "alternatives": [
            {"token": decode([int(i)]), "token_id": int(i), "logprob": float(lp)}
            for i, lp in zip(best.indices, best.values, strict=True)
        ],
        "value_read": req.value_read(),
        "steering": req.steering(),
    }


def workbench_routes(engine: Engine, limits: Limits) -> list[Route]:
    """The page, its assets, and the three routes it reads (see the module doc)."""
    on_model = engine.on_model if isinstance(engine, OnModel) else None

    async def page(request: Request) -> Response:
        return Response(_asset("index.html"), media_type="text/html; charset=utf-8", headers=_HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return JSONResponse(error_body(f"no asset {name!r}", kind="not_found_error"), status_code=404)
        return Response(_asset(name), media_type=f"{ASSETS[name]}; charset=utf-8", headers=_HEADERS)

    def needs_model() -> JSONResponse:
        return JSONResponse(
            error_body(
                "this route reads the transformers model: serve with --engine hf", kind="not_found_error"
            ),
            status_code=404,
        )

    async def inspect(request: Request) -> Response:
        if on_model is None:
            return needs_model()
        try:
            body = await _body(request)
            req = parse_request(body, limits, chat="messages" in body if isinstance(body, dict) else False)
            generated = _ints(body.get("token_ids"), "token_ids")
            index = body.get("index")
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(generated):
                raise RequestError("index", f"must be a token's index in token_ids (0..{len(generated) - 1})")
            top = body.get("alternatives", 5)
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP:
                raise RequestError("alternatives", f"must be an integer in [0, {MAX_TOP}]")
            return JSONResponse(await on_model(lambda lm: _inspect(lm, req, generated, index, top)))
        except RequestError as exc:
            return _error(exc)

    async def lens(request: Request) -> Response:
        if on_model is None:
            return needs_model()
        axis = limits.spec.first_axis()
        try:
            layer = check_layer(_query_int(request, "layer"), limits, "layer", axis.best_layer)
            k = _query_int(request, "k") or 10
            if not 1 <= k <= 50:
                raise RequestError("k", "must be in [1, 50]")
        except RequestError as exc:
            return _error(exc)
        found = await on_model(lambda lm: logit_lens(axis, lm, layer=layer, k=k))
        return JSONResponse({key: found[key] for key in ("layer", "promoted", "suppressed")})

    async def spec(request: Request) -> Response:
        try:
            body = await _body(request)
            if not isinstance(body, dict):
                raise RequestError("body", "must be a JSON object")
            steering = parse_steering(body.get("steering") or {"alpha": 0.0}, limits)
            assert steering is not None
            chosen, alpha = steering
            layer = check_layer(body.get("value_layer"), limits, "value_layer", limits.spec.read_layer)
            chosen = replace(chosen, read_layer=layer)
            if chosen.probe is None:
                raise RequestError("steering", "the server's axis has no probe folder to name in a spec file")
            return JSONResponse({"spec": chosen.to_dict(), "alpha": alpha, "command": _command(alpha)})
        except RequestError as exc:
            return _error(exc)

    return [
        Route("/", page, methods=["GET"]),
        Route("/workbench/{name}", asset, methods=["GET"]),
        Route("/v1/inspect", inspect, methods=["POST"]),
        Route("/v1/logit_lens", lens, methods=["GET"]),
        Route("/v1/spec", spec, methods=["POST"]),
    ]


def _query_int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise RequestError(name, f"must be an integer, got {raw!r}") from None


def _command(alpha: float) -> str:
    """``valueprobe steer`` with the spec file at this α beside 0, over a prompts file of yours."""
    alphas = f"0,{alpha:g}" if alpha else "0,1"
    words = ["valueprobe", "steer", "--spec", "spec.json", "--prompts", "prompts.jsonl", f"--alphas={alphas}"]
    return shlex.join([*words, "--out", "runs/workbench"])
