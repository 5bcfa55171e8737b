"""``valueprobe serve``: the OpenAI API with steering and per-token values, through the official client.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_serve.py``
References: the steered ``generate`` path (`valueprobe.steering.decode.generation.generate`, greedy
tokens), ``output_hidden_states`` under the `steer` handle (each token's σ-score at the value
layer), each request run alone (batched = alone), and α's order (readouts order by strength).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest
import torch
import uvicorn
from conftest import curl_events, run_cli
from test_cli_faults import one_line
from test_steer import planted_axis  # tests/ is on sys.path under pytest

from valueprobe.hooks.route import position_ids_from_mask
from valueprobe.serve import hf_engine
from valueprobe.serve.app import bind, build_app
from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.limits import Limits
from valueprobe.serve.ops import Operations
from valueprobe.steering.decode.generation import encode_prompts, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.spec import SteeringSpec

MODEL = "tiny-serve"
STEER_LAYER, VALUE_LAYER = 1, 2  # 4 blocks: resid_post[2] is hidden_states[3], before the final norm
MAX_ALPHA = 8.0
PROMPT = "The capital of France is"


class Server:
    """uvicorn on a free loopback port in a thread, serving ``build_app``; stopped by ``close``."""

    def __init__(
        self, engine: HFEngine, limits: Limits, *, api_key: str | None = None, ops: Operations | None = None
    ) -> None:
        self.engine = engine
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(engine, limits, api_key=api_key, ops=ops), log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=api_key, max_retries=0, timeout=60)

    def idle(self) -> None:
        """Wait until the engine's worker has finished the batch it last ran, hooks detached. The
        model is shared with the test: a forward on the test's thread while a batch detaches its
        hooks races the detach (PyTorch's hook tables are not thread-safe)."""
        self.engine.worker.submit(lambda: None).result()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def lm(tiny_lm_factory):
    return tiny_lm_factory("llama", n_layers=4)


@pytest.fixture(scope="module")
def axis(lm):
    a = planted_axis(lm)
    return type(a)(**{**a.__dict__, "best_layer": STEER_LAYER})


@pytest.fixture(scope="module")
def server(lm, axis):
    s = Server(
        HFEngine(lm, model=MODEL, window_s=0.15), Limits(MODEL, SteeringSpec(axis), max_alpha=MAX_ALPHA)
    )
    yield s
    s.close()


def _complete(client: openai.OpenAI, alpha: float | None, *, prompt: str = PROMPT, max_tokens: int = 6, **kw):
    extra = {"value_layer": VALUE_LAYER} | ({} if alpha is None else {"steering": {"alpha": alpha}})
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=extra, **kw
    )


def _together(server: Server, alphas: list[float | None], *, max_tokens: int) -> list:
    """One client per α, all released at once (a barrier), so the requests meet in one window."""
    clients = [server.client() for _ in alphas]
    gate = threading.Barrier(len(alphas))

    def one(i: int):
        gate.wait()
        return _complete(clients[i], alphas[i], max_tokens=max_tokens).choices[0]

    with ThreadPoolExecutor(len(alphas)) as pool:
        return list(pool.map(one, range(len(alphas))))


def _reference_values(lm, axis, prompt: str, alpha: float, token_ids: list[int]) -> list[float]:
    """Each generated token's σ-score at VALUE_LAYER, from ``output_hidden_states`` under `steer`:
    token i is read at the position that produced it (the last prompt token for i = 0)."""
    (ids,) = encode_prompts(lm, [prompt], chat=False)  # /v1/completions: the prompt as is
    full = torch.tensor([ids + token_ids[:-1]])
    mask = torch.ones_like(full)
    with steer(lm, SteeringSpec(axis, layers=[STEER_LAYER]), alpha), torch.no_grad():
        out = lm.model(
            input_ids=full,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            output_hidden_states=True,
        )
    h = out.hidden_states[VALUE_LAYER + 1][0, len(ids) - 1 :]
    return [float(x) for x in axis.score(h.float(), VALUE_LAYER)]


def test_models_lists_the_served_model(server):
    assert [m.id for m in server.client().models.list().data] == [MODEL]


@pytest.mark.parametrize("alpha", [-4.0, 3.0])
def test_completion_is_the_steered_generation_with_its_values(server, lm, axis, alpha):
    got = _complete(server.client(), alpha)
    choice = got.choices[0]
    server.idle()
    ref = generate(
        lm,
        SteeringSpec(axis, layers=[STEER_LAYER]),
        [PROMPT],
        decoding=Decoding(greedy=True, max_new_tokens=6),
        alphas=[alpha],
        progress=False,
        chat=False,
    )[0]
    ids = choice.model_extra["token_ids"]
    assert ids == list(ref.token_ids)[: len(ids)] and choice.text == ref.text
    values = choice.model_extra["values"]
    assert len(values) == len(ids) == 6
    assert values == pytest.approx(_reference_values(lm, axis, PROMPT, alpha, ids), abs=1e-4)
    assert (
        got.usage.prompt_tokens == len(encode_prompts(lm, [PROMPT], chat=False)[0])
        and got.usage.completion_tokens == 6
    )
    assert got.model_extra["steering"] == {
        "alpha": alpha,
        "unit": "sigma",
        "layer": STEER_LAYER,
        "positions": "all",
    }


def test_chat_stream_equals_chat_whole(server):
    client = server.client()
    body = dict(
        model=MODEL, messages=[{"role": "user", "content": "Is 7 prime?"}], max_tokens=5, temperature=0
    )
    extra = {"steering": {"alpha": 2, "positions": "generated"}, "value_layer": VALUE_LAYER}
    whole = client.chat.completions.create(**body, extra_body=extra).choices[0]
    pieces, values, reasons = [], [], []
    for chunk in client.chat.completions.create(**body, extra_body=extra, stream=True):
        c = chunk.choices[0]
        pieces.append(c.delta.content or "")
        values += c.model_extra["values"]
        reasons.append(c.finish_reason)
    assert "".join(pieces) == whole.message.content
    assert values == pytest.approx(whole.model_extra["values"], abs=1e-6)
    assert reasons[-1] == whole.finish_reason and all(r is None for r in reasons[:-1])


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_curl_stream_ends_in_done(server):
    events = curl_events(
        f"{server.url}/completions",
        {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "steering": {"alpha": 1},
            "value_layer": VALUE_LAYER,
        },
    )
    assert len(events) == 4
    chunks = [e["choices"][0] for e in events]
    whole = _complete(server.client(), 1.0, max_tokens=4).choices[0]
    assert [c["values"][0] for c in chunks] == pytest.approx(whole.model_extra["values"], abs=1e-6)
    assert "".join(c["text"] for c in chunks) == whole.text


def test_a_client_that_leaves_stops_only_its_row(server):
    before = server.engine.cancelled_rows
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1500, "stream": True, "steering": {"alpha": 1}}
    with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=30) as r:
        first = next(r.iter_lines())
    assert first.startswith("data: ")
    deadline = time.monotonic() + 30
    while server.engine.cancelled_rows == before:
        assert time.monotonic() < deadline, "the row of a client that left kept running"
        time.sleep(0.05)
    assert len(_complete(server.client(), 1.0, max_tokens=2).choices[0].model_extra["values"]) == 2


def test_rows_of_one_batch_equal_each_request_alone(server):
    client = server.client()
    alphas = [-4.0, 0.0, 4.0, None]
    before = len(server.engine.batch_sizes)
    together = _together(server, alphas, max_tokens=6)
    assert max(server.engine.batch_sizes[before:]) == len(alphas), "the requests did not share a batch"
    for a, got in zip(alphas, together, strict=True):
        alone = _complete(client, a).choices[0]
        assert got.model_extra["token_ids"] == alone.model_extra["token_ids"]
        assert got.model_extra["values"] == pytest.approx(alone.model_extra["values"], abs=1e-5)
    # α = 0 and no steering at all are the same run
    assert together[1].model_extra["values"] == pytest.approx(together[3].model_extra["values"], abs=1e-6)


def test_sixteen_clients_each_get_their_own_steering(server):
    alphas = [float(a) for a in torch.linspace(-6, 6, 16)]
    order = list(range(16))
    got = _together(server, alphas, max_tokens=4)
    means = [sum(c.model_extra["values"]) / len(c.model_extra["values"]) for c in got]
    assert sorted(order, key=lambda i: means[i]) == order, means


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"steering": {"alpha": "lots"}}, "steering.alpha"),
        ({"steering": {"alpha": 1, "layer": 99}}, "steering.layer"),
        ({"steering": {"alpha": 1, "unit": "percent"}}, "steering.unit"),
        ({"steering": {"alpha": 1, "where": "all"}}, "steering.where"),
        ({"steering": {"alpha": MAX_ALPHA + 1}}, "steering.alpha"),
        ({"steering": 3}, "steering"),
        ({"value_layer": -1}, "value_layer"),
        ({"model": "gpt-4"}, "model"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_bad_request_is_a_400_naming_the_field_and_the_server_keeps_serving(server, patch, param):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3} | patch
    r = httpx.post(f"{server.url}/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    with pytest.raises(openai.BadRequestError) as exc:
        server.client().completions.create(
            model=body.pop("model"),
            prompt=body.pop("prompt"),
            max_tokens=body.pop("max_tokens"),
            extra_body=body,
        )
    assert exc.value.body["param"] == param
    assert _complete(server.client(), 1.0, max_tokens=2).choices[0].model_extra["values"]


def test_a_prompt_past_the_context_is_a_400_from_the_engine(server, lm):
    context = lm.model.config.max_position_embeddings
    r = httpx.post(
        f"{server.url}/completions",
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": context},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_a_batch_that_fails_is_retried_row_by_row_so_only_the_bad_request_fails(server, monkeypatch):
    real = hf_engine.generate_rows

    def fragile(lm, spec, rows, alphas, **kw):  # a fault that only one request's row triggers
        if 7.0 in alphas:
            raise RuntimeError("row with alpha 7 broke the batch")
        return real(lm, spec, rows, alphas, **kw)

    monkeypatch.setattr(hf_engine, "generate_rows", fragile)
    before = len(server.engine.batch_sizes)
    clients = [server.client(), server.client()]
    gate = threading.Barrier(2)

    def one(i: int):
        gate.wait()
        try:
            return _complete(clients[i], [7.0, 1.0][i], max_tokens=3).choices[0]
        except openai.InternalServerError as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        bad, good = pool.map(one, range(2))
    assert server.engine.batch_sizes[before:] == [2, 1, 1]  # together, then each alone
    assert isinstance(bad, openai.InternalServerError) and "alpha 7" in str(bad)
    assert good.model_extra["values"] == pytest.approx(
        _complete(server.client(), 1.0, max_tokens=3).choices[0].model_extra["values"]
    )


def test_body_that_is_not_json_is_a_400(server):
    r = httpx.post(f"{server.url}/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_api_key_is_enforced(lm, axis):
    s = Server(HFEngine(lm, model=MODEL), Limits(MODEL, SteeringSpec(axis)), api_key="sekrit")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert httpx.get(f"{s.url}/models", timeout=30).status_code == 401
        assert s.client("sekrit").models.list().data[0].id == MODEL
    finally:
        s.close()


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory, tiny_lm_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "tiny"
    planted_axis(tiny_lm_factory("llama")).save(path)
    return path


def test_non_local_host_needs_an_api_key(probe_dir, capsys):
    code, _, err = run_cli(["serve", "--probe", str(probe_dir), "--host", "0.0.0.0"], capsys)
    assert "--api-key" in one_line(code, err)


def test_port_in_use_is_one_line(probe_dir, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        code, _, err = run_cli(
            ["serve", "--probe", str(probe_dir), "--port", str(taken.getsockname()[1])], capsys
        )
    assert "--port" in one_line(code, err)


def test_probe_of_another_model_is_refused(tmp_path, tiny_dir, tiny_lm_factory, capsys):
    planted_axis(tiny_lm_factory("gpt_neox")).save(tmp_path / "other")
    code, _, err = run_cli(
        ["serve", "--probe", str(tmp_path / "other"), "--model", tiny_dir, "--port", "0"], capsys
    )
    assert "fingerprint" in one_line(code, err)


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_without_the_extra_names_the_install(probe_dir, capsys):
    code, _, err = run_cli(["serve", "--probe", str(probe_dir), "--engine", "vllm"], capsys)
    assert "pip install 'valueprobe[vllm]'" in one_line(code, err)


def test_cli_serves_until_stopped(probe_dir, tiny_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "valueprobe",
        "serve",
        "--probe",
        str(probe_dir),
        "--model",
        tiny_dir,
        "--port",
        str(port),
        "--max-alpha",
        "5",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60
        )
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                (card,) = client.models.list().data
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.5)
        got = client.completions.create(
            model=card.id, prompt=PROMPT, max_tokens=3, extra_body={"steering": {"alpha": 2}}
        )
        assert len(got.choices[0].model_extra["values"]) == 3
        with pytest.raises(openai.BadRequestError):
            client.completions.create(
                model=card.id, prompt=PROMPT, max_tokens=3, extra_body={"steering": {"alpha": 6}}
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_smollm2_serves_steered_chat_with_values(default_lm):
    from valueprobe.probe.axis import ValueAxis

    axis = ValueAxis.load("probes/smollm2-135m-value", lm=default_lm)
    read = axis.best_layer + 2
    s = Server(
        HFEngine(default_lm, model="smollm2-135m"), Limits("smollm2-135m", SteeringSpec(axis), max_alpha=10)
    )
    try:
        client = s.client()
        chat = [{"role": "user", "content": "Is 91 a prime number?"}]

        def ask(alpha: float):
            return client.chat.completions.create(
                model="smollm2-135m",
                messages=chat,
                max_tokens=12,
                temperature=0,
                extra_body={"steering": {"alpha": alpha}, "value_layer": read},
            ).choices[0]

        with ThreadPoolExecutor(3) as pool:
            low, mid, high = pool.map(ask, [-4.0, 0.0, 4.0])
        s.idle()
        ref = generate(
            default_lm,
            axis,
            [chat],
            decoding=Decoding(greedy=True, max_new_tokens=12),
            alphas=[4.0],
            progress=False,
        )[0]
        assert high.model_extra["token_ids"][: len(ref.token_ids)] == list(ref.token_ids)
        means = [sum(c.model_extra["values"]) / len(c.model_extra["values"]) for c in (low, mid, high)]
        assert means[0] < means[1] < means[2], means
    finally:
        s.close()


def test_each_row_ends_at_eos_unless_it_ignores_eos(lm, axis, monkeypatch):
    from valueprobe.steering.decode import rows as rows_module

    (ids,) = encode_prompts(lm, [PROMPT], chat=False)
    spec = rows_module.RowSpec(tuple(ids), max_new_tokens=4)
    steering = SteeringSpec(axis, layers=STEER_LAYER, read_layer=VALUE_LAYER)
    (free,) = rows_module.generate_rows(lm, steering, [spec], [0.0])
    real = rows_module._config

    def eos_is_the_second_token(lm, **kw):  # make the row's own second greedy token its EOS
        config = real(lm, **kw)
        config.eos_token_id = free.token_ids[1]
        return config

    monkeypatch.setattr(rows_module, "_config", eos_is_the_second_token)
    # generate fills an unset EOS from the model's own generation config: that one must not stop it
    monkeypatch.setattr(lm.model.generation_config, "eos_token_id", free.token_ids[1])
    stops, runs = rows_module.generate_rows(lm, steering, [spec, replace(spec, ignore_eos=True)], [0.0, 0.0])
    assert (stops.token_ids, stops.finish) == (free.token_ids[:1], "stop")
    assert (runs.token_ids, runs.finish) == (free.token_ids, "length")
    assert runs.values == pytest.approx(free.values, abs=1e-5)


def test_penalties_counted_on_the_device_equal_vllms_formula_bit_for_bit():
    """The rows' penalties keep a count per token on the device (a scatter_add_ each step, no
    bincount): the penalized logits equal vLLM's formula over a bincount of each row's generated
    tokens exactly, and a row without penalties passes through untouched."""
    from valueprobe.steering.decode.rows import RowSpec, _Penalties

    rows = [
        RowSpec((1, 2), presence_penalty=0.5, frequency_penalty=1.5),
        RowSpec((1, 2)),
        RowSpec((1, 2), presence_penalty=-0.25, frequency_penalty=0.0),
    ]
    g = torch.Generator().manual_seed(0)
    vocab, width = 11, 2
    ids = torch.randint(vocab, (3, width), generator=g)
    penalties = _Penalties(rows)
    for _ in range(12):
        scores = torch.randn(3, vocab, generator=g)
        got = penalties(ids, scores, width)
        for i, row in enumerate(rows):
            counts = torch.bincount(ids[i, width:], minlength=vocab).to(scores.dtype)
            want = (
                scores[i]
                - row.frequency_penalty * counts
                - row.presence_penalty * (counts > 0).to(scores.dtype)
            )
            assert torch.equal(got[i], want)
        assert torch.equal(got[1], scores[1])
        # a short vocabulary, so tokens repeat
        ids = torch.cat([ids, torch.randint(vocab, (3, 1), generator=g)], dim=1)
