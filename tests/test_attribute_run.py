"""``valueprobe attribute`` end to end on a tiny model: outputs, resume after an interruption, shards and
their merge, and bad input in one line before any work."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import build_model, run_cli
from test_attribute import contrast, pair_examples
from test_cli import one_line_error
from test_steer import planted_axis

from valueprobe.attribute import run as run_module
from valueprobe.attribute import work as work_module
from valueprobe.attribute.folder import RUN, read_run
from valueprobe.attribute.run import AttributeSettings, Provenance, run_attribution
from valueprobe.datasets.io import write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.replicate.attribute import Job, replicate_attribute
from valueprobe.report.page import load_results

SRC = Provenance("probe", "sha", ())


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_lm_factory, tiny_dir):
    """A probe of the tiny llama (the one in ``tiny_dir``), a pairs file and a contrast file."""
    root = tmp_path_factory.mktemp("attr")
    planted_axis(tiny_lm_factory("llama"), sigma=0.05).save(root / "probe")
    write_jsonl(root / "pairs.jsonl", pair_examples(4))
    write_jsonl(root / "contrast.jsonl", contrast())
    return root


def _json(path):
    return json.loads(path.read_text())


def test_direct_and_patch_write_their_three_files_and_the_ablation(files, tiny_dir, tmp_path, capsys):
    out = tmp_path / "direct"
    code, stdout, err = run_cli(
        ["attribute", "--probe", str(files / "probe"), "--data", str(files / "pairs.jsonl"), "--model", tiny_dir,
         "--positions", "spans", "--span-labels", "post", "--ablate-top", "3", "--random", "4", "--bootstrap", "50",
         "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert {p.name for p in out.iterdir()} >= {"attribution.json", "components.csv", "attribution.html", RUN}
    res = _json(out / "attribution.json")
    assert (
        res["method"] == "direct" and res["ablation"]["k"] == 3 and len(res["ablation"]["auroc"]["null"]) == 4
    )
    assert res["ablation"]["steer"] is not None  # the pairs carry a yes/no question
    assert "ablating the top 3" in stdout
    lines = (out / "components.csv").read_text().splitlines()
    assert lines[0].startswith("name,kind,layer,head,mean_1,mean_0,gap,gap_ci_lo,gap_ci_hi")
    assert len(lines) == 1 + len(res["terms"])
    out = tmp_path / "patch"
    code, stdout, err = run_cli(
        ["attribute", "--probe", str(files / "probe"), "--data", str(files / "pairs.jsonl"), "--model", tiny_dir,
         "--method", "patch", "--positions", "spans", "--span-labels", "post", "--resid-layers", "1", "--limit", "2",
         "--bootstrap", "50", "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "exact patching: 2 pairs" in stdout
    res = _json(out / "attribution.json")
    assert res["n_units"] == 2 and res["grid"]["layers"] == [1] and res["baselines"] is not None


class Interrupted(BaseException):
    """Stands in for Ctrl-C's KeyboardInterrupt inside a library call (the CLI test uses the real one)."""


def test_an_interrupted_run_resumes_to_the_same_result(tiny_lm_factory, tmp_path, monkeypatch):
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm, sigma=0.05)
    settings = AttributeSettings(
        method="attrib-patch", positions="spans", span_labels=("post",), resid_layers="0,1", bootstrap=50
    )
    whole = run_attribution(
        lm, axis, pair_examples(4), tmp_path / "whole", settings, source=SRC, progress=False
    )
    calls = {"n": 0}
    real = work_module.PairWork.one

    def flaky(self, pair):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Interrupted
        return real(self, pair)

    monkeypatch.setattr(work_module.PairWork, "one", flaky)
    monkeypatch.setattr(run_module, "CHECKPOINT_SECONDS", 0.0)
    with pytest.raises(Interrupted):
        run_attribution(lm, axis, pair_examples(4), tmp_path / "cut", settings, source=SRC, progress=False)
    assert read_run(tmp_path / "cut").done == 2  # the two finished pairs are on disk
    monkeypatch.setattr(work_module.PairWork, "one", real)
    resumed = run_attribution(
        lm, axis, pair_examples(4), tmp_path / "cut", settings, source=SRC, progress=False
    )
    assert resumed is not None and whole is not None
    assert resumed.to_dict() == whole.to_dict()
    with pytest.raises(ValueprobeError, match="resume with the same options"):
        run_attribution(lm, axis, pair_examples(4), tmp_path / "cut", AttributeSettings(method="attrib-patch", bootstrap=60,
                        positions="spans", span_labels=("post",), resid_layers="0,1"), source=SRC, progress=False)  # fmt: skip


@pytest.mark.parametrize("method", ["direct", "patch"])
def test_shards_merge_into_the_one_process_result(files, tiny_dir, tmp_path, capsys, method):
    common = ["--probe", str(files / "probe"), "--data", str(files / "pairs.jsonl"), "--model", tiny_dir, "--method", method,
              "--positions", "spans", "--span-labels", "post", "--resid-layers", "none", "--batch-size", "2", "--bootstrap", "50"]  # fmt: skip
    assert run_cli(["attribute", *common, "--out", str(tmp_path / "one")], capsys)[0] == 0
    for i in range(2):
        code, _, err = run_cli(
            ["attribute", *common, "--shard", f"{i}/2", "--out", str(tmp_path / f"part{i}")], capsys
        )
        assert code == 0, err
        assert not (tmp_path / f"part{i}" / "attribution.json").exists()
    code, _, err = run_cli(
        ["merge", str(tmp_path / "merged"), str(tmp_path / "part1"), str(tmp_path / "part0")], capsys
    )
    assert code == 0, err
    assert _json(tmp_path / "merged" / "attribution.json") == _json(tmp_path / "one" / "attribution.json")
    assert (tmp_path / "merged" / "attribution.html").is_file()
    code, _, err = run_cli(["merge", str(tmp_path / "again"), str(tmp_path / "part0")], capsys)
    assert code == 2 and "shard 1/2 is missing" in err


def _one_line(code: int, err: str) -> str:
    return one_line_error(code, err)


def test_bad_input_is_one_line_before_any_work(files, tiny_dir, tmp_path, capsys, tiny_tokenizer):
    base = ["attribute", "--probe", str(files / "probe"), "--model", tiny_dir]
    pairs = ["--data", str(files / "pairs.jsonl")]
    line = _one_line(
        *run_cli([*base, *pairs, "--ablate-top", "99", "--out", str(tmp_path / "a")], capsys)[:3:2]
    )
    assert "--ablate-top 99" in line and "1..10" in line
    line = _one_line(
        *run_cli([*base, *pairs, "--method", "magic", "--out", str(tmp_path / "b")], capsys)[:3:2]
    )
    assert "direct, patch, attrib-patch" in line
    line = _one_line(
        *run_cli(
            [*base, *pairs, "--ablate-top", "2", "--shard", "0/2", "--out", str(tmp_path / "c")], capsys
        )[:3:2]
    )
    assert "merge the parts" in line
    line = _one_line(
        *run_cli(
            [
                *base,
                "--data",
                str(files / "contrast.jsonl"),
                "--method",
                "patch",
                "--out",
                str(tmp_path / "d"),
            ],
            capsys,
        )[:3:2]
    )
    assert "meta.pair" in line
    # a family without a per-head split: a tiny Gemma 2 saved as a model folder
    gemma = tmp_path / "gemma2"
    build_model("gemma2", len(tiny_tokenizer)).save_pretrained(gemma)
    tiny_tokenizer.save_pretrained(gemma)
    capsys.readouterr()  # the save's progress bar is not the command's output
    line = _one_line(
        *run_cli(
            [*base[:-2], "--model", str(gemma), *pairs, "--force", "--out", str(tmp_path / "e")], capsys
        )[:3:2]
    )
    assert "gemma2" in line and "llama" in line and "gpt_neox" in line
    assert not (tmp_path / "e" / "attribution.json").exists()


def test_ctrl_c_exits_130_and_a_rerun_resumes(files, tiny_dir, tmp_path, capsys, monkeypatch):
    args = ["attribute", "--probe", str(files / "probe"), "--data", str(files / "pairs.jsonl"), "--model", tiny_dir,
            "--method", "attrib-patch", "--positions", "spans", "--span-labels", "post", "--resid-layers", "none",
            "--bootstrap", "50", "--out", str(tmp_path / "run")]  # fmt: skip
    real = work_module.PairWork.one
    seen = {"n": 0, "cut": 2}

    def ctrl_c(self, pair):
        seen["n"] += 1
        if seen["n"] == seen["cut"]:
            raise KeyboardInterrupt
        return real(self, pair)

    monkeypatch.setattr(work_module.PairWork, "one", ctrl_c)
    code, _, err = run_cli(args, capsys)
    assert code == 130 and err.strip().splitlines()[-1].startswith("error: interrupted")
    assert read_run(tmp_path / "run").done == 1  # the first pair was kept
    seen.update(n=0, cut=-1)
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert _json(tmp_path / "run" / "attribution.json")["n_units"] == 4
    assert seen["n"] == 3  # the rerun ran the other three pairs only


def test_replicate_writes_each_job_the_sections_and_the_agreement(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    probe = tmp_path / "probe"
    planted_axis(lm, sigma=0.05).save(probe)
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "icrl_pairs.jsonl", pair_examples(4))
    post = AttributeSettings(
        positions="spans", span_labels=("post",), target="label", bootstrap=50, resid_layers="1"
    )
    jobs = (
        Job(
            "reward-history-ablate",
            str(probe),
            replace(post, method="direct", n_random=4),
            ablate_top=2,
            draws=3,
        ),
        Job("reward-history-patch", str(probe), replace(post, method="patch", limit=2)),
        Job("reward-history-attrib", str(probe), replace(post, method="attrib-patch")),
    )
    out = tmp_path / "out"
    results = replicate_attribute(
        lm, out, work=tmp_path / "work", data_dir=tmp_path / "data", jobs=jobs, progress=False
    )
    agree = results["reward-history-patch"].agreement
    assert agree is not None and agree.n_pairs == 2 and -1 <= agree.spearman_components <= 1
    for job in jobs:
        assert (out / job.name / "attribution.json").is_file() and (
            out / job.name / "components.csv"
        ).is_file()
    assert not list(out.rglob("*.safetensors"))  # the chunks stay in the work folder
    loaded = load_results(out)
    assert set(loaded.sections) == {"attribution", "attribution_patch"}
    assert loaded.sections["attribution_patch"].agreement == agree
    summary = (out / "summary.md").read_text()
    assert "Spearman" in summary and "Ablating the top 2" in summary
    # a rerun (every job resumes finished) rewrites the tables and keeps the hand-written reading
    (out / "summary.md").write_text(summary.replace("Spearman", "Spearman-old") + "## Reading\n\nBy hand.\n")
    replicate_attribute(
        lm, out, work=tmp_path / "work", data_dir=tmp_path / "data", jobs=jobs, progress=False
    )
    again = (out / "summary.md").read_text()
    assert again == summary + "## Reading\n\nBy hand.\n"


def test_a_finished_run_keeps_its_ablation_and_redoes_it_only_when_its_sizes_change(
    tiny_lm_factory, tmp_path, monkeypatch
):
    from valueprobe.attribute import run as run_module

    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm, sigma=0.05)
    s = AttributeSettings(positions="spans", span_labels=("post",), n_random=3, bootstrap=50)
    first = run_attribution(
        lm, axis, pair_examples(4), tmp_path / "a", s, source=SRC, ablate_top=2, progress=False
    )
    real = run_module._ablation
    calls = []
    monkeypatch.setattr(run_module, "_ablation", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = run_attribution(
        lm, axis, pair_examples(4), tmp_path / "a", s, source=SRC, ablate_top=2, progress=False
    )
    assert again is not None and first is not None and again.to_dict() == first.to_dict() and not calls
    other = run_attribution(
        lm, axis, pair_examples(4), tmp_path / "a", s, source=SRC, ablate_top=3, progress=False
    )
    assert calls and other is not None and other.ablation is not None and other.ablation.k == 3
