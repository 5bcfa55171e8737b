"""`valueprobe demo --quick` end to end on the real default model, then again from its caches."""

from __future__ import annotations

import json
import time

import pytest

from valueprobe.cli.main import main
from valueprobe.files import StageCache
from valueprobe.probe.axis import ValueAxis
from valueprobe.report.page import SECTIONS

RAN_SECTIONS = ("sweep", "history", "transfer", "matched_control", "logit_lens", "trace", "steer", "shift")


def test_stage_cache_reuses_by_inputs(tmp_path):
    calls = []

    def work():
        calls.append(1)
        return {"n": len(calls)}

    cache = StageCache(tmp_path)
    assert cache.run("a", {"x": 1}, work) == {"n": 1}
    assert StageCache(tmp_path).run("a", {"x": 1}, work) == {"n": 1}  # a new process: read from disk
    assert StageCache(tmp_path).run("a", {"x": 2}, work) == {"n": 2}  # inputs changed: runs again
    assert len(calls) == 2


def test_interrupted_stage_leaves_nothing_and_reruns(tmp_path):
    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        StageCache(tmp_path).run("a", {}, boom)
    assert not list(tmp_path.iterdir())
    assert StageCache(tmp_path).run("a", {}, lambda: {"ok": True}) == {"ok": True}


@pytest.mark.slow
def test_demo_quick_end_to_end_and_cached(tmp_path, capsys):
    out = tmp_path / "demo"
    t0 = time.perf_counter()
    main(["demo", "--quick", "--out", str(out)])
    first = time.perf_counter() - t0
    printed = capsys.readouterr().out
    assert f"report: {out / 'report.html'}" in printed.replace("\n", "")
    assert (out / "report.html").stat().st_size > 1_000_000
    axis = ValueAxis.load(out / "probe")
    assert axis.d_model == 576 and len(axis.layers) == 30
    results = json.loads((out / "results.json").read_text())
    assert set(RAN_SECTIONS) <= set(results["sections"])
    # every section the report knows is either in the results or listed as missing, with a reason
    assert {s.key for s in SECTIONS} <= set(results["sections"]) | set(results["missing"])
    assert 1 <= len(results["summary"]) <= 6
    assert results["sections"]["sweep"]["best_layer"] == axis.best_layer

    t0 = time.perf_counter()
    main(["demo", "--quick", "--out", str(out)])
    second = time.perf_counter() - t0
    again = capsys.readouterr().out
    assert "ran 0 stages" in again
    assert json.loads((out / "results.json").read_text())["sections"] == results["sections"]
    assert first >= 5 * second, (first, second)
