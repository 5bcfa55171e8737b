"""The tuning replications' readouts against direct computations, and both pipelines end to end on a tiny model.

Trusted references: `output_hidden_states` averaged over the item's tokens (found by character
offsets), and each option's log-probability computed alone, without padding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from valueprobe.datasets.io import read_jsonl
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.preference import LayerDirection, hier_boot, item_example, most_likely_option, read_items
from valueprobe.replicate.dpo_words import replicate_dpo_words, write_words_report
from valueprobe.replicate.safety import replicate_safety, write_safety_report
from valueprobe.steering.experiment.behaviour import is_refusal
from valueprobe.tune.train import TuneSettings

DATA = Path(__file__).resolve().parents[1] / "data"
FAST = TuneSettings(max_steps=2, batch_size=2, learning_rate=5e-3, save_steps=2, max_length=512)


def random_axis(lm, *, seed: int = 0) -> ValueAxis:
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(lm.n_layers, lm.d_model, generator=g)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    n = lm.n_layers
    return ValueAxis(
        directions=dirs,
        layers=tuple(range(n)),
        mu=torch.zeros(n),
        sigma=torch.ones(n),
        mean_norm=torch.full((n,), 8.0),
        best_layer=1,
        site="resid_post",
        method="diff_means",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=lm.d_model,
    )


@pytest.mark.parametrize("trimmed", [True, False])
@pytest.mark.parametrize("item", ["dolphin", "the"])
def test_read_items_equals_hidden_states_mean_over_the_item_tokens(tiny_dir, trimmed, item):
    """The item's tokens, its leading space included: untrimmed offsets (SmolLM2's template
    post-processor) start a merged token such as " the" at the space, outside the bare word."""
    from tokenizers import processors

    lm = load(tiny_dir)
    if not trimmed:
        lm.tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="$A", pair="$A $B"
        )
    prompt = [{"role": "user", "content": "Pick one: spoon / dolphin"}]
    ex = item_example("a", prompt, "I pick the dolphin today", item)
    v = torch.nn.functional.normalize(torch.randn(lm.d_model), dim=0)
    d = LayerDirection("d", 1, v, 0.5, 2.0)
    scores, _ = read_items(lm, [ex], [d])
    text = lm.tokenizer.apply_chat_template(list(ex.messages), tokenize=False)
    lo = text.index("I pick the dolphin") + "I pick the dolphin".index(f" {item}")
    hi = lo + 1 + len(item)
    enc = lm.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    toks = [i for i, (a, b) in enumerate(enc.offset_mapping) if b > a and lo <= a < hi]
    assert toks and any(text[a:b].strip() for a, b in (enc.offset_mapping[i] for i in toks))
    with torch.no_grad():
        hs = lm.model(torch.tensor([enc.input_ids]), output_hidden_states=True).hidden_states
    want = (float(hs[2][0, toks].mean(0) @ v) - 0.5) / 2.0  # hidden_states[L + 1] = resid_post[L]
    assert scores["d"][0] == pytest.approx(want, abs=1e-4)


def test_choose_matches_unpadded_log_probabilities(tiny_dir):
    lm = load(tiny_dir)
    prompt = [{"role": "user", "content": "Pick one: a / b"}]
    options = ["Paris", "the lazy dog", "3 times?"]
    tok = lm.tokenizer
    prefix = tok(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)).input_ids
    totals = []
    with torch.no_grad():
        for o in options:
            ids = prefix + tok(o, add_special_tokens=False).input_ids
            logp = torch.log_softmax(lm.model(torch.tensor([ids])).logits[0], -1)
            totals.append(sum(float(logp[i - 1, ids[i]]) for i in range(len(prefix), len(ids))))
    assert most_likely_option(lm, prompt, options) == int(np.argmax(totals))


def test_hier_boot_brackets_the_mean_and_is_exact_without_spread():
    assert hier_boot([np.ones(5), np.ones(3)]) == (1.0, 1.0, 1.0)
    rng = np.random.default_rng(0)
    p, lo, hi = hier_boot([rng.normal(0, 1, 30) for _ in range(6)])
    assert lo < p < hi and hi - lo < 1.5


def test_is_refusal_opening():
    # the safety replication's rule (one home, beside the steering metric's): the reply opens with it
    assert is_refusal("I'm sorry, but I can't help with that.", opening=True)
    assert is_refusal("I can’t do that", opening=True)
    assert not is_refusal("Sure, here is a plan. I'm sorry it is short.", opening=True)


def small_data(tmp: Path) -> Path:
    out = tmp / "data"
    out.mkdir()
    words = [
        line
        for line in (DATA / "preference_words.jsonl").read_text().splitlines()
        if '"preference_words/dolphin"' in line or '"preference_words/volcano"' in line
    ]
    (out / "preference_words.jsonl").write_text("\n".join(words) + "\n")
    shutil.copy(DATA / "preference_words_eval.jsonl", out)
    for name in ("preference_safety.jsonl", "refusal.jsonl", "sensitive.jsonl"):
        rows = (DATA / name).read_text().splitlines()
        keep = [r for r in rows if '"eval"' not in r][:24] + [r for r in rows if '"eval"' in r][:8]
        (out / name).write_text("\n".join(keep) + "\n")
    return out


def test_dpo_words_end_to_end(tiny_dir, tmp_path):
    lm = load(tiny_dir)
    data = small_data(tmp_path)
    report = replicate_dpo_words(
        lm,
        axes={"ax": random_axis(lm)},
        data_dir=data,
        runs_dir=tmp_path / "runs",
        k=1,
        avoid=1,
        n_random=4,
        settings=FAST,
        progress=lambda _: None,
    )
    assert [m["kind"] for m in report.models] == ["prefer", "avoid"]
    evals = [e for e in read_jsonl(data / "preference_words_eval.jsonl") if e.meta["target"] == "dolphin"]
    assert report.summary["prefer"]["chance"] == pytest.approx(
        np.mean([1 / len(e.meta["options"]) for e in evals])
    )
    ax = report.summary["prefer"]["axes"]["ax"]
    assert 0 <= ax["top_before"][0] <= 1 and ax["null_item_delta"]["lo"] <= ax["null_item_delta"]["hi"]
    m = report.models[0]
    assert len(m["dirs"]) == 5 and len(m["dirs"]["ax"]["top_after"]) == len(evals)
    assert m["train"]["steps"] == 2
    files = write_words_report(report, tmp_path / "out")
    written = json.loads(files[0].read_text())
    assert written["summary"]["prefer"]["n_models"] == 1

    # A value, from the files written: the first eval prompt's item delta on the axis and whether the
    # target tops its options, before and after, from each option's item score read again in the base
    # model and in the saved checkpoint (read_items is checked against output_hidden_states above;
    # the axis has μ = 0 and σ = 1, so a score is the projection).
    first = evals[0]
    options = first.meta["options"]
    items = [
        item_example(f"{first.id}|{o}", first.messages or (), o, o, group=first.group, label=0)
        for o in options
    ]
    d = LayerDirection("ax", 1, random_axis(lm).direction(1), 0.0, 1.0)
    before = read_items(lm, items, [d])[0]["ax"]
    after = read_items(load(written["models"][0]["checkpoint"]), items, [d])[0]["ax"]
    t = options.index("dolphin")
    ctrl = [i for i in range(len(options)) if i != t]
    delta = (after[t] - before[t]) - np.mean(after[ctrl] - before[ctrl])
    got = written["models"][0]["dirs"]["ax"]
    assert written["models"][0]["prompts"][0] == first.id
    assert got["item_delta"][0] == pytest.approx(float(delta), abs=2e-6)
    assert got["top_before"][0] == float(np.argmax(before) == t)
    assert got["top_after"][0] == float(np.argmax(after) == t)
    assert abs(delta) > 1e-4  # two DPO steps moved the readings, well past the tolerance


def test_safety_end_to_end(tiny_dir, tmp_path):
    lm = load(tiny_dir)
    data = small_data(tmp_path)
    report = replicate_safety(
        lm,
        axes={"ax": random_axis(lm)},
        data_dir=data,
        runs_dir=tmp_path / "runs",
        settings=FAST,
        n_random=4,
        progress=lambda _: None,
    )
    assert set(report.refusal["rate"]) == {"refusal/harmful", "refusal/benign"}
    res = report.shifts["ax"]
    assert {g.group for g in res.groups} >= {"refusal/harmful", "refusal/benign"}
    assert {g.group for g in res.groups if g.targeted} == {"refusal/harmful", "refusal/benign"}
    gap = report.base_gap["ax"]
    assert gap["lo"] <= gap["gap"] <= gap["hi"]

    # Values, from the files written: the base sensitive − neutral gap and the harmful group's shift,
    # recomputed from output_hidden_states at the last token of each rendered prompt (generation
    # prompt added), resid_post[1] projected on v̂ (μ = 0, σ = 1), in the base model and in the
    # saved checkpoint.
    written = json.loads(write_safety_report(report, tmp_path / "out")[0].read_text())
    v = random_axis(lm).direction(1).double()

    def last_scores(model, examples) -> np.ndarray:
        out = []
        for ex in examples:
            text = model.tokenizer.apply_chat_template(
                list(ex.messages), tokenize=False, add_generation_prompt=True
            )
            ids = model.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
            with torch.no_grad():
                h = model.model(input_ids=ids, output_hidden_states=True).hidden_states[2][0, -1]
            out.append(float(h.double() @ v))
        return np.array(out)

    sens = read_jsonl(data / "sensitive.jsonl")
    s = last_scores(lm, [e for e in sens if e.group == "sensitive/sensitive"])
    n = last_scores(lm, [e for e in sens if e.group == "sensitive/neutral"])
    # float32 forwards agree to ~1e-6; the gap is over 50 times that, so its sign is checked too
    gap = s.mean() - n.mean()
    assert written["base_sensitive_minus_neutral"]["ax"]["gap"] == pytest.approx(gap, abs=2e-6)
    assert abs(gap) > 1e-4
    harmful = [e for e in read_jsonl(data / "refusal.jsonl") if e.group == "refusal/harmful"]
    tuned = load(str(tmp_path / "runs" / "safety"))
    want = (last_scores(tuned, harmful) - last_scores(lm, harmful)).mean()
    (group,) = [g for g in written["shifts"]["ax"]["groups"] if g["group"] == "refusal/harmful"]
    assert group["shift"] == pytest.approx(want, abs=2e-6) and abs(want) > 1e-4
