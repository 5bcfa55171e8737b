"""A steered valueprobe model for lm-evaluation-harness, registered there as ``valueprobe``.

    python -m valueprobe.evals.lm_eval --model valueprobe \\
        --model_args model=smollm2-135m,spec=runs/spec.json,alpha=15 --tasks vp_arithmetic \\
        --include_path "$(python -m valueprobe.evals.tasks)" --apply_chat_template
    python -m valueprobe.evals.lm_eval --model valueprobe --model_args probe=smollm2-135m-value,alpha=15,random=3 ...

lm-eval 0.4.13 finds a model by name only in its own table (``lm_eval.models.MODEL_MAPPING``) or
among classes already imported and registered (``@register_model``); it reads no entry point
for models. So ``lm_eval --model valueprobe`` cannot load this class unless something imports it
first: ``python -m valueprobe.evals.lm_eval`` imports it (registering it) and then runs lm-eval's
own command line, with every option it has.

Model arguments (``--model_args k=v,...``): ``model`` (a name or folder, default
``smollm2-135m``), ``spec`` (a steering spec JSON file: any operator, phase, window, condition,
several layers or axes) or ``probe`` (a shipped axis's name or folder, every default), ``alpha``
(the strength in the spec's unit, default 0), ``random`` (steer along random direction K instead,
with the axis's sizes: the null, `valueprobe.evals.steering.along_random`), ``seed`` (of the
random directions and of sampling), ``allow_large`` (α past the server's cap), ``force`` (a
probe of another architecture): the steering, `valueprobe.evals.steering.EvalSteering`; and the
model's own, `LMEvalOptions`: ``batch_size``, ``max_batch_size``, ``device``, ``max_length``,
``progress``. lm-eval's ``create_from_arg_string`` / ``create_from_arg_obj`` hand them over as it
guessed their types (with its own ``--batch_size``, ``--max_batch_size`` and ``--device``); both
records are read from them once, each value converted to its field's type, and a key of neither
is refused in one line that names every key.

Requests: ``loglikelihood`` and ``loglikelihood_rolling`` are scored by
`valueprobe.evals.likelihood.continuation_logprobs` (the context is the prompt, the continuation
the generated tokens, for the spec's phase), tokenized as lm-eval's HFLM tokenizes them;
``generate_until`` runs `valueprobe.steering.decode.rows.generate_rows` (one `Steering` handle per
batch, α per row, the code ``vp.generate`` steers through), greedy unless the request samples, and
each row stops at EOS, its ``max_gen_toks``, or its first ``until`` string (left out of the text).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm.auto import tqdm

from valueprobe.errors import ValueprobeError
from valueprobe.evals.likelihood import Scored, continuation_logprobs, model_max_length
from valueprobe.evals.steering import EvalSteering, ModelArgs
from valueprobe.model.load import LoadedModel, load
from valueprobe.steering.decode.rows import RowSpec, RowStep, generate_rows
from valueprobe.steering.decode.sampling import row_seed

__all__ = ["LMEvalOptions", "ValueprobeLM", "main"]

# generate_until's gen_kwargs this model honours (others are refused in one line, not ignored)
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p")
MAX_GEN_TOKS = 256  # lm-eval's HFLM default


@dataclass(frozen=True)
class LMEvalOptions(ModelArgs):
    """The lm-eval model's own arguments beside the steering (`EvalSteering`): ``model`` (a name or
    folder), ``device``, ``batch_size`` (a number, or ``auto``: 16, under ``max_batch_size``),
    ``max_length`` (tokens of context; default the model's), ``progress`` (the bars)."""

    model: str = "smollm2-135m"
    device: str | None = None
    batch_size: int | str = 16
    max_batch_size: int | None = None
    max_length: int | None = None
    progress: bool = True


@register_model("valueprobe")
class ValueprobeLM(TemplateLM):
    """lm-eval's view of one steered model: a spec and one α (see the module doc for the arguments).

    lm-eval builds it from its ``--model_args`` (`create_from_arg_string`, `create_from_arg_obj`);
    in process, give the records, and ``lm`` for a model already loaded (`valueprobe eval` loads
    it once and builds one of these per strength and direction):

    >>> ValueprobeLM(EvalSteering(spec=spec, alpha=15.0), LMEvalOptions(batch_size=8), lm=lm)
    """

    def __init__(
        self,
        steering: EvalSteering,
        options: LMEvalOptions = LMEvalOptions(),
        *,
        lm: LoadedModel | None = None,
    ) -> None:
        super().__init__()
        self.lm = lm if lm is not None else load(options.model, device=_device(options.device))
        self.spec = steering.resolve(self.lm)
        self.alpha = steering.alpha
        self.seed = steering.seed
        self.tokenizer = self.lm.tokenizer
        self.batch = _batch_size(options.batch_size, options.max_batch_size)
        self.max_length = options.max_length if options.max_length is not None else model_max_length(self.lm)
        self.progress = options.progress

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> ValueprobeLM:
        """How lm-eval builds the model from ``--model_args`` (as a dict) and its own ``--batch_size``,
        ``--max_batch_size`` and ``--device`` (``additional_config``, where set): each key read once."""
        given = {**arg_dict, **{k: v for k, v in (additional_config or {}).items() if v is not None}}
        steering, options = EvalSteering.parse(given, beside=LMEvalOptions, harness="lm-eval")
        return cls(steering, options)

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict[str, Any] | None = None
    ) -> ValueprobeLM:
        """``--model_args`` as one ``k=v,...`` string, read by lm-eval's own parser."""
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ---- tokens, as lm-eval's HFLM makes them -------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The tokenizer's own special tokens unless told, and none where the text starts with BOS."""
        bos = self.tokenizer.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):
            add_special_tokens = False
        extra = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return list(self.tokenizer.encode(string, **extra))

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", self.lm.model_id)).replace("/", "__")

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                chat_history,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt,
            )
        )

    # ---- the three requests -------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, **kwargs: Any) -> list:
        rows = [Scored(tuple(ctx), tuple(cont)) for _, ctx, cont in requests]
        out = []
        for start in tqdm(
            range(0, len(rows), self.batch),
            desc="valueprobe loglikelihood",
            disable=disable_tqdm or not self.progress,
        ):
            part = rows[start : start + self.batch]
            out += continuation_logprobs(
                self.lm,
                self.spec,
                part,
                [self.alpha] * len(part),
                batch_size=self.batch,
                max_length=self.max_length,
            )
        for (key, _, _), result in zip(requests, out, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(text)
            for w in get_rolling_token_windows(
                token_list=tokens,
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                windows.append((None, *make_disjoint_window(w)))
                owner.append(i)
        scored = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, scored, strict=True):
            totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        out: list[str] = []
        indexed = list(enumerate(req.args for req in requests))
        for start in tqdm(
            range(0, len(indexed), self.batch),
            desc="valueprobe generate",
            disable=disable_tqdm or not self.progress,
        ):
            out += self._generate(indexed[start : start + self.batch])
        for req, text in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out

    def _generate(self, batch: Sequence[tuple[int, tuple[str, dict]]]) -> list[str]:
        rows, stops = [], []
        for i, (context, gen_kwargs) in batch:
            row, until = self._row(i, context, dict(gen_kwargs))
            rows.append(row)
            stops.append(until)
        made: list[list[int]] = [[] for _ in rows]

        def on_step(k: int, steps: list[RowStep | None]) -> list[int]:
            done = []
            for j, step in enumerate(steps):
                if step is None or step.finish is not None:
                    continue
                made[j].append(step.token_id)
                if (
                    stops[j]
                    and _first_stop(self.tokenizer.decode(made[j], skip_special_tokens=True), stops[j]) >= 0
                ):
                    done.append(j)
            return done

        outs = generate_rows(self.lm, self.spec, rows, [self.alpha] * len(rows), on_step=on_step)
        texts = [self.tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outs]
        return [t if (cut := _first_stop(t, s)) < 0 else t[:cut] for t, s in zip(texts, stops, strict=True)]

    def _row(self, index: int, context: str, gen_kwargs: dict[str, Any]) -> tuple[RowSpec, list[str]]:
        unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ValueprobeError(
                f"generation option {unknown[0]!r} is not one the valueprobe model honours: use {', '.join(GEN_KWARGS)}"
            )
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else [str(u) for u in until]
        new = int(gen_kwargs.get("max_gen_toks", MAX_GEN_TOKS))
        temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
        if not gen_kwargs.get("do_sample", False):
            temperature = 0.0  # lm-eval's rule: no sampling unless asked, whatever the temperature
        ids = self.tok_encode(context)[-max(1, self.max_length - new) :]
        row = RowSpec(
            tuple(ids),
            max_new_tokens=new,
            temperature=temperature,
            top_p=float(gen_kwargs.get("top_p", 1.0)),
            seed=row_seed(self.seed, index, 0),
        )
        return row, until


def _first_stop(text: str, stops: Sequence[str]) -> int:
    """Where the first of ``stops`` begins in ``text`` (-1: none)."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else -1


def _batch_size(batch_size: int | str, max_batch_size: int | None) -> int:
    """lm-eval's ``--batch_size`` (a number, or ``auto``: 16, under ``--max_batch_size``)."""
    text = str(batch_size)
    if text.startswith("auto"):
        return min(16, int(max_batch_size or 16))
    try:
        size = int(text)
    except ValueError:
        raise ValueprobeError(f"batch_size {batch_size!r}: give a whole number or auto") from None
    if size < 1:
        raise ValueprobeError(f"batch_size {size}: give a whole number >= 1")
    return size


def _device(device: str | None) -> str:
    """lm-eval's ``--device`` (its default is ``cuda:0``): the CPU where there is no CUDA, as its HFLM
    falls back."""
    if device is None or (device.startswith("cuda") and not torch.cuda.is_available()):
        if device is not None:
            warnings.warn(f"--device {device}: no CUDA device here, running on the CPU", stacklevel=2)
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def main() -> None:
    """lm-eval's own command line with the ``valueprobe`` model registered (this module's import);
    bad input to the model (a spec that does not fit, α past the cap) ends in one line, exit 2."""
    try:
        cli_evaluate()
    except ValueprobeError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
