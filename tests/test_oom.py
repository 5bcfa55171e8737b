"""Out of device memory (issue 27): a command says, in one line, what batch size to use and
leaves no result; a served request that runs out fails alone, with HTTP 503, and the server
goes on. The fault is injected: `torch.OutOfMemoryError` raised where a GPU would raise it."""

from __future__ import annotations

import httpx
import torch
from conftest import run_cli
from test_guide import cli_files, guide_argv  # noqa: F401  (cli_files is a fixture)
from test_serve import MODEL, PROMPT, VALUE_LAYER, _complete, axis, lm, server  # noqa: F401  (fixtures)

from valueprobe.guided.cache import CachedDecoder
from valueprobe.serve import hf_engine


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_guide_that_runs_out_of_memory_is_one_line_and_writes_no_result(cli_files, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(CachedDecoder, "step", _oom)
    out = cli_files["root"] / "oom"
    code, _, err = run_cli(guide_argv(cli_files, out, "--batch-size", "8"), capsys)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]  # (progress bars go there too)
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: out of device memory: rerun with a smaller --batch-size"), errors
    assert not (out / "guide.jsonl").exists() and not (out / "summary.json").exists()


def test_a_served_request_out_of_memory_is_a_503_and_the_server_keeps_serving(server, monkeypatch):  # noqa: F811
    real = hf_engine.generate_rows

    def hungry(lm, spec, rows, alphas, **kw):  # noqa: F811  (only the α = 7 request runs out)
        if 7.0 in alphas:
            _oom()
        return real(lm, spec, rows, alphas, **kw)

    monkeypatch.setattr(hf_engine, "generate_rows", hungry)
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 3,
        "temperature": 0,
        "value_layer": VALUE_LAYER,
        "steering": {"alpha": 7.0},
    }
    for stream in (False,):
        r = httpx.post(f"{server.url}/completions", json=body | {"stream": stream}, timeout=60)
        assert r.status_code == 503, r.text
        assert "out of device memory" in r.json()["error"]["message"]
    ok = _complete(server.client(), 1.0, max_tokens=3).choices[0]
    assert len(ok.model_extra["values"]) == 3
