"""Guided decoding on checkable tasks: accuracy against tokens spent, for each policy and baseline.

    valueprobe replicate guide --model smollm2-135m --tasks arithmetic --out probes/guide-smollm2-135m

For each task file (``data/task_*.jsonl``, read by `valueprobe.datasets.answers`) and the same
prompts (spread evenly over its groups):
- **greedy**: one argmax answer;
- **N samples** at ``temperature`` with common random numbers, once (`valueprobe.guided.run.guide`,
  best-of-n, reading the first axis in the generating forward). From these N the curves for
  n = 1, 2, 4 … N: one sample; best-of-n by each axis's mean σ; by mean log-probability; by each
  of ``controls`` random unit directions at the axis's layer (the null); self-consistency (the
  most common extracted answer); the oracle (any of the n right). The first n of N samples are the
  samples a run with that n draws (common random numbers), so the curves cost one run.
- **policies** of each axis, each its own run: prune (N rows, the lower siblings dropped at
  checkpoints) and rollback (one row, rolled back and resampled, optionally steered).
The other axis and the random directions are read by one teacher-forced pass over the same
tokens at their layers (the first axis read that way agrees with its in-forward reading to float
rounding; ``reread_max_diff`` records by how much). Accuracy CIs are 95% bootstraps over prompts.

Writes ``results.json`` (``{"sections": {"guide": ...}}``: `valueprobe report --from` draws it),
``summary.md``, ``budget.html`` and ``samples-TASK.jsonl`` (every sample, its answer and readings).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from tqdm.auto import tqdm

from valueprobe.datasets.answers import Task, check, extract_code, extract_integer, read_tasks
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable, markdown_table, write_html, write_json
from valueprobe.guided.budget import BudgetPoint, GuideBudget, GuideReplication, Kind, MethodCurve, Separation
from valueprobe.guided.policy import BestOfN, Policy, Prune, Rollback
from valueprobe.guided.records import Guided
from valueprobe.guided.run import guide
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.hooks.route import Point, record
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.report.budget import budget_figure
from valueprobe.stats.metrics import auroc
from valueprobe.stats.null import mean_ci, null_range, random_directions
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.decode.sampling import Decoding

__all__ = ["TASK_FILES", "GuideRun", "budgets", "pick_prompts", "replicate_guide"]

TASK_FILES: dict[str, str] = {"arithmetic": "task_arithmetic.jsonl", "code": "task_code.jsonl"}


@dataclass(frozen=True)
class GuideRun:
    """What one `replicate_guide` run samples and how (recorded with every result)."""

    prompts: int = 48
    samples: int = 8
    temperature: float = 0.8
    max_new_tokens: int = 128
    controls: int = 16
    seed: int = 0
    batch_size: int = 32
    prune: Prune = Prune(n=8, every=16, quantile=0.5)
    rollbacks: tuple[Rollback, ...] = (Rollback(n=1, k=8, tau=1.0), Rollback(n=1, k=8, tau=1.0, alpha=2.0))


def pick_prompts(tasks: Sequence[Task], k: int) -> list[Task]:
    """``k`` tasks spread evenly over the groups (round robin in file order), so every level is in."""
    by_group: dict[str, list[Task]] = {}
    for t in tasks:
        by_group.setdefault(t.group, []).append(t)
    out: list[Task] = []
    for i in range(max(len(g) for g in by_group.values())):
        out.extend(g[i] for g in by_group.values() if i < len(g))
    return out[:k]


def _answer(task: Task, text: str) -> str | None:
    """What self-consistency votes on: the extracted integer, or the code with whitespace collapsed."""
    if task.kind == "arithmetic":
        got = extract_integer(text)
        return None if got is None else str(got)
    return " ".join(extract_code(text).split()) or None


def _reread(
    lm: LoadedModel,
    encoded: list[list[int]],
    guided: Sequence[Guided],
    point: Point,
    dirs: np.ndarray,
    batch: int,
) -> np.ndarray:
    """Mean projection on each of ``dirs`` [k, d_model] over each sample's read response tokens, by a
    teacher-forced forward: [prompts, samples, k] (NaN for a sample with no reading)."""
    d = torch.as_tensor(dirs, dtype=torch.float32).T  # [d_model, k]
    jobs = [(p, s, c) for p, g in enumerate(guided) for s, c in enumerate(g.candidates)]
    out = np.full((len(guided), len(guided[0].candidates), dirs.shape[0]), np.nan)
    pad = pad_id_for(lm.tokenizer)
    for start in range(0, len(jobs), batch):
        chunk = jobs[start : start + batch]
        rows = [encoded[p] + list(c.token_ids[: max(len(c.sigma), 1)]) for p, _, c in chunk]
        ids, mask = pad_rows(rows, pad_id=pad, side="right")  # causal: pads after a row change nothing
        with (
            torch.inference_mode(),
            record(lm, [point], reduce=lambda h: h.detach().float() @ d.to(h.device)) as rec,
        ):
            lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device))
        proj = rec[point].cpu().numpy()  # [rows, pos, k]
        for row, (p, s, c) in enumerate(chunk):
            first = len(encoded[p])
            if c.sigma:
                out[p, s] = proj[row, first : first + len(c.sigma)].mean(axis=0)
    return out


def _best(score: np.ndarray, logprob: np.ndarray) -> np.ndarray:
    """Per prompt, the index of the highest score (ties: higher log-prob, then the first), NaN last."""
    s = np.where(np.isfinite(score), score, -np.inf)
    lp = np.where(np.isfinite(logprob), logprob, -np.inf)
    order = np.lexsort((-np.arange(s.shape[1])[None, :].repeat(s.shape[0], 0), lp, s), axis=1)
    return order[:, -1]


def _point(n: int, tokens: np.ndarray, right: npt.ArrayLike, seed: int) -> BudgetPoint:
    hits = np.asarray(right, dtype=float)
    return BudgetPoint(n, float(tokens.mean()), float(hits.mean()), mean_ci(hits, seed=seed))


def _vote(answers: list[list[str | None]], n: int) -> list[int]:
    """Per prompt, the sample whose answer is the most common of the first n (ties: the earliest)."""
    picks = []
    for row in answers:
        counts = Counter(a for a in row[:n] if a is not None)
        if not counts:
            picks.append(0)
            continue
        top = max(counts.values())
        picks.append(next(i for i, a in enumerate(row[:n]) if a is not None and counts[a] == top))
    return picks


def budgets(
    right: np.ndarray,
    tokens: np.ndarray,
    logprob: np.ndarray,
    sigma: Mapping[str, np.ndarray],
    null: Mapping[str, np.ndarray],
    answers: list[list[str | None]],
    *,
    seed: int = 0,
) -> list[MethodCurve]:
    """The best-of-n curves from N samples per prompt ([prompts, N] arrays; ``null[axis]`` [prompts, N, k]).

    >>> budgets(right, tokens, logprob, {"value": s}, {"value": r}, answers)[0].method
    'one sample'
    """
    p, n_max = right.shape
    ns = sorted({1, *[2**i for i in range(1, int(math.log2(n_max)) + 1)], n_max})
    rows = np.arange(p)

    def curve(pick) -> tuple[BudgetPoint, ...]:
        return tuple(_point(n, tokens[:, :n].sum(1), right[rows, pick(n)], seed) for n in ns)

    curves = [
        MethodCurve("one sample", "baseline", (_point(1, tokens[:, 0], right[:, 0], seed),)),
        MethodCurve("best-of-n by log-prob", "baseline", curve(lambda n: _best(logprob[:, :n], logprob[:, :n]))),
        MethodCurve("self-consistency", "baseline", curve(lambda n: np.array(_vote(answers, n)))),
        MethodCurve("oracle (any of n right)", "oracle",
                    tuple(_point(n, tokens[:, :n].sum(1), right[:, :n].any(1), seed) for n in ns)),
    ]  # fmt: skip
    for name, s in sigma.items():
        curves.append(
            MethodCurve(
                "best-of-n by value", "policy", curve(lambda n, s=s: _best(s[:, :n], logprob[:, :n])), name
            )
        )
        curves.append(
            MethodCurve(
                "best-of-n by random directions",
                "null",
                _null_points(null[name], right, tokens, logprob, ns, seed),
                name,
            )
        )
    return curves


def _null_points(
    proj: np.ndarray, right: np.ndarray, tokens: np.ndarray, logprob: np.ndarray, ns: list[int], seed: int
) -> tuple[BudgetPoint, ...]:
    rows = np.arange(right.shape[0])
    points = []
    for n in ns:
        per_direction = np.stack(
            [right[rows, _best(proj[:, :n, j], logprob[:, :n])] for j in range(proj.shape[2])]
        )  # [k, prompts]
        acc = per_direction.mean(1)
        ci = mean_ci(per_direction.mean(0), seed=seed)  # prompts resampled, directions averaged
        points.append(
            BudgetPoint(n, float(tokens[:, :n].sum(1).mean()), float(acc.mean()), ci, null_range(acc))
        )
    return tuple(points)


def _separation(
    name: str, layer: int, right: np.ndarray, sigma: np.ndarray, logprob: np.ndarray, null: np.ndarray
) -> Separation:
    """AUROC of the mean σ (and of log-prob, and each random direction) for right against wrong samples."""
    y = right.reshape(-1).astype(float)
    n_right = int(y.sum())

    def auc(x: np.ndarray) -> float:
        x = x.reshape(-1)
        keep = np.isfinite(x)
        labels = y[keep]
        return auroc(x[keep], labels) if 0 < labels.sum() < labels.size else float("nan")

    nulls = np.array([auc(null[:, :, j]) for j in range(null.shape[2])])
    return Separation(name, layer, auc(sigma), auc(logprob), null_range(nulls), int(y.size), n_right)


def _policy_curve(
    method: str,
    axis: str | None,
    n: int,
    guided: Sequence[Guided],
    tasks: Sequence[Task],
    seed: int,
    timeout_s: float,
    *,
    kind: Kind = "policy",
) -> MethodCurve:
    """One point: the accuracy of the picks of one policy run, at the tokens it spent."""
    right = np.array(
        [check(t, g.text, timeout_s=timeout_s).correct for t, g in zip(tasks, guided, strict=True)]
    )
    tokens = np.array([g.tokens_spent for g in guided], dtype=float)
    return MethodCurve(method, kind, (_point(n, tokens, right, seed),), axis)


def _guide(
    lm: LoadedModel, axis: ValueAxis, chats: list, policy: Policy, run: GuideRun, *, greedy: bool = False
) -> list[Guided]:
    decoding = Decoding(
        greedy=greedy, temperature=run.temperature, seed=run.seed, max_new_tokens=run.max_new_tokens
    )
    return guide(lm, axis, chats, policy, decoding=decoding, batch_size=run.batch_size)


@dataclass(frozen=True)
class _Reads:
    """Each axis's mean σ of every sample ([prompts, N]), its random directions' mean projections
    ([prompts, N, k]), the separations, and how far the re-read of the first axis is from its live read."""

    sigma: dict[str, np.ndarray]
    null: dict[str, np.ndarray]
    separations: tuple[Separation, ...]
    reread_max_diff: float


def _reads(
    lm: LoadedModel,
    axes: Mapping[str, ValueAxis],
    chats: list,
    sampled: list[Guided],
    right: np.ndarray,
    logprob: np.ndarray,
    run: GuideRun,
) -> _Reads:
    encoded = encode_prompts(lm, chats)
    sigma, null, seps = {}, {}, []
    for name, axis in axes.items():
        layer = axis.best_layer
        dirs = np.concatenate(
            [
                axis.direction(layer).double().numpy()[None],
                random_directions(lm.d_model, run.controls, seed=run.seed),
            ]
        )
        proj = _reread(lm, encoded, sampled, Point(layer, axis.site), dirs, run.batch_size)
        sigma[name] = (proj[:, :, 0] - float(axis.mu[axis.layers.index(layer)])) / axis.sigma_at(layer)
        null[name] = proj[:, :, 1:]
        seps.append(_separation(name, layer, right, sigma[name], logprob, null[name]))
    live = np.array([[c.sigma_mean for c in g.candidates] for g in sampled])
    diff = float(np.nanmax(np.abs(live - sigma[next(iter(axes))]))) if np.isfinite(live).any() else math.nan
    return _Reads(sigma, null, tuple(seps), diff)


def _run_task(
    lm: LoadedModel,
    axes: Mapping[str, ValueAxis],
    name: str,
    path: Path,
    run: GuideRun,
    out: Path,
    timeout_s: float,
    save: Callable[[GuideBudget], None],
) -> GuideBudget:
    tasks = pick_prompts(read_tasks(path), run.prompts)
    chats = [list(t.messages) for t in tasks]
    first = next(iter(axes.values()))
    greedy = _guide(lm, first, chats, BestOfN(n=1), run, greedy=True)
    sampled = _guide(lm, first, chats, BestOfN(n=run.samples), run)
    verdicts = [
        [check(t, c.text, timeout_s=timeout_s) for c in g.candidates]
        for t, g in zip(tasks, tqdm(sampled, desc="check"), strict=True)
    ]
    right = np.array([[v.correct for v in row] for row in verdicts])
    tokens = np.array([[c.tokens_spent for c in g.candidates] for g in sampled], dtype=float)
    logprob = np.array([[c.logprob for c in g.candidates] for g in sampled])
    answers = [[_answer(t, c.text) for c in g.candidates] for t, g in zip(tasks, sampled, strict=True)]
    reads = _reads(lm, axes, chats, sampled, right, logprob, run)
    curves = [
        _policy_curve("greedy", None, 1, greedy, tasks, run.seed, timeout_s, kind="baseline"),
        *budgets(right, tokens, logprob, reads.sigma, reads.null, answers, seed=run.seed),
    ]
    _write_samples(out / f"samples-{name}.jsonl", tasks, sampled, verdicts, reads.sigma, answers)
    settings = {**jsonable(run.__dict__), "reread_max_diff": reads.reread_max_diff, "timeout_s": timeout_s}
    budget = GuideBudget(name, str(path), len(tasks), run.samples, tuple(curves), reads.separations, settings)
    save(budget)  # the baselines now, each policy as it ends: a stopped run keeps what it finished
    for axis_name, axis in axes.items():
        policies: list[Policy] = [run.prune, *run.rollbacks]
        for policy in policies:
            label = f"rollback α={policy.alpha:g}" if isinstance(policy, Rollback) else policy.name
            guided = _guide(lm, axis, chats, policy, run)
            curve = _policy_curve(label, axis_name, policy.n, guided, tasks, run.seed, timeout_s)
            budget = replace(budget, curves=(*budget.curves, curve))
            save(budget)
    return budget


def _write_samples(path: Path, tasks, sampled, verdicts, sigma, answers) -> None:
    lines = []
    for p, (t, g) in enumerate(zip(tasks, sampled, strict=True)):
        for s, c in enumerate(g.candidates):
            lines.append(json.dumps({
                "task": t.id, "sample": s, "text": c.text, "answer": answers[p][s], "right": verdicts[p][s].correct,
                "tokens": c.tokens_spent, "logprob": c.logprob, "sigma": {k: float(v[p, s]) for k, v in sigma.items()},
            }, ensure_ascii=False))  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


def replicate_guide(
    lm: LoadedModel,
    *,
    axes: Mapping[str, ValueAxis],
    task_files: Mapping[str, Path],
    out: Path,
    run: GuideRun = GuideRun(),
    timeout_s: float = 5.0,
) -> GuideReplication:
    """Run every task file with every axis (the first also reads in the generating forward) and write ``out``.

    Args:
        axes: probe folder name → axis, e.g. ``{"smollm2-135m-value": ..., "smollm2-135m-reward-history": ...}``.
        task_files: task name → task file (`TASK_FILES` in ``data/``).
        run: sizes and sampling (`GuideRun`); timeout_s: the code sandbox's time limit per answer.
    """
    if not axes or not task_files:
        raise ValueprobeError("replicate guide needs at least one axis and one task file")
    results = GuideReplication(tasks={}, probes=tuple(axes), model=lm.model_id)
    for name, path in task_files.items():

        def save(budget: GuideBudget, name: str = name) -> None:
            nonlocal results
            results = GuideReplication({**results.tasks, name: budget}, results.probes, results.model)
            write(results, out)

        _run_task(lm, axes, name, path, run, out, timeout_s, save)
    return results


def write(results: GuideReplication, out: Path) -> list[Path]:
    """``results.json`` (a report's ``guide`` section), ``summary.md`` and ``budget.html`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": results.model,
        "sections": {"guide": results.to_dict()},
        "summary": guide_summary_lines(results),
    }
    paths = [out / "results.json", out / "summary.md", out / "budget.html"]
    write_json(paths[0], jsonable(payload))
    atomic_write_text(paths[1], markdown(results))
    html = "".join(
        budget_figure(b).to_html(full_html=False, include_plotlyjs=i == 0)
        for i, b in enumerate(results.tasks.values())
    )
    write_html(f"<html><body>{html}</body></html>\n", paths[2])
    return paths


def guide_summary_lines(results: GuideReplication) -> list[str]:
    return [line for b in results.tasks.values() for line in b.verdicts()]


def markdown(results: GuideReplication) -> str:
    """The summary: per task, every method at every budget, the separations, and the verdicts."""
    lines = [f"# Value-guided decoding on checkable tasks ({results.model})", ""]
    for b in results.tasks.values():
        s = b.settings
        lines += [
            f"## {b.task} (`{b.file}`, {b.n_prompts} prompts)",
            "",
            f"{b.samples} samples per prompt at temperature {s.get('temperature')}, at most"
            f" {s.get('max_new_tokens')} new tokens, seed {s.get('seed')}, {s.get('controls')} random directions"
            " per axis at its layer. Tokens are all tokens sampled per prompt (pruned and rolled-back ones"
            " included); accuracy with a 95% bootstrap CI over prompts. The first axis's in-forward reading and"
            f" the teacher-forced re-read differ by at most {s.get('reread_max_diff', float('nan')):.2g} σ.",
            "",
            *markdown_table(*b.table(), lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)),
            "",
            "Right against wrong samples (AUROC over all samples):",
            "",
            *markdown_table(
                ["axis", "layer", "samples", "right", "AUROC axis (mean σ)", "AUROC log-prob", "null 95% range"],
                [[x.axis, x.layer, x.n_samples, x.n_right, x.auroc, x.auroc_logprob, f"[{x.null[0]:.3f}, {x.null[1]:.3f}]"]
                 for x in b.separations],
                lambda v: f"{v:.3f}" if isinstance(v, float) else str(v),
            ),
            "",
            *[f"- {line}" for line in b.verdicts()],
            "",
        ]  # fmt: skip
    return "\n".join(lines)
