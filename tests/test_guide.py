"""Guided decoding (`valueprobe.guided`): readings against output_hidden_states, picks against an
independent readout, pruning and rollback against their definitions, tokens spent, bad input."""

from __future__ import annotations

import json
import re
from functools import partial

import numpy as np
import pytest
import torch
from conftest import run_cli

from valueprobe import guide as guide_chat
from valueprobe.errors import ValueprobeError
from valueprobe.files import jsonable
from valueprobe.guided.cache import CachedDecoder
from valueprobe.guided.policy import BestOfN, Prune, Rollback, as_policy
from valueprobe.guided.records import Guided
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import token_cos, val
from valueprobe.steering.decode.generation import encode_prompts as encode_chat
from valueprobe.steering.decode.generation import generate as generate_chat
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.spec import SteeringSpec

PROMPTS = ["The capital of France is", "def add(a, b):", "Wait, that's not right. Let me"]
# these prompts are completions, read as typed (chat=False); a chat list is rendered either way
guide = partial(guide_chat, chat=False)
generate = partial(generate_chat, chat=False)
encode_prompts = partial(encode_chat, chat=False)
LAYER = 1


def planted(lm, *, seed: int = 1) -> ValueAxis:
    """A random unit axis at every layer, μ = 0.1 and σ = 0.5 (so σ-scores are a known affine map)."""
    n, d = lm.n_layers, lm.d_model
    v = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True),
        layers=tuple(range(n)),
        mu=torch.full((n,), 0.1),
        sigma=torch.full((n,), 0.5),
        mean_norm=torch.full((n,), 8.0),
        best_layer=LAYER,
        site="resid_post",
        method="planted",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=d,
    )


def hidden(lm, prompt: list[int], tokens: tuple[int, ...], layer: int = LAYER) -> torch.Tensor:
    """resid_post[layer] of the response tokens, from one unpadded forward with output_hidden_states."""
    ids = torch.tensor([prompt + list(tokens)])
    with torch.no_grad():
        out = lm.model(input_ids=ids, output_hidden_states=True)
    return out.hidden_states[layer + 1][0, len(prompt) :]


def logprobs(lm, prompt: list[int], tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).numpy()


def sampled(c, eos: int) -> list[int]:
    """Every token the row sampled: its response, and the EOS it stopped on."""
    return list(c.token_ids) + ([eos] if c.finished else [])


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox"])
@pytest.mark.parametrize("null", [False, True])
def test_the_value_read_in_the_forward_equals_a_second_pass(tiny_lm_factory, arch, null):
    lm = tiny_lm_factory(arch)
    axis = planted(lm)
    direction = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(9)) if null else None
    out = guide(
        lm,
        SteeringSpec(axis, direction=direction),
        PROMPTS,
        BestOfN(n=3),
        decoding=Decoding(max_new_tokens=10),
        progress=False,
    )
    encoded = encode_prompts(lm, PROMPTS)
    d = axis.direction(LAYER) if direction is None else direction / direction.norm()
    checked = 0
    for g in out:
        for c in g.candidates:
            assert len(c.sigma) == len(c.token_ids) - (0 if c.finished else 1)
            h = hidden(lm, encoded[g.prompt], c.token_ids[: len(c.sigma)])
            want_sigma = ((h @ d) - 0.1) / 0.5
            np.testing.assert_allclose(c.sigma, want_sigma.numpy(), atol=2e-4)
            np.testing.assert_allclose(c.cos, token_cos(h, d), atol=2e-5)
            np.testing.assert_allclose(c.logprobs, logprobs(lm, encoded[g.prompt], sampled(c, 0)), atol=2e-4)
            checked += len(c.sigma)
    assert checked > 20


def test_candidates_are_the_rows_generate_samples(tiny_lm_factory):
    """Common random numbers: row (p, s) draws what vp.generate's row (p, s) draws, padding and all."""
    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    out = guide(
        lm,
        axis,
        PROMPTS,
        BestOfN(n=4),
        decoding=Decoding(max_new_tokens=12, seed=3, temperature=0.9),
        progress=False,
    )
    gens = generate(
        lm,
        axis,
        PROMPTS,
        decoding=Decoding(samples=4, max_new_tokens=12, seed=3, temperature=0.9),
        progress=False,
    )
    assert [g.token_ids for g in gens] == [c.token_ids for g in out for c in g.candidates]
    assert [g.text for g in gens] == [c.text for g in out for c in g.candidates]


@pytest.mark.parametrize("score", ["sigma", "cos", "logprob"])
@pytest.mark.parametrize("last_k", [None, 3])
def test_best_of_n_picks_the_argmax_of_an_independent_readout(tiny_lm_factory, score, last_k):
    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    out = guide(
        lm,
        axis,
        PROMPTS,
        BestOfN(n=6, last_k=last_k),
        decoding=Decoding(max_new_tokens=10),
        score=score,
        progress=False,
    )
    encoded = encode_prompts(lm, PROMPTS)
    for g in out:
        values = []
        for c in g.candidates:
            if score == "logprob":
                lp = logprobs(lm, encoded[g.prompt], sampled(c, 0))
                values.append(float(np.mean(lp if last_k is None else lp[-last_k:])))
                continue
            h = hidden(lm, encoded[g.prompt], c.token_ids[: len(c.sigma)])
            h = h if last_k is None else h[-last_k:]
            v = val(h, axis.direction(LAYER)) if score == "cos" else float(axis.score(h, LAYER).mean())
            values.append(v)
        assert len(set(np.round(values, 4))) == len(values)  # no near-tie: the argmax is well defined
        assert g.chosen == int(np.argmax(values))
        assert g.token_ids == g.candidates[g.chosen].token_ids
        assert g.tokens_spent == sum(len(sampled(c, 0)) for c in g.candidates)


def live_at(c, t: int, max_new: int) -> bool:
    """Whether the row still ran when its t-th token was sampled (a prune checkpoint at t)."""
    return (c.pruned_at is None or c.pruned_at >= t) and len(c.token_ids) >= t and t < max_new


@pytest.mark.parametrize("quantile", [0.3, 0.5, 0.8])
def test_prune_drops_exactly_the_rows_below_the_quantile_of_live_siblings(tiny_lm_factory, quantile):
    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    max_new, every = 16, 4
    policy = Prune(n=8, every=every, quantile=quantile)
    out = guide(lm, axis, PROMPTS, policy, decoding=Decoding(max_new_tokens=max_new, seed=5), progress=False)
    full = guide(
        lm, axis, PROMPTS, BestOfN(n=8), decoding=Decoding(max_new_tokens=max_new, seed=5), progress=False
    )
    dropped = 0
    for g, f in zip(out, full, strict=True):
        for t in range(every, max_new, every):
            live = [c for c in g.candidates if live_at(c, t, max_new)]
            running = np.array([np.mean(c.sigma[: t - 1]) for c in live])
            cut = np.quantile(running, quantile) if len(live) > 1 else -np.inf
            assert {c.sample for c in live if c.pruned_at == t} == {
                c.sample for c, v in zip(live, running, strict=True) if v < cut
            }
        for c, whole in zip(g.candidates, f.candidates, strict=True):
            # a row's tokens do not depend on its siblings: pruned rows are prefixes, kept rows whole
            assert c.token_ids == whole.token_ids[: len(c.token_ids)]
            assert (c.pruned_at is None) == (c.token_ids == whole.token_ids)
            dropped += c.pruned_at is not None
        assert g.tokens_spent == sum(len(sampled(c, 0)) for c in g.candidates) < f.tokens_spent
        assert g.candidates[g.chosen].pruned_at is None
    assert dropped > 0


@pytest.mark.parametrize(("quantile", "left"), [(0.99, 1), (0.01, 7)])
def test_prune_near_the_ends_keeps_the_best_or_drops_the_worst(tiny_lm_factory, quantile, left):
    lm = tiny_lm_factory("llama")
    out = guide(
        lm,
        planted(lm),
        PROMPTS[:1],
        Prune(n=8, every=3, quantile=quantile),
        decoding=Decoding(max_new_tokens=4),
        progress=False,
    )
    (g,) = out
    assert sum(c.pruned_at is None for c in g.candidates) == left


def fresh_logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_rolled_back_cache_gives_the_logits_of_a_fresh_forward_over_the_kept_prefix(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    prompts = [[5, 6, 7, 8], [9, 10]]
    dec = CachedDecoder(lm, prompts, pad_id=0)
    dec.prefill()
    fed = [list(p) for p in prompts]
    for t in range(6):
        step = [20 + t, 40 + t]
        dec.step(torch.tensor(step))
        fed = [f + [s] for f, s in zip(fed, step, strict=True)]
    width = dec.mask.shape[1]
    dec.unfeed(0, 4)  # row 0 drops 3 tokens and re-feeds the last kept one: a masked hole
    assert dec.mask.shape[1] == width == dec.cache.get_seq_length()
    logits = dec.step(torch.tensor([fed[0][-4], 99]))
    torch.testing.assert_close(logits[0], fresh_logits(lm, fed[0][:-3]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], fresh_logits(lm, fed[1] + [99]), atol=1e-4, rtol=1e-4)
    dec.keep([0])  # alone, a rollback is a true crop: the cells taken back and the hole before them go
    dec.unfeed(0, 3)
    kept = fed[0][:-3][:-2]
    assert dec.cache.get_seq_length() == dec.mask.shape[1] == len(kept) - 1
    assert bool(dec.mask.all())
    logits = dec.step(torch.tensor([kept[-1]]))
    torch.testing.assert_close(logits[0], fresh_logits(lm, kept), atol=1e-4, rtol=1e-4)


def test_rollback_spends_the_tokens_it_takes_back_and_stops_at_its_cap(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    policy = Rollback(n=3, k=3, tau=1e-6, beta=0.0, max_rollbacks=2)
    out = guide(lm, axis, PROMPTS, policy, decoding=Decoding(max_new_tokens=16, seed=2), progress=False)
    total = 0
    for g in out:
        for c in g.candidates:
            assert 0 <= c.rollbacks <= 2
            assert c.tokens_spent == len(sampled(c, 0)) + c.rollbacks * policy.k
            assert len(c.sigma) == len(c.token_ids) - (0 if c.finished else 1)
            total += c.rollbacks
        assert g.tokens_spent == sum(c.tokens_spent for c in g.candidates)
        assert g.rollbacks == sum(c.rollbacks for c in g.candidates)
    assert total > 0
    # the readings after rollbacks are still the second pass's (the cache forgot the dropped tokens)
    encoded = encode_prompts(lm, PROMPTS)
    for g in out:
        for c in g.candidates:
            h = hidden(lm, encoded[g.prompt], c.token_ids[: len(c.sigma)])
            np.testing.assert_allclose(c.sigma, (axis.score(h, LAYER)).numpy(), atol=2e-4)


def _decisions(records):
    return [
        (g.chosen, c.token_ids, c.finished, c.rollbacks, c.tokens_spent, c.pruned_at)
        for g in records
        for c in g.candidates
    ]


@pytest.mark.parametrize(
    "policy",
    [BestOfN(n=3), Rollback(n=2, k=3, tau=0.05, beta=0.5, max_rollbacks=3, alpha=2.0, steer_tokens=4)],
    ids=["best-of-n", "rollback"],
)
def test_the_host_looking_once_per_checkpoint_decides_as_it_would_every_step(
    tiny_lm_factory, monkeypatch, policy
):
    """Rows decode on the device between checkpoints; a row that ended or rolled back inside a chunk
    is replayed as if the host had looked every step (CHECK_EVERY = 1): the same tokens, rollbacks,
    ends and picks, readings equal within float32 rounding (the batch keeps ended rows longer)."""
    from valueprobe.guided import run

    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    kw = {"decoding": Decoding(max_new_tokens=20, seed=4), "progress": False}
    first = guide(lm, axis, PROMPTS, policy, **kw)
    # a token the rows sample often, as EOS, so rows end inside chunks
    counts = torch.bincount(torch.tensor([t for g in first for c in g.candidates for t in c.token_ids]))
    eos, lm.tokenizer.eos_token_id = lm.tokenizer.eos_token_id, int(counts.argmax())
    try:
        chunked = guide(lm, axis, PROMPTS, policy, **kw)
        monkeypatch.setattr(run, "CHECK_EVERY", 1)
        stepwise = guide(lm, axis, PROMPTS, policy, **kw)
    finally:
        lm.tokenizer.eos_token_id = eos
    assert _decisions(chunked) == _decisions(stepwise)
    assert any(c.finished for g in chunked for c in g.candidates)
    if isinstance(policy, Rollback):
        assert sum(g.rollbacks for g in chunked) > 0
    for g, h in zip(chunked, stepwise, strict=True):
        for a, b in zip(g.candidates, h.candidates, strict=True):
            np.testing.assert_allclose(a.sigma + a.logprobs, b.sigma + b.logprobs, atol=1e-5)


def test_rollback_that_never_fires_is_best_of_n(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    never = guide(
        lm,
        axis,
        PROMPTS,
        Rollback(n=2, tau=1e9, alpha=3.0),
        decoding=Decoding(max_new_tokens=10),
        progress=False,
    )
    plain = guide(lm, axis, PROMPTS, BestOfN(n=2), decoding=Decoding(max_new_tokens=10), progress=False)
    assert [c.token_ids for g in never for c in g.candidates] == [
        c.token_ids for g in plain for c in g.candidates
    ]


def test_rollback_steers_only_after_a_rollback(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted(lm)
    kw = {"decoding": Decoding(max_new_tokens=12), "progress": False}
    spec = SteeringSpec(axis, read_layer=2, layers=0)
    calm = guide(lm, spec, PROMPTS, Rollback(n=4, k=2, tau=0.05, beta=0.0), **kw)
    pushed = guide(lm, spec, PROMPTS, Rollback(n=4, k=2, tau=0.05, beta=0.0, alpha=40.0), **kw)
    pairs = [
        (a, b)
        for g, h in zip(calm, pushed, strict=True)
        for a, b in zip(g.candidates, h.candidates, strict=True)
    ]
    untouched = [(a, b) for a, b in pairs if a.rollbacks == b.rollbacks == 0]
    assert untouched and len(untouched) < len(pairs)
    assert all(a.token_ids == b.token_ids and a.sigma == b.sigma for a, b in untouched)
    assert any(a.token_ids != b.token_ids for a, b in pairs if b.rollbacks)


def test_guided_records_round_trip_through_json(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    out = guide(
        lm, planted(lm), PROMPTS[:2], Prune(n=4, every=2), decoding=Decoding(max_new_tokens=6), progress=False
    )
    again = [Guided.from_dict(json.loads(json.dumps(jsonable(g.to_dict())))) for g in out]
    assert [jsonable(g.to_dict()) for g in again] == [jsonable(g.to_dict()) for g in out]
    assert again[0].candidates[0].sigma == out[0].candidates[0].sigma


@pytest.mark.parametrize(
    ("policy", "options", "says"),
    [
        ("best-of-n", {"n": 0}, "N (samples per prompt)"),
        ("prune", {"quantile": 1.0}, "strictly between 0 and 1"),
        ("prune", {"quantile": 0.0}, "strictly between 0 and 1"),
        ("rollback", {"tau": float("nan")}, "tau"),
        ("rollback", {"tau": "x"}, "tau"),
        ("best-of-n", {"quantile": 0.5}, "takes no option 'quantile'"),
        ("greedy", {}, "unknown policy"),
    ],
)
def test_bad_policy_settings_are_refused_in_one_line(policy, options, says):
    with pytest.raises(ValueprobeError, match=re.escape(says)):
        as_policy(policy, **options)


# --- the command line ---


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory, tiny_dir, tiny_lm_factory):
    from valueprobe.datasets.io import Example, write_jsonl

    root = tmp_path_factory.mktemp("guide")
    planted(tiny_lm_factory("llama")).save(root / "probe")
    write_jsonl(
        root / "prompts.jsonl",
        [Example(id=f"p{i}", label=1, group="g", text=t) for i, t in enumerate(PROMPTS)],
    )
    return {
        "model": tiny_dir,
        "probe": str(root / "probe"),
        "prompts": str(root / "prompts.jsonl"),
        "root": root,
    }


def guide_argv(files, out, *extra: str) -> list[str]:
    return [
        "guide",
        "--model",
        files["model"],
        "--probe",
        files["probe"],
        "--prompts",
        files["prompts"],
        "--out",
        str(out),
        "--max-new-tokens",
        "6",
        *extra,
    ]


def test_the_command_writes_the_records_and_a_summary(cli_files, capsys, tiny_lm_factory):
    out = cli_files["root"] / "run"
    argv = guide_argv(
        cli_files, out, "--policy", "prune", "--n", "4", "--every", "2", "--random-directions", "2"
    )
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    lines = (out / "guide.jsonl").read_text().splitlines()
    records = [Guided.from_dict(json.loads(line)) for line in lines]
    assert [g.direction for g in records] == ["axis"] * 3 + ["random-0"] * 3 + ["random-1"] * 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["quantile"] == 0.5 and summary["summary"]["policy"] == "prune"
    rows = {r[0]: r for r in summary["summary"]["rows"]}
    assert rows["axis"][2] == pytest.approx(np.mean([g.tokens_spent for g in records[:3]]))
    # the same library call gives the same records (the CLI adds nothing of its own)
    lm = tiny_lm_factory("llama")
    again = guide(
        lm, planted(lm), PROMPTS, Prune(n=4, every=2), decoding=Decoding(max_new_tokens=6), progress=False
    )
    assert [g.token_ids for g in again] == [g.token_ids for g in records[:3]]
    assert "tokens/prompt" in stdout


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--n", "0"], "--n 0 is too small"),
        (["--policy", "prune", "--quantile", "1.5"], "quantile must be strictly between 0 and 1"),
        (["--policy", "prune", "--quantile", "0"], "quantile must be strictly between 0 and 1"),
        (["--policy", "rollback", "--tau", "abc"], "--tau 'abc' is not a number"),
        (["--policy", "rollback", "--tau", "nan"], "--tau 'nan' is not a finite number"),
        (["--policy", "best-of-n", "--tau", "1"], "takes no option 'tau'"),
        (["--score", "vibes"], "--score 'vibes'"),
    ],
)
def test_bad_input_to_the_command_is_one_line(cli_files, capsys, tmp_path, extra, says):
    from test_cli_faults import one_line

    code, _, err = run_cli(guide_argv(cli_files, tmp_path / "out", *extra), capsys)
    assert says in one_line(code, err)
    assert not (tmp_path / "out").exists()


class _NoCache(torch.nn.Module):
    """A causal LM whose forward keeps no KV cache (as some remote-code models do)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, **kw):
        out = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        return out


def test_rollback_on_a_model_without_a_kv_cache_is_one_line(cli_files, capsys, tmp_path, monkeypatch):
    from test_cli_faults import one_line

    from valueprobe.model.load import load, wrap

    def no_cache_load(model, **kw):
        lm = load(model, **kw)
        return wrap(
            _NoCache(lm.model), lm.tokenizer, model_id=lm.model_id, layers_path="inner." + lm.layers_path
        )

    monkeypatch.setattr("valueprobe.model.load.load", no_cache_load)
    code, _, err = run_cli(guide_argv(cli_files, tmp_path / "out", "--policy", "rollback"), capsys)
    assert "returns no KV cache" in one_line(code, err)


@pytest.mark.slow
def test_on_the_default_model_the_read_is_the_second_pass_and_the_samples_are_generates(default_lm):
    from pathlib import Path

    lm = default_lm
    axis = ValueAxis.load(
        Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-reward-history", lm=lm
    )
    chats = [[{"role": "user", "content": "What is 7 + 5? Give the final answer as a number."}]]
    out = guide(
        lm, axis, chats, BestOfN(n=3), decoding=Decoding(max_new_tokens=10, temperature=0.8), progress=False
    )
    gens = generate(
        lm, axis, chats, decoding=Decoding(samples=3, max_new_tokens=10, temperature=0.8), progress=False
    )
    assert [g.token_ids for g in gens] == [c.token_ids for c in out[0].candidates]
    prompt = encode_prompts(lm, chats)[0]
    layer = axis.best_layer
    for c in out[0].candidates:
        h = hidden(lm, prompt, c.token_ids[: len(c.sigma)], layer)
        np.testing.assert_allclose(c.sigma, axis.score(h.float(), layer).numpy(), atol=1e-3)
    means = [float(np.mean(c.sigma)) for c in out[0].candidates]
    assert out[0].chosen == int(np.argmax(means))
