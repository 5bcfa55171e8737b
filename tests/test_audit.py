"""The audit: its 2×2 data, its readings against output_hidden_states, its statistics on planted data,
the verdict rule, the confidence parser, and the command (bad input, resume after Ctrl-C)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import run_cli as run
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import spearmanr

from valueprobe.activations.encode import encode
from valueprobe.audit import lens
from valueprobe.audit.cut import FRACTIONS, CutReads, _contrast, cut_test
from valueprobe.audit.dissociation import SteerRow, dissociation_test, parse_confidence
from valueprobe.audit.orthogonal import ROUTE_ONE, OrthogonalFit, fit_routes
from valueprobe.audit.reading import NEUTRAL, Directions
from valueprobe.audit.records import Audit, Effect, Sign, verdict_of
from valueprobe.audit.run import rendering_of
from valueprobe.audit.turns import ARMS, build_turns, check_turns
from valueprobe.audit.two_by_two import TurnReads, contrasts, read_turns, two_by_two
from valueprobe.datasets.io import Span, read_jsonl
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.metrics import dose_slope, partial_correlations, spearman_columns
from valueprobe.stats.null import random_directions
from valueprobe.vocab import Positions


def tiny_axis(lm, *, best: int = 1, metrics: dict | None = None) -> ValueAxis:
    d = torch.from_numpy(random_directions(lm.d_model, lm.n_layers, seed=5)).float()
    n = lm.n_layers
    return ValueAxis(
        directions=d, layers=tuple(range(n)), mu=torch.zeros(n), sigma=torch.full((n,), 2.0),
        mean_norm=torch.full((n,), 8.0), best_layer=best, site="resid_post", method="test",
        model_id=lm.model_id, fingerprint=lm.fingerprint, d_model=lm.d_model,
        metrics={"best_layer_rule": "test"} if metrics is None else metrics,
    )  # fmt: skip


# --- the 2×2 data -------------------------------------------------------------------------------


def test_every_arm_has_the_same_tail_at_the_same_positions(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    sets, dropped = build_turns(lm, n=6)
    assert len(sets) + dropped == 6 and len(sets) >= 4
    for s in sets:
        full = encode(lm, s.arms, positions=Positions.last)
        ids = [e.input_ids for e in full]
        assert len({len(x) for x in ids}) == 1  # one length: as many tokens before the tail in every arm
        assert len({tuple(x[s.tail_start :]) for x in ids}) == 1  # identical tail ids from the same position
        assert [(a.meta["value"], a.meta["end"]) for a in s.arms] == list(ARMS)
        assert all(a.messages[:-1] == s.arms[0].messages[:-1] for a in s.arms)  # one history


def test_a_conversation_whose_tails_differ_is_dropped_never_shifted(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    sets, _ = build_turns(lm, n=3)
    rows = [arm for s in sets for arm in s.arms]
    kept, dropped = check_turns(lm, rows, chat_template="model")
    assert (len(kept), dropped) == (3, 0)
    bad = rows[0]
    text = bad.messages[-1]["content"]
    (tail,) = bad.spans
    longer = replace(  # one word more before the tail: its tokens would sit one place later
        bad,
        messages=(*bad.messages[:-1], {"role": "assistant", "content": "Well, " + text}),
        spans=(Span(tail.start + 6, tail.end + 6, "tail", message=tail.message),),
    )
    kept, dropped = check_turns(lm, [longer, *rows[1:]], chat_template="model")
    assert (len(kept), dropped) == (2, 1)
    assert all(s.conversation != bad.meta["conversation"] for s in kept)


@pytest.mark.slow
def test_the_default_tokenizer_aligns_every_conversation_without_padding(default_lm):
    sets, dropped = build_turns(default_lm, n=40)
    assert dropped == 0 and len(sets) == 40
    assert {a.meta["pad_tokens"] for s in sets for a in s.arms} == {0}  # the phrasings are matched in length


# --- readings against the model's own hidden states -------------------------------------------------


def _hidden(lm, ids: list[int], layer: int) -> np.ndarray:
    with torch.no_grad():
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[layer + 1][0].double().numpy()  # resid_post[L] is hidden_states[L + 1]


def test_neutral_sigma_is_the_spread_of_each_direction_over_neutral_text(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    dirs = Directions.of(axis, lm, layer=1, n_random=3, seed=0)
    assert np.allclose(dirs.matrix[1:], random_directions(lm.d_model, 3, seed=0))
    texts = [ex.text for ex in read_jsonl(NEUTRAL)]
    h = np.concatenate(
        [_hidden(lm, lm.tokenizer(t)["input_ids"], 1)[1:] for t in texts]
    )  # every token but the sink
    assert dirs.reference_tokens == len(h)
    np.testing.assert_allclose(dirs.reference_sigma, (h @ dirs.matrix.T).std(axis=0), rtol=1e-4)
    assert dirs.axis_units() == pytest.approx(dirs.reference_sigma[0] / 2.0)


def test_tail_readings_equal_output_hidden_states(tiny_lm_factory):
    lm = tiny_lm_factory("qwen2")
    axis = tiny_axis(lm)
    dirs = Directions.build(
        axis, layer=1, n_random=2, seed=0, reference_sigma=np.ones(3)
    )  # not the last: its
    # hidden_states entry is after the final norm
    sets, _ = build_turns(lm, n=2)
    reads = read_turns(lm, dirs, sets, site=axis.site)
    for c, s in enumerate(sets):
        for a, arm in enumerate(s.arms):
            (enc,) = encode(lm, [arm], positions=Positions.span_tokens)
            at = [toks[0] for _, toks in enc.selections]  # the tail's tokens (those with text of their own)
            assert at[0] == s.tail_start and len(at) == s.n_tail
            h = _hidden(lm, enc.input_ids, 1)[at].mean(axis=0)
            np.testing.assert_allclose(reads.hidden[c, a], h, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(reads.tail[c, a], dirs.matrix @ h, rtol=1e-4, atol=1e-5)


# --- statistics on planted readings ----------------------------------------------------------------


def _dirs(k: int) -> Directions:
    return Directions(0, np.eye(k + 1, 8), np.ones(k + 1), 1, axis_sigma=1.0, axis_mu=0.0)


def _planted_turns(value: float, end: float, *, n: int = 30, k: int = 32, seed: int = 0) -> TurnReads:
    rng = np.random.default_rng(seed)
    tail = rng.normal(0, 0.05, (n, 4, k + 1)) + rng.normal(
        0, 1, (n, 1, k + 1)
    )  # each conversation its own level
    for a, (v, e) in enumerate(ARMS):
        tail[:, a, 0] += value * (v == "high") + end * (e == "near")
    return TurnReads(sets=(), tail=tail, hidden=np.zeros((n, 4, 8)), n_tokens=0)


def test_two_by_two_effects_are_the_paired_contrasts():
    reads = _planted_turns(0.5, 0.0)
    c = contrasts(reads)
    hn, hf, ln, lf = (reads.tail[:, a] for a in range(4))
    np.testing.assert_allclose(c["value"], (hn + hf - ln - lf) / 2)
    np.testing.assert_allclose(c["end"], (hn + ln - hf - lf) / 2)
    np.testing.assert_allclose(c["interaction"], (hn - ln) - (hf - lf))
    assert c["value"][:, 0].mean() == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize(
    ("value", "end", "verdict"),
    [(0.5, 0.0, "value"), (0.0, 0.5, "the rival"), (0.5, 0.5, "both"), (0.0, 0.0, "neither")],
)
def test_the_two_by_two_tells_both_from_one(value, end, verdict, monkeypatch):
    monkeypatch.setattr("valueprobe.audit.two_by_two._cells", lambda reads, x: (0, 0))
    monkeypatch.setattr("valueprobe.audit.two_by_two._padding_note", lambda reads: "")
    test = two_by_two(_planted_turns(value, end), _dirs(32), dropped=0, seconds=0.0)
    assert test.verdict == verdict, test.why


def test_a_ramp_gives_one_contrast_at_every_cut_and_a_jump_peaks_at_its_cut():
    ramp = np.arange(20.0)[:, None]
    assert {float(_contrast(ramp, c)[0]) for c in range(1, 20)} == {10.0}  # half the rise, wherever the cut
    step = (np.arange(20) >= 8).astype(float)[:, None]
    contrasts_ = [float(_contrast(step, c)[0]) for c in range(1, 20)]
    assert int(np.argmax(contrasts_)) + 1 == 8 and max(contrasts_) == 1.0


def _planted_cuts(real: float, failed: float, *, n: int = 24, k: int = 32, peak: float = 0.3) -> CutReads:
    rng = np.random.default_rng(1)
    noise = lambda *shape: rng.normal(0, 0.05, shape)  # noqa: E731
    placebo = noise(n, len(FRACTIONS), k + 1)
    placebo[:, :, 0] += real - peak
    r = noise(n, k + 1)
    r[:, 0] += real
    f = noise(n, k + 1)
    f[:, 0] += failed
    return CutReads(
        real=r, placebo=placebo, failed=f, real_fraction=np.full(n, 0.5), n_sequences=n, n_tokens=0
    )


@pytest.mark.parametrize(("real", "failed", "verdict"), [(1.0, 0.0, "value"), (1.0, 1.0, "the rival")])
def test_the_cut_test_tells_a_jump_from_a_ramp(real, failed, verdict):
    test = cut_test(_planted_cuts(real, failed), _dirs(32), seconds=0.0)
    assert test.verdict == verdict, test.why


def test_partial_correlations_match_the_closed_form():
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=500), rng.normal(size=500)
    z = z + 0.6 * x
    y = 0.8 * x + 0.3 * z + rng.normal(size=500)
    r = np.corrcoef([y, x, z])
    closed = (r[0, 1] - r[0, 2] * r[1, 2]) / np.sqrt((1 - r[0, 2] ** 2) * (1 - r[1, 2] ** 2))
    got = partial_correlations(y[:, None], np.stack([x, z], axis=1))
    assert got[0, 0] == pytest.approx(closed)


def test_spearman_columns_match_scipy():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=(50, 3))
    expected = [spearmanr(x, y[:, j]).statistic for j in range(3)]
    np.testing.assert_allclose(spearman_columns(x, y), expected)


# --- the verdict rule and the parser --------------------------------------------------------------


def _effect(est: float, ci: tuple[float, float], null: tuple[float, float], expected: Sign = "+") -> Effect:
    return Effect(
        name="e", role="value", expected=expected, estimate=est, ci=ci, unit="σ", reference=est, null=null,
        null_percentile=50.0, n=10,
    )  # fmt: skip


def test_value_needs_its_ci_the_null_and_the_rival_held_fixed():
    good = _effect(0.5, (0.3, 0.7), (-0.1, 0.1))
    assert verdict_of(good, None, True)[0] == "value"
    assert verdict_of(good, None, False)[0] == "neither"  # gone with the rival held fixed
    assert verdict_of(_effect(0.5, (-0.1, 0.9), (-0.1, 0.1)), None, True)[0] == "neither"  # CI spans 0
    assert verdict_of(_effect(0.05, (0.03, 0.07), (-0.1, 0.1)), None, True)[0] == "neither"  # inside the null
    assert verdict_of(_effect(-0.5, (-0.7, -0.3), (-0.1, 0.1)), None, True)[0] == "neither"  # value inverted
    rival = _effect(-0.5, (-0.7, -0.3), (-0.1, 0.1), expected="±")
    assert verdict_of(good, rival, True)[0] == "both"
    assert verdict_of(None, rival, None) == ("the rival", "value: not measured by this design; rival: holds")


@given(st.integers(0, 10))
def test_a_rating_out_of_ten_parses(n):
    assert parse_confidence(f"I'd say {n}/10.") == n
    assert parse_confidence(f"{n} out of 10") == n


@given(st.integers(0, 100))
def test_a_percentage_is_a_tenth(p):
    assert parse_confidence(f"I'm {p}% confident that") == pytest.approx(p / 10)


@given(st.text(alphabet=st.characters(blacklist_categories=("Nd",)), max_size=40))
def test_no_number_is_unparsed(text):
    assert parse_confidence(text) is None


def test_numbers_outside_the_scale_are_unparsed():
    assert parse_confidence("Maybe 12 of them") is None
    assert parse_confidence("150%") is None
    assert parse_confidence("That's a great question. I'm") is None


def test_the_lens_counts_whole_words_and_end_tokens(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    specials = lens.closing_tokens(lm)
    assert "<|endoftext|>" in specials and "<|im_end|>" in specials
    closing, success = lens._shares(
        [(" Finally", 1.0), ("<|im_end|>", 1.0), ("ending", 1.0), (" Yes", 1.0)], specials
    )
    assert closing.tolist() == [1.0, 1.0, 1.0, 0.0] and success.tolist() == [0.0, 0.0, 0.0, 1.0]


# --- the command ----------------------------------------------------------------------------------

SMALL = ["--turns", "3", "--conversations", "3", "--answers", "4", "--steer-prompts", "2", "--steer-random", "2",
         "--random", "8", "--k", "10"]  # fmt: skip


@pytest.fixture
def tiny_probe(tiny_dir, tmp_path, capsys):
    path = tmp_path / "probe"
    tiny_axis(load(tiny_dir)).save(path)
    capsys.readouterr()  # the load's progress bar
    return path


def test_the_audit_runs_resumes_after_ctrl_c_and_writes_its_files(
    tiny_dir, tiny_probe, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "audit"
    args = ["audit", "--probe", str(tiny_probe), "--model", tiny_dir, "--out", str(out), *SMALL]

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr("valueprobe.audit.run.lens_test", interrupted)
        code, _, err = run(args, capsys)
    assert code == 130 and "rerun the same command to resume" in err
    done = {p.stem for p in (out / "stages").glob("*.json")}
    assert {"reference", "reads-a", "reads-b", "answers", "reads-c", "steer-0", "steer-2"} <= done
    code, stdout, err = run(args, capsys)
    assert code == 0, err
    assert (
        "reads-a: reused" in stdout and "steer-2: reused" in stdout and "▶" not in stdout
    )  # nothing ran again
    audit = Audit.from_dict(json.loads((out / "audit.json").read_text()))
    assert [t.key for t in audit.tests] == list("abcde") and audit.layer == 1
    assert all(t.verdict in ("value", "the rival", "both", "neither") for t in audit.tests)
    assert audit.command.startswith("valueprobe audit --probe ") and "--turns=3" in audit.command
    assert "Is it value?" in (out / "audit.html").read_text()
    assert len(read_jsonl(out / "turns.jsonl")) == 4 * int(
        audit.tests[0].notes[0].split()[0]
    )  # four arms each


def test_an_axis_without_a_recorded_best_layer_needs_layer(tiny_dir, tmp_path, capsys):
    lm = load(tiny_dir)
    a, b = tiny_axis(lm), tiny_axis(lm, metrics={})
    made = tmp_path / "made"
    (a - replace(b, directions=-b.directions.roll(1, dims=1))).save(made)
    capsys.readouterr()  # the load's progress bar
    code, _, err = run(
        ["audit", "--probe", str(made), "--model", tiny_dir, "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and err.count("\n") == 1
    assert "records no best layer" in err and "made by axis arithmetic" in err and "--layer" in err


@pytest.mark.parametrize(
    ("extra", "says"),
    [(["--layer", "9"], "--layer 9"), (["--tests", "xz"], "--tests"), (["--alphas", "0"], "--alphas"),
     (["--turns", "1"], "turns 1")],
)  # fmt: skip
def test_bad_input_is_one_line_before_the_model_loads(
    tiny_dir, tiny_probe, tmp_path, capsys, extra, says, monkeypatch
):
    monkeypatch.setattr(
        "valueprobe.cli.app.LoadOptions.load", lambda *a, **k: pytest.fail("the model loaded")
    )
    args = ["audit", "--probe", str(tiny_probe), "--model", tiny_dir, "--out", str(tmp_path / "o"), *extra]
    code, _, err = run(args, capsys)
    assert code == 2 and err.count("\n") == 1 and says in err, err


def test_replicate_eot_writes_each_design_beside_the_published_figure(tiny_dir, tiny_probe, tmp_path, capsys):
    out = tmp_path / "eot"
    args = ["replicate", "eot", "--probe", str(tiny_probe), "--model", tiny_dir, "--out", str(out),
            "--turns", "3", "--steer-prompts", "2"]  # fmt: skip
    code, stdout, err = run(args, capsys)
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert res["layer"] == 2  # round(3 · 21/36): the paper's depth
    assert res["alphas"] == [-75.0, -50.0, -25.0, 0.0, 25.0, 50.0, 75.0]
    summary = (out / "summary.md").read_text()
    for published in ("65 of 65", "18 of 18", "−0.077", "−0.96", "7.5–8.9"):
        assert published in summary
    assert "different, smaller model" in summary and "different, smaller model" in stdout


def test_the_2x2_fit_is_orthogonal_to_its_end_of_turn_direction():
    rng = np.random.default_rng(0)
    tails = rng.normal(size=(12, 4, 16))
    routes = fit_routes(tails, rng.normal(size=16))
    end = routes["end of turn (2×2, near − far)"]
    for name in (ROUTE_ONE, "shipped axis ⊥ end of turn"):
        assert abs(routes[name] @ end) < 1e-12 and np.linalg.norm(routes[name]) == pytest.approx(1.0)


def test_replicate_orthogonal_scores_every_route_beside_its_null(tiny_dir, tiny_probe, tmp_path, capsys):
    out = tmp_path / "orth"
    code, stdout, err = run(["replicate", "orthogonal", "--probes", str(tiny_probe), "--model", tiny_dir,
                             "--out", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    res = OrthogonalFit.from_dict(json.loads((out / "results.json").read_text()))
    assert [s.name.split(" (at")[0] for s in res.scores] == [
        str(tiny_probe),
        ROUTE_ONE,
        f"{tiny_probe} ⊥ end of turn",
        "end of turn (2×2, near − far)",
    ]
    first = res.scores[0]
    assert set(first.auroc) == {"icrl (held-out rules)", "confidence", "refusal", "code"}
    assert all(lo <= first.auroc[k] <= hi for k, (lo, hi) in first.ci.items())
    assert "does not hold its controls" in stdout or "holds its controls: saved" in stdout


def test_a_model_without_a_chat_template_gets_the_plain_rendering_and_aligned_tails(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    bare = copy.copy(lm.tokenizer)
    bare.chat_template = None
    base = replace(lm, tokenizer=bare)
    template, said = rendering_of(base)
    assert template == "plain" and "no chat template" in said and "User:" in said
    sets, dropped = build_turns(base, n=3, chat_template=template)
    assert len(sets) + dropped == 3 and sets
    for s in sets:
        ids = [e.input_ids for e in encode(base, s.arms, positions=Positions.last, chat_template=template)]
        assert len({tuple(x[s.tail_start :]) for x in ids}) == 1 and len({len(x) for x in ids}) == 1


def _rows(alpha: float, direction: int, confidence: list[float | None], length: int) -> list[SteerRow]:
    return [
        SteerRow(
            direction=direction,
            prompt=p,
            alpha=alpha,
            n_tokens=length,
            finished=True,
            rating_text="",
            confidence=c,
        )
        for p, c in enumerate(confidence)
    ]


def test_unparsed_ratings_are_counted_and_a_mostly_unparsed_strength_is_left_out():
    rows = [
        *_rows(0.0, 0, [5.0, 5.0, 6.0, 5.0], 50),
        *_rows(30.0, 0, [None, None, None, 9.0], 30),  # 75% unparsed: unreliable
        *_rows(-30.0, 0, [4.0, 4.0, None, 5.0], 70),
        *_rows(30.0, 1, [5.0, 5.0, 6.0, 5.0], 50),
        *_rows(-30.0, 1, [5.0, 5.0, 6.0, 5.0], 50),
    ]
    test = dissociation_test(rows, seconds=0.0, cost="")
    note = test.notes[0]
    assert "+30: 75%" in note and "-30: 25%" in note and "left out: +30" in note
    confidence, length = test.effects
    assert confidence.estimate == pytest.approx(
        dose_slope([0] * 4 + [-30] * 3, [5, 5, 6, 5, 4, 4, 5], list("abcdabd")).slope * 10
    )
    assert length.estimate == pytest.approx(-20 / 30 * 10)  # 70 → 50 → 30 tokens over 60 points of α
