"""TRL DPO / SFT through valueprobe.tune.train on a tiny random model: weights change, checkpoints reload.

Trusted references: the base model's own state dict (the tuned one must differ in the layers LoRA
targets and match elsewhere), TRL's logged loss, and a fresh `valueprobe.load` of the folder.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest
import torch
import trl

from valueprobe.cli.main import main
from valueprobe.errors import ValueprobeError
from valueprobe.model.adapter import TUNE_FILE, ignore_old_checkpointing_reads
from valueprobe.model.fingerprint import Fingerprint
from valueprobe.model.load import load
from valueprobe.tune import train as tune_train
from valueprobe.tune.pairs import Pair, read_pairs
from valueprobe.tune.train import METHODS, TuneMethod, TuneRecord, TuneSettings, train

DATA = Path(__file__).resolve().parents[1] / "data"
FAST = TuneSettings(max_steps=4, batch_size=2, learning_rate=5e-3, save_steps=2, max_length=512)


@pytest.fixture(scope="module")
def pairs() -> list[Pair]:
    return read_pairs(DATA / "preference_words.jsonl", groups=["preference_words/dolphin"])[:8]


def _state(lm) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


@pytest.mark.parametrize("method", ["dpo", "sft"])
def test_train_changes_weights_and_reloads(method, tiny_dir, pairs, tmp_path, monkeypatch):
    base = load(tiny_dir)
    before = _state(base)
    out = tmp_path / "ckpt"
    logs: list[list[dict]] = []
    real_record = tune_train._train_record

    def keep_log(trainer, *args):
        logs.append(list(trainer.state.log_history))
        return real_record(trainer, *args)

    monkeypatch.setattr(tune_train, "_train_record", keep_log)
    res = train(tiny_dir, pairs, out, settings=replace(FAST, method=method))
    assert res.record.train.steps == 4
    (history,) = logs
    losses = [h["loss"] for h in history if "loss" in h]
    assert len(losses) == 4 and res.record.train.first_loss == losses[0]
    if method == "dpo":
        # TRL's logged loss at step 1, before any update: LoRA starts with B = 0, so the policy is
        # its reference, every log-ratio is 0 and the sigmoid DPO loss is -log σ(0) = ln 2.
        assert losses[0] == pytest.approx(math.log(2), abs=1e-4)
        assert history[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-4)
    assert not out.with_name("ckpt.partial").exists()
    assert (out / "adapter_model.safetensors").exists()
    assert not list(out.rglob("*.bin")) and not list(out.rglob("*.pt"))  # no pickle in the artifact
    record = json.loads((out / TUNE_FILE).read_text())
    assert TuneRecord.from_dict(record) == res.record  # the file is the record
    assert record["base"]["fingerprint"] == base.fingerprint
    assert record["settings"]["method"] == method

    tuned = load(str(out))  # adapter merged over the recorded base
    after = _state(tuned)
    assert set(after) == set(before)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    # LoRA touches the linear layers of the blocks, never the embeddings or the norms
    assert changed and all("proj" in k for k in changed)
    assert not any("embed" in k or "norm" in k for k in changed)
    fp_base, fp_tuned = Fingerprint.parse(base.fingerprint), Fingerprint.parse(tuned.fingerprint)
    assert fp_tuned.arch == fp_base.arch and fp_tuned.weights != fp_base.weights
    assert (tuned.n_layers, tuned.d_model) == (base.n_layers, base.d_model)
    ids = base.tokenizer("Pick one word", return_tensors="pt").input_ids
    with torch.no_grad():
        assert not torch.allclose(base.model(ids).logits, tuned.model(ids).logits)


def test_every_method_has_one_row_in_the_table():
    assert set(METHODS) == set(get_args(TuneMethod))
    assert all(hasattr(trl, spec.trainer) and hasattr(trl, spec.config) for spec in METHODS.values())


# pyproject ignores FutureWarning for the suite; this test turns it back into an error. An option
# passed under a name transformers or TRL has deprecated (`gradient_checkpointing` for
# `activation_checkpointing`) fails here, as does any new FutureWarning in a tuning step or in
# loading its checkpoint (what the demo's shift stage does next).
@pytest.mark.filterwarnings("error::FutureWarning")
@pytest.mark.parametrize("method", ["dpo", "sft"])
def test_a_tuning_step_warns_nothing_deprecated(method, tiny_dir, pairs, tmp_path):
    filters = list(warnings.filters)
    res = train(tiny_dir, pairs[:2], tmp_path / "ckpt", settings=replace(FAST, method=method, max_steps=1))
    assert res.record.train.steps == 1
    load(str(res.out))  # the adapter merged over its base
    assert warnings.filters == filters  # the one ignored message is ignored only inside those calls
    with ignore_old_checkpointing_reads():  # which is that message only: others still raise
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
        with pytest.raises(FutureWarning):
            warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)


def test_full_finetune_saves_a_plain_model(tiny_dir, pairs, tmp_path):
    out = tmp_path / "full"
    train(tiny_dir, pairs, out, settings=replace(FAST, lora=False))
    assert (out / "config.json").exists() and not (out / "adapter_config.json").exists()
    assert load(str(out)).fingerprint != load(tiny_dir).fingerprint


def test_interrupted_run_resumes_from_its_last_checkpoint(tiny_dir, pairs, tmp_path, monkeypatch):
    """Kill training after step 2's checkpoint: no OUT appears; the rerun resumes at step 2."""
    from transformers import Trainer

    out = tmp_path / "ckpt"
    real_save = Trainer._save_checkpoint

    def save_then_die(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_dir, pairs, out, settings=FAST)
    monkeypatch.setattr(Trainer, "_save_checkpoint", real_save)
    assert not out.exists()  # nothing that loads as complete
    partial = out.with_name("ckpt.partial")
    assert (partial / "checkpoint-2" / "adapter_model.safetensors").exists()

    res = train(tiny_dir, pairs, out, settings=FAST)
    assert res.record.train.resumed_from == "checkpoint-2"
    assert res.record.train.steps == 4
    assert not partial.exists()
    load(str(out))


def test_partial_run_with_other_settings_is_refused(tiny_dir, pairs, tmp_path):
    out = tmp_path / "ckpt"
    partial = out.with_name("ckpt.partial")
    partial.mkdir()
    (partial / "run.json").write_text(json.dumps({"format": 1, "settings": {}, "data": {}}))
    with pytest.raises(ValueprobeError, match="interrupted run with other settings"):
        train(tiny_dir, pairs, out, settings=FAST)


def test_read_pairs_forms_and_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "Pick one", "chosen": "dolphin", "rejected": "spoon"})
        + "\n"
        + json.dumps(
            {"messages": [{"role": "user", "content": "Pick"}], "meta": {"chosen": "a", "rejected": "b"}}
        )
        + "\n"
    )
    got = read_pairs(f)
    assert [p.chosen for p in got] == ["dolphin", "a"]
    assert got[0].prompt == ({"role": "user", "content": "Pick one"},)
    assert got[0].flipped().chosen == "spoon"
    f.write_text(
        json.dumps({"prompt": "x", "chosen": "y", "rejected": "z"})
        + "\n"
        + json.dumps({"prompt": "x", "chosen": "y"})
        + "\n"
    )
    with pytest.raises(ValueprobeError, match=r"p\.jsonl:2: missing 'rejected'"):
        read_pairs(f)
    with pytest.raises(ValueprobeError, match="no pairs in groups"):
        read_pairs(DATA / "preference_words.jsonl", groups=["preference_words/nothing"])


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "rejected": "z"}) + "\n")
    out = tmp_path / "ckpt"
    code, err = run(["tune", "dpo", "--data", str(bad), "--out", str(out)], capsys)
    assert code == 2 and err.count("\n") == 1 and "bad.jsonl:1: missing 'chosen'" in err
    assert not out.exists() and not out.with_name("ckpt.partial").exists()
    out.mkdir()
    good = DATA / "preference_words.jsonl"
    code, err = run(["tune", "sft", "--data", str(good), "--out", str(out)], capsys)
    assert code == 2 and "already exists" in err and "--overwrite" in err


def test_cli_trains_and_reports(tiny_dir, tmp_path, capsys):
    out = tmp_path / "ckpt"
    argv = [
        "tune",
        "dpo",
        "--model",
        tiny_dir,
        "--data",
        str(DATA / "preference_safety.jsonl"),
        "--split",
        "train",
        "--out",
        str(out),
        "--max-steps",
        "2",
        "--batch-size",
        "2",
        "--seed",
        "1",
    ]
    code, err = run(argv, capsys)
    assert code == 0, err
    record = json.loads((out / TUNE_FILE).read_text())
    assert record["data"]["split"] == "train" and len(record["data"]["sha256"]) == 64
    assert record["settings"]["seed"] == 1 and record["settings"]["beta"] == 0.1
