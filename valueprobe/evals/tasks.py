"""The two evaluation tasks valueprobe ships, built from its own data, for both harnesses offline.

    lm_eval --tasks valueprobe_arithmetic --include_path "$(python -m valueprobe.evals.tasks)" ...
    inspect eval valueprobe/arithmetic --model valueprobe/smollm2-135m -M probe=smollm2-135m-value
    valueprobe eval --harness lm-eval --task arithmetic --probe smollm2-135m-value --alphas -30,0,30 ...

- **arithmetic**: the word problems of ``data/task_arithmetic.jsonl`` (40 per level, levels 1-3,
  in that order), asked as the file's chat; greedy, at most `ARITHMETIC_NEW_TOKENS` new tokens,
  no stop string but EOS; right when the response's last integer is the answer: the rule of
  `valueprobe.datasets.answers.check`, which both harnesses' scorers call, so their accuracy is the
  accuracy valueprobe's own task runs report (``benchmarks/task_accuracy.py``, the side effects).
- **corrigible_ab**: CAA's corrigible-neutral-HHH A/B questions (``data/caa``,
  `valueprobe.datasets.caa`); the score is the share of questions answered with the letter
  matching the behaviour (corrigibility). lm-eval reads it as multiple choice: the log-likelihood
  of ``(A)`` against ``(B)`` right after the assistant turn opens, as CAA reads it; Inspect asks for a
  few tokens and takes the first letter (Inspect's model interface has no scoring of a given answer).

The lm-eval tasks are YAML files in ``lm_eval_tasks/`` beside this module (`lm_eval_folder`, the
folder ``--include_path`` takes). Their rows come from this module (``custom_dataset``), not from
``dataset_path: json`` with ``data_files``: lm-eval hands a relative ``data_files`` to
``datasets.load_dataset``, which reads it from the working directory, so a YAML shipped inside a
package cannot name the file beside it; here the arithmetic rows are still read by ``datasets``'
own JSON loader from the installed file. No task reaches the hub.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from valueprobe.datasets.answers import Task, check
from valueprobe.datasets.caa import read_caa
from valueprobe.datasets.shipped import DATA_DIR, dataset_path
from valueprobe.errors import ValueprobeError

if TYPE_CHECKING:
    import datasets

__all__ = [
    "AB_NEW_TOKENS",
    "ARITHMETIC_NEW_TOKENS",
    "SHIPPED",
    "ShippedTask",
    "arithmetic_docs",
    "arithmetic_results",
    "arithmetic_rows",
    "arithmetic_verdict",
    "corrigible_docs",
    "corrigible_rows",
    "lm_eval_folder",
    "shipped_task",
]

ARITHMETIC_NEW_TOKENS = 48  # as the steering evaluation's side effects read arithmetic
AB_NEW_TOKENS = 4
CAA_BEHAVIOUR = "corrigible-neutral-HHH"


@dataclass(frozen=True)
class ShippedTask:
    """One shipped task: its name in ``valueprobe eval --task``, in lm-eval, in Inspect, and the
    metric each harness reports that ``valueprobe eval`` plots."""

    name: str
    lm_eval: str
    inspect: str
    metric: Mapping[str, str]  # harness -> the metric's name in that harness's results
    about: str


SHIPPED: dict[str, ShippedTask] = {
    "arithmetic": ShippedTask(
        name="arithmetic",
        lm_eval="valueprobe_arithmetic",
        inspect="valueprobe/arithmetic",
        metric={"lm-eval": "exact_match", "inspect": "accuracy"},
        about="exact integer answers to data/task_arithmetic.jsonl (greedy)",
    ),
    "corrigible_ab": ShippedTask(
        name="corrigible_ab",
        lm_eval="valueprobe_corrigible_ab",
        inspect="valueprobe/corrigible_ab",
        metric={"lm-eval": "acc", "inspect": "accuracy"},
        about="CAA corrigible-neutral-HHH A/B: share answered with the corrigible letter",
    ),
}


def shipped_task(name: str) -> ShippedTask:
    """The shipped task ``name``; any other is one line (it would need the hub, unreachable here)."""
    task = SHIPPED.get(name)
    if task is None:
        raise ValueprobeError(
            f"task {name!r} is not shipped with valueprobe and would need the Hugging Face hub, which is"
            f" unreachable here: use one of the shipped tasks, {', '.join(SHIPPED)}"
        )
    return task


def lm_eval_folder() -> Path:
    """The folder of the shipped lm-eval task YAMLs (lm-eval's ``--include_path``)."""
    return Path(__file__).resolve().parent / "lm_eval_tasks"


# ---- the rows, one builder per task: both harnesses read these -------------------------------------


def arithmetic_rows() -> list[dict[str, Any]]:
    """Every arithmetic task as ``{id, group, prompt, answer}`` (one user turn each), in file order."""
    # `datasets` comes with the [evals] extra (lm-eval needs it), imported when a task is read
    import datasets

    path = dataset_path("task_arithmetic")
    table = datasets.load_dataset("json", data_files={"test": str(path)}, split="test")
    rows = []
    for doc in table:
        messages = doc["messages"]
        if len(messages) != 1 or messages[0]["role"] != "user":
            raise ValueprobeError(f"{path}: task {doc['id']} is not one user turn: the shipped task asks one")
        rows.append(
            {
                "id": doc["id"],
                "group": doc["group"],
                "prompt": messages[0]["content"],
                "answer": int(doc["meta"]["answer"]),
            }
        )
    return rows


def corrigible_rows() -> list[dict[str, Any]]:
    """Every corrigible-neutral-HHH item as ``{id, question, matching, label}`` (label 0 for A, 1 for B)."""
    items = read_caa(DATA_DIR / "caa", CAA_BEHAVIOUR)
    return [
        {
            "id": f"{CAA_BEHAVIOUR}-{it.index:04d}",
            "question": it.question,
            "matching": it.matching,
            "label": "AB".index(it.matching),
        }
        for it in items
    ]


def _dataset(rows: Callable[[], list[dict[str, Any]]]) -> datasets.DatasetDict:
    import datasets  # the [evals] extra's, as in `arithmetic_rows`

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows())})


def arithmetic_docs(**metadata: object) -> datasets.DatasetDict:
    """lm-eval's ``custom_dataset`` for ``valueprobe_arithmetic`` (its metadata is not needed)."""
    return _dataset(arithmetic_rows)


def corrigible_docs(**metadata: object) -> datasets.DatasetDict:
    """lm-eval's ``custom_dataset`` for ``valueprobe_corrigible_ab``."""
    return _dataset(corrigible_rows)


def arithmetic_verdict(row: Mapping[str, Any], response: str) -> tuple[bool, str | None]:
    """Whether ``response`` answers an arithmetic row, by `valueprobe.datasets.answers.check`;
    and the integer read from it."""
    task = Task(
        id=str(row["id"]),
        group=str(row["group"]),
        kind="arithmetic",
        messages=({"role": "user", "content": row["prompt"]},),
        answer=int(row["answer"]),
    )
    verdict = check(task, response)
    return verdict.correct, verdict.extracted


def arithmetic_results(doc: Mapping[str, Any], results: list[str]) -> dict[str, float]:
    """lm-eval's ``process_results`` for ``valueprobe_arithmetic``: 1.0 when the answer is right."""
    right, _ = arithmetic_verdict(doc, results[0])
    return {"exact_match": float(right)}


if __name__ == "__main__":
    sys.stdout.write(f"{lm_eval_folder()}\n")
