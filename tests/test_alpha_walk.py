"""The modules α crosses from where it is read to the hook, as docs/ARCHITECTURE.md lists them.

The walk is measured, not declared: `alpha_walk` traces a real ``steer --alphas`` and a real served
request on a tiny model (its module doc gives the rule). The walk is held equal to the page, not to
a count: the CLI checks α against the largest push and prints it in both units before the sweep.
"""

from __future__ import annotations

import pytest
from alpha_walk import ALPHAS, ROOT, Tracer, entered_twice, serve_walk, steer_walk, tiny_model_and_probe

from valueprobe.files import jsonable
from valueprobe.model.load import load
from valueprobe.stats.metrics import auroc
from valueprobe.stats.null import null_range

PAGE = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, str]:
    return tiny_model_and_probe(tmp_path_factory.mktemp("walk"))


def test_steer_alphas_reach_the_operator_as_the_architecture_page_says(tiny, tmp_path):
    model, probe = tiny
    walk = steer_walk(model, probe, ROOT / "data" / "steer_open.jsonl", tmp_path / "steer").walk()
    assert walk == [
        "valueprobe/cli/steer.py",
        "valueprobe/steering/hook/strength.py",
        "valueprobe/probe/units.py",
        "valueprobe/steering/hook/strength.py",
        "valueprobe/probe/units.py",
        "valueprobe/steering/experiment/settings.py",
        "valueprobe/steering/experiment/sweep.py",
        "valueprobe/records.py",
        "valueprobe/steering/experiment/sweep.py",
        "valueprobe/steering/decode/generation.py",
        "valueprobe/steering/hook/handle.py",
        "valueprobe/steering/hook/resident.py",
        "valueprobe/steering/hook/operators.py",
    ]
    assert all(f"`{m.removeprefix('valueprobe/')}`" in PAGE for m in walk)


def test_a_served_requests_alpha_reaches_the_operator_through_seven_modules_none_twice(tiny):
    model, probe = tiny
    walk = serve_walk(load(model), probe).walk()
    assert walk == [
        "valueprobe/serve/app.py",
        "valueprobe/serve/protocol.py",
        "valueprobe/serve/hf_engine.py",
        "valueprobe/steering/decode/rows.py",
        "valueprobe/steering/hook/handle.py",
        "valueprobe/steering/hook/resident.py",
        "valueprobe/steering/hook/operators.py",
    ]
    assert not entered_twice(walk)


def test_the_tracer_sees_alpha_handed_back_and_forth():
    """The measure can fail: α handed to stats/metrics.py, then stats/null.py, then stats/metrics.py
    again (real calls, under the same tracer) is a walk of three entries with metrics.py entered
    twice. files.py, where α is written down, is no step (see tests/alpha_walk.py)."""
    with Tracer() as tracer:
        auroc([ALPHAS[0], ALPHAS[1]], [0, 1])
        jsonable({"alpha": ALPHAS[1]})  # recorded, not carried
        null_range([ALPHAS[0], ALPHAS[1]])
        auroc([ALPHAS[1], 0.0], [1, 0])
        auroc([0.5, 0.25], [1, 0])  # no α: not a step of the walk
    walk = tracer.walk()
    assert walk == [
        "valueprobe/stats/metrics.py",
        "valueprobe/stats/null.py",
        "valueprobe/stats/metrics.py",
    ], walk
    assert entered_twice(walk) == ["valueprobe/stats/metrics.py"]
