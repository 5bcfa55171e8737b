"""tune-steer: chosen on validation within the KL bound, reported on test, written as a spec that
``steer --spec`` runs; bad search spaces are one line.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_tune_steer.py
Reference: the choice recomputed from the candidates (largest validation move at KL ≤ bound); each
candidate's KL equal to the side-effect KL of its setting computed alone; the spec's settings read
back from the sweep ``steer --spec`` writes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_cli as run
from test_steer_sweep import chats, tiny_axis

from valueprobe.cli.tune_steer import _print
from valueprobe.datasets.io import read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.steering.experiment.prompting import Goal
from valueprobe.steering.experiment.search import (
    SearchSpace,
    SteerSearch,
    Trial,
    check_space,
    choose,
    split_prompts,
    tune_steer,
)
from valueprobe.steering.experiment.side_effects import text_side_effects
from valueprobe.steering.experiment.sweep import SweepSettings
from valueprobe.steering.hook.spec import SteeringSpec

DATA = Path(__file__).resolve().parents[1] / "data"


def test_bad_search_spaces_are_one_line():
    good = SearchSpace((1,), (1.0,), ("all",), ("add",), 0.5)
    check_space(good)
    for bad, match in (
        (SearchSpace((), (1.0,), ("all",), ("add",), 0.5), "--layers is empty"),
        (SearchSpace((1,), (), ("all",), ("add",), 0.5), "--alphas is empty"),
        (SearchSpace((1,), (1.0,), ("all",), ("add",), 0.0), "--max-kl 0.0 must be a positive"),
        (SearchSpace((1,), (1.0,), ("all",), ("add",), -1.0), "positive KL bound"),
        (SearchSpace((1,), (1.0,), ("all",), ("clamp",), 0.5), "--ops 'clamp'"),
        (SearchSpace((1,), (-1.0,), ("all",), ("add",), 0.5), "positive strengths"),
    ):
        with pytest.raises(ValueprobeError, match=match):
            check_space(bad)


def test_cli_refuses_an_empty_space_or_kl_bound_before_loading(tmp_path, capsys):
    base = ["tune-steer", "--probe", "probes/smollm2-135m-value", "--prompts", "data/steer_open.jsonl",
            "--out", str(tmp_path / "o")]  # fmt: skip
    for extra, words in (
        (["--max-kl", "0"], "positive KL bound"),
        (["--positions", " "], "--positions is empty"),
    ):
        code, _, err = run([*base, *extra], capsys)
        assert code == 2 and err.count("\n") == 1 and words in err
    assert not (tmp_path / "o").exists()


def test_choice_is_the_best_validation_move_within_the_bound():
    def cand(alpha: float, kl: float, move: float) -> Trial:
        return Trial(1, "add", "all", alpha, kl, move, 0.0, 0.0, (0.0, 0.0))

    best_overall, best_within = cand(4.0, 0.9, 3.0), cand(2.0, 0.3, 1.0)
    pool = [cand(1.0, 0.1, 0.2), best_within, best_overall, cand(-2.0, 0.3, float("nan"))]
    assert choose(pool, 0.5) == best_within and choose(pool, 1.0) == best_overall
    assert choose(pool, 0.05) is None


def test_split_keeps_pairs_together():
    conf = read_jsonl(DATA / "steer_confidence.jsonl")[:8]
    val, test = split_prompts(conf)
    assert val and test and not val & test and val | test == {ex.id for ex in conf}
    for ex in conf:
        twin = (
            ex.id.replace("direct", "inverted") if "direct" in ex.id else ex.id.replace("inverted", "direct")
        )
        assert (ex.id in val) == (twin in val)


def test_search_chooses_within_the_bound_on_validation_and_writes_a_spec_steer_runs(
    tiny_lm_factory, tiny_dir, tmp_path, capsys
):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    write_jsonl(tmp_path / "p.jsonl", chats(4))
    base = SweepSettings(spec=SteeringSpec(axis, probe="tiny"), probe_fingerprint=axis.fingerprint, model="tiny", prompts=str(tmp_path / "p.jsonl"),
                         prompts_sha256="0", alphas=(0.0, 1.0), max_new_tokens=4, controls=1, greedy=True,
                         metrics=("length", "degenerate"))  # fmt: skip
    texts = tmp_path / "neutral.jsonl"
    write_jsonl(
        texts, read_jsonl(DATA / "neutral_text.jsonl")[:2] + read_jsonl(DATA / "neutral_text.jsonl")[24:26]
    )
    space = SearchSpace((1,), (2.0, 8.0), ("all", "generated"), ("add",), 0.05)
    found = tune_steer(lm, chats(4), base, space, Goal("length", "all", -1), out=tmp_path / "o",
                       neutral=texts, batch_size=8, progress=False)  # fmt: skip
    assert len(found.candidates) == 2 * 4  # positions × ±α
    within = [c for c in found.candidates if c.kl <= space.max_kl]
    assert within and found.chosen == max(within, key=lambda c: c.val_effect)
    c = found.candidates[-1]
    settings = replace(base, spec=replace(base.spec, layers=[c.layer], positions=c.positions))
    kl, _ = text_side_effects(lm, replace(settings, alphas=(0.0, c.alpha)), read_jsonl(texts), progress=False)
    assert kl.values["axis"][1] == pytest.approx(c.kl, rel=1e-5)
    assert SteerSearch.from_dict(json.loads(json.dumps(found.to_dict()))) == found
    assert found.test_front is not None and {p.alpha for p in found.test_front.axis} == {
        0.0,
        -8.0,
        -2.0,
        2.0,
        8.0,
    }
    chosen = found.chosen
    assert chosen is not None
    probe = tmp_path / "probe"
    axis.save(probe)
    _print(
        found, tmp_path / "o", replace(base.spec, probe=str(probe))
    )  # what tune-steer writes: the one SteeringSpec, α kept apart
    written = SteeringSpec.load(tmp_path / "o" / "spec.json")
    assert (written.probe, written.layers, written.positions, written.op.op.value) == (
        str(probe),
        (chosen.layer,),
        chosen.positions,
        chosen.op,
    )
    code, _, err = run(["steer", "--spec", str(tmp_path / "o" / "spec.json"), f"--alphas=0,{chosen.alpha:g}",
                        "--prompts", str(tmp_path / "p.jsonl"), "--model", tiny_dir, "--max-new-tokens", "2",
                        "--random-directions", "1", "--greedy", "--conditions", "none", "--force",
                        "--allow-large", "--out", str(tmp_path / "s")], capsys)  # fmt: skip
    assert code == 0, err
    ran = json.loads((tmp_path / "s" / "settings.json").read_text())
    assert (ran["layer"], ran["alphas"], ran.get("positions", "all")) == (
        chosen.layer,
        [0.0, chosen.alpha],
        chosen.positions,
    )
    code, _, err = run(["steer", "--spec", str(tmp_path / "o" / "spec.json"), "--layers", str(chosen.layer + 1),
                        "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "s2")], capsys)  # fmt: skip
    assert code == 2 and "says the steering" in err


def test_a_bad_spec_is_one_line(tmp_path, capsys):
    (tmp_path / "spec.json").write_text(json.dumps({"format": "other", "format_version": 1}))
    code, _, err = run(["steer", "--spec", str(tmp_path / "spec.json"), "--prompts", "data/steer_open.jsonl",
                        "--out", str(tmp_path / "s")], capsys)  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "is not a steering spec" in err
    code, _, err = run(["steer", "--spec", str(tmp_path / "none.json"), "--prompts", "data/steer_open.jsonl",
                        "--out", str(tmp_path / "s")], capsys)  # fmt: skip
    assert code == 2 and "cannot read it" in err
