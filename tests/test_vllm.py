"""The vLLM plugin on SmolLM2, in the second venv (.venv-vllm, built by bash .ci/vllm-env):

    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm.py

Skipped where vLLM does not import (the main venv). Trusted references: the residual stream read
inside the worker by a plain forward hook (h + α·v̂), the HF route's greedy tokens and traced
σ-scores (`valueprobe.steering.decode.generation.generate`), and the same requests run alone.
"""

from __future__ import annotations

import math
import os
from functools import partial
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm.inputs import TokensPrompt  # noqa: E402

import valueprobe as vp  # noqa: E402
from valueprobe.probe.axis import ValueAxis  # noqa: E402
from valueprobe.steering.decode.generation import encode_prompts  # noqa: E402
from valueprobe.steering.decode.sampling import Decoding  # noqa: E402
from valueprobe.steering.hook.spec import SteeringSpec  # noqa: E402
from valueprobe.vllm.generate import VllmGenerator, open_llm, take_values  # noqa: E402
from valueprobe.vllm.request import VllmArgs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROBE = Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-value"


def steering(alpha: float, key: str | None = None, **spec) -> VllmArgs:
    """One request's payload: the probe's spec (``spec``: its fields) at strength ``alpha``."""
    return VllmArgs(SteeringSpec(probe=str(PROBE), **spec), alpha=alpha, key=key)


PROMPTS = [
    [{"role": "user", "content": c}]
    for c in (
        "Describe a robot learning to paint.",
        "Tell me about winter mornings.",
        "Tell me about the history of bicycles.",
        "Write a short story about winter mornings.",
        "Describe gardening.",
        "Is 7 a prime number? Answer yes or no.",
        "Give me three tips for learning to cook.",
        "What is the capital of France?",
        "Explain what a compiler does.",
        "Write a haiku about rain.",
        "Should I learn Python or JavaScript first?",
        "Summarize the plot of a heist movie.",
    )
]


@pytest.fixture(scope="module")
def engine():
    # the recorder below travels to the workers as a pickled reference (test-only)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    lm = vp.load("smollm2-135m")
    axis = ValueAxis.load(PROBE, lm=lm)
    llm = open_llm("smollm2-135m", enforce_eager=True, max_model_len=1024)
    yield lm, axis, llm
    del llm


def _record_block(block: int, model) -> None:
    """In the worker (through ``LLM.apply_model``, pickled by reference): record the residual
    stream (hidden + residual) at ``block``'s output, after the plugin's hook."""
    model._vp_rec = []

    def hook(module, args, output):
        hidden, residual = output
        model._vp_rec.append((hidden + residual).detach().clone())

    model._vp_rec_handle = model.model.layers[block].register_forward_hook(hook)


def _read_and_stop(model):
    model._vp_rec_handle.remove()
    return [t.tolist() for t in model._vp_rec]


def _params(**kw):
    return vllm.SamplingParams(temperature=0.0, **kw)


def test_steered_block_holds_h_plus_alpha_v(engine):
    """At the steered block, the residual stream read by a plain hook after the plugin's is the
    unsteered one plus α·σ·v̂ on every steered position, and untouched elsewhere."""
    lm, axis, llm = engine
    layer, alpha = axis.best_layer, 4.0
    ids = encode_prompts(lm, [PROMPTS[0]])[0]
    prompt = TokensPrompt(prompt_token_ids=ids)

    def run(spec: VllmArgs | None) -> torch.Tensor:
        llm.reset_prefix_cache()
        llm.apply_model(partial(_record_block, layer))
        extra = None if spec is None else spec.extra_args()
        llm.generate([prompt], _params(max_tokens=1, extra_args=extra), use_tqdm=False)
        return torch.tensor(llm.apply_model(_read_and_stop)[0][0])  # [prompt tokens, d_model]

    plain = run(None)
    steered = run(steering(alpha, layers=layer))
    only_generated = run(steering(alpha, layers=layer, positions="generated"))
    step = alpha * axis.sigma_at(layer) * axis.direction(layer).float()
    assert plain.shape == (len(ids), lm.d_model)
    torch.testing.assert_close(steered, plain + step, atol=2e-5, rtol=1e-6)
    assert torch.equal(only_generated, plain)  # the prompt pass is not touched at all


def test_alpha_zero_is_bit_identical_to_no_steering(engine):
    lm, axis, llm = engine
    ids = encode_prompts(lm, PROMPTS[:3])
    prompts = [TokensPrompt(prompt_token_ids=i) for i in ids]
    spec = steering(0.0).extra_args()
    # one request per call, as in the no-plugin test below: a batch's make-up depends on timing
    plain = [llm.generate([p], _params(max_tokens=12, logprobs=1), use_tqdm=False)[0] for p in prompts]
    zero = [
        llm.generate([p], _params(max_tokens=12, logprobs=1, extra_args=spec), use_tqdm=False)[0]
        for p in prompts
    ]
    for a, b in zip(plain, zero, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [{k: v.logprob for k, v in step.items()} for step in a.outputs[0].logprobs] == [
            {k: v.logprob for k, v in step.items()} for step in b.outputs[0].logprobs
        ]


_NO_PLUGIN_SCRIPT = """
import json, sys
if __name__ == "__main__":  # vLLM starts worker processes
    import vllm
    from vllm.inputs import TokensPrompt
    from valueprobe.vllm.generate import engine_kwargs
    from valueprobe.steering.hook.spec import SteeringSpec
    from valueprobe.vllm.request import VllmArgs
    ids, probe = json.loads(sys.argv[1]), sys.argv[2]
    llm = vllm.LLM(**engine_kwargs("smollm2-135m", max_model_len=512))  # torch.compile on: vLLM's default
    extra = VllmArgs(SteeringSpec(probe=probe), alpha=0.0).extra_args() if probe else None
    params = vllm.SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, extra_args=extra)
    # one request per call: a batch's make-up depends on when requests reach the engine core, and
    # another make-up is other GEMM shapes, so a batched comparison would test timing, not the plugin
    outs = [llm.generate([TokensPrompt(prompt_token_ids=i)], params, use_tqdm=False)[0] for i in ids]
    got = [[o.outputs[0].token_ids, [{str(k): v.logprob for k, v in s.items()} for s in o.outputs[0].logprobs]]
           for o in outs]
    print("RESULT " + json.dumps(got), flush=True)
"""


def _subprocess_env(**extra: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return os.environ | {"PYTHONPATH": root, "HF_HUB_OFFLINE": "1"} | extra


def test_alpha_zero_is_bit_identical_to_vllm_without_the_plugin(engine, tmp_path):
    """A fresh vLLM with no plugin at all (``VLLM_PLUGINS=""``) and one with the plugin and α = 0, both
    under vLLM's torch.compile (the default), give the same tokens and bit-identical logprobs: the
    op in the compiled graph changes nothing where there is no work."""
    import json
    import subprocess
    import sys

    lm, _, _ = engine
    ids = json.dumps(encode_prompts(lm, PROMPTS[:3]))
    script = tmp_path / "tokens.py"
    script.write_text(_NO_PLUGIN_SCRIPT)

    def run(probe: str, env: dict[str, str]) -> list:
        done = subprocess.run(
            [sys.executable, str(script), ids, probe], env=env, capture_output=True, text=True, timeout=600
        )
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        assert done.returncode == 0 and lines, done.stderr[-2000:]
        return json.loads(lines[-1].removeprefix("RESULT "))

    without = run("", _subprocess_env(VLLM_PLUGINS=""))
    with_plugin = run(str(PROBE), _subprocess_env())
    assert len(without) == 3 and all(len(tokens) == 12 for tokens, _ in without)
    for (tokens, logprobs), (plain_tokens, plain_logprobs) in zip(with_plugin, without, strict=True):
        first = next(
            (i for i, (a, b) in enumerate(zip(logprobs, plain_logprobs, strict=False)) if a != b), None
        )
        assert tokens == plain_tokens and first is None, (
            first,
            logprobs[first or 0],
            plain_logprobs[first or 0],
        )


def test_an_engine_without_the_plugin_is_refused_before_it_starts(tmp_path):
    """``VLLM_PLUGINS`` naming only another plugin: ``serve --engine vllm`` and ``steer --engine
    vllm`` each stop with one line that says why and how to fix it, before any engine starts."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = _subprocess_env(VLLM_PLUGINS="lora_filesystem_resolver")
    serve = ["serve", "--engine", "vllm", "--probe", str(PROBE), "--port", "0"]
    steer = ["steer", "--engine", "vllm", "--probe", str(PROBE), "--out", str(tmp_path / "sweep")]
    steer += ["--prompts", str(root / "data" / "steer_open.jsonl"), "--limit", "1"]
    for argv in (serve, steer):
        done = subprocess.run(
            [sys.executable, "-m", "valueprobe", *argv], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2, (argv[0], done.stderr[-2000:])
        errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and "VLLM_PLUGINS='lora_filesystem_resolver'" in errors[0], done.stderr[
            -2000:
        ]
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "sweep" / "generations.jsonl").exists()
    # vLLM places the model itself: --device-map is refused before it starts, for serve as for steer
    done = subprocess.run(
        [sys.executable, "-m", "valueprobe", *serve, "--device-map", "auto"],
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "--engine vllm places the model itself" in done.stderr, done.stderr[
        -2000:
    ]


def test_vllm_greedy_matches_hf_route(engine):
    """Greedy tokens through vLLM equal the HF route's at α ∈ {−4σ, 0, +4σ} on >= 90% of 12
    prompts each, and the per-token values equal the HF trace at the steered point."""
    lm, axis, llm = engine
    alphas = [-4.0, 0.0, 4.0]
    hf = vp.generate(
        lm,
        axis,
        PROMPTS,
        decoding=Decoding(greedy=True, max_new_tokens=24),
        alphas=alphas,
        trace=True,
        progress=False,
    )
    got = VllmGenerator(llm).with_values(
        lm,
        SteeringSpec(axis, probe=str(PROBE)),
        PROMPTS,
        alphas=alphas,
        decoding=Decoding(greedy=True, max_new_tokens=24),
    )
    steered = f"resid_post[{axis.best_layer}]"
    report = []
    for a in alphas:
        pairs = [(h, g) for h, g in zip(hf, got, strict=True) if h.alpha == a]
        same = sum(h.token_ids == g.generation.token_ids for h, g in pairs)
        agree = sum(
            _prefix(h.token_ids, g.generation.token_ids) / max(len(h.token_ids), 1) for h, g in pairs
        ) / len(pairs)
        report.append(f"alpha {a:+g}: {same}/12 identical, token agreement {agree:.3f}")
        assert same >= 11, report
    print("; ".join(report))
    for h, g in zip(hf, got, strict=True):
        if h.token_ids != g.generation.token_ids:
            continue
        assert h.trace is not None
        n = h.trace.n_prompt
        expected = h.trace.values[steered][n - 1 : n - 1 + len(h.token_ids)]
        assert len(g.values) >= len(expected)
        torch.testing.assert_close(
            torch.tensor(g.values[: len(expected)]), torch.tensor(expected), atol=2e-3, rtol=1e-3
        )


def _prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Tokens the two agree on before they first differ (two empty outputs agree fully: 1)."""
    if a == b:
        return max(len(a), 1)
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_batched_alphas_equal_each_request_alone(engine):
    lm, axis, llm = engine
    gen = VllmGenerator(llm)
    spec, decoding = SteeringSpec(axis, probe=str(PROBE)), Decoding(greedy=True, max_new_tokens=16)
    alphas = [-4.0, -2.0, 0.0, 2.0, 4.0]
    together = gen.with_values(lm, spec, PROMPTS[:2], alphas=alphas, decoding=decoding, progress=False)
    for row in together:
        alone = gen.with_values(
            lm,
            spec,
            [PROMPTS[row.generation.prompt]],
            alphas=[row.generation.alpha],
            decoding=decoding,
            progress=False,
        )[0]
        assert alone.generation.token_ids == row.generation.token_ids
        torch.testing.assert_close(torch.tensor(alone.values), torch.tensor(row.values), atol=1e-4, rtol=1e-4)


def test_prefix_cache_never_shares_steered_kv(engine):
    """Steered and unsteered requests for one long prompt do not share cache blocks; two requests
    with the same steering do, and α = 0 shares with no steering (it is bit-identical)."""
    lm, axis, llm = engine
    text = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." for i in range(40))
    ids = lm.tokenizer(text)["input_ids"]
    prompt = TokensPrompt(prompt_token_ids=ids)
    llm.reset_prefix_cache()

    def cached(alpha: float | None) -> int:
        extra = None if alpha is None else steering(alpha).extra_args()
        out = llm.generate([prompt], _params(max_tokens=1, extra_args=extra), use_tqdm=False)[0]
        return int(out.num_cached_tokens or 0)

    assert cached(None) == 0
    assert cached(None) > 0  # the cache is on and this prompt fills blocks
    assert cached(4.0) == 0  # steered: never the unsteered blocks
    assert cached(4.0) > 0  # the same steering shares
    assert cached(-4.0) == 0  # another strength does not
    assert cached(0.0) > 0  # α = 0 shares the unsteered blocks


def test_values_are_taken_once(engine):
    lm, axis, llm = engine
    ids = encode_prompts(lm, [PROMPTS[5]])[0]
    spec = steering(2.0, key="once")
    out = llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        _params(max_tokens=5, extra_args=spec.extra_args()),
        use_tqdm=False,
    )[0]
    values = take_values(llm, ["once"])["once"]
    assert len(values) == len(out.outputs[0].token_ids) and all(math.isfinite(v) for v in values)
    assert take_values(llm, ["once"]) == {}


def test_serve_engine_streams_values_that_order_by_alpha(engine):
    """The serve engine on vLLM: concurrent requests, each with its own α, stream one chunk per
    token; read three layers downstream of the steering, the first token's value orders by α."""
    import asyncio

    from valueprobe.serve.protocol import SteerRequest
    from valueprobe.serve.vllm_engine import VllmEngine

    lm, axis, _ = engine
    layer = axis.best_layer
    spec = SteeringSpec(axis, probe=str(PROBE), layers=layer, read_layer=layer + 3)

    def request(i: int, alpha: float | None) -> SteerRequest:
        return SteerRequest(
            id=f"req-{i}",
            prompt=None,
            messages=tuple(PROMPTS[1]),
            max_tokens=8,
            temperature=0.0,
            top_p=1.0,
            seed=None,
            spec=spec,
            alpha=0.0 if alpha is None else alpha,
            steered=alpha is not None,
        )

    async def run() -> list[list]:
        served = VllmEngine(spec, "smollm2-135m", enforce_eager=True)
        try:
            await served.start()
            alphas = [-8.0, -4.0, None, 4.0, 8.0]

            async def one(i: int, a: float | None) -> list:
                return [c async for c in served.submit(request(i, a))]

            return await asyncio.gather(*(one(i, a) for i, a in enumerate(alphas)))
        finally:
            await served.close()

    streams = asyncio.run(run())
    for chunks in streams:
        assert 1 <= len(chunks) <= 8 and chunks[-1].finish_reason in ("stop", "length")
        assert all(c.finish_reason is None for c in chunks[:-1])
        assert all(math.isfinite(c.value) for c in chunks)
    first = [chunks[0].value for chunks in streams]
    assert first == sorted(first) and first[0] < first[-1] - 1.0


@pytest.fixture(scope="module")
def vllm_server(engine):
    """``valueprobe serve --engine vllm``'s app on a free loopback port (uvicorn in a thread)."""
    import threading
    import time

    import uvicorn

    from valueprobe.serve.app import bind, build_app
    from valueprobe.serve.limits import Limits
    from valueprobe.serve.vllm_engine import VllmEngine

    lm, axis, _ = engine
    spec = SteeringSpec(axis, probe=str(PROBE))
    served = VllmEngine(spec, "smollm2-135m", enforce_eager=True)
    sock = bind("127.0.0.1", 0)
    app = build_app(served, Limits(model="smollm2-135m", spec=spec, max_alpha=10.0, max_tokens=64))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()


def test_openai_client_gets_steered_completions_and_values_from_vllm(vllm_server, engine):
    import openai

    lm, axis, llm = engine
    client = openai.OpenAI(base_url=vllm_server, api_key="none", max_retries=0, timeout=120)
    extra = {"steering": {"alpha": 4.0}}
    whole = client.completions.create(
        model="smollm2-135m", prompt="The capital of France is", max_tokens=6, temperature=0, extra_body=extra
    ).choices[0]
    values = whole.model_extra["values"]
    assert len(values) >= 1 and all(math.isfinite(v) for v in values)
    # the same request offline through the plugin: the same tokens and values
    ids = lm.tokenizer("The capital of France is")["input_ids"]
    # the server reads after the addition by default (value_at), as the hf engine does
    spec = VllmArgs(SteeringSpec(probe=str(PROBE), layers=axis.best_layer), 4.0, "http-ref", "after")
    ref = llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        _params(max_tokens=6, extra_args=spec.extra_args()),
        use_tqdm=False,
    )[0]
    assert whole.text == ref.outputs[0].text
    torch.testing.assert_close(torch.tensor(values), torch.tensor(take_values(llm, ["http-ref"])["http-ref"]))
    pieces, streamed = [], []
    for chunk in client.chat.completions.create(
        model="smollm2-135m",
        messages=PROMPTS[2],
        max_tokens=6,
        temperature=0,
        stream=True,
        extra_body=extra,
    ):
        pieces.append(chunk.choices[0].delta.content or "")
        streamed += chunk.choices[0].model_extra.get("values") or []
    chat = client.chat.completions.create(
        model="smollm2-135m", messages=PROMPTS[2], max_tokens=6, temperature=0, extra_body=extra
    ).choices[0]
    assert "".join(pieces) == chat.message.content
    assert streamed == pytest.approx(chat.model_extra["values"], abs=1e-5)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(
            model="smollm2-135m", prompt="x", max_tokens=2, extra_body={"steering": {"alpha": 99}}
        )
    assert bad.value.body["param"].startswith("steering")


def test_sixteen_concurrent_clients_each_get_their_own_steering(vllm_server, engine):
    """16 clients at once, each with its own α, read three layers downstream: values order by α."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    _, axis, _ = engine
    client = openai.OpenAI(base_url=vllm_server, api_key="none", max_retries=0, timeout=300)
    alphas = [-8.0 + i for i in range(16)]

    def one(alpha: float) -> list[float]:
        got = client.completions.create(
            model="smollm2-135m",
            prompt="My favourite season is",
            max_tokens=4,
            temperature=0,
            extra_body={"steering": {"alpha": alpha}, "value_layer": axis.best_layer + 3},
        )
        return got.choices[0].model_extra["values"]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, alphas))
    first = [v[0] for v in got]
    assert first == sorted(first) and first[0] < first[-1] - 1.0


def test_steer_engine_vllm_writes_the_sweep_files(tmp_path, capsys):
    """``valueprobe steer --engine vllm``: the same folder as the HF route (settings, one row per
    (prompt, α, direction), metrics, dose figure), the engine recorded in settings.json."""
    import json

    from conftest import run_cli

    out = tmp_path / "sweep"
    root = Path(__file__).resolve().parents[1]
    args = [
        "steer",
        "--probe",
        str(PROBE),
        "--prompts",
        str(root / "data" / "steer_open.jsonl"),
        "--out",
        str(out),
    ]
    # the plain prompt only: --conditions' default (auto) adds toward/away rows where steer_conditions states them
    args += [
        "--engine",
        "vllm",
        "--limit",
        "2",
        "--alphas",
        "-4,4",
        "--random-directions",
        "1",
        "--conditions",
        "none",
    ]
    code, _, err = run_cli([*args, "--max-new-tokens", "8", "--greedy", "--bootstrap", "50"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 and {r["direction"] for r in rows} == {"axis", "random-0"}
    assert json.loads((out / "settings.json").read_text())["engine"] == "vllm"
    for name in ("metrics.json", "metrics.csv", "dose.html"):
        assert (out / name).is_file()


def _post(url: str, path: str, body: dict) -> dict:
    import httpx

    r = httpx.post(f"{url}/{path}", json={"model": "smollm2-135m", "temperature": 0} | body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _hf_logits(lm, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """The HF model's float32 logits at each position that produced one of ``token_ids``."""
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([prompt_ids + token_ids[:-1]]))
    return out.logits[0, len(prompt_ids) - 1 :].float()


def test_vllm_serves_value_at_logprobs_penalties_n_and_stop_through_the_shared_layer(vllm_server, engine):
    """The request fields of the shared layer on the vLLM engine, each against a reference: value_at
    (after = before + α for α σ at the read layer, a closed form), logprobs (the HF model's own
    log_softmax at vLLM's tokens), penalties (each token the penalized argmax of the HF logits, up to
    float noise), n (each choice = the request alone with seed + index), stop (the free text cut)."""
    lm, axis, _ = engine
    layer, chat = axis.best_layer, PROMPTS[5]
    steer = {
        "steering": {"alpha": 3.0, "layer": layer},
        "value_layer": layer,
        "max_tokens": 6,
        "ignore_eos": True,
    }
    after = _post(vllm_server, "completions", {"prompt": "My favourite season is"} | steer)
    before = _post(
        vllm_server, "completions", {"prompt": "My favourite season is", "value_at": "before"} | steer
    )
    a, b = after["choices"][0], before["choices"][0]
    assert a["token_ids"] == b["token_ids"] and after["value_read"]["at"] == "after"
    assert [x - y for x, y in zip(a["values"], b["values"], strict=True)] == pytest.approx(
        [3.0] * 6, abs=1e-2
    )

    got = _post(
        vllm_server,
        "chat/completions",
        {"messages": chat, "max_tokens": 8, "logprobs": True, "top_logprobs": 3},
    )
    ids = got["choices"][0]["token_ids"]
    (prompt,) = encode_prompts(lm, [chat])
    ref = torch.log_softmax(_hf_logits(lm, prompt, ids), dim=-1)
    content = got["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in content] == pytest.approx(
        [float(ref[i, t]) for i, t in enumerate(ids)], abs=2e-3
    )
    for i, e in enumerate(content):
        assert [t["logprob"] for t in e["top_logprobs"]] == pytest.approx(
            torch.topk(ref[i], 3).values.tolist(), abs=2e-3
        )
        assert e["token"] == lm.tokenizer.decode([ids[i]])
    text = _post(
        vllm_server, "completions", {"prompt": "The capital of France is", "max_tokens": 4, "logprobs": 2}
    )
    assert all(len(t) == 2 for t in text["choices"][0]["logprobs"]["top_logprobs"])

    body = {"prompt": "One, two, one, two, one,", "max_tokens": 10}
    plain = _post(vllm_server, "completions", body)["choices"][0]["token_ids"]
    pen = _post(vllm_server, "completions", body | {"frequency_penalty": 1.5, "presence_penalty": 0.5})
    ids = pen["choices"][0]["token_ids"]
    assert ids != plain, "the penalties changed nothing"
    (prompt,) = encode_prompts(lm, [body["prompt"]], chat=False)
    logits = _hf_logits(lm, prompt, ids)
    for i, t in enumerate(ids):
        counts = torch.bincount(torch.tensor(ids[:i], dtype=torch.long), minlength=logits.shape[1]).float()
        penalized = logits[i] - 1.5 * counts - 0.5 * (counts > 0).float()
        assert float(penalized.max() - penalized[t]) < 1e-2, (i, t)

    sampled = {"prompt": "My favourite season is", "max_tokens": 5, "temperature": 1.0}
    both = _post(vllm_server, "completions", sampled | {"n": 2, "seed": 5})["choices"]
    for i, choice in enumerate(both):
        alone = _post(vllm_server, "completions", sampled | {"seed": 5 + i})["choices"][0]
        assert choice["token_ids"] == alone["token_ids"]
        assert choice["values"] == pytest.approx(alone["values"], abs=1e-4)
        assert len(choice["values"]) == len(choice["token_ids"]) and all(map(math.isfinite, choice["values"]))

    free = _post(vllm_server, "completions", {"prompt": "The capital of France is", "max_tokens": 12})[
        "choices"
    ][0]["text"]
    stop = next(
        free[i : i + 2]
        for i in range(1, len(free) - 2)
        if free[i : i + 2].strip() and free.find(free[i : i + 2]) == i
    )
    cut = _post(
        vllm_server, "completions", {"prompt": "The capital of France is", "max_tokens": 12, "stop": [stop]}
    )
    assert (
        cut["choices"][0]["text"] == free[: free.find(stop)] and cut["choices"][0]["finish_reason"] == "stop"
    )
