"""Steering operators against their closed forms on tiny random models of three architectures.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_operators.py``
References: the unsteered ``output_hidden_states`` with each operator's formula applied by hand
(written out here, apart from `valueprobe.steering.hook.operators`), left padded; and, under the KV
cache, a no-cache forward of the final sequence with the operator on.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli
from test_steer import PROMPTS, _batch, _forward, planted_axis  # tests/ is on sys.path under pytest
from test_steer_sweep import settings_for, tiny_files  # noqa: F401 (a fixture)

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.route import Point, intervene
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.experiment.sweep import SweepSettings
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec

ARCHS = ("llama", "gpt2", "gpt_neox")
# The tiny models' projections on a random direction at layer 1 run about ±0.08: with these
# statistics their σ-scores spread over about ±4, so the clamp holds some cells and leaves others.
MU, SIGMA = 0.01, 0.02
OPERATORS = {
    "add": Operator("add"),
    "ablate": Operator("ablate"),
    "set": Operator("set", target=1.5),
    "clamp": Operator("clamp", lo=-1.0, hi=1.0),
    "add-norm": Operator("add-norm"),
}
# α per row: strengths in σ for add and add-norm, the share of the move for the others
ALPHAS = {"add": [2.0, -1.5, 0.0, 3.0], "add-norm": [2.0, -1.5, 0.0, 3.0]}
SHARES = [1.0, 0.5, 0.0, 1.0]


def closed_form(name: str, h: torch.Tensor, alpha: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The operator on ``h`` [batch, pos, d] with α per row, from its formula."""
    a = alpha[:, None, None]
    p = (h @ v)[..., None]
    if name == "add":
        return h + a * SIGMA * v
    if name == "ablate":
        return h - a * p * v
    if name == "set":
        return h + a * (MU + 1.5 * SIGMA - p) * v
    if name == "clamp":
        return h + a * (p.clamp(MU - 1.0 * SIGMA, MU + 1.0 * SIGMA) - p) * v
    x = h + a * SIGMA * v  # add-norm
    return x * h.norm(dim=-1, keepdim=True) / x.norm(dim=-1, keepdim=True)


def op_axis(lm) -> ValueAxis:
    """A planted axis with μ = MU and σ = SIGMA at every layer."""
    axis = planted_axis(lm, sigma=SIGMA)
    return ValueAxis(**{**axis.__dict__, "mu": torch.full((lm.n_layers,), MU)})


def _alpha(name: str) -> torch.Tensor:
    return torch.tensor(ALPHAS.get(name, SHARES))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(OPERATORS))
def test_operator_output_is_its_closed_form_under_left_padding(tiny_lm_factory, arch, name):
    lm = tiny_lm_factory(arch)
    axis = op_axis(lm)
    v = axis.direction(1)
    ids, mask = _batch(lm)
    assert not mask.bool().all()  # the batch is left padded
    alpha = _alpha(name)
    base = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    with steer(lm, SteeringSpec(axis, layers=1, op=OPERATORS[name]), alpha):
        got = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    real = mask.bool()
    torch.testing.assert_close(got[2][real], closed_form(name, base[2], alpha, v)[real], atol=1e-5, rtol=0)
    assert torch.equal(got[2][~real], base[2][~real])  # pad cells bit for bit
    assert torch.equal(got[2][2], base[2][2])  # the α = 0 row bit for bit
    assert torch.equal(got[1], base[1])  # upstream untouched
    assert not torch.allclose(got[2][real], base[2][real], atol=1e-4)  # it did something
    # what each operator promises, read as the axis's σ-score at full strength (rows 0 and 3)
    score = axis.score(got[2][[0, 3]], 1)[real[[0, 3]]]
    before = axis.score(base[2][[0, 3]], 1)[real[[0, 3]]]
    if name == "ablate":
        torch.testing.assert_close(score, torch.full_like(score, -MU / SIGMA), atol=1e-4, rtol=0)
    elif name == "set":
        torch.testing.assert_close(score, torch.full_like(score, 1.5), atol=1e-4, rtol=0)
    elif name == "clamp":
        torch.testing.assert_close(score, before.clamp(-1.0, 1.0), atol=1e-4, rtol=0)
        assert (before.abs() > 1).any() and (before.abs() < 1).any()
    elif name == "add-norm":
        torch.testing.assert_close(
            got[2].norm(dim=-1)[real], base[2].norm(dim=-1)[real], atol=1e-5, rtol=1e-6
        )


def cached_and_full(lm, ids, mask, new: int, spec, alpha):
    """Greedy ``generate`` with the KV cache under ``steer(lm, spec, alpha)``, and the references: a
    no-cache steered forward of the final sequence, and its unsteered ``output_hidden_states``.
    Asserts the cached logits of every generated token equal the full forward's."""
    width = ids.shape[1]
    with steer(lm, spec, alpha, prompt_length=width), torch.no_grad():
        run = lm.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    seq = run.sequences
    full_mask = torch.cat([mask, torch.ones(len(seq), new, dtype=mask.dtype)], 1)
    with steer(lm, spec, alpha, prompt_length=width):
        out = _forward(lm, seq, full_mask, output_hidden_states=True)
    base = _forward(lm, seq, full_mask, output_hidden_states=True)
    for t in range(new):
        torch.testing.assert_close(run.logits[t], out.logits[:, width - 1 + t], atol=1e-4, rtol=0)
    assert not torch.allclose(out.logits[full_mask.bool()], base.logits[full_mask.bool()], atol=1e-3)
    return out, base, full_mask.bool()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(OPERATORS))
def test_operator_under_kv_cache_equals_full_forward(tiny_lm_factory, arch, name):
    """Generate with the cache; a no-cache forward of the final sequence with the operator on gives
    the logits of every generated token, and its cells are the closed form of the unsteered cells
    (blocks 0 and 1 run before the operator, so the unsteered h is the operator's input)."""
    lm = tiny_lm_factory(arch)
    axis = op_axis(lm)
    ids, mask = _batch(lm)
    alpha = _alpha(name)
    out, base, real = cached_and_full(lm, ids, mask, 5, SteeringSpec(axis, op=OPERATORS[name]), alpha)
    want = closed_form(name, base.hidden_states[2], alpha, axis.direction(1))
    torch.testing.assert_close(out.hidden_states[2][real], want[real], atol=1e-5, rtol=0)


def test_operator_settings_refused_in_one_line(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)
    with pytest.raises(ValueprobeError, match="lo 2 is above hi 1"):
        Operator("clamp", lo=2.0, hi=1.0)
    with pytest.raises(ValueprobeError, match="--op set needs --target"):
        Operator("set")
    with pytest.raises(ValueprobeError, match="--op clamp needs --lo and/or --hi"):
        Operator("clamp")
    with pytest.raises(ValueprobeError, match="--target goes with --op set"):
        Operator("add", target=1.0)
    with pytest.raises(ValueprobeError, match="unknown operator"):
        steer(lm, SteeringSpec(axis, op="scale"), 1.0)
    # set and clamp read σ: an uncalibrated axis (axis arithmetic) is refused before any hook
    mixed = axis + planted_axis(lm, seed=2)
    with pytest.raises(ValueprobeError, match="no σ calibration"):
        steer(lm, SteeringSpec(mixed, unit="raw", op=Operator("set", target=0.0)), 1.0)
    ids, mask = _batch(lm, PROMPTS[:1])
    before = _forward(lm, ids, mask).logits
    with steer(lm, SteeringSpec(mixed, unit="raw", op="ablate"), 1.0):  # ablate needs no σ
        assert not torch.allclose(_forward(lm, ids, mask).logits, before, atol=1e-4)


def test_generate_takes_the_operator_and_nnsight_refuses_it(tiny_lm_factory):
    """``generate(op=...)`` runs the operator: α = 0 rows are the unsteered text, α = 1 rows are
    the text of a hand-written ablation hook; the nnsight route refuses in one line."""
    lm = tiny_lm_factory("llama")
    axis = op_axis(lm)
    v = axis.direction(1)
    kw = dict(decoding=Decoding(greedy=True, max_new_tokens=6), progress=False)
    gens = generate(lm, SteeringSpec(axis, op="ablate"), PROMPTS, alphas=[0.0, 1.0], **kw)
    plain = generate(lm, axis, PROMPTS, alphas=[0.0], **kw)
    assert [g.token_ids for g in gens[::2]] == [g.token_ids for g in plain]
    assert {g.op for g in gens} == {"ablate"} and {g.op for g in plain} == {"add"}
    by_hand = []
    for prompt in PROMPTS:
        ids, mask = _batch(lm, [prompt])
        with intervene(lm, Point(1), lambda h, step: h - (h @ v)[..., None] * v), torch.no_grad():
            seq = lm.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0
            )
        by_hand.append(tuple(seq[0, ids.shape[1] :].tolist()))
    ablated = [g.token_ids for g in gens[1::2]]
    assert [t[: len(a)] for t, a in zip(by_hand, ablated, strict=True)] == ablated
    assert ablated != [g.token_ids for g in plain]
    with pytest.raises(
        ValueprobeError, match="^op clamp: nnsight's generate graph only adds α·unit·v̂ .*: use --route hooks$"
    ):
        generate(
            lm,
            SteeringSpec(axis, op=Operator("clamp", hi=0.0)),
            PROMPTS[:1],
            alphas=[1.0],
            route="nnsight",
            **kw,
        )


def test_sweep_settings_without_op_are_an_add_sweep(tmp_path):
    """A settings.json written before operators existed resumes as ``add``; another op is another sweep."""
    add = settings_for(tmp_path)
    assert "op" not in add.to_dict() and "lo" not in add.to_dict()
    old = {k: v for k, v in add.to_dict().items()}
    assert SweepSettings.from_dict(old) == add and SweepSettings.from_dict(old).spec.op == Operator("add")
    clamp = settings_for(tmp_path, spec=SteeringSpec(probe="tiny", op=Operator("clamp", lo=-1.0)))
    assert clamp.to_dict()["op"] == "clamp" and clamp.to_dict()["lo"] == -1.0
    assert SweepSettings.from_dict(json.loads(json.dumps(clamp.to_dict()))) == clamp
    with pytest.raises(ValueprobeError, match="lo 2 is above hi 1"):
        SweepSettings.from_dict({**old, "op": "clamp", "lo": 2.0, "hi": 1.0})


def test_cli_steer_op_bad_input_one_line_before_model_load(tiny_files, tmp_path, capsys, monkeypatch):  # noqa: F811
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("valueprobe.model.load.load", no_load)
    r = tiny_files
    base = [
        "steer",
        "--probe",
        str(r / "probe"),
        "--model",
        str(r / "model"),
        "--prompts",
        str(r / "p.jsonl"),
    ]
    cases = [
        (["--op", "clamp", "--lo", "2", "--hi", "1"], "the bound lo 2 is above hi 1"),
        (["--op", "set"], "--op set needs --target"),
        (["--op", "add", "--lo", "1"], "--lo goes with --op clamp"),
        (["--op", "scale"], "scale"),
    ]
    for extra, words in cases:
        code, _, err = run_cli([*base, *extra, "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and err.count("\n") == 1 and words in err, (extra, err)
        assert not (tmp_path / "o").exists()


# --- sites and phases ------------------------------------------------------------------------------

# each family's attention submodule, named here apart from the hook layer's table
ATTENTION = {"llama": "self_attn", "gpt2": "attn", "gpt_neox": "attention"}


def _module_output(lm, module, ids, mask, spec=None, alpha=None):
    """The module's output (first element) in one forward, caught by a plain torch hook, and the
    forward's hidden states; steered when ``spec`` is given."""
    seen = []
    hook = module.register_forward_hook(
        lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        if spec is not None:
            with steer(lm, spec, alpha):
                states = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
        else:
            states = _forward(lm, ids, mask, output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    return seen[0], states


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["add", "ablate"])
def test_attention_and_mlp_outputs_take_the_operator(tiny_lm_factory, arch, name):
    """At attn_out / mlp_out the operator acts on the submodule's output o (closed form on o); the
    MLP's output is the block's last addition, so there resid_post moves by exactly o' − o."""
    lm = tiny_lm_factory(arch)
    axis = op_axis(lm)
    v = axis.direction(1)
    ids, mask = _batch(lm)
    real = mask.bool()
    alpha = _alpha(name)
    for site, module in (("attn_out", getattr(lm.layers[1], ATTENTION[arch])), ("mlp_out", lm.layers[1].mlp)):
        o, base = _module_output(lm, module, ids, mask)
        got_o, got = _module_output(
            lm, module, ids, mask, SteeringSpec(axis, layers=1, site=site, op=name), alpha
        )
        want_o = closed_form(name, o, alpha, v)
        torch.testing.assert_close(got_o[real], want_o[real], atol=1e-5, rtol=0)
        assert torch.equal(got[1], base[1]) and torch.equal(got_o[2], o[2])  # upstream, α = 0 row
        if site == "mlp_out":
            torch.testing.assert_close(got[2][real], (base[2] + want_o - o)[real], atol=1e-5, rtol=0)
        else:
            assert not torch.allclose(got[2][real], base[2][real], atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_output_steering_under_kv_cache(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    ids, mask = _batch(lm)
    cached_and_full(
        lm, ids, mask, 5, SteeringSpec(op_axis(lm), site="attn_out"), torch.tensor([3.0, -2.0, 0.0, 1.0])
    )


def test_a_family_without_the_submodule_is_refused_in_one_line(tiny_lm_factory, tiny_tokenizer):
    lm = _renamed_mlp(tiny_lm_factory("llama"), tiny_tokenizer)
    model = lm.model
    hooks = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())  # noqa: E731
    before = hooks()
    with pytest.raises(ValueprobeError, match="blocks of tiny-renamed expose no mlp_out submodule"):
        steer(lm, SteeringSpec(op_axis(lm), site="mlp_out", op="ablate"), 1.0)
    with pytest.raises(ValueprobeError, match="unknown site"):
        steer(lm, SteeringSpec(op_axis(lm), site="resid_mid"), 1.0)
    assert hooks() == before  # nothing left on


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("window", [(0, 1), (1, 3)])
def test_window_of_generated_tokens(tiny_lm_factory, arch, window):
    """Only generated tokens a <= i < b move (i = 0 at the prompt's padded width), under the cache."""
    lm = tiny_lm_factory(arch)
    axis = op_axis(lm)
    ids, mask = _batch(lm)
    width, alpha = ids.shape[1], torch.tensor([3.0, -2.0, 0.0, 1.0])
    out, base, real = cached_and_full(lm, ids, mask, 5, SteeringSpec(axis, window=window), alpha)
    column = torch.arange(real.shape[1])
    moved = real & ((column >= width + window[0]) & (column < width + window[1]))[None, :]
    want = closed_form("add", base.hidden_states[2], alpha, axis.direction(1))
    torch.testing.assert_close(out.hidden_states[2][moved], want[moved], atol=1e-5, rtol=0)
    assert torch.equal(out.hidden_states[2][~moved], base.hidden_states[2][~moved])
    assert int(moved.sum()) == 4 * (window[1] - window[0])  # every row, b - a generated cells
    for bad, words in (((2, 2), "0 <= a < b"), ((-1, 2), "0 <= a < b")):
        with pytest.raises(ValueprobeError, match=words):
            steer(lm, SteeringSpec(axis, window=bad), 1.0, prompt_length=width)
    with pytest.raises(ValueprobeError, match="cannot go with positions='prompt'"):
        steer(lm, SteeringSpec(axis, window=(0, 2), positions="prompt"), 1.0, prompt_length=width)
    with pytest.raises(
        ValueprobeError,
        match="^site attn_out with a window of generated tokens: nnsight's generate graph only adds",
    ):
        generate(
            lm,
            SteeringSpec(axis, site="attn_out", window=(0, 2)),
            PROMPTS[:1],
            route="nnsight",
            progress=False,
        )


def _renamed_mlp(lm, tokenizer):
    """A copy of ``lm`` whose blocks call their MLP something the hook layer does not know."""
    import copy

    from valueprobe.model.load import wrap

    model = copy.deepcopy(lm.model)
    for block in model.model.layers:
        block._modules["dense_block"] = block._modules.pop("mlp")
    return wrap(model, tokenizer, model_id="tiny-renamed")


def test_cli_steer_op_at_a_site_runs_and_records_it(tiny_files, tmp_path, capsys):  # noqa: F811
    r = tiny_files
    argv = [
        "steer",
        "--probe",
        str(r / "probe"),
        "--model",
        str(r / "model"),
        "--prompts",
        str(r / "p.jsonl"),
    ]
    argv += [
        "--alphas",
        "0,1",
        "--op",
        "ablate",
        "--site",
        "mlp_out",
        "--max-new-tokens",
        "2",
        "--limit",
        "2",
    ]
    argv += ["--random-directions", "1", "--greedy", "--bootstrap", "10", "--out", str(tmp_path / "o")]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    settings = json.loads((tmp_path / "o" / "settings.json").read_text())
    assert (settings["op"], settings["site"]) == ("ablate", "mlp_out") and "lo" not in settings
    assert SweepSettings.from_dict(settings).spec.op == Operator("ablate")


def test_cli_steer_at_a_site_the_family_lacks_is_one_line(
    tiny_files,  # noqa: F811
    tiny_lm_factory,
    tmp_path,
    capsys,
    monkeypatch,
):
    lm = _renamed_mlp(tiny_lm_factory("llama"), tiny_lm_factory("llama").tokenizer)
    monkeypatch.setattr("valueprobe.model.load.load", lambda *a, **k: lm)
    r = tiny_files
    argv = [
        "steer",
        "--probe",
        str(r / "probe"),
        "--model",
        str(r / "model"),
        "--prompts",
        str(r / "p.jsonl"),
    ]
    argv += ["--op", "ablate", "--site", "mlp_out", "--alphas", "0,1", "--out", str(tmp_path / "o")]
    code, _, err = run_cli(argv, capsys)
    errors = [line for line in err.splitlines() if "error" in line]  # (stderr also has progress bars)
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error: "), err
    assert "expose no mlp_out submodule" in err and "use site resid_post or resid_pre" in err
