"""A prompt as the token ids the model reads: the one rule for Python, the CLI and the server.

    >>> prompt_ids(lm, "Is 7 prime?")                         # a user turn, through the chat template
    >>> prompt_ids(lm, "Is 7 prime? Answer:", chat=False)     # the text as is (valueprobe trace --raw)
    >>> prompt_ids(lm, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}])
    >>> prompt_ids(lm, [101, 2054, 102])                      # token ids, checked against the vocabulary

``vp.values``, ``vp.generate``, ``valueprobe trace --prompt`` and ``valueprobe serve`` all come
through `prompt_ids`, so one prompt is one list of ids wherever it is typed. A string is a user
turn rendered with the model's chat template (``chat=False``, ``--raw``: the text alone; a
tokenizer without a template reads the text alone too). A chat list is rendered with the template;
a chat whose last message is the assistant's is continued (a prefilled answer), any other gets the
assistant turn opened. OpenAI's ``/v1/completions`` sends its ``prompt`` raw, as OpenAI defines it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from valueprobe.errors import ValueprobeError

__all__ = ["Prompt", "is_chat", "prompt_ids"]

# raw or chat-rendered text, a chat (a list of {"role", "content"}), or token ids
Prompt = str | Sequence[Mapping[str, str]] | Sequence[int] | torch.Tensor


def is_chat(prompt: object) -> bool:
    """Whether ``prompt`` is a chat list (``[{"role": ..., "content": ...}, ...]``)."""
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and len(prompt) > 0
        and all(isinstance(m, Mapping) for m in prompt)
    )


def _has_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], where: str) -> list[int]:
    if not _has_template(tokenizer):
        raise ValueprobeError(
            f"{where} is a chat but the tokenizer has no chat template: give the text instead (chat=False, --raw)"
        )
    chat = [dict(m) for m in messages]
    final_assistant = chat[-1].get("role") == "assistant"
    text = tokenizer.apply_chat_template(
        chat,
        tokenize=False,
        add_generation_prompt=not final_assistant,
        continue_final_message=final_assistant,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _checked_ids(tokenizer: Any, ids: Sequence[int] | torch.Tensor, where: str) -> list[int]:
    flat = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
    if any(isinstance(t, bool) or not isinstance(t, int) for t in flat):
        raise ValueprobeError(f"{where}: token ids must be whole numbers")
    size = len(tokenizer)
    bad = [t for t in flat if not 0 <= t < size]
    if bad:
        raise ValueprobeError(
            f"{where}: token id {bad[0]} is outside this tokenizer's vocabulary of {size}: these ids"
            " come from another tokenizer; pass the text instead"
        )
    return flat


def prompt_ids(
    tokenizer_or_lm: Any, prompt: Prompt, *, chat: bool = True, where: str = "prompt"
) -> list[int]:
    """The token ids of one prompt (see the module doc for the rule).

    Args:
        tokenizer_or_lm: a tokenizer, or anything with a ``.tokenizer`` (a `LoadedModel`).
        prompt: a string, a chat list, or token ids (a list or a 1-row tensor).
        chat: render a string as a user turn with the chat template (False: the text as is).
        where: how an error names the prompt (``prompt 3``, ``--prompt``).
    """
    tokenizer = getattr(tokenizer_or_lm, "tokenizer", tokenizer_or_lm)
    if isinstance(prompt, str):
        if chat and _has_template(tokenizer):
            ids = _render_chat(tokenizer, [{"role": "user", "content": prompt}], where)
        else:
            ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    elif is_chat(prompt):
        ids = _render_chat(tokenizer, cast(Sequence[Mapping[str, str]], prompt), where)
    elif isinstance(prompt, torch.Tensor | Sequence):
        ids = _checked_ids(tokenizer, cast(Sequence[int] | torch.Tensor, prompt), where)
    else:
        raise ValueprobeError(
            f"{where}: expected text, a chat list or token ids, got {type(prompt).__name__}"
        )
    if not ids or (isinstance(prompt, str) and not prompt):
        raise ValueprobeError(f"{where} is empty: give at least one token of text")
    return ids
