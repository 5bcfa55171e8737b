# ruff: noqa: F811 - the fixtures imported from test_serve are parameters here
"""``valueprobe serve`` under an operator (issue 30): /health, /metrics, a full queue (429 with
Retry-After), a request timeout (504), one log line per request, and SIGTERM's drain (503 for new
requests, in-flight ones finish, exit 0).

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_serve_ops.py``
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import MODEL, PROMPT, Server, axis, lm, probe_dir, server  # noqa: F401 - fixtures

from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.limits import Limits
from valueprobe.serve.ops import Operations
from valueprobe.steering.hook.spec import SteeringSpec


def _samples(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_health_and_metrics_count_what_was_served(server):
    base = server.url.removesuffix("/v1")
    assert httpx.get(f"{base}/health", timeout=30).json() == {"status": "ok", "in_flight": 0}
    before = _samples(server.url)
    server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    httpx.post(f"{server.url}/completions", json={"model": "nope", "prompt": PROMPT}, timeout=30)
    after = _samples(server.url)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("valueprobe_requests_total", route="completions", status="200") == 1
    assert grew("valueprobe_requests_total", route="completions", status="400") == 1
    assert grew("valueprobe_tokens_total", kind="completion") == 3
    assert grew("valueprobe_tokens_total", kind="prompt") > 0
    assert grew("valueprobe_time_to_first_token_seconds_count") == 1
    assert grew("valueprobe_time_per_output_token_seconds_count") == 2
    assert after[("valueprobe_queue_depth", ())] == 0
    assert after[("valueprobe_batch_size_count", ())] >= 1


@pytest.mark.parametrize(
    ("method", "path", "status"), [("get", "/v1/nothing", 404), ("get", "/v1/completions", 405)]
)
def test_unknown_route_and_method_are_openai_errors(server, method, path, status):
    r = httpx.request(method.upper(), server.url.removesuffix("/v1") + path, timeout=30)
    assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_one_log_line_per_request_without_the_prompt(server, caplog):
    caplog.set_level(logging.INFO, logger="valueprobe.serve")
    secret = "my secret prompt text"
    got = server.client().completions.create(
        model=MODEL, prompt=secret, max_tokens=2, extra_body={"steering": {"alpha": 1.5}}
    )
    lines = [r.getMessage() for r in caplog.records if got.id in r.getMessage()]
    assert len(lines) == 1, lines
    assert "status=200" in lines[0] and "alpha=1.5" in lines[0] and "completion_tokens=2" in lines[0]
    assert secret not in caplog.text


def _server(lm, axis, ops: Operations, window_s: float = 0.02):
    s = Server(
        HFEngine(lm, model=MODEL, window_s=window_s), Limits(MODEL, SteeringSpec(axis), max_alpha=8), ops=ops
    )
    yield s
    s.close()


@pytest.fixture(scope="module")
def guarded(lm, axis):
    """One request at a time, each waiting 3 s for batch neighbours."""
    yield from _server(lm, axis, Operations(max_queue=1), window_s=3.0)


@pytest.fixture(scope="module")
def timed(lm, axis):
    """1.5 s per request at most, prompts logged."""
    yield from _server(lm, axis, Operations(request_timeout=1.5, log_prompts=True))


def test_a_full_queue_is_a_429_with_retry_after_and_serving_goes_on(guarded):
    """The one slot is held by a request waiting in the engine's 3 s batch window."""
    health = guarded.url.removesuffix("/v1") + "/health"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(guarded.client().completions.create, model=MODEL, prompt=PROMPT, max_tokens=1)
        deadline = time.monotonic() + 30
        while httpx.get(health, timeout=30).json()["in_flight"] != 1:
            assert time.monotonic() < deadline, "the first request was never admitted"
            time.sleep(0.02)
        r = httpx.post(f"{guarded.url}/completions", json={"model": MODEL, "prompt": PROMPT}, timeout=30)
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
        assert r.json()["error"]["type"] == "rate_limit_error" and "param" in r.json()["error"]
        assert held.result(timeout=60).choices[0].text is not None
    assert httpx.get(health, timeout=30).json()["in_flight"] == 0
    assert (
        guarded.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).choices[0].text
        is not None
    )


def test_a_request_past_the_timeout_is_a_504_and_its_row_stops(timed, caplog):
    guarded = timed
    caplog.set_level(logging.INFO, logger="valueprobe.serve")
    before = guarded.engine.cancelled_rows
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
    r = httpx.post(f"{guarded.url}/completions", json=body, timeout=60)
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout", r.text
    deadline = time.monotonic() + 30
    while guarded.engine.cancelled_rows == before:
        assert time.monotonic() < deadline, "the timed-out row kept running"
        time.sleep(0.05)
    assert "status=504" in caplog.text and PROMPT in caplog.text  # --log-prompts puts it in
    assert (
        guarded.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).choices[0].text
        is not None
    )


def _spawn(probe_dir, tiny_dir, *flags: str) -> tuple[subprocess.Popen, str]:
    """``valueprobe serve`` on the tiny model as a process of its own, once it answers /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "valueprobe", "serve", "--probe", str(probe_dir), "--model", tiny_dir]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--max-alpha", "5", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "serve did not come up"
        time.sleep(0.3)


def _long_stream(base: str, tokens: int) -> tuple[threading.Event, Future]:
    """A streamed request of ``tokens`` tokens in a thread: (its first event came, its data lines)."""
    started = threading.Event()
    body = {"model": "", "prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True, "stream": True}

    def read() -> list[str]:
        body["model"] = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        lines = []
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[len("data: ") :])
                    started.set()
        return lines

    return started, ThreadPoolExecutor(1).submit(read)


def test_sigterm_drains_in_flight_refuses_new_with_503_and_exits_0(probe_dir, tiny_dir):
    drain = 60.0
    proc, base = _spawn(probe_dir, tiny_dir, "--drain-seconds", f"{drain:g}")
    try:
        started, stream = _long_stream(base, 400)
        assert started.wait(60), "the stream never started"
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        deadline = sent + 10
        while (health := httpx.get(f"{base}/health", timeout=30)).status_code != 503:
            assert time.monotonic() < deadline, "SIGTERM did not start the drain"
            time.sleep(0.05)
        assert health.json() == {"status": "draining", "in_flight": 1}
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        late = httpx.post(f"{base}/v1/completions", json={"model": model, "prompt": PROMPT}, timeout=30)
        assert late.status_code == 503, late.text
        assert late.json()["error"]["type"] == "service_unavailable" and "param" in late.json()["error"]
        lines = stream.result(timeout=drain)
        assert lines[-1] == "[DONE]" and len(lines) == 401, lines[-3:]  # every token, then [DONE]
        assert all(json.loads(e)["choices"][0]["text"] is not None for e in lines[:-1])
        assert proc.wait(timeout=drain) == 0, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() - sent < drain
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_drain_past_drain_seconds_still_exits_0_in_time(probe_dir, tiny_dir):
    """A stream longer than --drain-seconds is cut: the process does not wait for it."""
    proc, base = _spawn(probe_dir, tiny_dir, "--drain-seconds", "1")
    try:
        started, stream = _long_stream(base, 1900)
        assert started.wait(60), "the stream never started"
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert proc.wait(timeout=30) == 0, proc.stdout.read() if proc.stdout else ""
        # 1 s of drain, then uvicorn's 2 s graceful shutdown, then the process's own exit
        assert time.monotonic() - sent < 10
        with contextlib.suppress(Exception):
            stream.result(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _neighbour(server: Server, alpha: float | None) -> dict:
    """A greedy 24-token request (values read at the probe's layer), its choice as JSON."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    body |= {} if alpha is None else {"steering": {"alpha": alpha}}
    r = httpx.post(f"{server.url}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_a_client_leaving_mid_stream_leaves_its_batch_neighbours_as_if_alone(server):
    """Four neighbours and one streamed request meet in one batch; the stream's client leaves
    after two tokens; each neighbour's tokens and values equal the same request sent alone."""
    alphas = [-3.0, 0.0, 3.0, None]
    gate = threading.Barrier(len(alphas) + 1)
    batches, cancelled = len(server.engine.batch_sizes), server.engine.cancelled_rows

    def leaver() -> int:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True, "stream": True}
        body["steering"] = {"alpha": 2.0}
        gate.wait()
        got = 0
        with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                got += line.startswith("data: ")
                if got == 2:
                    break  # the client leaves mid-stream: the connection closes here
        return got

    def neighbour(alpha: float | None) -> dict:
        gate.wait()
        return _neighbour(server, alpha)

    with ThreadPoolExecutor(len(alphas) + 1) as pool:
        left = pool.submit(leaver)
        together = list(pool.map(neighbour, alphas))
        assert left.result(timeout=60) == 2
    assert max(server.engine.batch_sizes[batches:]) == len(alphas) + 1, "the requests did not share a batch"
    assert server.engine.cancelled_rows == cancelled + 1, "the leaver's row was not cancelled"
    for alpha, got in zip(alphas, together, strict=True):
        alone = _neighbour(server, alpha)
        assert len(got["token_ids"]) == 24 and got["finish_reason"] == "length"
        assert got["token_ids"] == alone["token_ids"] and got["text"] == alone["text"]
        assert got["values"] == pytest.approx(alone["values"], abs=1e-5)
