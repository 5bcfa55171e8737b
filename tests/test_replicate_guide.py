"""`valueprobe replicate guide`: the best-of-n curves against brute force, the re-read against the
in-forward reading, and a whole run on a tiny model written and read back.

Run: ``python -m pytest -q tests/test_replicate_guide.py``
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from valueprobe.datasets.answers import Task, read_tasks
from valueprobe.files import jsonable
from valueprobe.guided.budget import GuideReplication
from valueprobe.guided.policy import Prune, Rollback
from valueprobe.probe.axis import ValueAxis
from valueprobe.replicate.guide import GuideRun, budgets, pick_prompts, replicate_guide
from valueprobe.report.page import load_results, render_report


def _axis(lm, seed: int) -> ValueAxis:
    n, d = lm.n_layers, lm.d_model
    v = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True),
        layers=tuple(range(n)),
        mu=torch.full((n,), 0.1),
        sigma=torch.full((n,), 0.5),
        mean_norm=torch.full((n,), 8.0),
        best_layer=1 + seed % (n - 1),
        site="resid_post",
        method="planted",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=d,
    )


def _brute_best(score, logprob, n):
    """The index among the first n with the highest (score, log-prob), the first on a full tie."""
    best = 0
    for i in range(1, n):
        if (score[i], logprob[i]) > (score[best], logprob[best]):
            best = i
    return best


def test_budget_curves_match_brute_force():
    rng = np.random.default_rng(0)
    p, n_max, k = 30, 8, 3
    right = rng.random((p, n_max)) < 0.3
    tokens = rng.integers(5, 50, (p, n_max)).astype(float)
    logprob = rng.normal(size=(p, n_max)).round(1)  # rounded: ties happen
    sigma = rng.normal(size=(p, n_max)).round(1)
    null = rng.normal(size=(p, n_max, k))
    answers = [[str(x) if x < 4 else None for x in row] for row in rng.integers(0, 6, (p, n_max))]
    curves = {
        (c.method, c.axis): c for c in budgets(right, tokens, logprob, {"v": sigma}, {"v": null}, answers)
    }
    for i, n in enumerate((1, 2, 4, 8)):
        spent = tokens[:, :n].sum(1).mean()
        value = curves["best-of-n by value", "v"].points[i]
        want = np.mean([right[q, _brute_best(sigma[q], logprob[q], n)] for q in range(p)])
        assert (value.n, value.tokens, value.accuracy) == (n, spent, want)
        want = np.mean([right[q, _brute_best(logprob[q], logprob[q], n)] for q in range(p)])
        assert curves["best-of-n by log-prob", None].points[i].accuracy == want
        assert curves["oracle (any of n right)", None].points[i].accuracy == right[:, :n].any(1).mean()
        per_dir = [
            np.mean([right[q, _brute_best(null[q, :, j], logprob[q], n)] for q in range(p)]) for j in range(k)
        ]
        assert curves["best-of-n by random directions", "v"].points[i].accuracy == pytest.approx(
            np.mean(per_dir)
        )
        votes = []
        for q in range(p):
            counts = Counter(a for a in answers[q][:n] if a is not None)
            top = max(counts.values(), default=0)
            votes.append(
                next((j for j in range(n) if answers[q][j] is not None and counts[answers[q][j]] == top), 0)
            )
        assert curves["self-consistency", None].points[i].accuracy == np.mean(right[np.arange(p), votes])
    assert curves["one sample", None].points[0].accuracy == right[:, 0].mean()
    lo, hi = curves["best-of-n by value", "v"].points[-1].ci
    assert lo <= curves["best-of-n by value", "v"].points[-1].accuracy <= hi


def test_pick_prompts_spreads_over_groups():
    tasks = [
        Task(f"{g}{i}", g, "arithmetic", ({"role": "user", "content": "?"},), answer=1)
        for g in "ab"
        for i in range(3)
    ]
    assert [t.id for t in pick_prompts(tasks, 4)] == ["a0", "b0", "a1", "b1"]


TASKS = [
    ("What is 2 + 3? Give the final answer as a number.", 5),
    ("What is 7 - 4? Give the final answer as a number.", 3),
    ("What is 2 * 6? Give the final answer as a number.", 12),
]


def test_a_tiny_run_writes_its_results_and_the_report_draws_them(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    path = tmp_path / "task_arithmetic.jsonl"
    rows = [
        {"id": f"t{i}", "label": 1, "group": f"g{i % 2}", "messages": [{"role": "user", "content": q}],
         "meta": {"task": "arithmetic", "answer": a}}
        for i, (q, a) in enumerate(TASKS)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = GuideRun(
        prompts=3, samples=2, max_new_tokens=5, controls=2, batch_size=4,
        prune=Prune(n=2, every=2, quantile=0.5), rollbacks=(Rollback(n=1, k=2, tau=0.5),),
    )  # fmt: skip
    axes = {"value": _axis(lm, 1), "history": _axis(lm, 2)}
    out = tmp_path / "guide"
    results = replicate_guide(lm, axes=axes, task_files={"arithmetic": path}, out=out, run=run)
    budget = results.tasks["arithmetic"]
    # the teacher-forced re-read lands on the tokens the generating forward read
    assert budget.settings["reread_max_diff"] < 1e-3
    methods = {(c.method, c.axis) for c in budget.curves}
    for axis in axes:
        assert {
            ("best-of-n by value", axis),
            ("best-of-n by random directions", axis),
            ("prune", axis),
        } <= methods
        assert ("rollback α=0", axis) in methods
    assert {("greedy", None), ("one sample", None), ("self-consistency", None)} <= methods
    for c in budget.curves:  # the oracle bounds every pick at the same n
        oracle = {p.n: p.accuracy for p in budget.curve("oracle (any of n right)").points}
        for p in c.points:
            if c.method.startswith("best-of-n") or c.method == "self-consistency":
                assert p.accuracy <= oracle[p.n]
    assert read_tasks(path)[0].answer == 5
    saved = json.loads((out / "results.json").read_text())
    again = GuideReplication.from_dict(saved["sections"]["guide"])
    assert jsonable(again.to_dict()) == jsonable(results.to_dict()) == saved["sections"]["guide"]
    samples = (out / "samples-arithmetic.jsonl").read_text().splitlines()
    assert len(samples) == 3 * 2
    page = render_report(load_results(out))
    assert "Guided decoding: accuracy against tokens spent" in page and "Not in this run" in page
    assert (out / "summary.md").read_text().count("best-of-2 by the axis") == 2
