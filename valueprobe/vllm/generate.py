"""A steering sweep's generations through vLLM: every (prompt, sample, α) row is one request.

    valueprobe steer --engine vllm --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl --out runs/steer-vllm

    >>> llm = open_llm("smollm2-135m")
    >>> run = VllmGenerator(llm)
    >>> spec = SteeringSpec(probe="probes/smollm2-135m-value")
    >>> rows = run.with_values(lm, spec, ["Is 7 prime?"], alphas=[-2, 0, 2], decoding=Decoding(greedy=True))
    >>> rows[0].generation.text, rows[0].values        # the text, and one σ-score per generated token

Rows are the same records, in the same order, as `valueprobe.steering.decode.generation.generate`
gives, so `valueprobe.steering.experiment.sweep.run_sweep` takes `VllmGenerator` in its place
(``generator=``). Each request carries the spec and its own α (`valueprobe.vllm.request.VllmArgs`
in ``extra_args``), so the whole sweep is one ``LLM.generate`` call that vLLM batches as it likes.
Prompts are the same token ids as the HF route (`encode_prompts`); sampling uses each row's
common-random-numbers seed as vLLM's per-request seed, so every strength of one (prompt, sample)
draws the same numbers (vLLM's own generator, so sampled texts differ from the HF route's; greedy
texts agree up to kernel numerics).
"""

from __future__ import annotations

import math
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from valueprobe.activations.prompts import Prompt
from valueprobe.errors import ValueprobeError
from valueprobe.model.gguf import ALIASES, alias_dir
from valueprobe.model.load import LoadedModel, cache_dir
from valueprobe.steering.decode.generation import Generation, encode_prompts
from valueprobe.steering.decode.sampling import Decoding, row_seed
from valueprobe.steering.hook.handle import Specified
from valueprobe.steering.hook.spec import SteeringSpec, as_spec
from valueprobe.vllm import plugin
from valueprobe.vllm.request import VllmArgs, check_spec

__all__ = [
    "INSTALL",
    "VllmGenerator",
    "VllmRow",
    "absolute",
    "check_plugin",
    "check_workers",
    "engine_kwargs",
    "model_path",
    "open_llm",
    "take_values",
]

INSTALL = (
    "pip install 'valueprobe[vllm]' in its own virtual environment (bash .ci/vllm-env builds .venv-vllm)"
)


def model_path(model: str) -> str:
    """The local folder vLLM loads for ``model``: an alias's safetensors cache, or the folder given."""
    if model in ALIASES:
        return str(alias_dir(model, cache_dir()))
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    return model  # a hub id, for machines that reach the hub


def engine_kwargs(
    model: str,
    *,
    seed: int = 0,
    max_model_len: int = 2048,
    enforce_eager: bool = False,
    prefix_caching: bool = True,
    dtype: str = "float32",
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` / ``AsyncEngineArgs`` valueprobe's engines use.

    ``dtype`` float32 by default, as the HF route loads; a 2 GiB CPU KV cache unless
    ``VLLM_CPU_KVCACHE_SPACE`` says otherwise (vLLM's CPU default is far larger).
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return {
        "model": model_path(model),
        "dtype": dtype,
        "seed": seed,
        "max_model_len": max_model_len,
        "enforce_eager": enforce_eager,
        "enable_prefix_caching": prefix_caching,
    }


def _refuse(why: str) -> ValueprobeError:
    return ValueprobeError(
        f"vLLM would run without valueprobe's plugin ({why}); it loads through the entry point"
        f" vllm.general_plugins, so VLLM_PLUGINS, if set, must name 'valueprobe', and valueprobe must be"
        f" installed in vLLM's environment: {INSTALL}"
    )


def check_plugin() -> None:
    """Refuse, before an engine starts, where its workers would load no plugin or another copy of it.

    Workers load general plugins the way this process does (same environment, same ``sys.path``),
    so what vLLM's own loader resolves here is what they run. Without this check such an engine
    generates unsteered text and fails its first request for values.
    """
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group  # the [vllm] extra

    found = load_plugins_by_group(DEFAULT_PLUGINS_GROUP).get("valueprobe")
    if found is None:
        raise _refuse(f"VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')!r}" if "VLLM_PLUGINS" in os.environ
                      else "no entry point named 'valueprobe'")  # fmt: skip
    if found is not plugin.register:
        where = getattr(sys.modules.get(getattr(found, "__module__", "")), "__file__", "?")
        raise _refuse(f"its entry point loads {where}, not {plugin.__file__}")


def check_workers(replies: Sequence[Any]) -> None:
    """Refuse a started engine whose workers hooked no decoder blocks; ``replies`` is what
    ``collective_rpc("valueprobe_status")`` returned, one per worker."""
    if not replies or any(not isinstance(r, dict) or not r.get("hooks") for r in replies):
        raise _refuse(f"the workers hooked no decoder blocks: {list(replies)}")


def open_llm(model: str, **kw: Any) -> Any:
    """A ``vllm.LLM`` on ``model`` with valueprobe's plugin loaded (its entry point does that) and
    checked in every worker; ``kw`` as `engine_kwargs`. One clear line when vLLM is not installed
    or the plugin would not load."""
    try:
        from vllm import LLM  # optional dependency: the [vllm] extra
    except ImportError:
        raise ValueprobeError(f"the vLLM engine needs vLLM: {INSTALL}") from None
    check_plugin()
    llm = LLM(**engine_kwargs(model, **kw))
    check_workers(llm.collective_rpc("valueprobe_status"))
    return llm


def take_values(llm: Any, keys: Sequence[str]) -> dict[str, list[float]]:
    """The per-token values the workers kept under ``keys``, from the first generated token on
    (each key once: taking forgets them). ``llm`` is a ``vllm.LLM``."""
    out: dict[str, list[float]] = {}
    for part in llm.collective_rpc("valueprobe_take_values", args=(list(keys),)):
        for key, (first, values) in (part or {}).items():
            out[key] = [math.nan] * int(first) + [float(v) for v in values]
    return out


@dataclass(frozen=True)
class VllmRow:
    """One generated row and its per-token values (σ, at the steered layer, after the addition)."""

    generation: Generation
    values: tuple[float, ...]


def absolute(spec: SteeringSpec) -> SteeringSpec:
    """The spec with its probe an absolute folder (every worker reads it from there)."""
    if not isinstance(spec.probe, str):
        raise ValueprobeError("the vllm engine needs the spec's probe folder: build the spec with probe=")
    return replace(spec, probe=str(Path(spec.probe).resolve()))


class VllmGenerator:
    """`generate` through vLLM: call it as `valueprobe.steering.decode.generation.generate` is called.

    Args:
        llm: a ``vllm.LLM`` (`open_llm`) on the same model as ``lm``.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def __call__(
        self, lm: LoadedModel, spec: Specified, prompts: Sequence[Prompt], **kw: Any
    ) -> list[Generation]:
        return [r.generation for r in self.with_values(lm, spec, prompts, **kw)]

    def with_values(
        self,
        lm: LoadedModel,
        spec: Specified,
        prompts: Sequence[Prompt],
        *,
        alphas: Sequence[float] = (0.0,),
        decoding: Decoding = Decoding(),
        batch_size: int = 0,  # noqa: ARG002 - vLLM batches by itself
        progress: bool = True,
        chat: bool = True,
    ) -> list[VllmRow]:
        """Every (prompt, sample, α) row, in that nested order, with its per-token values."""
        from vllm import SamplingParams  # optional dependency: the [vllm] extra
        from vllm.inputs import TokensPrompt

        spec = absolute(as_spec(spec))
        check_spec(spec)
        encoded = encode_prompts(lm, prompts, chat=chat)
        eos = getattr(lm.tokenizer, "eos_token_id", None)
        rows, requests, params = [], [], []
        for p, ids in enumerate(encoded):
            for s in range(decoding.samples):
                row_s = None if decoding.greedy else row_seed(decoding.seed, p, s)
                for a in alphas:
                    key = uuid.uuid4().hex
                    args = VllmArgs(spec, alpha=float(a), key=key)
                    rows.append((p, s, float(a), row_s, key))
                    requests.append(TokensPrompt(prompt_token_ids=ids))
                    params.append(
                        SamplingParams(
                            max_tokens=decoding.max_new_tokens,
                            temperature=0.0 if decoding.greedy else decoding.temperature,
                            top_p=1.0 if decoding.greedy else decoding.top_p,
                            seed=row_s,
                            stop_token_ids=None if eos is None else [int(eos)],
                            extra_args=args.extra_args(),
                        )
                    )
        outs = self.llm.generate(requests, params, use_tqdm=progress)
        values = take_values(self.llm, [r[4] for r in rows])
        return [_row(lm, r, out, values.get(r[4], []), spec) for r, out in zip(rows, outs, strict=True)]


def _row(lm: LoadedModel, r: tuple, out: Any, values: list[float], spec: SteeringSpec) -> VllmRow:
    p, s, a, row_s, _ = r
    done = out.outputs[0]
    ids = [int(t) for t in done.token_ids]
    eos = getattr(lm.tokenizer, "eos_token_id", None)
    finished = done.finish_reason == "stop"
    kept = ids[: ids.index(eos)] if eos is not None and eos in ids else ids
    gen = Generation(
        prompt=p,
        sample=s,
        alpha=a,
        unit=spec.unit.value,
        direction=spec.name(),
        seed=row_s,
        text=lm.tokenizer.decode(kept, skip_special_tokens=True),
        token_ids=tuple(kept),
        finished=finished,
        op=spec.op.describe(),
    )
    return VllmRow(gen, tuple(values[: len(ids)]))
