"""Faults a user causes end in one line, a documented exit status, and no file that looks complete.

One case per fault class of issue 10 (interrupts, partial and corrupt stores and probes, output
paths, nonsense parameters, texts over the context, base models without a chat template, lost
progress, and the smaller ones), on a tiny model saved to disk. Exit status: 2 bad input,
130 interrupt, 1 internal error (the line names a log file holding the traceback).
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import tqdm.auto
from conftest import run_cli as run

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.activations.encode import render, render_plain
from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.cli.main import main
from valueprobe.datasets.io import Example, Span, read_jsonl, write_jsonl
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import ScoreSettings, score_dataset

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


def one_line(code: int, err: str, *, want: int = 2) -> str:
    """The failure is exactly one ``error:`` line (progress bars and warnings aside), no traceback."""
    assert code == want, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, err
    progress = re.compile(r"\d+/\d+ \[")  # tqdm bars (model loading, capture) are not messages
    others = [ln for ln in err.strip().splitlines() if ln.strip() and not progress.search(ln)]
    assert all(ln.startswith(("error: ", "warning: ")) for ln in others), err
    return lines[0]


def fails(argv: list[str], capsys, *, want: int = 2) -> str:
    return one_line(*run(argv, capsys)[::2], want=want)


@pytest.fixture(scope="module")
def icrl_small(tmp_path_factory):
    per_rule: dict[str, int] = {}
    keep = []
    for ex in read_jsonl(DATA / "icrl.jsonl"):
        if per_rule.get(ex.group, 0) < 1 and len(keep) < 12:
            per_rule[ex.group] = per_rule.get(ex.group, 0) + 1
            keep.append(ex)
    path = tmp_path_factory.mktemp("data") / "icrl.jsonl"
    write_jsonl(path, keep)
    return path


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, tiny_dir, icrl_small):
    out = tmp_path_factory.mktemp("stores") / "icrl"
    try:
        main(
            [
                "capture",
                "--model",
                tiny_dir,
                "--data",
                str(icrl_small),
                "--out",
                str(out),
                "--positions",
                "spans",
                "--examples-per-shard",
                "4",
            ]
        )
    except SystemExit as exc:
        assert not exc.code
    return out


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory, store_dir):
    out = tmp_path_factory.mktemp("probes") / "p"
    try:
        main(["fit", "--store", str(store_dir), "--method", "span_diff", "--out", str(out), "--splits", "2"])
    except SystemExit as exc:
        assert not exc.code
    return out


def copy_store(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def looks_complete(folder: Path) -> bool:
    """Any finished-looking artifact in ``folder``: a probe, scores, or a complete store."""
    if not folder.exists():
        return False
    manifest = folder / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("complete"):
        return True
    return any(
        (folder / name).exists() for name in ("probe.json", "axis.safetensors", "scores.csv", "summary.json")
    )


# ---------------------------------------------------------------- 1. interrupts


def test_ctrl_c_exits_130_and_keeps_the_last_checkpoint(tiny_dir, tmp_path, capsys):
    """A real SIGINT to a real capture: exit 130 and one line; the store keeps every checkpoint
    written before it (equal to a capture of those examples) and `fit` refuses it as partial.
    Resuming to the same bytes is test_store's kill -9 case and test_time_checkpoints_... below."""
    # Thousands of short texts, one per batch: a run of some seconds, with a checkpoint every second.
    big = [
        Example(id=f"e{i}", label=i % 2, group=f"g{i % 7}", text=f"x = {i}\n" * (1 + i % 5))
        for i in range(3000)
    ]
    data = tmp_path / "big.jsonl"
    write_jsonl(data, big)
    out = tmp_path / "store"
    argv = [
        "capture",
        "--model",
        tiny_dir,
        "--data",
        str(data),
        "--out",
        str(out),
        "--layers",
        "0,2",
        "--positions",
        "last",
        "--batch-size",
        "1",
        "--checkpoint-seconds",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "valueprobe", *argv],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A job started with '&' from a script inherits SIGINT ignored, and Python then never raises
        # KeyboardInterrupt: give the child the default a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while not (out / "manifest.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the first checkpoint (one second of work) has been written
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    line = one_line(proc.returncode, err, want=130)
    assert "interrupted" in line
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and manifest["shards"], "the checkpoint before the interrupt is kept"
    assert not list(out.glob("*.tmp"))

    assert "partial" in fails(["fit", "--store", str(out), "--out", str(tmp_path / "probe")], capsys)
    assert not (tmp_path / "probe").exists()

    kept = ActivationStore.open(out, allow_partial=True)
    done = kept.manifest.n_examples_done
    lm = load(tiny_dir)
    ref = capture(
        lm,
        big[:done],
        CaptureSettings(layers=[0, 2], positions="last", batch_size=1, include_embed=True),
        progress=False,
    )
    assert kept.rows().example_id == [ex.id for ex in big[:done]]
    for key in kept.manifest.keys:
        np.testing.assert_array_equal(kept.acts(key), ref.acts[key].half().float().numpy())


# ---------------------------------------------------------------- 2. incomplete stores


def test_partial_store_refused_unless_allowed(store_dir, tmp_path, capsys):
    partial = copy_store(store_dir, tmp_path / "partial")
    manifest = json.loads((partial / "manifest.json").read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:2], False
    (partial / "manifest.json").write_text(json.dumps(manifest))
    probe = tmp_path / "probe"
    line = fails(["fit", "--store", str(partial), "--out", str(probe), "--splits", "1"], capsys)
    assert "partial" in line and "8 of 12 examples" in line and "--allow-partial" in line
    assert not looks_complete(probe)
    code, _, err = run(
        ["fit", "--store", str(partial), "--out", str(probe), "--splits", "1", "--allow-partial"], capsys
    )
    assert code == 0, err
    assert "warning:" in err and "16 rows (8 of 12 examples)" in err


# ---------------------------------------------------------------- 3. output paths, checked before work


@pytest.mark.parametrize("command", ["fit", "score", "capture"])
def test_output_path_checked_before_work(
    command, store_dir, probe_dir, tiny_dir, icrl_small, tmp_path, capsys, monkeypatch
):
    # Any model load or store read would fail loudly here: the checks must come first.
    monkeypatch.setattr(
        "valueprobe.model.load.load", lambda *a, **k: pytest.fail("model loaded before the check")
    )
    monkeypatch.setattr(
        "valueprobe.probe.fit.fit_probe", lambda *a, **k: pytest.fail("fit ran before the check")
    )
    args = {
        "fit": ["fit", "--store", str(store_dir)],
        "score": ["score", "--probe", str(probe_dir), "--data", str(icrl_small), "--model", tiny_dir],
        "capture": ["capture", "--data", str(icrl_small), "--model", tiny_dir],
    }[command]
    a_file = tmp_path / "taken.txt"
    a_file.write_text("keep me")
    assert "is a file" in fails([*args, "--out", str(a_file)], capsys)
    assert "is a file" in fails([*args, "--out", str(a_file / "sub")], capsys)
    assert a_file.read_text() == "keep me"
    assert "cannot create" in fails([*args, "--out", "/proc/valueprobe-test/out"], capsys)
    other = store_dir if command != "capture" else probe_dir
    before = sorted(p.name for p in other.iterdir())
    assert "already holds a" in fails([*args, "--out", str(other)], capsys)
    assert sorted(p.name for p in other.iterdir()) == before


def test_read_only_output_folder(store_dir, tmp_path, capsys, monkeypatch):
    """A folder nobody may write in, made by refusing every creation inside it (root ignores a
    read-only mode, and CI runs as root): the check says so before any work, and writes nothing."""
    ro = tmp_path / "ro"
    ro.mkdir()

    def inside(path) -> bool:
        return path is not None and Path(path).resolve().is_relative_to(ro.resolve())

    def refuse(real):
        def guarded(*args, **kwargs):
            where = kwargs.get("dir", args[0] if args else None)
            if inside(where):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(where))
            return real(*args, **kwargs)

        return guarded

    monkeypatch.setattr(tempfile, "mkstemp", refuse(tempfile.mkstemp))
    monkeypatch.setattr(os, "mkdir", refuse(os.mkdir))
    monkeypatch.setattr(os, "open", refuse(os.open))
    line = fails(["fit", "--store", str(store_dir), "--out", str(ro / "p")], capsys)
    assert "cannot create" in line and "Permission denied" in line and str(ro) in line
    assert not list(ro.iterdir())


# ---------------------------------------------------------------- 4. corrupt or missing files


def test_truncated_probe_is_one_line(probe_dir, tiny_dir, icrl_small, tmp_path, capsys):
    bad = copy_store(probe_dir, tmp_path / "bad")
    data = (bad / "axis.safetensors").read_bytes()
    (bad / "axis.safetensors").write_bytes(data[: len(data) // 2])
    out = tmp_path / "scores"
    line = fails(
        ["score", "--probe", str(bad), "--model", tiny_dir, "--data", str(icrl_small), "--out", str(out)],
        capsys,
    )
    assert "probe" in line and "refit" in line
    assert not looks_complete(out)


@pytest.mark.parametrize("damage", ["truncate", "delete", "garbage"])
def test_damaged_shard_is_one_line_and_resume_repairs_it(
    damage, store_dir, tiny_dir, icrl_small, tmp_path, capsys
):
    bad = copy_store(store_dir, tmp_path / "bad")
    shard = bad / "shard-00001.safetensors"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif damage == "delete":
        shard.unlink()
    else:
        shard.write_bytes(b"\x07" * 64)
    line = fails(["fit", "--store", str(bad), "--out", str(tmp_path / "p")], capsys)
    assert "shard-00001.safetensors" in line and "rerun the same `valueprobe capture" in line
    assert not looks_complete(tmp_path / "p")
    # The rerun the message asks for recaptures from the damaged shard and gives the same store.
    code, _, err = run(
        [
            "capture",
            "--model",
            tiny_dir,
            "--data",
            str(icrl_small),
            "--out",
            str(bad),
            "--positions",
            "spans",
            "--examples-per-shard",
            "4",
        ],
        capsys,
    )
    assert code == 0, err
    for key in ActivationStore.open(store_dir).manifest.keys:
        np.testing.assert_array_equal(
            ActivationStore.open(bad).acts(key), ActivationStore.open(store_dir).acts(key)
        )


def test_remote_without_network_leaves_no_store(tiny_dir, icrl_small, tmp_path, capsys, monkeypatch):
    import nnsight

    monkeypatch.setattr(nnsight.CONFIG.API, "HOST", "http://127.0.0.1:9")  # nothing listens: no network
    out = tmp_path / "remote"
    line = fails(
        [
            "capture",
            "--model",
            tiny_dir,
            "--data",
            str(icrl_small),
            "--out",
            str(out),
            "--layers",
            "0",
            "--backend",
            "nnsight",
            "--remote",
        ],
        capsys,
    )
    assert "remote run on NDIF failed" in line
    assert not out.exists()


# ---------------------------------------------------------------- 5. nonsense parameters


@pytest.mark.parametrize("splits", ["0", "-3"])
def test_splits_below_one(splits, store_dir, tmp_path, capsys):
    out = tmp_path / "p"
    assert "--splits" in fails(
        ["fit", "--store", str(store_dir), "--out", str(out), "--splits", splits], capsys
    )
    assert not out.exists()


def test_bad_numbers_and_layer_specs_before_the_model(icrl_small, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        "valueprobe.model.load.load", lambda *a, **k: pytest.fail("model loaded before the check")
    )
    base = ["capture", "--data", str(icrl_small), "--out", str(tmp_path / "s")]
    assert "--batch-size 0" in fails([*base, "--batch-size", "0"], capsys)
    assert "--examples-per-shard" in fails([*base, "--examples-per-shard", "0"], capsys)
    assert "--max-length" in fails([*base, "--max-length", "0"], capsys)
    assert "not a layer spec" in fails([*base, "--layers", "1:x"], capsys)
    assert "--remote runs on NDIF" in fails([*base, "--remote"], capsys)
    assert not (tmp_path / "s").exists()


def test_group_by_matching_nothing(icrl_small, tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        "valueprobe.model.load.load", lambda *a, **k: pytest.fail("model loaded before the check")
    )
    out = tmp_path / "s"
    line = fails(
        [
            "capture",
            "--model",
            tiny_dir,
            "--data",
            str(icrl_small),
            "--out",
            str(out),
            "--group-by",
            "meta.nope",
        ],
        capsys,
    )
    assert "meta.nope links no two examples" in line and "meta keys in this dataset" in line
    assert not out.exists()


def test_text_over_context_is_named_or_truncated_with_warning(tiny_dir, tmp_path, capsys):
    long = Example(id="too-long", label=1, group="g", text="def add(a, b): return a + b\n" * 400)
    short = [Example(id=f"s{i}", label=i % 2, group=f"g{i}", text="x = 1\n" * (i + 1)) for i in range(3)]
    data = tmp_path / "long.jsonl"
    write_jsonl(data, [*short, long])
    out = tmp_path / "s"
    line = fails(["capture", "--model", tiny_dir, "--data", str(data), "--out", str(out)], capsys)
    assert "'too-long'" in line and "context of 2048" in line and "--max-length" in line
    assert not out.exists()
    code, _, err = run(
        ["capture", "--model", tiny_dir, "--data", str(data), "--out", str(out), "--max-length", "512"],
        capsys,
    )
    assert code == 0, err
    assert "warning: truncated 1 of 4 examples to max_length 512" in err and "'too-long'" in err
    assert ActivationStore.open(out).rows().n_tokens.max() == 512
    assert "over the model's context" in fails(
        [
            "capture",
            "--model",
            tiny_dir,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "s2"),
            "--max-length",
            "4096",
        ],
        capsys,
    )


def test_demo_out_checked_before_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        "valueprobe.replicate.demo.load", lambda *a, **k: pytest.fail("model loaded before the check")
    )
    out = tmp_path / "demo"
    out.write_text("not a folder")
    assert "is a file, not a folder" in fails(["demo", "--out", str(out)], capsys)
    assert out.read_text() == "not a folder"


# ---------------------------------------------------------------- 6. base models: --chat-template plain


def test_render_plain_maps_spans_like_a_template():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Yes. No."},
    ]
    text, starts = render_plain(messages)
    assert text == "System: Be brief.\nUser: Hi?\nAssistant: Yes. No."
    assert [text[s : s + len(m["content"])] for s, m in zip(starts, messages, strict=True)] == [
        m["content"] for m in messages
    ]
    assert render_plain(messages[:2])[0].endswith("User: Hi?\nAssistant:")  # the plain generation prompt
    ex = Example(id="c", label=1, group="g", messages=tuple(messages), spans=(Span(5, 8, "post", message=2),))
    text, starts = render(None, ex, chat_template="plain")
    assert text[starts[2] + 5 : starts[2] + 8] == "No."


def test_chat_template_plain_on_a_model_without_one(tiny_lm_factory, icrl_small, tmp_path, capsys):
    lm = tiny_lm_factory("llama")
    base = tmp_path / "base-model"
    lm.model.save_pretrained(base)
    lm.tokenizer.save_pretrained(base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in base.glob("chat_template.*"):
        extra.unlink()
    args = [
        "capture",
        "--model",
        str(base),
        "--data",
        str(icrl_small),
        "--positions",
        "spans",
        "--layers",
        "1",
    ]
    line = fails([*args, "--out", str(tmp_path / "s")], capsys)
    assert "no chat template" in line and "--chat-template plain" in line
    assert not (tmp_path / "s").exists()
    code, _, err = run([*args, "--out", str(tmp_path / "s"), "--chat-template", "plain"], capsys)
    assert code == 0, err
    store = ActivationStore.open(tmp_path / "s")
    assert store.manifest.chat_template == "plain" and store.rows().span[:2] == ["pre", "post"]
    # Against a hand rendering: the transcript, tokenized with special tokens, read at the spans.
    ex = read_jsonl(icrl_small)[0]
    text, starts = render_plain([dict(m) for m in ex.messages or ()])
    enc = lm.tokenizer(text, return_offsets_mapping=True)
    span = next(sp for sp in ex.spans if sp.label == "pre")
    lo = starts[span.message] + span.start
    hi = starts[span.message] + span.end
    toks = [t for t, (a, b) in enumerate(enc["offset_mapping"]) if b > a and lo <= a < hi]
    with torch.no_grad():
        hidden = lm.model(torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states[2][0]
    np.testing.assert_allclose(store.acts(1)[0], hidden[toks].mean(0).numpy(), rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- 7. checkpoints by time


def test_time_checkpoints_give_the_same_store(tiny_lm_factory, tmp_path, monkeypatch):
    lm = tiny_lm_factory("llama")
    exs = [
        Example(id=f"e{i}", label=i % 2, group=f"g{i % 3}", text="def f(x):\n    return x\n" * (i + 1))
        for i in range(7)
    ]
    one = capture_to_store(
        lm,
        exs,
        tmp_path / "one",
        CaptureSettings(layers="all", batch_size=2, include_embed=True),
        dtype="float32",
        progress=False,
    )
    clock = iter(range(0, 10**6, 100))  # every batch takes "100 s": each one ends a shard
    monkeypatch.setattr("valueprobe.activations.store.time.monotonic", lambda: float(next(clock)))
    many = capture_to_store(
        lm,
        exs,
        tmp_path / "many",
        CaptureSettings(layers="all", batch_size=2, include_embed=True),
        dtype="float32",
        checkpoint_seconds=60,
        progress=False,
    )
    assert len(one.manifest.shards) == 1
    assert [s.examples for s in many.manifest.shards] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    for key in one.manifest.keys:
        np.testing.assert_array_equal(many.acts(key), one.acts(key))


# ---------------------------------------------------------------- 8. smaller ones


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda(icrl_small, tmp_path, capsys):
    line = fails(
        ["capture", "--data", str(icrl_small), "--out", str(tmp_path / "s"), "--device", "cuda"], capsys
    )
    assert "no CUDA device" in line


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"id": "a", "label": 1, "group": "g", "text": "hi"}).encode() + b"\n"
    )
    assert read_jsonl(path)[0].id == "a"


def test_span_tokens_hint_names_a_real_option(probe_dir, tiny_dir, tmp_path, capsys):
    data = tmp_path / "plain.jsonl"
    write_jsonl(
        data,
        [Example(id="a", label=1, group="g", text="x = 1"), Example(id="b", label=0, group="h", text="y")],
    )
    line = fails(
        [
            "score",
            "--probe",
            str(probe_dir),
            "--model",
            tiny_dir,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "o"),
            "--tokens",
            "span_tokens",
        ],
        capsys,
    )
    assert "use last or all" in line  # both are --tokens choices (and --positions choices)


def test_artifacts_are_0644_like_the_json(probe_dir, store_dir):
    for path in [
        probe_dir / "axis.safetensors",
        probe_dir / "sweep.html",
        store_dir / "shard-00000.safetensors",
    ]:
        assert (
            stat.S_IMODE(path.stat().st_mode)
            == stat.S_IMODE((probe_dir / "probe.json").stat().st_mode)
            == 0o644
        )


def test_internal_error_names_a_traceback_log(store_dir, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setenv("VALUEPROBE_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr("valueprobe.probe.fit.fit_probe", broken)
    line = fails(["fit", "--store", str(store_dir), "--out", str(tmp_path / "p")], capsys, want=1)
    assert "internal error (RuntimeError: a bug)" in line
    (log,) = (tmp_path / "logs").iterdir()
    assert str(log) in line and "Traceback" in log.read_text() and "a bug" in log.read_text()


def test_os_and_json_errors_are_bad_input(store_dir, tmp_path, capsys):
    bad = copy_store(store_dir, tmp_path / "bad")
    (bad / "manifest.json").write_text("{not json")
    assert "manifest is not valid JSON" in fails(
        ["fit", "--store", str(bad), "--out", str(tmp_path / "p")], capsys
    )
    assert "cannot read dataset" in fails(
        ["capture", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "s")], capsys
    )


def test_score_progress_moves_per_batch(probe_dir, tiny_lm_factory, monkeypatch):
    steps: list[int] = []

    class Recorder(tqdm.auto.tqdm):
        def update(self, n=1):
            steps.append(n)
            return super().update(n)

    monkeypatch.setattr("valueprobe.read.readout.tqdm", Recorder)
    exs = [Example(id=f"e{i}", label=i % 2, group=f"g{i % 3}", text=f"x = {i}\n") for i in range(10)]
    score_dataset(
        ValueAxis.load(probe_dir),
        tiny_lm_factory("llama"),
        exs,
        ScoreSettings(batch_size=3, bootstrap=0, force=True),
    )
    assert steps == [3, 3, 3, 1]  # one step per batch, not one per 32 batches


@pytest.mark.parametrize("kind", ["bert", "t5"])
def test_not_a_decoder_only_lm_is_refused_before_any_work(kind, tmp_path, tiny_tokenizer, capsys):
    """An encoder (BERT's masked LM) or an encoder-decoder (T5) is named as such, for demo and load alike."""
    from transformers import BertConfig, BertForMaskedLM, T5Config, T5ForConditionalGeneration

    small = dict(vocab_size=len(tiny_tokenizer), num_attention_heads=2)
    if kind == "bert":
        model = BertForMaskedLM(
            BertConfig(hidden_size=16, num_hidden_layers=2, intermediate_size=32, **small)
        )
    else:
        model = T5ForConditionalGeneration(T5Config(d_model=16, d_kv=8, d_ff=32, num_layers=2, **small))
    folder = tmp_path / kind
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    out = tmp_path / "demo"
    line = fails(["demo", "--quick", "--model", str(folder), "--out", str(out)], capsys)
    assert "not a decoder-only LM" in line and kind in line and str(folder) in line
    assert not out.exists()  # refused before the first stage wrote anything
    with pytest.raises(Exception, match="not a decoder-only LM"):
        load(str(folder))


@pytest.mark.parametrize(
    ("verb", "option", "value"),
    [
        (["replicate", "safety"], "--epochs", "0"),
        (["replicate", "dpo-words"], "--lr", "-1"),
        (["replicate", "safety"], "--lr", "0"),
        (["tune", "dpo", "--data", "data/preference_words.jsonl"], "--epochs", "-1"),
        (["tune", "sft", "--data", "data/preference_words.jsonl"], "--batch-size", "0"),
        (["tune", "dpo", "--data", "data/preference_words.jsonl"], "--max-steps", "0"),
        (["tune", "dpo", "--data", "data/preference_words.jsonl"], "--beta", "-0.1"),
    ],
)
def test_tuning_refuses_impossible_numbers_before_any_work(
    verb, option, value, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    line = fails([*verb, option, value, "--out", str(tmp_path / "out")], capsys)
    assert line.startswith(f"error: {option} ") and "must be" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
