"""The workbench in a real browser (Debian's headless Chromium), against a real server on a free port.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_workbench_browser.py``
References: the same requests through the official ``openai`` client (each token's value and
colour), ``valueprobe steer`` at the slider's α and seed (the regenerated text), ``vp.values``
under ``vp.steer`` (a clicked token's value at every layer), `SteeringSpec.load` and ``steer
--spec`` (the exported spec). Any console error, uncaught exception or request to another host
fails a test; without Chromium they skip unless VALUEPROBE_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import openai
import pytest
import torch
import transformers as tf
from conftest import run_cli
from test_serve import Server
from test_steer import planted_axis

import valueprobe as vp
from valueprobe.activations.prompts import prompt_ids
from valueprobe.model.load import load, wrap
from valueprobe.read.strip import colour
from valueprobe.report.browser import Browser
from valueprobe.serve.hf_engine import HFEngine
from valueprobe.serve.limits import Limits
from valueprobe.steering.hook.spec import SteeringSpec

HAVE_CHROMIUM = bool(
    shutil.which("chromium") or shutil.which("chromium-browser") or os.environ.get("VALUEPROBE_CHROMIUM")
)
pytestmark = pytest.mark.skipif(
    not HAVE_CHROMIUM and os.environ.get("VALUEPROBE_REQUIRE_BROWSER") != "1",
    reason="no chromium (apt-get install chromium)",
)

MODEL = "tiny-workbench"
PROMPT = "Is 7 prime?"
ALPHA = 2.5
CAP = 6.0
TOKENS = 10
COLUMNS = ("steered", "unsteered", "random")
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
# a copy of every response the page reads, kept beside the page: what the API sent, byte for byte
TEE = """window.__responses = [];
const realFetch = window.fetch;
window.fetch = async (...args) => {
  const response = await realFetch(...args);
  response.clone().text().then(
    (text) => window.__responses.push({url: String(args[0]), body: (args[1] || {}).body || null, text}),
    () => {});
  return response;
};"""
# every token span of a column: its text, token id, value and computed background colour
SPANS = """[...document.querySelectorAll('#col-%s .tok')].map(s => ({text: s.textContent,
  id: Number(s.dataset.tokenId), value: Number(s.dataset.value), bg: getComputedStyle(s).backgroundColor}))"""


@pytest.fixture(scope="module")
def model(tiny_dir, tmp_path_factory):
    """The tiny model as a folder (what ``steer --model`` reads), loaded once, and its probe folder."""
    lm = load(tiny_dir)
    axis = replace(planted_axis(lm), model_id=tiny_dir, fingerprint=lm.fingerprint)
    probe = tmp_path_factory.mktemp("wb-browser") / "probe"
    axis.save(probe)
    return lm, axis, probe


@pytest.fixture(scope="module")
def bench(model):
    lm, _, probe = model
    spec = SteeringSpec(probe=str(probe)).check()
    s = Server(HFEngine(lm, model=MODEL, window_s=0.05), Limits(MODEL, spec, max_alpha=CAP))
    yield s
    s.close()


def _root(server: Server) -> str:
    return server.url.removesuffix("/v1")


def _set(b: Browser, element: str, value: object, event: str = "change") -> None:
    """Set an input's value as a user would, then fire its event."""
    b.evaluate(
        f"(() => {{ const e = document.getElementById({json.dumps(element)}); e.value = {json.dumps(str(value))};"
        f" e.dispatchEvent(new Event({json.dumps(event)}, {{bubbles: true}})); }})()"
    )


def _done(b: Browser, columns=COLUMNS, alpha: float | None = None) -> None:
    """Wait until every column in ``columns`` has finished streaming (at ``alpha``, when given)."""
    want = "" if alpha is None else f" && state.columns.steered.body.steering.alpha === {alpha}"
    names = json.dumps(list(columns))
    b.wait_for(f"{names}.every(c => state.columns[c] && state.columns[c].done){want}", timeout=120)


def _stream(b: Browser, column: str) -> dict:
    """The SSE stream the page read for ``column``'s last request, parsed: the request body as
    sent, and the tokens, values and text the API streamed back."""
    body = b.evaluate(f"stringify(state.columns.{column}.body)")
    (got,) = [r for r in b.evaluate("window.__responses") if r["body"] == body]
    events = [line[len("data: ") :] for line in got["text"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    choices = [json.loads(e)["choices"][0] for e in events[:-1]]
    return {
        "body": body,
        "token_ids": [i for c in choices for i in c["token_ids"]],
        "values": [v for c in choices for v in c["values"]],
        "text": "".join(c["delta"].get("content") or "" for c in choices),
    }


def _steer_row(tmp_path, model, prompts, *, alpha: float, args: list[str], capsys) -> dict:
    """``valueprobe steer`` at 0 and ``alpha``: the α row (its seed and text)."""
    out = tmp_path / f"steer-{len(list(tmp_path.iterdir()))}"
    code, _, err = run_cli(
        ["steer", "--model", model[1].model_id, "--prompts", str(prompts), f"--alphas=0,{alpha}",
         "--random-directions", "1", "--bootstrap", "0", "--max-new-tokens", str(TOKENS),
         "--temperature", "0.8", "--seed", "3", "--out", str(out), *args],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["alpha"] == alpha and r["direction"] == "axis"]
    return row


def test_the_workbench_in_a_real_browser(bench, model, tmp_path, capsys):
    lm, axis, probe = model
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "p0", "messages": [{"role": "user", "content": PROMPT}], "label": 1, "group": "wb"})
        + "\n"
    )
    row = _steer_row(tmp_path, model, prompts, alpha=ALPHA, args=["--probe", str(probe)], capsys=capsys)
    root = _root(bench)
    with Browser(width=1300, height=1200, allowed=(f"{root}/",)) as b:
        # load the page
        b.add_init_script(TEE)
        b.open(f"{root}/")
        b.wait_for("document.body && document.body.dataset.ready === '1'")
        # type a prompt and generate, sampling at the steer row's seed
        for element, value in (("seed", row["seed"]), ("temperature", 0.8), ("max-tokens", TOKENS)):
            _set(b, element, value)
        _set(b, "prompt", PROMPT, "input")
        b.evaluate("document.getElementById('send').click()")
        _done(b)
        # each span's value is the value the API sent for that token, and its colour that value's
        b.wait_for("window.__responses.filter(r => r.url.endsWith('/chat/completions')).length === 3")
        client = openai.OpenAI(base_url=bench.url, api_key="none", max_retries=0, timeout=60)
        for name in COLUMNS:
            spans = b.evaluate(SPANS % name)
            sent = _stream(b, name)
            assert [s["id"] for s in spans] == sent["token_ids"], name
            assert [s["value"] for s in spans] == sent["values"], name
            assert [s["bg"] for s in spans] == [colour(v) for v in sent["values"]], name
            assert "".join(s["text"] for s in spans) == sent["text"], name
            # and the same request again, through the official client, gives the same tokens
            body = json.loads(sent["body"])
            extra = {k: body[k] for k in ("steering", "value_layer") if k in body}
            again = client.chat.completions.create(
                model=MODEL, messages=body["messages"], max_tokens=body["max_tokens"],
                temperature=body["temperature"], seed=body["seed"], extra_body=extra,
            ).choices[0]  # fmt: skip
            assert again.model_extra["token_ids"] == sent["token_ids"], name
            # (a request alone and one batched with another differ in the last bits on a CPU)
            assert again.model_extra["values"] == pytest.approx(sent["values"], abs=1e-5), name
        assert (
            b.evaluate("document.getElementById('read-point').textContent")
            == "resid_post[1], after the addition"
        )
        # move the α slider: the steered text is `valueprobe steer`'s at that α and seed
        _set(b, "alpha", ALPHA, "input")
        _done(b, ("steered", "random"), alpha=ALPHA)
        steered = "".join(s["text"] for s in b.evaluate(SPANS % "steered"))
        assert steered == row["text"] and row["alpha"] == ALPHA
        # click a token: its value at every layer, as vp.values reads it under the same steering
        index = 2
        b.evaluate(f"document.querySelector('#col-steered .tok[data-index=\"{index}\"]').click()")
        b.wait_for(
            "document.querySelectorAll('#plot circle').length > 0 && document.getElementById('lens').textContent"
        )
        plotted = b.evaluate(
            "[...document.querySelectorAll('#plot circle')].map(c => [Number(c.dataset.layer), Number(c.dataset.value)])"
        )
        ids = [s["id"] for s in b.evaluate(SPANS % "steered")]
        context = prompt_ids(lm, [{"role": "user", "content": PROMPT}]) + ids[:index]
        with vp.steer(lm, SteeringSpec(axis, layers=1), ALPHA):
            want = [[layer, vp.values(lm, axis, context, layer=layer).sigma[-1]] for layer in axis.layers]
        assert [p[0] for p in plotted] == [w[0] for w in want]
        assert [p[1] for p in plotted] == pytest.approx([w[1] for w in want], abs=1e-5)
        assert b.evaluate("document.querySelectorAll('#alternatives tr').length") == 8
        # export the spec and load it back; steer --spec with it writes the page's text again
        b.evaluate("document.getElementById('export-spec').click()")
        b.wait_for("document.getElementById('spec-out').textContent")
        exported = tmp_path / "spec.json"
        exported.write_text(b.evaluate("document.getElementById('spec-out').textContent"))
        assert SteeringSpec.load(exported) == SteeringSpec(probe=str(probe), layers=1, read_layer=1)
        again = _steer_row(
            tmp_path, model, prompts, alpha=ALPHA, args=["--spec", str(exported)], capsys=capsys
        )
        assert again["text"] == steered
        # the conversation with per-token values, as JSONL
        b.evaluate("document.getElementById('export-jsonl').click()")
        lines = [
            json.loads(x) for x in b.evaluate("document.getElementById('jsonl-out').textContent").splitlines()
        ]
        assert lines[0] == {"role": "user", "content": PROMPT}
        (mine,) = [x for x in lines if x.get("column") == "steered"]
        assert (
            mine["values"] == [s["value"] for s in b.evaluate(SPANS % "steered")]
            and mine["content"] == steered
        )
        # bad input: α past the cap is the API's one-line 400, shown in the page
        _set(b, "alpha-num", CAP + 1)
        b.wait_for("document.getElementById('error').textContent")
        shown = b.evaluate("document.getElementById('error').textContent")
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=2,
                extra_body={"steering": {"alpha": CAP + 1, "layer": 1, "positions": "all"}},
            )  # fmt: skip
        assert shown == refused.value.body["message"] and "beyond this server's --max-alpha" in shown
        # a conversation longer than the model's context: a clear message, not a stalled page
        _set(b, "alpha-num", 0)
        b.evaluate("document.getElementById('mode-raw').click()")
        _set(b, "prompt", "Is 7 prime? " * 700, "input")
        b.evaluate(
            "document.getElementById('error').textContent = ''; document.getElementById('send').click()"
        )
        b.wait_for("document.getElementById('error').textContent")
        assert "exceed the context" in b.evaluate("document.getElementById('error').textContent")
        check = b.check()
    assert not check.console_errors and not check.network_requests, check.problems()
    # the only failed requests are the refusals asked for above (the browser logs each 400)
    assert check.failed_requests and all("400" in x for x in check.failed_requests), check.failed_requests


def writer_model(tokenizer, text: str, *, positions: int = 256, d_model: int = 256):
    """A GPT-2 whose greedy output at position p is token p of ``text`` (cycled), whatever it reads:
    its blocks add nothing, tokens embed to zero, positions to orthogonal vectors, and each
    token's unembedding row sums the (normed) positions where ``text`` has it."""
    target = tokenizer(text, add_special_tokens=False)["input_ids"]
    config = tf.GPT2Config(
        vocab_size=len(tokenizer), n_embd=d_model, n_layer=2, n_head=4, n_positions=positions,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                proj.bias.zero_()
        model.transformer.wte.weight.zero_()
        model.transformer.wpe.weight.copy_(torch.eye(positions, d_model) * 10)
        model.lm_head.weight.zero_()
        for p in range(positions):
            u = model.transformer.ln_f(model.transformer.wpe.weight[p])
            model.lm_head.weight[target[p % len(target)]] += u / u.norm()
    return model


def test_model_and_user_strings_are_text_never_markup(tiny_tokenizer):
    lm = wrap(writer_model(tiny_tokenizer, XSS), tiny_tokenizer, model_id="tiny-writer")
    axis = planted_axis(lm)
    s = Server(HFEngine(lm, model=MODEL, window_s=0.05), Limits(MODEL, SteeringSpec(axis), max_alpha=CAP))
    try:
        root = _root(s)
        with Browser(allowed=(f"{root}/",)) as b:
            b.open(f"{root}/")
            b.wait_for("document.body && document.body.dataset.ready === '1'")
            _set(b, "max-tokens", 110)
            _set(b, "temperature", 0)
            _set(b, "prompt", XSS, "input")
            b.evaluate("document.getElementById('send').click()")
            _done(b)
            text = b.evaluate("document.querySelector('#col-unsteered .strip').textContent")
            assert XSS in text  # the model wrote the markup, and the page shows it as text
            assert b.evaluate("document.querySelector('#turns').textContent").endswith(XSS)  # the user's too
            b.evaluate("document.querySelector('#col-unsteered .tok[data-index=\"1\"]').click()")
            b.wait_for("document.querySelectorAll('#alternatives tr').length > 0")
            b.evaluate("document.getElementById('export-jsonl').click()")
            lines = [
                json.loads(x)
                for x in b.evaluate("document.getElementById('jsonl-out').textContent").splitlines()
            ]
            assert lines[0]["content"] == XSS and any(XSS in x["content"] for x in lines[1:])
            assert b.evaluate("typeof window.__xss") == "undefined"  # nothing ran
            assert b.evaluate("document.querySelectorAll('img, #columns script, #turns script').length") == 0
            check = b.check()
        assert not (check.console_errors or check.network_requests or check.failed_requests), check.problems()
    finally:
        s.close()


def test_the_key_guards_the_page_in_the_browser(model):
    lm, _, probe = model
    spec = SteeringSpec(probe=str(probe)).check()
    s = Server(HFEngine(lm, model=MODEL), Limits(MODEL, spec, max_alpha=CAP), api_key="sekrit")
    try:
        root = _root(s)
        with Browser(allowed=(f"{root}/",)) as b:
            b.open(f"{root}/")
            b.wait_for("!!document.querySelector('form input[name=key]')")  # asked for the key, no workbench
            assert b.evaluate("typeof state") == "undefined"
            b.open(f"{root}/?key=sekrit")
            b.wait_for("document.body && document.body.dataset.ready === '1'")
            assert b.evaluate("location.search") == ""  # the key is not left in the address bar
            _set(b, "max-tokens", 3)
            _set(b, "prompt", PROMPT, "input")
            b.evaluate("document.getElementById('send').click()")
            _done(b)
            check = b.check()
        assert not check.console_errors and not check.network_requests, check.problems()
        assert all("401" in x for x in check.failed_requests)  # the first visit, before the key
    finally:
        s.close()
