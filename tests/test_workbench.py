"""The workbench's routes and guard, through real clients (the official ``openai`` package, curl, httpx).

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_workbench.py``
References: ``vp.values`` under ``vp.steer`` (each layer's value of the forward that produced a
token), a no-cache forward's log-softmax (the alternatives), ``logit_lens`` called directly, a
random direction drawn by `random_directions` and added by hand, `SteeringSpec.load`.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace

import httpx
import pytest
import torch
from conftest import run_cli
from test_cli_faults import one_line
from test_serve import MODEL, Server, axis, lm  # noqa: F401 - fixtures
from test_steer import planted_axis

import valueprobe as vp
from valueprobe.activations.prompts import prompt_ids
from valueprobe.read.readout import logit_lens
from valueprobe.serve.guard import COOKIE, cookie_value
from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.limits import Limits, random_spec
from valueprobe.serve.workbench import CSP
from valueprobe.stats.null import random_directions
from valueprobe.steering.hook.spec import SteeringSpec

CHAT = [{"role": "user", "content": "Is 7 prime?"}]
CAP = 6.0


@pytest.fixture(scope="module")
def probe(tmp_path_factory, axis):  # noqa: F811 - the fixture imported above
    path = tmp_path_factory.mktemp("wb-probe") / "tiny"
    axis.save(path)
    return path


@pytest.fixture(scope="module")
def bench(lm, probe):  # noqa: F811
    spec = SteeringSpec(probe=str(probe)).check()
    s = Server(HFEngine(lm, model=MODEL, window_s=0.05), Limits(MODEL, spec, max_alpha=CAP))
    yield s
    s.close()


def _root(server: Server) -> str:
    return server.url.removesuffix("/v1")


def _post(server: Server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{_root(server)}{path}", json=body, timeout=60, **kw)


def test_the_page_and_its_assets_are_served_offline_with_a_strict_policy(bench):
    page = httpx.get(f"{_root(bench)}/", timeout=30)
    assert page.status_code == 200 and page.headers["content-security-policy"] == CSP
    html = page.text
    assert "http://" not in html and "https://" not in html  # no CDN, nothing from elsewhere
    for name in ("workbench.js", "workbench.css"):
        asset = httpx.get(f"{_root(bench)}/workbench/{name}", timeout=30)
        assert asset.status_code == 200 and f"/workbench/{name}" in html
        # the one absolute URL is SVG's namespace name, which nothing fetches
        assert re.findall(r"https?://[^\s\"'`]*", asset.text) in ([], ["http://www.w3.org/2000/svg"])
    assert httpx.get(f"{_root(bench)}/workbench/../app.py", timeout=30).status_code == 404
    assert "innerHTML" not in httpx.get(f"{_root(bench)}/workbench/workbench.js", timeout=30).text


def test_inspect_gives_each_layers_value_of_the_producing_forward(bench, lm, axis):  # noqa: F811
    client = bench.client()
    steering = {"alpha": 2.0, "layer": 1}
    got = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=5,
        temperature=0,
        extra_body={"steering": steering, "value_layer": 2},
    )
    ids = got.choices[0].model_extra["token_ids"]
    index = 3
    body = {"model": MODEL, "messages": CHAT, "steering": steering, "value_layer": 2, "token_ids": ids}
    seen = _post(bench, "/v1/inspect", body | {"index": index, "alternatives": 4}).json()
    context = prompt_ids(lm, CHAT) + ids[:index]
    spec = SteeringSpec(axis, layers=1)
    bench.idle()
    with vp.steer(lm, spec, 2.0):
        want = {layer: vp.values(lm, axis, context, layer=layer).sigma[-1] for layer in axis.layers}
    assert [p["layer"] for p in seen["layers"]] == list(axis.layers)
    assert [p["value"] for p in seen["layers"]] == pytest.approx(
        [want[layer] for layer in axis.layers], abs=1e-5
    )
    # the stream's value of token ``index`` is the same forward's value at the read layer
    assert seen["layers"][2]["value"] == pytest.approx(got.choices[0].model_extra["values"][index], abs=1e-4)
    assert seen["position"] == len(context) - 1 and seen["token_id"] == ids[index]
    with torch.no_grad(), vp.steer(lm, spec, 2.0):
        logits = lm.model(input_ids=torch.tensor([context])).logits[0, -1]
    logprobs = torch.log_softmax(logits.float(), -1)
    top = torch.topk(logprobs, 4)
    assert [a["token_id"] for a in seen["alternatives"]] == top.indices.tolist()
    assert [a["logprob"] for a in seen["alternatives"]] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert seen["logprob"] == pytest.approx(float(logprobs[ids[index]]), abs=1e-5)
    assert seen["value_read"]["read"] == "resid_post[2], after the addition at layer 1"


def test_logit_lens_is_the_library_call(bench, lm, axis):  # noqa: F811
    got = httpx.get(f"{bench.url}/logit_lens", params={"layer": 2, "k": 3}, timeout=30).json()
    want = logit_lens(axis, lm, layer=2, k=3)
    assert got["layer"] == 2 and [t for t, _ in got["promoted"]] == [t for t, _ in want["promoted"]]
    bad = httpx.get(f"{bench.url}/logit_lens", params={"layer": 9}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "layer"


def test_a_random_direction_pushes_with_the_axis_norm(bench, lm, axis):  # noqa: F811
    """``steering.random`` adds α·σ along random unit direction ``seed``: the same norm as the axis's push."""
    client = bench.client()
    got = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
        extra_body={"steering": {"alpha": 3.0, "layer": 1, "random": 11}, "value_layer": 1},
    )  # fmt: skip
    assert got.model_extra["steering"]["direction"] == "random-11"
    bench.idle()
    r = torch.from_numpy(random_directions(lm.d_model, 1, seed=11)[0]).float()
    spec = SteeringSpec(axis, layers=1, direction=r, direction_name="random-11")
    (ref,) = vp.generate(
        lm, spec, [prompt_ids(lm, "The capital of France is", chat=False)], alphas=[3.0], trace=True,
        decoding=vp.Decoding(greedy=True, max_new_tokens=4), progress=False,
    )  # fmt: skip
    assert got.choices[0].model_extra["token_ids"] == list(ref.token_ids)
    assert got.choices[0].model_extra["values"] == pytest.approx(list(ref.values.sigma), abs=1e-4)


def test_the_spec_export_loads_back_and_steers_the_same(bench, probe, tmp_path):
    body = {
        "steering": {"alpha": 1.5, "layer": 2, "positions": "generated", "window": [0, 3]},
        "value_layer": 2,
    }
    got = _post(bench, "/v1/spec", body).json()
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(got["spec"]))
    spec = SteeringSpec.load(path)
    assert spec == SteeringSpec(
        probe=str(probe), layers=2, positions="generated", window=(0, 3), read_layer=2
    )
    assert got["alpha"] == 1.5 and "--spec spec.json" in got["command"] and "--alphas=0,1.5" in got["command"]
    over = _post(bench, "/v1/spec", {"steering": {"alpha": CAP + 1}})
    assert over.status_code == 400 and over.json()["error"]["param"] == "steering.alpha"


def test_bad_workbench_requests_are_one_line_400s(bench):
    base = {"model": MODEL, "messages": CHAT, "token_ids": [5, 6]}
    cases = {
        "index": base | {"index": 2},
        "token_ids": base | {"index": 0, "token_ids": [5, 10**6]},
        "alternatives": base | {"index": 0, "alternatives": 99},
        "steering.alpha": base | {"index": 0, "steering": {"alpha": CAP * 2}},
        "steering.window": base | {"index": 0, "steering": {"alpha": 1, "window": [3, 1]}},
        "steering.random": base | {"index": 0, "steering": {"alpha": 1, "random": -1}},
    }
    for param, body in cases.items():
        got = _post(bench, "/v1/inspect", body)
        assert got.status_code == 400, (param, got.text)
        error = got.json()["error"]
        assert error["param"] == param and "\n" not in error["message"], error
    assert "another tokenizer" in _post(bench, "/v1/inspect", cases["token_ids"]).json()["error"]["message"]


def test_an_over_long_conversation_gets_a_clear_message(bench):
    long = [{"role": "user", "content": "Is 7 prime? " * 700}]
    got = _post(bench, "/v1/chat/completions", {"model": MODEL, "messages": long, "max_tokens": 4})
    assert got.status_code == 400 and "exceed the context" in got.json()["error"]["message"]


def test_cross_origin_and_foreign_host_requests_are_refused(bench):
    url = f"{bench.url}/chat/completions"
    body = json.dumps({"model": MODEL, "messages": CHAT, "max_tokens": 2})
    for header in ("Origin: http://evil.example", "Origin: null", "Host: rebound.example"):
        out = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url, "-H", "Content-Type: application/json",
             "-H", header, "-d", body],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert out == "403", header
    own = f"Origin: {_root(bench)}"
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url, "-H", "Content-Type: application/json",
         "-H", own, "-d", body],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert out == "200"
    assert "access-control-allow-origin" not in httpx.get(f"{bench.url}/models", timeout=30).headers


def test_the_api_key_guards_the_page_and_its_calls(lm, probe):  # noqa: F811
    spec = SteeringSpec(probe=str(probe)).check()
    s = Server(HFEngine(lm, model=MODEL), Limits(MODEL, spec, max_alpha=CAP), api_key="sekrit")
    try:
        root = _root(s)
        assert httpx.get(f"{root}/", timeout=30).status_code == 401  # a form asking for the key
        assert httpx.get(f"{root}/workbench/workbench.js", timeout=30).status_code == 401
        assert httpx.get(f"{root}/?key=wrong", timeout=30).status_code == 401
        assert httpx.get(f"{root}/health", timeout=30).status_code == 200
        opened = httpx.get(f"{root}/?key=sekrit", timeout=30, follow_redirects=False)
        assert opened.status_code == 303 and opened.headers["location"] == "/"
        cookie = opened.cookies[COOKIE]
        assert cookie == cookie_value("sekrit") != "sekrit"
        assert (
            "httponly" in opened.headers["set-cookie"].lower()
            and "samesite=strict" in opened.headers["set-cookie"].lower()
        )
        with httpx.Client(cookies={COOKIE: cookie}, timeout=30) as browser:
            assert browser.get(f"{root}/").status_code == 200
            assert browser.get(f"{s.url}/models").status_code == 200
        assert httpx.get(f"{s.url}/models", timeout=30, cookies={COOKIE: "forged"}).status_code == 401
        assert len(s.client("sekrit").models.list().data) == 1
    finally:
        s.close()


def test_explore_refuses_a_probe_of_another_model(tmp_path, tiny_dir, tiny_lm_factory, capsys):
    planted_axis(tiny_lm_factory("gpt_neox")).save(tmp_path / "other")
    code, _, err = run_cli(
        ["explore", "--probe", str(tmp_path / "other"), "--model", tiny_dir, "--port", "0"], capsys
    )
    assert "fingerprint" in one_line(code, err)


def test_the_random_spec_is_the_axis_spec_along_r(axis):  # noqa: F811
    spec = SteeringSpec(axis, layers=1)
    got = random_spec(5, spec)
    r = torch.from_numpy(random_directions(axis.d_model, 1, seed=5)[0]).float()
    assert got == replace(spec, direction=r, direction_name="random-5")
    (point,) = got.points_for(n_layers=len(axis.layers), d_model=axis.d_model)
    torch.testing.assert_close(point.direction, r / r.norm())
    assert point.unit_size == pytest.approx(float(axis.sigma[1]))  # the axis's σ: the same push size
