"""P(yes) under steering: how a steered model answers a yes/no question, read from one forward
pass at the first answer token (no sampling). `valueprobe.steering.experiment.sweep` tables it as ``p_yes``.

    >>> from valueprobe.steering.experiment.yes_no import p_yes
    >>> p_yes(lm, axis, [chat, chat], [-2.0, 2.0])   # one (prompt, α) per row; or a SteeringSpec
    array([0.31, 0.46])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.load import LoadedModel
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.hook.handle import Specified, steer
from valueprobe.steering.hook.spec import as_spec

__all__ = ["answer_tokens", "p_yes"]


def _answer_ids(tokenizer: Any, word: str) -> set[int]:
    """Tokens an answer ``word`` starts with: its single-token forms (yes, Yes, YES, " yes", " Yes")
    where the tokenizer has any, else the first token of each form."""
    forms = [
        tokenizer(f, add_special_tokens=False)["input_ids"]
        for f in (word, word.capitalize(), word.upper(), " " + word, " " + word.capitalize())
    ]
    single = {int(ids[0]) for ids in forms if len(ids) == 1}
    return single or {int(ids[0]) for ids in forms if ids}


def answer_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids read as "yes" and as "no"; a token both words start with (a bare space) counts for neither."""
    yes, no = _answer_ids(tokenizer, "yes"), _answer_ids(tokenizer, "no")
    return sorted(yes - no), sorted(no - yes)


def p_yes(
    lm: LoadedModel,
    spec: Specified,
    prompts: Sequence[Sequence[dict[str, str]] | str],
    alphas: Sequence[float],
    *,
    batch_size: int = 16,
) -> np.ndarray:
    """P(yes) / (P(yes) + P(no)) at the first answer token, one per (prompt, α) row, steered.

    "yes" and "no" each pool the single-token forms of the word (on the default model: yes, Yes,
    " yes", " Yes"; "YES" is two tokens and is left out), see `answer_tokens`.

    Args:
        spec: what to steer (`valueprobe.steering.hook.spec.SteeringSpec`; an axis: ``add`` along
            it at its best layer). The forward holds the prompt only, so positions ``generated``
            or a window steer nothing here.
        prompts: one prompt per row (chats get the assistant turn opened).
        alphas: one strength per row, in the spec's unit.

    >>> p_yes(lm, axis, [chat, chat], [-2.0, 2.0])
    array([0.31, 0.46])
    """
    spec = as_spec(spec)
    if len(prompts) != len(alphas):
        raise ValueprobeError(f"p_yes: {len(prompts)} prompts but {len(alphas)} strengths")
    yes, no = answer_tokens(lm.tokenizer)
    encoded = encode_prompts(lm, prompts, chat=False)  # text as is, as the sweep generates it
    pad = pad_id_for(lm.tokenizer)
    out = np.empty(len(encoded))
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start : start + batch_size]
        # right padding: real tokens keep positions 0..n-1 and never see pads
        ids, mask = pad_rows(rows, pad_id=pad, side="right")
        alpha = torch.tensor([float(a) for a in alphas[start : start + batch_size]])
        with torch.no_grad(), steer(lm, spec, alpha, prompt_length=ids.shape[1]):
            logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device)).logits
        last = torch.tensor([len(r) - 1 for r in rows])
        probs = torch.softmax(logits[torch.arange(len(rows)), last.to(logits.device)].float(), dim=-1).cpu()
        py, pn = probs[:, yes].sum(dim=1), probs[:, no].sum(dim=1)
        out[start : start + len(rows)] = (py / (py + pn)).numpy()
    return out
