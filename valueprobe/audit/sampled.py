"""The model's own answers to neutral prompts: what tests c (distance to the end) and d (steering)
read and steer.

    from valueprobe.audit.sampled import neutral_prompts, sample_answers
    prompts = neutral_prompts(read_jsonl("steer_open"), n=24)
    answers = sample_answers(lm, axis, prompts, decoding=ANSWERS)

A prompt is a one-turn chat (the shipped ``steer_open`` set: "Describe a city at night.", ...) with
``SHORT`` appended, so that most answers end inside ``max_new_tokens`` and the end of the turn is
the model's own. Only answers that ended on EOS have a known end; the others are counted and left
out of test c. For a model without a chat template the chat is rendered as capture renders it
(`valueprobe.activations.encode.render_plain`) and sent as text.
"""

from __future__ import annotations

from collections.abc import Sequence

from valueprobe.activations.encode import render_plain
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.steering.decode.generation import Generation, Prompt, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import ChatTemplate

__all__ = ["ANSWERS", "SHORT", "Chat", "as_prompt", "neutral_prompts", "sample_answers"]

SHORT = " Answer in two or three sentences."
ANSWERS = Decoding(max_new_tokens=96, temperature=0.7, seed=0)

Chat = tuple[dict[str, str], ...]


def neutral_prompts(examples: Sequence[Example], *, n: int) -> list[Chat]:
    """The first ``n`` one-turn user prompts of ``examples``, each asking for a short answer."""
    chats = []
    for ex in examples:
        if ex.messages and ex.messages[-1]["role"] == "user":
            *head, last = ex.messages
            chats.append((*head, {"role": "user", "content": last["content"] + SHORT}))
        elif ex.text:
            chats.append(({"role": "user", "content": ex.text + SHORT},))
        if len(chats) == n:
            return chats
    raise ValueprobeError(f"the prompt set has {len(chats)} usable prompts, fewer than the {n} asked for")


def as_prompt(chat: Chat, chat_template: ChatTemplate) -> Prompt:
    """A chat as `generate` takes it: the chat itself, or its plain transcript for a base model."""
    if chat_template == ChatTemplate.plain:
        return render_plain(list(chat))[0]
    return list(chat)


def sample_answers(
    lm: LoadedModel,
    spec: SteeringSpec,
    prompts: Sequence[Chat],
    *,
    decoding: Decoding = ANSWERS,
    chat_template: ChatTemplate = ChatTemplate.model,
    batch_size: int = 32,
    progress: bool = True,
) -> list[Generation]:
    """One unsteered answer per prompt (α = 0 on ``spec``: no addition)."""
    return generate(
        lm,
        spec,
        [as_prompt(p, chat_template) for p in prompts],
        alphas=(0.0,),
        decoding=decoding,
        batch_size=batch_size,
        progress=progress,
    )
