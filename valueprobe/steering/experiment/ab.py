"""CAA's read of an A/B question under steering: P(the answer matching a behaviour), one forward of
the question shared by every steering setting.

    valueprobe replicate caa --out probes/caa-smollm2-135m

    >>> p = ab_match(lm, chats, ["A", "B"], [(caa_spec(axis, 12), 0.0), (caa_spec(axis, 12, v), 4.0)])

As Rimsky et al. read it (CAA, §3): the chat ends with the assistant's answer opened by ``(``; the
model's next-token probabilities of ``A`` and ``B`` there give p(match) = P(matching letter) /
(P(A) + P(B)). Each setting is a steering spec, taken whole, and its α. CAA's own (`caa_spec`)
adds α·v̂ (raw units: α is the vector's length) at one layer to the tokens after the user's
prompt only, CAA's ``add_vector_after_position`` from the end of the instruction; here that is the
``(``, valueprobe's ``positions="generated"`` with the prompt's width as ``prompt_length``. So the
question (system prompt, user turn, the assistant header) is run once
per batch into a KV cache, unsteered, and each setting runs only the answer's first token on it; the
cache is cut back after each. Prompts are left padded with explicit position ids, so a batch gives
each item's single-item figures.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import Unit

__all__ = ["ANSWER_OPEN", "Setting", "ab_match", "answer_ids", "caa_spec"]

ANSWER_OPEN = "("  # the assistant's answer starts "(A" or "(B": the letter is the next token
Setting = tuple[SteeringSpec, float]  # what steers the answer, and α in the spec's unit


def caa_spec(axis: ValueAxis, layer: int, direction: torch.Tensor | None = None) -> SteeringSpec:
    """CAA's steering: α·v̂ in raw units (α is the vector's length) at ``layer``, on the answer only;
    along ``direction`` (a unit vector) instead of the axis's own there when one is given."""
    return SteeringSpec(axis, layers=[layer], unit=Unit.raw, direction=direction, positions="generated")


def answer_ids(tokenizer) -> tuple[list[int], int, int]:  # noqa: ANN001 - any HF tokenizer
    """The ids of the answer's opening (``(``) and of the letters A and B that follow it; one line
    when the tokenizer merges "(A" into one token (then the letter is not the next token)."""
    opening = tokenizer(ANSWER_OPEN, add_special_tokens=False)["input_ids"]
    ids = {x: tokenizer(ANSWER_OPEN + x, add_special_tokens=False)["input_ids"] for x in "AB"}
    if any(v[: len(opening)] != opening or len(v) != len(opening) + 1 for v in ids.values()):
        raise ValueprobeError(
            f"this tokenizer does not split '(A' into '(' and 'A' ({ids['A']}): the A/B read needs the letter"
            " as its own next token"
        )
    return list(opening), ids["A"][-1], ids["B"][-1]


def _encode(lm: LoadedModel, chats: Sequence[Sequence[dict[str, str]]]) -> list[list[int]]:
    out = []
    for chat in chats:
        text = lm.tokenizer.apply_chat_template(list(chat), tokenize=False, add_generation_prompt=True)
        out.append(list(lm.tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def _batch(
    lm: LoadedModel,
    prefixes: list[list[int]],
    settings: Sequence[Setting],
    *,
    opening: list[int],
    letters: tuple[int, int],
) -> np.ndarray:
    """P(A) / (P(A) + P(B)) [settings, items] for one batch of prompts."""  # fmt: skip
    ids, mask = pad_rows(prefixes, pad_id=pad_id_for(lm.tokenizer), side="left")
    width, device = ids.shape[1], lm.device
    position = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding adds no position
    cache = DynamicCache(config=lm.model.config)
    # transformers 5.24 renamed the forward's past_key_values to cache (the old name warns)
    key = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"
    if not getattr(cache, "is_croppable", True):
        raise ValueprobeError(
            f"{lm.model_id}'s KV cache cannot be cut back: the A/B read shares one per question"
        )
    with torch.no_grad():
        lm.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=position.to(device),
                 use_cache=True, **{key: cache})  # fmt: skip
    n = len(prefixes)
    # the answer's inputs and the results stay on the device: one host copy per batch, at the end
    answer = torch.tensor([opening] * n).to(device)
    full = torch.cat([mask, torch.ones(n, len(opening), dtype=mask.dtype)], dim=1).to(device)
    after = (position[:, -1:] + 1 + torch.arange(len(opening))[None, :]).to(device)
    out = torch.empty((len(settings), n), dtype=torch.float64, device=device)
    for k, (spec, alpha) in enumerate(settings):
        with torch.no_grad(), steer(lm, spec, alpha, prompt_length=width):
            logits = lm.model(input_ids=answer, attention_mask=full, position_ids=after, use_cache=True,
                              **{key: cache}).logits  # fmt: skip
        cache.crop(-len(opening))  # back to the question alone
        probs = torch.softmax(logits[:, -1].double(), dim=-1)
        pa, pb = probs[:, letters[0]], probs[:, letters[1]]
        out[k] = pa / (pa + pb)
    return out.cpu().numpy()


def ab_match(
    lm: LoadedModel,
    chats: Sequence[Sequence[dict[str, str]]],
    matching: Sequence[str],
    settings: Sequence[Setting],
    *,
    batch_size: int = 16,
    progress: bool = False,
) -> np.ndarray:
    """p(match) of every question under every steering setting, ``[settings, items]``.

    Args:
        chats: each question as a chat ending on the user's turn (a system prompt first, if any).
        matching: the letter ("A" or "B") whose answer matches the behaviour, per question.
        settings: (spec, α), the spec taken whole (`caa_spec` is CAA's); α = 0 is the unsteered
            model. One forward of the questions serves every setting, whatever it steers.
    """
    if len(chats) != len(matching) or any(m not in ("A", "B") for m in matching):
        raise ValueprobeError("ab_match: give one matching letter, A or B, per question")
    opening, a, b = answer_ids(lm.tokenizer)
    encoded = _encode(lm, chats)
    p_a = np.empty((len(settings), len(encoded)))
    starts = range(0, len(encoded), batch_size)
    for start in tqdm(starts, desc="A/B questions", unit="batch", disable=not progress):
        rows = encoded[start : start + batch_size]
        p_a[:, start : start + len(rows)] = _batch(lm, rows, settings, opening=opening, letters=(a, b))
    is_a = np.array([m == "A" for m in matching])
    return np.where(is_a[None, :], p_a, 1.0 - p_a)
