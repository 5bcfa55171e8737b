"""valueprobe inside Inspect AI: the ``valueprobe/<model>`` provider against valueprobe's own
generation and served values, the shipped tasks, and the entry point (no import in the task).
Tiny random models, offline."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import torch
from test_steer import planted_axis  # tests/ is on sys.path under pytest

from valueprobe.errors import ValueprobeError
from valueprobe.evals.steering import along_random
from valueprobe.evals.tasks import arithmetic_rows
from valueprobe.steering.decode.generation import encode_prompts, generate
from valueprobe.steering.decode.rows import RowSpec, generate_rows
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.spec import SteeringSpec

pytest.importorskip("inspect_ai")
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.model import ChatMessageSystem, ChatMessageUser, GenerateConfig, get_model  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def lm(tiny_lm_factory):
    return tiny_lm_factory("llama")


@pytest.fixture(scope="module")
def spec(lm):
    return SteeringSpec(planted_axis(lm), layers=[1], unit="sigma")


def _model(lm, spec, alpha, **kw):
    return get_model("valueprobe/tiny", lm=lm, spec=spec, alpha=alpha, memoize=False, **kw)


def _ask(model, messages, **config):
    return asyncio.run(model.generate(messages, config=GenerateConfig(**config)))


CHAT = [ChatMessageSystem(content="Be brief."), ChatMessageUser(content="Is 7 prime? Wait, 12 * 7 = 84.")]
DICTS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Is 7 prime? Wait, 12 * 7 = 84."},
]


def test_greedy_output_is_vp_generate_with_the_served_values(lm, spec):
    out = _ask(_model(lm, spec, 2.0), CHAT, temperature=0.0, max_tokens=8)
    greedy = Decoding(greedy=True, max_new_tokens=8)
    (want,) = generate(lm, spec, [DICTS], alphas=[2.0], decoding=greedy, progress=False)
    assert out.completion == want.text
    meta = out.metadata["valueprobe"]
    # the values the server reads (after the addition, at the read layer) for the same row
    row_spec = RowSpec(tuple(encode_prompts(lm, [DICTS])[0]), max_new_tokens=8)
    (row,) = generate_rows(lm, spec, [row_spec], [2.0], value_at="after")
    assert meta["values"][: len(row.values)] == pytest.approx(row.values, abs=1e-5)
    assert meta["steering"] == {"alpha": 2.0, "unit": "sigma", "direction": "axis", "op": "add"}
    assert out.usage.output_tokens == len(meta["values"])


def test_sampling_follows_temperature_and_seed_and_stops_at_stop_sequences(lm, spec):
    model = _model(lm, spec, 1.0)
    a = _ask(model, CHAT, temperature=1.5, seed=11, max_tokens=12).completion
    assert a == _ask(model, CHAT, temperature=1.5, seed=11, max_tokens=12).completion
    assert {a} != {
        _ask(model, CHAT, temperature=1.5, seed=s, max_tokens=12).completion for s in range(12, 16)
    }
    greedy = _ask(model, CHAT, temperature=0.0, max_tokens=12).completion
    stop = greedy[3:5]
    cut = _ask(model, CHAT, temperature=0.0, max_tokens=12, stop_seqs=[stop])
    assert cut.completion == greedy[: greedy.index(stop)] and cut.choices[0].stop_reason == "stop"
    short = _ask(model, CHAT, temperature=0.0, max_tokens=2)
    assert short.choices[0].stop_reason == "max_tokens" and len(short.metadata["valueprobe"]["values"]) == 2


def test_a_random_direction_and_alpha_zero_come_from_the_same_provider(lm, spec):
    plain = _ask(_model(lm, spec, 0.0), CHAT, temperature=0.0, max_tokens=8).completion
    greedy = Decoding(greedy=True, max_new_tokens=8)
    (unsteered,) = generate(lm, spec, [DICTS], alphas=[0.0], decoding=greedy, progress=False)
    assert plain == unsteered.text
    null = _ask(_model(lm, spec, 2.0, random=1), CHAT, temperature=0.0, max_tokens=8)
    assert null.metadata["valueprobe"]["steering"]["direction"] == "random-1"


def test_the_shipped_tasks_run_in_inspect(lm, spec, tmp_path):
    logs = inspect_eval(
        ["valueprobe/arithmetic", "valueprobe/corrigible_ab"],
        model=_model(lm, spec, 2.0),
        limit=3,
        log_dir=str(tmp_path),
        display="none",
    )
    assert [log.status for log in logs] == ["success", "success"]
    arithmetic = logs[0]
    chats = [[{"role": "user", "content": r["prompt"]}] for r in arithmetic_rows()[:3]]
    want = generate(
        lm, spec, chats, alphas=[2.0], decoding=Decoding(greedy=True, max_new_tokens=48), progress=False
    )
    got = {s.id: s.output.completion for s in arithmetic.samples}
    assert [got[r["id"]] for r in arithmetic_rows()[:3]] == [g.text for g in want]
    assert arithmetic.results.scores[0].metrics["accuracy"].value in (0.0, 1 / 3, 2 / 3, 1.0)


def test_the_provider_reads_inspects_model_args_once_typed_and_refuses_unknown_keys(lm, spec):
    # -M values as Inspect's command line reads them (YAML): text where YAML sees no number
    model = _model(lm, spec, "1e-1", random="2", seed=3, value_at="before", max_batch="4")
    assert (model.api.alpha, model.api.value_at, model.api.engine.max_batch) == (0.1, "before", 4)
    assert model.api.spec.name() == "random-2"
    assert torch.equal(model.api.spec.direction, along_random(spec, 2, seed=3).direction)
    with pytest.raises(
        ValueprobeError, match="'alhpa' is not one .*: use spec, probe, .*, device, value_at, max_batch$"
    ):
        get_model("valueprobe/tiny", lm=lm, spec=spec, alhpa=1.0, memoize=False)
    with pytest.raises(ValueprobeError, match="value_at='sideways': give before or after"):
        get_model("valueprobe/tiny", lm=lm, spec=spec, value_at="sideways", memoize=False)


def test_inspect_finds_the_provider_and_tasks_through_the_entry_point(tiny_dir, lm, tmp_path):
    planted_axis(lm).save(tmp_path / "probe")
    argv = [sys.executable, "-m", "inspect_ai._cli.main", "eval", "valueprobe/corrigible_ab"]
    argv += ["--model", f"valueprobe/{tiny_dir}", "-M", f"probe={tmp_path / 'probe'}", "-M", "alpha=1.0"]
    argv += ["--limit", "2", "--log-dir", str(tmp_path / "logs"), "--display", "plain"]
    env = {**os.environ, **OFFLINE}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert list((tmp_path / "logs").glob("*.eval"))
