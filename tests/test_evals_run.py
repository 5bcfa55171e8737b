"""``valueprobe eval``: its settings, the table and figure, shards and merge, resume, and the one-line
refusals (a task that needs the hub, a probe that does not fit the model, α past the cap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from test_cli_faults import one_line
from test_steer import planted_axis  # tests/ is on sys.path under pytest

from valueprobe.errors import ValueprobeError
from valueprobe.evals import harness as harness_module
from valueprobe.evals.harness import Scored
from valueprobe.evals.parts import EVAL_PARTS
from valueprobe.evals.records import EvalResult, EvalSettings
from valueprobe.evals.run import eval_part, eval_settings, run_eval
from valueprobe.report.browser import open_report
from valueprobe.sharded import merge
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import ShardSpec


@pytest.fixture(scope="module")
def lm(tiny_lm_factory):
    return tiny_lm_factory("llama")


@pytest.fixture
def spec(lm, tmp_path):
    planted_axis(lm).save(tmp_path / "probe")
    return SteeringSpec(probe=str(tmp_path / "probe"), layers=[1], unit="norm").check()


def fake_harness(calls: list):
    """A harness whose score is a known function of the steering (the parts mechanism under test)."""

    def run(lm, spec, alpha, *, task, limit, batch_size):
        calls.append((spec.name(), alpha))
        k = 0 if spec.name() == "axis" else 1 + int(spec.name().split("-")[1])
        return Scored(0.5 + 0.001 * alpha * (1 + k), 0.01, limit or 7)

    return run


SETTINGS = EvalSettings("lm-eval", "arithmetic", (-2.0, 0.0, 2.0), random_directions=3, limit=5)


def test_settings_run_alpha_zero_once_then_the_axis_then_each_random_direction():
    assert eval_settings(SETTINGS) == [
        ("axis", 0.0), ("axis", -2.0), ("axis", 2.0), ("random-0", -2.0), ("random-0", 2.0),
        ("random-1", -2.0), ("random-1", 2.0), ("random-2", -2.0), ("random-2", 2.0),
    ]  # fmt: skip


def test_shards_merge_into_the_one_process_run(lm, spec, tmp_path):
    whole = run_eval(lm, spec, SETTINGS, out=tmp_path / "whole", progress=False, harness=fake_harness([]))
    for i in range(3):
        eval_part(
            lm,
            spec,
            SETTINGS,
            out=tmp_path / f"p{i}",
            shard=ShardSpec(i, 3),
            progress=False,
            harness=fake_harness([]),
        )
    merged = merge(tmp_path / "merged", [tmp_path / f"p{i}" for i in (2, 0, 1)], EVAL_PARTS)
    assert merged.points == whole.points
    assert json.loads((tmp_path / "merged" / "eval.json").read_text()) == json.loads(
        (tmp_path / "whole" / "eval.json").read_text()
    )
    with pytest.raises(Exception, match="shard 1/3 is missing"):
        merge(tmp_path / "m2", [tmp_path / "p0", tmp_path / "p2"], EVAL_PARTS)


def test_a_rerun_resumes_the_part_and_a_part_of_another_run_is_refused(lm, spec, tmp_path):
    calls: list = []
    eval_part(
        lm,
        spec,
        SETTINGS,
        out=tmp_path / "p",
        shard=ShardSpec(0, 2),
        progress=False,
        harness=fake_harness(calls),
    )
    first = len(calls)
    eval_part(
        lm,
        spec,
        SETTINGS,
        out=tmp_path / "p",
        shard=ShardSpec(0, 2),
        progress=False,
        harness=fake_harness(calls),
    )
    assert len(calls) == first  # nothing run twice
    other = EvalSettings("lm-eval", "arithmetic", (-1.0, 0.0, 1.0), random_directions=3, limit=5)
    with pytest.raises(Exception, match="another run"):
        eval_part(
            lm,
            spec,
            other,
            out=tmp_path / "p",
            shard=ShardSpec(0, 2),
            progress=False,
            harness=fake_harness([]),
        )


def _as_before_sigma_references(part: Path) -> None:
    """Rewrite a part as one written before σ had a reference: spec format 1, α in σ of another σ."""
    head = json.loads((part / "eval-part.json").read_text())
    head["spec"] = {k: v for k, v in head["spec"].items() if k != "sigma_reference"} | {"format_version": 1}
    head["points"] = [p | {"alpha_other": p["alpha_other"] * 3.0} for p in head["points"]]
    (part / "eval-part.json").write_text(json.dumps(head))


def test_a_part_from_before_sigma_was_recalibrated_resumes_in_norm_and_restates_its_sigma(lm, spec, tmp_path):
    first = run_eval(lm, spec, SETTINGS, out=tmp_path / "r", progress=False, harness=fake_harness([]))
    _as_before_sigma_references(tmp_path / "r")
    calls: list = []
    again = run_eval(lm, spec, SETTINGS, out=tmp_path / "r", progress=False, harness=fake_harness(calls))
    assert calls == [] and again == first  # nothing scored again; every α in σ as the axis says now
    assert json.loads((tmp_path / "r" / "eval-part.json").read_text())["spec"] == spec.to_dict()


def test_a_part_in_sigma_of_another_reference_is_refused(lm, spec, tmp_path):
    in_sigma = SteeringSpec(probe=spec.probe, layers=[1], unit="sigma").check()
    eval_part(lm, in_sigma, SETTINGS, out=tmp_path / "p", progress=False, harness=fake_harness([]))
    _as_before_sigma_references(tmp_path / "p")
    with pytest.raises(ValueprobeError, match="its α is in σ, measured over another reference"):
        eval_part(lm, in_sigma, SETTINGS, out=tmp_path / "p", progress=False, harness=fake_harness([]))
    with pytest.raises(ValueprobeError, match="another steering spec"):
        eval_part(lm, spec, SETTINGS, out=tmp_path / "p", progress=False, harness=fake_harness([]))


def test_the_table_puts_the_axis_beside_its_random_null_in_both_units(lm, spec, tmp_path):
    result = run_eval(lm, spec, SETTINGS, out=tmp_path / "r", progress=False, harness=fake_harness([]))
    headers, rows = result.table()
    assert headers[:3] == ["α (norm)", "α (sigma)", "exact_match"]
    by_alpha = {r[0]: r for r in rows}
    assert by_alpha["2"][2] == pytest.approx(0.502) and by_alpha["2"][4] == "[0.504, 0.508]"
    assert by_alpha["2"][6] == "yes"  # the axis (0.502) lies below every random direction
    axis = spec.first_axis()
    assert float(by_alpha["2"][1]) == pytest.approx(
        2 * axis.unit_size(1, "norm") / axis.unit_size(1, "sigma"), rel=1e-3
    )
    assert EvalResult.from_dict(json.loads((tmp_path / "r" / "eval.json").read_text())) == result


def test_the_figure_draws_offline_in_chromium(lm, spec, tmp_path):
    run_eval(lm, spec, SETTINGS, out=tmp_path / "r", progress=False, harness=fake_harness([]))
    check = open_report(tmp_path / "r" / "eval.html", timeout=60)
    assert check.n_figures == 1
    assert check.ok, check.problems()


def _eval_argv(tmp_path, harness="lm-eval", task="arithmetic", *more):
    """``valueprobe eval`` along the shipped value axis, strengths -1, 0, 1, and ``more``."""
    argv = ["eval", "--harness", harness, "--task", task, "--probe", "smollm2-135m-value", "--alphas=-1,0,1"]
    return [*argv, *more, "--out", str(tmp_path / "e")]


def test_a_task_that_needs_the_hub_is_one_line_naming_the_shipped_tasks(capsys, tmp_path):
    code, _, err = run_cli(_eval_argv(tmp_path, "lm-eval", "gsm8k"), capsys)
    line = one_line(code, err)
    assert "unreachable" in line and "arithmetic" in line and "corrigible_ab" in line


def test_an_unknown_harness_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(_eval_argv(tmp_path, "helm"), capsys)
    assert "lm-eval, inspect" in one_line(code, err)


@pytest.mark.parametrize(
    "option, value, least",
    [("--random-directions", "-1", 0), ("--limit", "0", 1), ("--batch-size", "0", 1)],
)
def test_the_evaluation_options_are_checked_in_one_line_before_any_model_loads(
    capsys, tmp_path, option, value, least
):
    code, _, err = run_cli(_eval_argv(tmp_path, "lm-eval", "arithmetic", option, value), capsys)
    assert one_line(code, err) == f"error: {option} {value}: give a whole number >= {least}"


def test_a_probe_that_does_not_fit_the_model_is_refused_before_the_harness(
    capsys, tmp_path, tiny_dir, monkeypatch
):
    monkeypatch.setitem(
        harness_module.HARNESSES, "lm-eval", lambda *a, **k: pytest.fail("the harness started")
    )
    code, _, err = run_cli(_eval_argv(tmp_path, "lm-eval", "arithmetic", "--model", tiny_dir), capsys)
    assert "d_model" in one_line(code, err)


def test_alphas_past_the_cap_are_one_line_unless_allowed(capsys, tmp_path, tiny_dir, lm, monkeypatch):
    axis = planted_axis(lm, mean_norm=8.0)
    axis.save(tmp_path / "probe")
    calls: list = []
    monkeypatch.setitem(harness_module.HARNESSES, "lm-eval", fake_harness(calls))
    argv = ["eval", "--harness", "lm-eval", "--task", "arithmetic", "--probe", str(tmp_path / "probe")]
    argv += ["--model", tiny_dir, "--unit", "norm", "--alphas=-150,0,150", "--random-directions", "1"]
    argv += ["--limit", "2"]
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "e")], capsys)
    assert "--allow-large" in one_line(code, err) and not calls
    code, out, err = run_cli([*argv, "--out", str(tmp_path / "e2"), "--allow-large"], capsys)
    assert code == 0, err
    assert len(calls) == 5 and (tmp_path / "e2" / "summary.md").read_text().count("valueprobe eval") == 1


def test_each_harness_scores_the_shipped_tasks_on_the_tiny_model(lm, spec):
    from valueprobe.evals.harness import HARNESSES
    from valueprobe.evals.tasks import shipped_task

    pytest.importorskip("lm_eval")
    pytest.importorskip("inspect_ai")
    arithmetic = {
        h: run(lm, spec, 3.0, task=shipped_task("arithmetic"), limit=3, batch_size=3)
        for h, run in HARNESSES.items()
    }
    assert arithmetic["lm-eval"] == arithmetic["inspect"]  # the same answers, by the same rule
    for h, run in HARNESSES.items():
        ab = run(lm, spec, 3.0, task=shipped_task("corrigible_ab"), limit=3, batch_size=3)
        assert ab.n == 3 and ab.score in (0.0, 1 / 3, 2 / 3, 1.0), h


RESULTS = Path(__file__).resolve().parents[1] / "probes" / "evals-smollm2-135m"


@pytest.mark.parametrize("axis", ["value", "reward-history"])
def test_the_committed_runs_read_back_and_say_what_the_guide_says(axis):
    from valueprobe.files import jsonable

    runs = {}
    for harness in ("lm-eval", "inspect"):
        text = (RESULTS / f"{axis}-{harness}" / "eval.json").read_text()
        runs[harness] = EvalResult.from_dict(json.loads(text))
        assert json.dumps(jsonable(runs[harness].to_dict()), indent=2) + "\n" == text
        assert runs[harness].settings.harness == harness and len(runs[harness].points) == 19
    scores = {h: [(p.direction, p.alpha, p.score) for p in r.points] for h, r in runs.items()}
    assert scores["lm-eval"] == scores["inspect"]
    own = json.loads((RESULTS / "valueprobe-task-accuracy.json").read_text())
    assert runs["lm-eval"].at("axis", 0.0).score == sum(row["right"] for row in own) / len(own)


@pytest.mark.slow
def test_both_harnesses_agree_with_valueprobes_own_accuracy_on_the_default_model(default_lm):
    # α = 0 through lm-eval and through Inspect is the model valueprobe's task runs read: the same
    # answers, so the same accuracy; the A/B task runs through each harness's own reading
    from valueprobe.datasets.answers import check, read_tasks
    from valueprobe.datasets.shipped import dataset_path
    from valueprobe.evals.harness import HARNESSES
    from valueprobe.evals.tasks import ARITHMETIC_NEW_TOKENS, shipped_task
    from valueprobe.steering.decode.generation import generate
    from valueprobe.steering.decode.sampling import Decoding

    spec = SteeringSpec(probe="smollm2-135m-value", unit="norm").check()
    n = 4
    tasks = read_tasks(dataset_path("task_arithmetic"))[:n]
    gens = generate(
        default_lm,
        spec,
        [list(t.messages) for t in tasks],
        alphas=[0.0],
        batch_size=n,
        progress=False,
        decoding=Decoding(greedy=True, max_new_tokens=ARITHMETIC_NEW_TOKENS),
    )
    own = sum(check(t, g.text).correct for t, g in zip(tasks, gens, strict=True)) / n
    got = {
        h: run(default_lm, spec, 0.0, task=shipped_task("arithmetic"), limit=n, batch_size=n)
        for h, run in HARNESSES.items()
    }
    assert got["lm-eval"].score == got["inspect"].score == own
    assert got["lm-eval"].n == got["inspect"].n == n
    for h, run in HARNESSES.items():
        ab = run(default_lm, spec, 0.0, task=shipped_task("corrigible_ab"), limit=n, batch_size=n)
        assert ab.n == n and 0.0 <= ab.score <= 1.0, h
