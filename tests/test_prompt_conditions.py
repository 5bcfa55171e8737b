"""Prompt conditions beside a steering sweep: the prompts come from the data file, each condition's
rows are the generation of the chat it names, and bad conditions are one line.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_prompt_conditions.py
Reference: the rows of a condition equal `generate` run by hand on the chat with the stated system
prompt (or the reworded message) put in by the test itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli as run
from test_steer_sweep import chats, settings_for, tiny_axis

from valueprobe.datasets.io import Example, read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file
from valueprobe.report.effects import dose_response_figure
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.experiment.dose import SteerSweep
from valueprobe.steering.experiment.prompting import (
    PromptCondition,
    parse_conditions,
    read_conditions,
    read_target,
)
from valueprobe.steering.experiment.sweep import GENERATIONS, read_rows, run_sweep

DATA = Path(__file__).resolve().parents[1] / "data"


def conditions_file(tmp: Path, stem: str = "p", **override: str) -> Path:
    rows = [
        Example(
            id=f"{stem}-{name}",
            label=1,
            group=f"steer_conditions/{stem}",
            messages=({"role": role, "content": override.get(name, text)},),
            meta={
                "set": stem,
                "condition": name,
                "kind": kind,
                "metric": "length",
                "subset": "all",
                "sign": -1,
            },
        )
        for name, role, kind, text in (
            ("toward", "system", "system", "Be brief."),
            ("away", "system", "system", "Be long."),
            ("reworded", "user", "wording", "Please: {prompt}"),
        )
    ]
    path = tmp / "steer_conditions.jsonl"
    write_jsonl(path, rows)
    return path


def test_every_committed_set_states_three_conditions_and_a_target():
    for stem in ("steer_confidence", "steer_backtracking", "steer_code", "steer_refusal", "steer_open"):
        conds = read_conditions(DATA / "steer_conditions.jsonl", stem, ("toward", "away", "reworded"))
        assert [c.kind for c in conds] == ["system", "system", "wording"]
        assert conds[0].text != conds[1].text
        target = read_target(DATA / "steer_conditions.jsonl", stem)
        assert target is not None and target.sign in (-1, 1)
    first = read_jsonl(DATA / "steer_open.jsonl")[0]
    chat = conds[2].apply(list(first.messages or ()))
    assert (
        chat[-1]["content"].endswith(first.messages[-1]["content"])
        and chat[-1]["content"] != first.messages[-1]["content"]
    )


def test_apply_puts_the_system_prompt_first_and_rewords_the_last_user_message():
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    sys = PromptCondition("toward", "system", "S").apply(chat)
    assert sys[0] == {"role": "system", "content": "S"} and sys[1:] == chat
    again = PromptCondition("toward", "system", "T").apply(sys)  # a system prompt is replaced, not stacked
    assert [m["role"] for m in again].count("system") == 1 and again[0]["content"] == "T"
    worded = PromptCondition("reworded", "wording", "<{prompt}>").apply(chat)
    assert worded[:2] == chat[:2] and worded[2]["content"] == "<c>"


def test_condition_rows_are_the_generation_of_the_chat_they_name(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    path = conditions_file(tmp_path)
    write_jsonl(tmp_path / "p.jsonl", chats(3))
    settings = settings_for(
        tmp_path,
        axis,
        conditions=("toward", "reworded"),
        conditions_file=str(path),
        conditions_sha256=sha256_file(path),
    )
    sweep = run_sweep(lm, chats(3), tmp_path / "out", settings, n_boot=20, progress=False)
    rows = read_rows(tmp_path / "out" / GENERATIONS)
    assert {r.condition for r in rows} == {"none", "toward", "reworded"}
    assert len(rows) == 3 * 3 * 3 * (1 + settings.controls)  # conditions × prompts × α × directions
    for name, chat in (
        ("toward", [{"role": "system", "content": "Be brief."}, *chats(3)[1].messages]),
        ("reworded", [{"role": "user", "content": "Please: " + chats(3)[1].messages[0]["content"]}]),
    ):
        by_hand = generate(
            lm,
            axis,
            [chat],
            alphas=settings.alphas,
            decoding=Decoding(greedy=True, max_new_tokens=4),
            progress=False,
        )
        got = {
            r.alpha: r.text
            for r in rows
            if r.condition == name and r.prompt_id == "p1" and r.direction == "axis"
        }
        assert got == {g.alpha: g.text for g in by_hand}
    assert set(sweep.prompted) == {"toward", "reworded"}
    assert [e.metric for e in sweep.prompted["toward"]] == [e.metric for e in sweep.effects]
    plain = [r for r in rows if r.condition == "none"]
    assert (
        sweep.effects
        == run_sweep(lm, chats(3), tmp_path / "out", settings, n_boot=20, progress=False).effects
    )
    assert all("condition" not in r.to_dict() for r in plain)  # plain rows read as before conditions
    again = SteerSweep.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert again.prompted == sweep.prompted
    fig = dose_response_figure(sweep)
    assert {t.name for t in fig.data} >= {"axis (95% CI)", "axis, toward", "axis, reworded"}


def test_a_changed_conditions_file_is_refused(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    path = conditions_file(tmp_path)
    settings = settings_for(
        tmp_path,
        tiny_axis(lm),
        conditions=("toward",),
        conditions_file=str(path),
        conditions_sha256=sha256_file(path),
    )
    run_sweep(lm, chats(2), tmp_path / "out", settings, n_boot=0, progress=False)
    conditions_file(tmp_path, toward="Be very brief.")
    with pytest.raises(ValueprobeError, match="has changed"):
        run_sweep(lm, chats(2), tmp_path / "out", settings, n_boot=0, progress=False)


def test_parse_conditions():
    assert parse_conditions("toward, away") == ("toward", "away")
    assert parse_conditions("none") == () and parse_conditions("") == ()
    for bad in ("toward,toward", "none,toward"):
        with pytest.raises(ValueprobeError, match="--conditions"):
            parse_conditions(bad)


def _steer(tmp_path: Path, *extra: str) -> list[str]:
    return ["steer", "--probe", "probes/smollm2-135m-value", "--prompts", str(tmp_path / "p.jsonl"),
            "--out", str(tmp_path / "out"), *extra]  # fmt: skip


def test_a_condition_without_a_prompt_is_one_line(tmp_path, capsys):
    write_jsonl(tmp_path / "p.jsonl", chats(2))
    conditions_file(tmp_path)
    code, _, err = run(_steer(tmp_path, "--conditions", "toward,flattery"), capsys)
    assert code == 2 and err.count("\n") == 1 and "'flattery' names no system prompt" in err
    conditions_file(tmp_path, toward="   ")
    code, _, err = run(_steer(tmp_path, "--conditions", "toward"), capsys)
    assert code == 2 and err.count("\n") == 1 and "names no system prompt" in err
    (tmp_path / "steer_conditions.jsonl").unlink()
    code, _, err = run(_steer(tmp_path, "--conditions", "toward"), capsys)
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err
    write_jsonl(tmp_path / "p.jsonl", [Example(id="t", label=1, group="g", text="plain text")])
    conditions_file(tmp_path)
    code, _, err = run(_steer(tmp_path, "--conditions", "toward"), capsys)
    assert code == 2 and err.count("\n") == 1 and "plain text" in err
    assert not (tmp_path / "out").exists()
