"""Steering sweeps: P(yes) against a hand computation, resumption, the controls' null, the CLI.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_steer_sweep.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli as run

from valueprobe.cli.steer import parse_alphas
from valueprobe.datasets.io import Example, read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.route import steered_logits
from valueprobe.model.fingerprint import FingerprintWarning
from valueprobe.probe.axis import ValueAxis
from valueprobe.report.effects import dose_response_figure
from valueprobe.stats.null import random_directions as null_directions
from valueprobe.steering.decode import generation
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.experiment.dose import SweepRow, summarize_rows
from valueprobe.steering.experiment.sweep import GENERATIONS, SweepSettings, run_sweep, sweep_directions
from valueprobe.steering.experiment.yes_no import answer_tokens, p_yes
from valueprobe.steering.hook.spec import SteeringSpec

DATA = Path(__file__).resolve().parents[1] / "data"


def tiny_axis(lm, *, d_model: int | None = None, mean_norm: float = 10.0, seed: int = 0) -> ValueAxis:
    d = d_model or lm.d_model
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(lm.n_layers, d, generator=g)
    return ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True),
        layers=tuple(range(lm.n_layers)),
        mu=torch.zeros(lm.n_layers),
        sigma=torch.full((lm.n_layers,), 2.0),
        mean_norm=torch.full((lm.n_layers,), mean_norm),
        best_layer=1,
        site="resid_post",
        method="test",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=d,
    )


def chats(n: int, *, yes_no: bool = False) -> list[Example]:
    ask = " Answer yes or no." if yes_no else ""
    return [
        Example(
            id=f"p{i}",
            label=1,
            group="g",
            messages=({"role": "user", "content": f"Is {i} + 1 = {i + 1}?{ask}"},),
        )
        for i in range(n)
    ]


def settings_for(tmp: Path, axis: ValueAxis | None = None, **kw) -> SweepSettings:
    """A small greedy sweep's settings: its spec names probe "tiny" and steers ``axis`` when given."""
    base = dict(
        spec=SteeringSpec(axis, probe="tiny"),
        probe_fingerprint="x",
        model="tiny",
        prompts=str(tmp / "p.jsonl"),
        prompts_sha256="0",
        alphas=(-2.0, 0.0, 2.0),
        max_new_tokens=4,
        controls=2,
        greedy=True,
        chunk_prompts=2,
        metrics=("length", "degenerate"),
    )
    return SweepSettings(**{**base, **kw})  # type: ignore[arg-type]


# --- P(yes) ----------------------------------------------------------------------------------------


def test_p_yes_matches_steered_logits_by_hand(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    prompts = [list(ex.messages or ()) for ex in chats(3, yes_no=True)]
    alphas = [-3.0, 0.0, 1.5]
    got = p_yes(lm, SteeringSpec(axis, unit="sigma"), prompts, alphas, batch_size=2)
    tok = lm.tokenizer
    # This tokenizer has no single "yes" token: the first tokens of the forms, less any shared one.
    yes = {tok(w, add_special_tokens=False)["input_ids"][0] for w in ("yes", "Yes", "YES", " yes", " Yes")}
    no = {tok(w, add_special_tokens=False)["input_ids"][0] for w in ("no", "No", "NO", " no", " No")}
    yes, no = sorted(yes - no), sorted(no - yes)
    assert yes and no and answer_tokens(tok) == (yes, no)
    for row, (prompt, a) in enumerate(zip(encode_prompts(lm, prompts), alphas, strict=True)):
        ids = torch.tensor([prompt])
        # The trusted route: h += α·σ·v̂ at the axis layer on every position, one unbatched forward.
        logits = steered_logits(
            lm, ids, torch.ones_like(ids), layer=1, vector=axis.direction(1) * 2.0, alpha=a
        )
        probs = torch.softmax(logits[0, -1], dim=-1)
        want = probs[yes].sum() / (probs[yes].sum() + probs[no].sum())
        assert got[row] == pytest.approx(float(want), abs=1e-5)
    assert got[0] != pytest.approx(got[1], abs=1e-6)  # steering moved it
    # norm units (α % of the mean norm, 10 here) and another direction (with the axis's σ)
    ids = torch.tensor([encode_prompts(lm, prompts[:1])[0]])
    other = torch.nn.functional.normalize(
        torch.randn(lm.d_model, generator=torch.Generator().manual_seed(9)), dim=0
    )
    (along_axis,) = p_yes(lm, SteeringSpec(axis, unit="sigma"), prompts[:1], [4.0])
    for spec, vector in (
        (SteeringSpec(axis, unit="norm"), axis.direction(1) * 10.0 / 100),
        (SteeringSpec(axis, unit="sigma", direction=other * 5.0), other * 2.0),  # the direction is normalized
    ):
        (one,) = p_yes(lm, spec, prompts[:1], [4.0])
        logits = steered_logits(lm, ids, torch.ones_like(ids), layer=1, vector=vector, alpha=4.0)
        probs = torch.softmax(logits[0, -1], dim=-1)
        assert one == pytest.approx(float(probs[yes].sum() / (probs[yes].sum() + probs[no].sum())), abs=1e-5)
        assert one != pytest.approx(along_axis, abs=1e-4)  # so a dropped unit or direction shows


# --- sweeps -----------------------------------------------------------------------------------------


def test_sweep_rows_controls_and_resume(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis, other = tiny_axis(lm), tiny_axis(lm, seed=1)
    examples = chats(5, yes_no=True)
    settings = settings_for(tmp_path, axis, other_probe="other", metrics=("yes", "p_yes", "length"))
    full = run_sweep(lm, examples, tmp_path / "full", settings, other=other, n_boot=50, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "full" / GENERATIONS).read_text().splitlines()]
    # 5 prompts × 3 α × 1 sample × (axis + other + 2 random), each key once
    assert len(rows) == 5 * 3 * 4 == full.n_rows
    assert len({(r["prompt_id"], r["alpha"], r["direction"], r["sample"]) for r in rows}) == len(rows)
    assert {r["direction"] for r in rows} == {"axis", "other:other", "random-0", "random-1"}
    assert all(0.0 <= r["metrics"]["p_yes"] <= 1.0 for r in rows)
    # A random model never answers yes or no, so "yes" has no valid row and no effect; the rest of
    # the settings' metrics each have one, in the settings' order.
    assert all(r["metrics"]["yes"] is None for r in rows)
    assert [e.metric for e in full.effects] == ["p_yes", "length"]
    assert all(len(e.null) == 2 for e in full.effects)

    # Interrupt after two chunks, then resume: finished chunks are not generated again.
    calls: list[int] = []
    stop_at = [3]
    real = generation.generate

    def counting(*args, **kw):
        calls.append(len(args[2]))
        if len(calls) == stop_at[0]:
            raise KeyboardInterrupt
        return real(*args, **kw)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(
            lm,
            examples,
            tmp_path / "resumed",
            settings,
            other=other,
            n_boot=50,
            progress=False,
            generator=counting,
        )
    path = tmp_path / "resumed" / GENERATIONS
    assert len(path.read_text().splitlines()) == 2 * 2 * 3  # two chunks of 2 prompts × 3 α
    with path.open("a") as f:
        f.write('{"prompt_id": "p4", "alph')  # a line cut by the interruption
    calls.clear()
    stop_at[0] = -1
    again = run_sweep(
        lm,
        examples,
        tmp_path / "resumed",
        settings,
        other=other,
        n_boot=50,
        progress=False,
        generator=counting,
    )
    assert len(calls) == 4 * 3 - 2  # 3 blocks per direction, 4 directions, 2 blocks already done
    resumed = [json.loads(x) for x in path.read_text().splitlines()]
    key = lambda r: (r["prompt_id"], r["alpha"], r["direction"], r["sample"])  # noqa: E731
    assert sorted(map(key, resumed)) == sorted(map(key, rows))
    # Greedy rows are the same whatever chunk or run produced them.
    assert {key(r): r["text"] for r in resumed} == {key(r): r["text"] for r in rows}
    assert again.to_dict()["effects"][0]["axis"]["slope"] == pytest.approx(
        full.to_dict()["effects"][0]["axis"]["slope"]
    )


def test_sweep_refuses_a_folder_with_another_sweep(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    run_sweep(lm, chats(2), tmp_path / "s", settings_for(tmp_path, axis), n_boot=10, progress=False)
    with pytest.raises(ValueprobeError, match="different sweep"):
        run_sweep(
            lm, chats(2), tmp_path / "s", settings_for(tmp_path, axis, alphas=(-1.0, 1.0)), progress=False
        )


def test_sweep_random_directions_are_the_stats_null_rows(tiny_lm_factory, tmp_path):
    """One random-direction scheme: the sweep's ``random-K`` is row K of stats.null's draw, seed for seed."""
    axis = tiny_axis(tiny_lm_factory("llama"))
    settings = settings_for(tmp_path, axis, controls=3, seed=5)
    named = dict(sweep_directions(settings, None, 3))
    expected = torch.from_numpy(null_directions(axis.d_model, 3, seed=5)).float()
    assert named["axis"] is None
    for k in range(3):
        assert torch.equal(named[f"random-{k}"], expected[k])
    assert not torch.equal(
        named["random-0"], torch.from_numpy(null_directions(axis.d_model, 1, seed=6)).float()[0]
    )


@pytest.mark.parametrize("text", ["", " , ", "1,x", "1,nan", "2,2"])
def test_parse_alphas_rejects(text):
    with pytest.raises(ValueprobeError):
        parse_alphas(text)


# --- summary on planted rows ----------------------------------------------------------------------------


def planted_rows(axis_slope: float, *, degenerate_at: float | None = None) -> list[SweepRow]:
    rng = np.random.default_rng(0)
    rows = []
    for d, slope in [
        ("axis", axis_slope),
        ("other:h", 0.0),
        *((f"random-{k}", rng.normal(0, 0.05)) for k in range(8)),
    ]:
        for p in range(20):
            offset = rng.normal(0, 1)
            for a in (-2.0, -1.0, 0.0, 1.0, 2.0):
                deg = d == "axis" and a == degenerate_at and p < 15
                value = 1000.0 if deg else slope * a + offset + rng.normal(0, 0.1)
                rows.append(
                    SweepRow(f"p{p}", "g", a, d, 0, 1, "x", {"length": value, "degenerate": float(deg)})
                )
    return rows


def test_summary_null_and_drop_rule():
    res = summarize_rows(planted_rows(1.0, degenerate_at=2.0), unit="sigma", metrics=["length"], n_boot=200)
    (e,) = res.effects
    assert e.dropped == (2.0,)  # 15 of 20 outputs degenerate at α = 2: the whole strength goes
    assert e.axis.slope == pytest.approx(1.0, abs=0.05) and e.axis.ci[0] < 1.0 < e.axis.ci[1]
    assert len(e.null) == 8 and e.outside is True and e.other_outside is False
    assert e.curves["axis"].alphas == (-2.0, -1.0, 0.0, 1.0)
    flat = summarize_rows(planted_rows(0.0), unit="norm", metrics=["length"], n_boot=200)
    assert flat.effects[0].outside is False and flat.step == 25.0
    headers, table = flat.table()
    assert headers[2] == "axis slope (per 25 norm)" and table[0][6] == "no"
    json.dumps(flat.to_dict())
    # the one dose-response figure (the report's): null band, other axis, the axis's CI band and its line
    assert len(dose_response_figure(flat).data) == 4


# --- CLI ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory, tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    root = tmp_path_factory.mktemp("steer")
    lm.model.save_pretrained(root / "model")
    lm.tokenizer.save_pretrained(root / "model")
    tiny_axis(lm).save(root / "probe")
    tiny_axis(lm, seed=1).save(root / "other")
    ax = tiny_axis(lm)
    ValueAxis(**{**ax.__dict__, "mean_norm": torch.full((lm.n_layers,), float("nan"))}).save(root / "no-norm")
    wide = tiny_axis(lm, d_model=32)
    wide.save(root / "wide")
    arch, weights = lm.fingerprint.split("-")
    foreign = "0" * len(arch) if arch != "0" * len(arch) else "1" * len(arch)
    ValueAxis(**{**ax.__dict__, "fingerprint": f"{foreign}-{weights}"}).save(root / "foreign")
    write_jsonl(root / "p.jsonl", chats(4, yes_no=True))
    (root / "empty.jsonl").write_text("")
    (root / "bad.jsonl").write_text('{"id": "a", "label": 1}\n')
    return root


def steer_argv(files: Path, probe: str = "probe", **options: object) -> list[str]:
    """``valueprobe steer`` on the tiny files: ``max_new_tokens=3`` is ``--max-new-tokens 3``, ``greedy=True`` a flag."""
    argv = ["steer", "--probe", str(files / probe), "--model", str(files / "model"), "--prompts"]
    argv.append(str(files / "p.jsonl"))
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def test_cli_steer_writes_and_resumes(tiny_files, tmp_path, capsys):
    r = tiny_files
    argv = steer_argv(
        r,
        alphas="-2,0,2",
        max_new_tokens=3,
        random_directions=2,
        greedy=True,
        other_probe=r / "other",
        out=tmp_path / "out",
        bootstrap=50,
    )
    code, out, err = run(argv, capsys)
    assert code == 0, err
    for name in ("settings.json", "generations.jsonl", "metrics.json", "metrics.csv", "dose.html"):
        assert (tmp_path / "out" / name).is_file(), name
    html = (tmp_path / "out" / "dose.html").read_text()
    assert '<script src="http' not in html and len(html) > 1_000_000  # plotly.js inlined, no CDN
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    # a yes/no prompts file: yes and p_yes before the defaults; "yes" has no valid row (as above)
    rows = [json.loads(x) for x in (tmp_path / "out" / "generations.jsonl").read_text().splitlines()]
    assert all(r["metrics"]["yes"] is None for r in rows)
    assert [e["metric"] for e in metrics["effects"]] == ["p_yes", "length", "degenerate"]
    before = (tmp_path / "out" / "generations.jsonl").read_bytes()
    assert len(before.splitlines()) == 4 * 3 * 4
    code, _, err = run(argv, capsys)  # everything done: nothing regenerated, nothing appended
    assert code == 0, err
    assert (tmp_path / "out" / "generations.jsonl").read_bytes() == before


def test_cli_steer_refuses_a_probe_of_another_architecture_unless_forced(tiny_files, tmp_path, capsys):
    argv = steer_argv(
        tiny_files, "foreign", alphas="-2,2", max_new_tokens=2, random_directions=1, greedy=True, bootstrap=10
    )
    code, _, err = run([*argv, "--out", str(tmp_path / "refused")], capsys)
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]  # the model's load bar aside
    assert code == 2 and "Traceback" not in err, err
    assert "another architecture" in line and "--force" in line
    assert not (tmp_path / "refused" / "generations.jsonl").exists()
    with pytest.warns(FingerprintWarning, match="another architecture") as seen:
        code, _, err = run([*argv, "--out", str(tmp_path / "forced"), "--force"], capsys)
    assert code == 0, err
    assert not [w for w in seen if "other weights" in str(w.message)]
    assert len((tmp_path / "forced" / "generations.jsonl").read_text().splitlines()) == 4 * 2 * 2


def test_cli_steer_bad_input_before_model_load(tiny_files, tmp_path, capsys, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("valueprobe.model.load.load", no_load)
    r = tiny_files
    (tmp_path / "other-sweep").mkdir()
    (tmp_path / "other-sweep" / "settings.json").write_text('{"alphas": [1, 2]}')
    base = {
        "--probe": str(r / "probe"),
        "--model": str(r / "model"),
        "--prompts": str(r / "p.jsonl"),
        "--out": str(tmp_path / "o"),
    }
    cases = [
        ({"--alphas": "1,x"}, "does not parse"),
        ({"--alphas": ""}, "empty"),
        ({"--probe": str(r / "wide")}, "d_model"),
        ({"--layer": "7"}, "has no layer 7"),
        ({"--probe": str(r / "no-norm"), "--unit": "norm"}, "norm statistics"),
        ({"--prompts": str(r / "empty.jsonl")}, "empty"),
        ({"--prompts": str(r / "bad.jsonl")}, "bad.jsonl"),
        ({"--prompts": str(r / "missing.jsonl")}, "does not exist"),
        ({"--max-new-tokens": "0"}, "max-new-tokens"),
        ({"--max-new-tokens": "-3"}, "max-new-tokens"),
        ({"--out": str(tmp_path / "other-sweep")}, "different sweep"),
        ({"--batch-size": "0"}, "--batch-size 0"),
        ({"--bootstrap": "-1"}, "--bootstrap -1"),
        ({"--limit": "0"}, "--limit 0"),
        ({"--temperature": "0"}, "--temperature 0"),
    ]
    for change, words in cases:
        args = {**base, **change}
        code, out, err = run(["steer", *[x for kv in args.items() for x in kv]], capsys)
        assert code == 2, (change, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (change, err)
        assert not (tmp_path / "o").exists()


def _stop_at_load(*a, **k):
    raise ValueprobeError("stop: every argument was checked")


@pytest.mark.parametrize("command", [["steer"], ["replicate", "steer"]])
def test_random_directions_and_its_hidden_old_spelling(command, tiny_files, tmp_path, capsys, monkeypatch):
    """``--random-directions`` was ``--controls``: both spellings set the sweep's count, --help shows
    only the new one, and the two given with different values are one clear error."""
    from valueprobe.steering.experiment import sweep as lib_sweep  # the command imports it when it runs

    counts: list[int] = []
    real_check = lib_sweep.check_settings

    def spy(settings, *a, **k):
        counts.append(settings.controls)
        return real_check(settings, *a, **k)

    monkeypatch.setattr(lib_sweep, "check_settings", spy)
    monkeypatch.setattr("valueprobe.model.load.load", _stop_at_load)
    r = tiny_files
    base = (
        ["--probe", str(r / "probe"), "--model", str(r / "model"), "--prompts", str(r / "p.jsonl")]
        if command == ["steer"]
        else ["--probe", str(r / "probe"), "--other-probe", str(r / "other"), "--model", str(r / "model")]
    )
    base += ["--out", str(tmp_path / "o")] + (
        [] if command == ["steer"] else ["--runs", str(tmp_path / "runs")]
    )
    for given, expected in [
        ([], 8),
        (["--random-directions", "3"], 3),
        (["--controls", "3"], 3),
        (["--random-directions", "3", "--controls", "3"], 3),
    ]:
        counts.clear()
        code, _, err = run([*command, *base, *given], capsys)
        assert code == 2 and "stop: every argument was checked" in err, (given, err)
        assert counts and set(counts) == {expected}, (given, counts)
    counts.clear()
    code, _, err = run([*command, *base, "--random-directions", "3", "--controls", "2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--random-directions 3 and --controls 2 disagree" in err
    assert not counts
    monkeypatch.setenv("COLUMNS", "200")  # rich cuts option names to fit 80 columns
    code, out, _ = run([*command, "--help"], capsys)
    assert code == 0 and "--random-directions" in out and "--controls" not in out


def test_shipped_steering_sets_parse_and_pick_metrics():
    from valueprobe.steering.experiment.sweep import metrics_for

    conf = read_jsonl(DATA / "steer_confidence.jsonl")
    assert metrics_for(DATA / "steer_confidence.jsonl", conf) == ("yes", "p_yes")
    assert metrics_for(DATA / "steer_code.jsonl", read_jsonl(DATA / "steer_code.jsonl"))[0] == "code_lines"


def test_replicate_steer_runs_every_benchmark(tiny_lm_factory, tmp_path):
    from valueprobe.replicate.steer import BENCHMARKS, ReplicateSteerSettings, replicate_steer

    lm = tiny_lm_factory("llama")
    axis, other = tiny_axis(lm), tiny_axis(lm, seed=1)
    run = ReplicateSteerSettings(
        probe=Path("p/value"),
        other_probe=Path("p/history"),
        data_dir=DATA,
        runs_dir=tmp_path / "runs",
        prompts=2,
        alphas=(-1.0, 1.0),
        unit="sigma",
        controls=1,
        tokens=0.05,
    )
    report = replicate_steer(lm, run, axis=axis, other=other, out=tmp_path / "out")
    assert list(report.sweeps) == [b.name for b in BENCHMARKS]
    assert report.sweeps["confidence"].settings.max_new_tokens == 1  # ceil(4 × 0.05)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["sweeps"]) == {b.name for b in BENCHMARKS}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "too few prompts to tell" in summary  # 2 prompts: no verdict is claimed
    assert len(report.combined().effects) == sum(len(s.effects) for s in report.sweeps.values())

    # A value, from the files written: the confidence set's first prompt is alone in its group
    # (direct), so its P(yes) slope in results.json is (p(+1) − p(−1)) / 2 of that one prompt; both
    # p are recomputed with the trusted route (h += α·σ·v̂ at the axis layer, one unbatched forward)
    # and checked against the rows in generations.jsonl too.
    first = read_jsonl(DATA / "steer_confidence.jsonl")[0]
    yes, no = answer_tokens(lm.tokenizer)
    (prompt,) = encode_prompts(lm, [list(first.messages or ())])
    ids = torch.tensor([prompt])
    p = {}
    for a in (-1.0, 1.0):
        logits = steered_logits(
            lm, ids, torch.ones_like(ids), layer=1, vector=axis.direction(1) * 2.0, alpha=a
        )
        probs = torch.softmax(logits[0, -1].double(), dim=-1)
        p[a] = float(probs[yes].sum() / (probs[yes].sum() + probs[no].sum()))
    rows = [json.loads(x) for x in (tmp_path / "runs" / "confidence" / GENERATIONS).read_text().splitlines()]
    got = {
        r["alpha"]: r["metrics"]["p_yes"]
        for r in rows
        if r["prompt_id"] == first.id and r["direction"] == "axis"
    }
    assert got == pytest.approx(p, abs=1e-6)
    (effect,) = [
        e
        for e in results["sweeps"]["confidence"]["effects"]
        if e["metric"] == "p_yes" and e["subset"] == first.group
    ]
    assert effect["axis"]["slope"] == pytest.approx((p[1.0] - p[-1.0]) / 2, abs=1e-6)
    assert (
        abs(p[1.0] - p[-1.0]) > 1e-3
    )  # the steering moved it well past the tolerance: the slope is no trivial 0


@pytest.mark.slow
def test_p_yes_on_the_default_model(default_lm):
    yes, no = answer_tokens(default_lm.tokenizer)
    words = {default_lm.tokenizer.decode([t]).strip().lower() for t in yes + no}
    assert words == {"yes", "no"}
    conf = [list(ex.messages or ()) for ex in read_jsonl(DATA / "steer_confidence.jsonl")[:4]]
    axis = ValueAxis.load(Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-value")
    base = p_yes(default_lm, SteeringSpec(axis, unit="norm"), conf, [0.0] * 4)
    assert np.all((base > 0) & (base < 1))
    moved = p_yes(default_lm, SteeringSpec(axis, unit="norm"), conf, [30.0] * 4)
    assert not np.allclose(base, moved)
    # The first prompt's P(yes) at α = 0 and 30 % of the mean norm, against the trusted route:
    # h += 30 · mean_norm / 100 · v̂ at the axis's best layer, one unbatched forward.
    (prompt,) = encode_prompts(default_lm, conf[:1])
    ids = torch.tensor([prompt])
    layer = axis.best_layer
    step = axis.direction(layer) * float(axis.mean_norm[axis.layers.index(layer)]) / 100
    for alpha, got in ((0.0, base[0]), (30.0, moved[0])):
        logits = steered_logits(default_lm, ids, torch.ones_like(ids), layer=layer, vector=step, alpha=alpha)
        probs = torch.softmax(logits[0, -1].double(), dim=-1)
        want = float(probs[yes].sum() / (probs[yes].sum() + probs[no].sum()))
        assert got == pytest.approx(want, abs=2e-3)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--n-prompts", "0"), ("--batch-size", "0"), ("--token-scale", "0"), ("--token-scale", "nan")],
)
def test_replicate_steer_refuses_impossible_numbers_before_loading(
    option, value, capsys, tmp_path, monkeypatch
):
    monkeypatch.setattr("valueprobe.model.load.load", _stop_at_load)
    code, _, err = run(["replicate", "steer", option, value, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.startswith(f"error: {option} ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("command", "old", "new"),
    [
        (["replicate", "steer"], "--prompts", "--n-prompts"),
        (["replicate", "steer"], "--tokens", "--token-scale"),
        (["replicate", "guide"], "--prompts", "--n-prompts"),
    ],
)
def test_an_old_count_option_is_refused_naming_the_new_one(command, old, new, capsys, tmp_path, monkeypatch):
    """A count is --n-prompts and a length scale --token-scale: --prompts and --tokens mean a dataset
    and a choice of tokens in every other command, so the old spellings are refused, not aliased."""
    monkeypatch.setattr("valueprobe.model.load.load", _stop_at_load)
    code, _, err = run([*command, old, "12", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.startswith(f"error: {old} is now {new} ") and err.count("\n") == 1, err
    assert f"give {new} 12" in err
