"""valueprobe inside lm-evaluation-harness: the exported steer config under lm-eval's own
``SteeredModel``, the ``valueprobe`` model's three requests against valueprobe's own steering, and
the shipped tasks through ``simple_evaluate``. Tiny random models, offline."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from test_steer import planted_axis  # tests/ is on sys.path under pytest

from valueprobe.errors import ValueprobeError
from valueprobe.evals.likelihood import Scored, continuation_logprobs
from valueprobe.evals.lm_eval_steer import hookpoint, steer_config, write_steer_config
from valueprobe.evals.steering import EvalSteering, along_random
from valueprobe.evals.tasks import arithmetic_rows, lm_eval_folder
from valueprobe.hooks.route import position_ids_from_mask
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.condition import Condition
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import HookSite

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.hf_steered import SteeredModel  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from valueprobe.evals.lm_eval import LMEvalOptions, ValueprobeLM  # noqa: E402

PAIRS = [
    ("The capital of France", " is Paris, and the capital of Italy is Rome."),
    ("def add(a, b):", "\n    return a + b\n"),
    ("Wait, that's not right.", " Let me recompute: 12 * 7 = 84."),
]


def _requests(pairs=PAIRS) -> list[Instance]:
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


@pytest.fixture(scope="module")
def lm(tiny_lm_factory):
    return tiny_lm_factory("llama")


@pytest.fixture(scope="module")
def axis(lm):
    return planted_axis(lm)


def _steered(tiny_dir, path) -> SteeredModel:
    return SteeredModel(
        pretrained=tiny_dir, steer_path=str(path), device="cpu", batch_size=2, dtype="float32"
    )


@pytest.mark.parametrize(
    "spec, alpha",
    [
        (dict(layers=[1], unit="sigma"), 3.0),  # add at one layer
        (dict(layers=[0, 2], unit="norm"), -40.0),  # add at two layers
        (dict(layers=[1], site=HookSite.mlp_out, unit="raw"), 2.5),  # add to a submodule's output
        (dict(layers=[2], op=Operator("set", target=2.0)), 1.0),  # set: lm-eval's clamp
        (dict(layers=[1], op="ablate"), 1.0),  # ablate: a clamp to 0
    ],
)
def test_lm_evals_steered_model_on_the_export_gives_valueprobes_loglikelihoods(
    lm, axis, tiny_dir, tmp_path, spec, alpha
):
    s = SteeringSpec(axis, **spec)
    path = write_steer_config(steer_config(lm, s, alpha=alpha), tmp_path / "steer.pt")
    theirs = [lp for lp, _ in _steered(tiny_dir, path).loglikelihood(_requests())]
    steered = ValueprobeLM(EvalSteering(spec=s, alpha=alpha, allow_large=True), lm=lm)
    ours = [lp for lp, _ in steered.loglikelihood(_requests())]
    plain = [lp for lp, _ in ValueprobeLM(EvalSteering(spec=s, alpha=0.0), lm=lm).loglikelihood(_requests())]
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-4)  # float32 rounding, summed over tokens
    assert min(abs(a - b) for a, b in zip(ours, plain, strict=True)) > 1e-3  # the steering moved each


def test_the_export_is_plain_tensors_with_valueprobes_alpha_as_coefficient(lm, axis, tmp_path):
    s = SteeringSpec(axis, layers=[0, 2], unit="norm")
    path = write_steer_config(steer_config(lm, s, alpha=15.0), tmp_path / "steer.pt")
    config = torch.load(path, weights_only=True)  # no pickled objects beyond tensors and numbers
    assert set(config) == {"layers.0", "layers.2"}
    assert hookpoint(lm, HookSite.resid_pre, 2) == "layers.1"
    for layer in (0, 2):
        e = config[f"layers.{layer}"]
        assert e["action"] == "add" and e["steering_coefficient"] == 15.0
        want = axis.unit_size(layer, "norm") * axis.direction(layer)
        assert torch.allclose(e["steering_vector"], want, atol=1e-7)


@pytest.mark.parametrize(
    "spec, alpha, says",
    [
        (dict(positions="generated"), 1.0, "every position"),
        (dict(window=(0, 3)), 1.0, "every position"),
        (dict(op="add-norm"), 1.0, "no lm-eval action"),
        (dict(op="ablate"), 0.5, "no lm-eval action"),
        (dict(op=Operator("clamp", lo=-1.0, hi=1.0)), 1.0, "no lm-eval action"),
        (dict(site=HookSite.resid_pre, layers=[0]), 1.0, "resid_pre of layer 0"),
    ],
)
def test_the_export_refuses_what_lm_eval_cannot_express(lm, axis, spec, alpha, says):
    with pytest.raises(ValueprobeError, match=says):
        steer_config(lm, SteeringSpec(axis, **spec), alpha=alpha)


def _reference(lm, spec, alpha, context, continuation):
    """log P(continuation | context) from one unbatched forward under vp.steer (context = prompt)."""
    ids = torch.tensor([context + continuation])
    mask = torch.ones_like(ids)
    with torch.no_grad(), steer(lm, spec, alpha, prompt_length=len(context)):
        logits = lm.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
        ).logits
    lp = torch.log_softmax(logits[0, len(context) - 1 : -1].float(), dim=-1)
    return float(lp.gather(-1, torch.tensor(continuation)[:, None]).sum())


SPECS = {
    "add, two layers": dict(layers=[0, 2], unit="sigma"),
    "ablate": dict(layers=[1], op="ablate"),
    "clamp": dict(layers=[1], op=Operator("clamp", lo=-0.5, hi=0.5)),
    "add-norm": dict(layers=[1], op="add-norm"),
    "generated phase": dict(layers=[1], positions="generated"),
    "prompt phase": dict(layers=[1], positions="prompt"),
    "window": dict(layers=[1], window=(1, 3)),
    "condition": dict(layers=[1], condition=Condition(0.0, when="above")),
}


@pytest.mark.parametrize("name", SPECS)
def test_batched_loglikelihoods_with_alpha_per_row_equal_one_row_each_under_every_spec(lm, axis, name):
    spec = SteeringSpec(axis, **SPECS[name])
    enc = [(lm.tokenizer.encode(c), lm.tokenizer.encode(x)) for c, x in PAIRS]
    alphas = [2.0, 0.0, -1.5]
    got = continuation_logprobs(lm, spec, [Scored(tuple(c), tuple(x)) for c, x in enc], alphas, batch_size=3)
    want = [_reference(lm, spec, a, c, x) for (c, x), a in zip(enc, alphas, strict=True)]
    assert [g for g, _ in got] == pytest.approx(want, abs=2e-4)


def test_the_generated_phase_leaves_the_first_continuation_token_alone(lm, axis):
    # the first continuation token is predicted at the last context position, which a spec of the
    # generated phase never steers: its log-probability is the unsteered one
    spec = SteeringSpec(axis, layers=[1], positions="generated")
    c, x = lm.tokenizer.encode(PAIRS[0][0]), lm.tokenizer.encode(PAIRS[0][1])
    rows = [Scored(tuple(c), tuple(x[:1])), Scored(tuple(c), tuple(x))]
    (first, _), (whole, _) = continuation_logprobs(lm, spec, rows, [50.0, 50.0])
    (first0, _), (whole0, _) = continuation_logprobs(lm, spec, rows, [0.0, 0.0])
    assert first == pytest.approx(first0, abs=1e-6) and abs(whole - whole0) > 1e-2


def test_rolling_loglikelihood_is_the_whole_text_after_the_prefix_token(lm, axis):
    spec = SteeringSpec(axis, layers=[1])
    model = ValueprobeLM(EvalSteering(spec=spec, alpha=1.5), lm=lm)
    text = PAIRS[2][0] + PAIRS[2][1]
    (got,) = model.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    want = _reference(lm, spec, 1.5, [model.prefix_token_id], model.tok_encode(text))
    assert got == pytest.approx(want, abs=2e-4)


@pytest.mark.parametrize("name", ["add, two layers", "window", "condition", "clamp"])
def test_generate_until_is_vp_generate_and_stops_at_until(lm, axis, name):
    spec = SteeringSpec(axis, **SPECS[name])
    prompts = ["The quick brown fox", "def add(a, b):"]
    model = ValueprobeLM(EvalSteering(spec=spec, alpha=1.0), LMEvalOptions(batch_size=2), lm=lm)
    got = model.generate_until(
        [
            Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 8}), i)
            for i, p in enumerate(prompts)
        ]
    )
    want = generate(
        lm,
        spec,
        prompts,
        alphas=[1.0],
        decoding=Decoding(greedy=True, max_new_tokens=8),
        progress=False,
        chat=False,  # lm-eval sends its requests' text as is (it applies a chat template itself, if asked)
    )
    assert got == [g.text for g in want]
    stop = got[0][2:4]
    cut = model.generate_until(
        [Instance("generate_until", {}, (prompts[0], {"until": [stop], "max_gen_toks": 8}), 0)]
    )
    assert cut == [got[0][: got[0].index(stop)]]


def test_the_null_is_a_random_direction_of_the_same_norm_at_the_same_place(lm, axis):
    spec = SteeringSpec(axis, layers=[1], unit="norm")
    null = along_random(spec, 3)
    (p,), (q,) = spec.points(lm), null.points(lm)
    assert null.name() == "random-3" and q.point == p.point and q.unit_size == p.unit_size
    assert float(q.direction.norm()) == pytest.approx(1.0) and abs(float(q.direction @ p.direction)) < 0.5
    assert torch.equal(along_random(spec, 3).direction, null.direction)  # the same seed, the same direction


def test_the_shipped_tasks_run_through_simple_evaluate(lm, axis):
    spec = SteeringSpec(axis, layers=[1])
    model = ValueprobeLM(EvalSteering(spec=spec, alpha=2.0), LMEvalOptions(batch_size=4), lm=lm)
    manager = TaskManager(include_path=str(lm_eval_folder()), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model=model,
        tasks=["valueprobe_arithmetic", "valueprobe_corrigible_ab"],
        task_manager=manager,
        limit=3,
        apply_chat_template=True,
        log_samples=True,
    )
    assert out["results"]["valueprobe_corrigible_ab"]["acc,none"] in (0.0, 1 / 3, 2 / 3, 1.0)
    rows = arithmetic_rows()[:3]
    chats = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    want = generate(
        lm, spec, chats, alphas=[2.0], decoding=Decoding(greedy=True, max_new_tokens=48), progress=False
    )
    samples = sorted(out["samples"]["valueprobe_arithmetic"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in samples] == [g.text for g in want]


def test_lm_eval_builds_the_model_from_its_arguments_read_once_and_typed(tiny_dir, lm, axis, tmp_path):
    # as lm-eval's simple_evaluate builds it: --model_args, then its own --batch_size and friends
    axis.save(tmp_path / "probe")
    args = f"model={tiny_dir},probe={tmp_path / 'probe'},alpha=-1.5,random=2,seed=7,allow_large=true"
    model = ValueprobeLM.create_from_arg_string(
        args, {"batch_size": "auto", "max_batch_size": 4, "device": None}
    )
    assert (model.alpha, model.seed, model.batch) == (-1.5, 7, 4)
    want = along_random(SteeringSpec(probe=str(tmp_path / "probe")).check(), 2, seed=7)
    assert model.spec.name() == "random-2" and torch.equal(model.spec.direction, want.direction)
    texts = {"model": tiny_dir, "probe": str(tmp_path / "probe"), "alpha": "2", "max_length": "64"}
    model = ValueprobeLM.create_from_arg_obj(texts, {"batch_size": "3"})
    assert (model.alpha, model.max_length, model.batch, model.spec.name()) == (2.0, 64, 3, "axis")


def test_lm_eval_arguments_are_refused_in_one_line_before_any_model_loads():
    with pytest.raises(ValueprobeError, match="'alhpa' is not one .*: use spec, probe, alpha, .*, progress$"):
        ValueprobeLM.create_from_arg_string("model=no/such-model,probe=p,alhpa=1")
    with pytest.raises(ValueprobeError, match="alpha='strong': give a finite number"):
        ValueprobeLM.create_from_arg_obj({"model": "no/such-model", "probe": "p", "alpha": "strong"})


def test_python_m_runs_lm_evals_command_line_with_the_model_registered(tiny_dir, axis, tmp_path):
    axis.save(tmp_path / "probe")
    args = f"model={tiny_dir},probe={tmp_path / 'probe'},alpha=1.0"
    argv = [sys.executable, "-m", "valueprobe.evals.lm_eval", "--model_args", args, "--model", "valueprobe"]
    argv += ["--tasks", "valueprobe_corrigible_ab", "--include_path", str(lm_eval_folder())]
    argv += ["--limit", "2", "--apply_chat_template"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "valueprobe_corrigible_ab" in run.stdout and "acc" in run.stdout
    bad = subprocess.run(
        [*argv[:4], f"{args},alhpa=2", *argv[5:]], capture_output=True, text=True, timeout=300, env=env
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: lm-eval model argument 'alhpa'")


def test_valueprobe_export_to_lm_eval_writes_the_file_and_refuses_in_one_line(
    tiny_dir, axis, tmp_path, capsys
):
    from conftest import run_cli
    from test_cli_faults import one_line

    axis.save(tmp_path / "probe")
    argv = ["export", "--to", "lm-eval", "--probe", str(tmp_path / "probe"), "--model", tiny_dir]
    argv += ["--unit", "sigma", "--alpha", "2", "--layer", "1"]
    code, out, err = run_cli([*argv, "--out", str(tmp_path / "steer.pt")], capsys)
    assert code == 0, err
    config = torch.load(tmp_path / "steer.pt", weights_only=True)
    assert list(config) == ["layers.1"] and config["layers.1"]["steering_coefficient"] == 2.0
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "steer.gguf")], capsys)
    assert ".pt" in one_line(code, err)
    code, _, err = run_cli([*argv, "--positions", "generated", "--out", str(tmp_path / "g.pt")], capsys)
    assert "every position" in one_line(code, err)
