"""One harness run of one shipped task at one steering: the table of harnesses `valueprobe eval` drives.

    >>> HARNESSES["lm-eval"](lm, spec, 15.0, task=shipped_task("arithmetic"), limit=40, batch_size=16)
    Scored(score=0.45, stderr=0.0797, n=40)

Each harness runs in this process on the model already loaded: lm-eval's ``simple_evaluate``
with a `valueprobe.evals.lm_eval.ValueprobeLM` (chat template applied, as valueprobe asks its
tasks), Inspect's ``eval`` with the ``valueprobe`` provider (`valueprobe.evals.inspect_model`),
its logs in a temporary folder. Both read the shipped rows (`valueprobe.evals.tasks`) and reach
no host. The harnesses are imported when a run starts, not before (they are the optional
``[evals]`` extra and take seconds to import).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Protocol

from valueprobe.errors import ValueprobeError
from valueprobe.evals.steering import EvalSteering
from valueprobe.evals.tasks import ShippedTask, lm_eval_folder
from valueprobe.model.load import LoadedModel
from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["HARNESSES", "Harness", "Scored", "check_harness", "offline"]

# Neither harness may try the hub: datasets, transformers and huggingface_hub read these.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Scored:
    """A harness's score of a task at one steering: the metric, its standard error, the items."""

    score: float
    stderr: float
    n: int


class Harness(Protocol):
    def __call__(
        self,
        lm: LoadedModel,
        spec: SteeringSpec,
        alpha: float,
        *,
        task: ShippedTask,
        limit: int | None,
        batch_size: int,
    ) -> Scored: ...


def offline() -> None:
    """Set the variables that keep datasets, transformers and the hub client off the network."""
    os.environ.update(OFFLINE)


def _lm_eval(
    lm: LoadedModel,
    spec: SteeringSpec,
    alpha: float,
    *,
    task: ShippedTask,
    limit: int | None,
    batch_size: int,
) -> Scored:
    # lm-eval is the optional [evals] extra, imported only when a run uses it
    import lm_eval
    from lm_eval.tasks import TaskManager

    from valueprobe.evals.lm_eval import LMEvalOptions, ValueprobeLM

    offline()
    # the strengths were checked against the cap (or allowed past it) before the run began
    steering = EvalSteering(spec=spec, alpha=alpha, allow_large=True)
    model = ValueprobeLM(steering, LMEvalOptions(batch_size=batch_size, progress=False), lm=lm)
    manager = TaskManager(include_path=str(lm_eval_folder()), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model=model,
        tasks=[task.lm_eval],
        task_manager=manager,
        limit=limit,
        apply_chat_template=True,
        log_samples=False,
        verbosity="ERROR",
    )
    if out is None:
        raise ValueprobeError(f"lm-eval returned no results for {task.lm_eval}")
    got = out["results"][task.lm_eval]
    metric = task.metric["lm-eval"]
    n = int(out["n-samples"][task.lm_eval]["effective"])
    return Scored(float(got[f"{metric},none"]), float(got[f"{metric}_stderr,none"]), n)


def _inspect(
    lm: LoadedModel,
    spec: SteeringSpec,
    alpha: float,
    *,
    task: ShippedTask,
    limit: int | None,
    batch_size: int,
) -> Scored:
    # inspect-ai is the optional [evals] extra, imported only when a run uses it
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    from valueprobe.evals import inspect_tasks

    offline()
    model = get_model(
        f"valueprobe/{lm.model_id}",
        lm=lm,
        spec=spec,
        alpha=alpha,
        allow_large=True,
        max_batch=batch_size,
        memoize=False,
    )
    with model, tempfile.TemporaryDirectory(prefix="valueprobe-inspect-") as logs:
        (log,) = inspect_eval(
            getattr(inspect_tasks, task.name)(),
            model=model,
            limit=limit,
            log_dir=logs,
            display="none",
            max_connections=batch_size,
            log_samples=False,
            score_display=False,
        )
    if log.status != "success" or log.results is None or not log.results.scores:
        raise ValueprobeError(
            f"Inspect did not finish {task.inspect}: {log.error.message if log.error else log.status}"
        )
    metrics = log.results.scores[0].metrics
    return Scored(
        float(metrics["accuracy"].value), float(metrics["stderr"].value), int(log.results.completed_samples)
    )


HARNESSES: dict[str, Harness] = {"lm-eval": _lm_eval, "inspect": _inspect}


def check_harness(name: str) -> str:
    """``name``, or one line naming the harnesses."""
    if name not in HARNESSES:
        raise ValueprobeError(f"unknown harness {name!r} (--harness): use one of {', '.join(HARNESSES)}")
    return name
