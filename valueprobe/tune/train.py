"""Fine-tune a model with TRL's DPO or SFT trainer and a peft LoRA adapter, resumably.

    valueprobe tune dpo --model smollm2-135m --data data/preference_words.jsonl \\
        --group preference_words/dolphin --out runs/tune/dolphin
    python -c "import valueprobe as vp; lm = vp.load('runs/tune/dolphin')"   # adapter merged over its base

The loss is TRL's (``DPOTrainer`` sigmoid loss, ``SFTTrainer`` completion loss); nothing here
computes one. Defaults are the paper's (LoRA r 16, α 32, dropout 0.05 on all linear layers,
sigmoid loss β 0.1, cosine schedule, batch 8) with the training budget scaled to CPU: the paper's
6 epochs at lr 5e-5 become 1 epoch at lr 3e-4 (the same lr × epochs), in fp32 instead of bf16,
without gradient checkpointing, sequences cut at 256 tokens (every shipped pair is under 80), and
the reference log-probabilities computed once when there is more than one epoch. A model is
trained on one word's pairs (``--group``, 82 pairs: 11 steps), as in the paper. Pass
``--epochs 6 --lr 5e-5`` for the paper's budget.

Folders:
- ``OUT.partial/`` holds the run while it trains: ``run.json`` (the settings and data hash the run
  was started with) and TRL's ``checkpoint-N/`` folders (adapter as safetensors; optimizer and
  scheduler state that transformers reloads with ``torch.load(weights_only=True)``). Rerunning the
  same command after an interruption resumes from the last ``checkpoint-N``.
- ``OUT/`` appears only when training has finished, by one rename. It holds the adapter
  (``adapter_model.safetensors``, ``adapter_config.json``) or, with ``--full``, the whole model as
  safetensors, the tokenizer, and ``valueprobe-tune.json`` (base spec and fingerprint, data sha256,
  settings, final loss). No pickle.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir, write_json
from valueprobe.model.adapter import TUNE_FILE, TunedBase, ignore_old_checkpointing_reads
from valueprobe.model.load import LoadedModel, load
from valueprobe.records import Record
from valueprobe.tune.pairs import Pair
from valueprobe.vocab import TuneMethod

__all__ = [
    "METHODS",
    "MethodSpec",
    "TuneMethod",
    "TuneSettings",
    "TuneRecord",
    "TuneResult",
    "train",
]

FORMAT = 1


@dataclass(frozen=True)
class TuneSettings:
    """Training settings; the paper's DPO word-preference settings, its budget scaled to CPU (module doc).

    Args:
        method: ``dpo`` (TRL DPOTrainer) or ``sft`` (TRL SFTTrainer on prompt + chosen).
        lora: LoRA adapter (True) or full fine-tuning (False).
        epochs: passes over the pairs; ``max_steps`` > 0 overrides it (tests, smoke runs).
        save_steps: a resumable checkpoint every this many optimizer steps.
    """

    method: TuneMethod = "dpo"
    lora: bool = True
    r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: str = "all-linear"
    beta: float = 0.1
    loss_type: str = "sigmoid"
    learning_rate: float = 3e-4  # paper: 5e-5 over 6 epochs; CPU: 1 epoch, same lr × epochs
    lr_scheduler: str = "cosine"
    batch_size: int = 8
    epochs: float = 1.0  # paper: 6
    max_steps: int = -1
    max_length: int = 256
    seed: int = 0
    save_steps: int = 10

    def check(self) -> None:
        """Refuse settings no training can run (``--epochs -1`` once wrote an adapter): one line each."""
        positive = {"--epochs": self.epochs, "--lr": self.learning_rate, "--beta": self.beta}
        at_least_one = {"--batch-size": self.batch_size, "--max-length": self.max_length, "r": self.r}
        at_least_one |= {"save_steps": self.save_steps}
        for option, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueprobeError(f"{option} {value} must be a positive number")
        for option, value in at_least_one.items():
            if value < 1:
                raise ValueprobeError(f"{option} {value} must be at least 1")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueprobeError(f"--max-steps {self.max_steps} must be -1 (run the epochs) or at least 1")
        if not 0 <= self.lora_dropout < 1:
            raise ValueprobeError(f"lora_dropout {self.lora_dropout} must be in [0, 1)")


@dataclass(frozen=True)
class TrainLog:
    """Steps, first and last logged loss (NaN when none was logged), seconds, the checkpoint resumed from."""

    steps: int
    first_loss: float
    last_loss: float
    seconds: float
    resumed_from: str | None


@dataclass(frozen=True)
class TuneRecord(Record):
    """What a checkpoint's ``valueprobe-tune.json`` says: the base, the data, the settings, the run."""

    format: int
    kind: str  # "lora-adapter" or "full"
    base: TunedBase
    data: dict[str, Any]  # provenance: rows, path, sha256, groups, ...
    settings: TuneSettings
    train: TrainLog


@dataclass(frozen=True)
class TuneResult:
    """What :func:`train` wrote: the checkpoint folder and its record."""

    out: Path
    record: TuneRecord

    def table(self) -> tuple[list[str], list[list[object]]]:
        r, s = self.record, self.record.settings
        rows: list[list[object]] = [
            ["method", f"{s.method} ({'LoRA r ' + str(s.r) if s.lora else 'full'})"],
            ["base", f"{r.base.spec} ({r.base.fingerprint})"],
            ["pairs", r.data["rows"]],
            ["steps", r.train.steps],
            ["first → last loss", f"{r.train.first_loss:.4f} → {r.train.last_loss:.4f}"],
            ["seconds", f"{r.train.seconds:.0f}"],
            ["checkpoint", str(self.out)],
        ]
        return ["", "value"], rows


def _dpo_row(pair: Pair) -> dict[str, Any]:
    return {
        "prompt": list(pair.prompt),
        "chosen": [{"role": "assistant", "content": pair.chosen}],
        "rejected": [{"role": "assistant", "content": pair.rejected}],
    }


def _sft_row(pair: Pair) -> dict[str, Any]:
    return {"prompt": list(pair.prompt), "completion": [{"role": "assistant", "content": pair.chosen}]}


def _dpo_options(settings: TuneSettings) -> dict[str, Any]:
    # more than one pass: the frozen reference's log-probs once, not once per epoch
    precompute = settings.epochs > 1 and settings.max_steps < 0
    return dict(beta=settings.beta, loss_type=[settings.loss_type], precompute_ref_log_probs=precompute)


def _sft_options(settings: TuneSettings) -> dict[str, Any]:
    return dict(completion_only_loss=True, packing=False)


@dataclass(frozen=True)
class MethodSpec:
    """How one tune method trains: TRL's trainer and config classes (named, so TRL is imported
    only when training), the config fields the method sets, and one dataset row per pair in TRL's
    conversational format."""

    trainer: str
    config: str
    options: Callable[[TuneSettings], dict[str, Any]]
    row: Callable[[Pair], dict[str, Any]]


METHODS: dict[TuneMethod, MethodSpec] = {
    "dpo": MethodSpec("DPOTrainer", "DPOConfig", _dpo_options, _dpo_row),  # chosen vs rejected
    "sft": MethodSpec("SFTTrainer", "SFTConfig", _sft_options, _sft_row),  # loss on the completion only
}


def _trl(name: str) -> Any:
    """A class of TRL's. Optional-dependency exception to imports-at-top: TRL (with transformers'
    Trainer and accelerate) serves training only and takes seconds to import."""
    import trl

    return getattr(trl, name)


def _dataset(pairs: Sequence[Pair], spec: MethodSpec) -> Any:
    """The pairs as an HF ``Dataset`` in TRL's conversational format."""
    # Optional-dependency exception to imports-at-top: HF datasets (with pandas) serves training
    # only, like TRL and peft. Importing it here keeps `valueprobe --help` and every other
    # command ~0.5 s faster, and keeps it from loading inside an nnsight trace (its anyio import
    # trips over nnsight's `.save` patch), so `valueprobe` can import this module eagerly.
    from datasets import Dataset

    return Dataset.from_list([spec.row(p) for p in pairs])


def _checkpointing_field() -> str:
    """The training-argument name that switches activation (gradient) checkpointing.

    transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing``; the old name
    still works but prints a FutureWarning. TRL's configs default it to on, so it is always passed.
    """
    from transformers import TrainingArguments  # with TRL: loaded only when training

    fields = TrainingArguments.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def _trainer_args(settings: TuneSettings, output_dir: Path) -> Any:
    """DPOConfig / SFTConfig with the settings; CPU-friendly precision, progress bar on."""
    spec = METHODS[settings.method]
    common: dict[str, Any] = {
        "output_dir": str(output_dir),
        "learning_rate": settings.learning_rate,
        "lr_scheduler_type": settings.lr_scheduler,
        "per_device_train_batch_size": settings.batch_size,
        "num_train_epochs": settings.epochs,
        "max_steps": settings.max_steps,
        "seed": settings.seed,
        "data_seed": settings.seed,
        "max_length": settings.max_length,
        "bf16": False,
        "fp16": False,
        _checkpointing_field(): False,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": settings.save_steps,
        "save_total_limit": 2,
        "report_to": "none",
        "disable_tqdm": False,
        "dataloader_num_workers": 0,
        "use_cpu": not torch.cuda.is_available(),
    }
    return _trl(spec.config)(**spec.options(settings), **common)


def _last_checkpoint(folder: Path) -> Path | None:
    ckpts = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    complete = [p for p in ckpts if (p / "trainer_state.json").exists()]
    return max(complete, key=lambda p: int(p.name.split("-")[-1]), default=None)


def check_out(out: Path, *, overwrite: bool) -> None:
    """Refuse an existing output folder unless ``overwrite`` (checked before any model loads)."""
    if out.exists() and not overwrite:
        raise ValueprobeError(f"output folder {out} already exists: choose another --out or pass --overwrite")


def _open_partial(partial: Path, run: dict[str, Any], *, overwrite: bool) -> Path | None:
    """Start ``partial`` afresh with ``run.json``, or find the checkpoint to resume when it holds
    the same run; an interrupted run with other settings is refused unless ``overwrite``."""
    run_file = partial / "run.json"
    same = run_file.exists() and json.loads(run_file.read_text()) == json.loads(json.dumps(run, default=str))
    if run_file.exists() and not same and not overwrite:
        raise ValueprobeError(
            f"{partial} holds an interrupted run with other settings or data: delete it or pass --overwrite"
        )
    if same:
        return _last_checkpoint(partial)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    write_json(run_file, run, newline=False, default=str)
    return None


def _lora(settings: TuneSettings) -> Any:
    """peft's LoraConfig for the settings; None for full fine-tuning."""
    if not settings.lora:
        return None
    from peft import LoraConfig  # with TRL: loaded only when training

    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )


def _trainer(lm: LoadedModel, pairs: Sequence[Pair], settings: TuneSettings, output_dir: Path) -> Any:
    """TRL's trainer for the method, around ``lm``'s model (put in train mode; a pad token set)."""
    lm.model.train()
    tok = lm.tokenizer
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    peft_config = _lora(settings)
    torch.manual_seed(settings.seed)
    spec = METHODS[settings.method]
    with ignore_old_checkpointing_reads():
        return _trl(spec.trainer)(
            model=lm.model,
            args=_trainer_args(settings, output_dir),
            train_dataset=_dataset(pairs, spec),
            processing_class=tok,
            peft_config=peft_config,
        )


def _train_record(trainer: Any, output: Any, resume: Path | None) -> TrainLog:
    """Steps, first and last logged loss, seconds, and the checkpoint resumed from."""
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return TrainLog(
        steps=trainer.state.global_step,
        first_loss=losses[0] if losses else float("nan"),
        last_loss=losses[-1] if losses else float("nan"),
        seconds=float(output.metrics.get("train_runtime", 0.0)),
        resumed_from=None if resume is None else resume.name,
    )


def _publish(trainer: Any, tok: Any, record: TuneRecord, partial: Path, out: Path) -> None:
    """Save the trained model, tokenizer and record into ``out`` in one step (a temporary sibling
    renamed into place), then drop ``partial``."""

    def fill(tmp: Path) -> None:
        trainer.model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        write_json(tmp / TUNE_FILE, record.to_dict(), newline=False, default=str)

    atomic_write_dir(out, fill)
    shutil.rmtree(partial, ignore_errors=True)


def train(
    base: str | LoadedModel,
    pairs: Sequence[Pair],
    out: str | Path,
    *,
    settings: TuneSettings = TuneSettings(),
    data: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> TuneResult:
    """Train an adapter (or the full model) on ``pairs`` and save it to ``out``.

    Args:
        base: a model spec for :func:`valueprobe.load` (recorded, so the checkpoint reloads), or a
            :class:`LoadedModel` whose ``model_id`` is a loadable folder.
        data: provenance recorded in ``valueprobe-tune.json`` (path, sha256, groups, ...).
        overwrite: replace an existing ``out`` and discard an interrupted run with other settings.

    Returns:
        The checkpoint folder and its record. An interrupted call leaves only ``out.partial``;
        calling again with the same arguments resumes there.
    """
    out = Path(out)
    settings.check()
    check_out(out, overwrite=overwrite)
    if not pairs:
        raise ValueprobeError("no pairs to train on")
    partial = out.with_name(out.name + ".partial")
    data = {"rows": len(pairs), **(data or {})}
    run = {"format": FORMAT, "settings": asdict(settings), "data": data}
    resume = _open_partial(partial, run, overwrite=overwrite)

    lm = base if isinstance(base, LoadedModel) else load(base)
    base_record = TunedBase(spec=_spec_of(lm), fingerprint=lm.fingerprint, **_arch(lm))
    trainer = _trainer(lm, pairs, settings, partial)
    with ignore_old_checkpointing_reads():
        output = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    record = TuneRecord(
        format=FORMAT,
        kind="lora-adapter" if settings.lora else "full",
        base=base_record,
        data=data,
        settings=settings,
        train=_train_record(trainer, output, resume),
    )
    _publish(trainer, lm.tokenizer, record, partial, out)
    return TuneResult(out=out, record=record)


def _spec_of(lm: LoadedModel) -> str:
    """How to load the base again: the alias as given, or a folder's absolute path."""
    spec = lm.model_id
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path.resolve())
    return spec


def _arch(lm: LoadedModel) -> dict[str, Any]:
    cfg = lm.model.config
    return {
        "model_type": getattr(cfg, "model_type", None),
        "d_model": lm.d_model,
        "n_layers": lm.n_layers,
        "vocab_size": len(lm.tokenizer),
    }
