"""Shared fixtures: an offline tokenizer and tiny random models of several architectures.

Nothing here reaches the network: the tokenizer is trained on a few sentences at session start,
and the models are built from configs with random weights.
"""

from __future__ import annotations

import json
import os
import subprocess

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from valueprobe.cli.main import main

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def add(a, b):\n    return a + b\n",
    "Wait, that's not right. Let me recompute: 12 * 7 = 84.",
    "Do you think your answer is correct? Yes. No.",
    "The quick brown fox jumps over the lazy dog - twice, maybe 3 times?",
    "Rewrite the sentence so that it follows the hidden rule. +1 -1",
] * 4

ARCHS = ("llama", "qwen2", "gpt2", "gemma2", "gpt_neox")


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    return fast


def build_model(arch: str, vocab_size: int, *, n_layers: int = 3, d_model: int = 64, seed: int = 0):
    import transformers as tf

    common = dict(vocab_size=vocab_size, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    if arch == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=d_model,
            intermediate_size=128,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            **common,
        )
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(
            hidden_size=d_model,
            intermediate_size=128,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            **common,
        )
    elif arch == "gemma2":
        cfg = tf.Gemma2Config(
            hidden_size=d_model,
            intermediate_size=128,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=2048,
            **common,
        )
    elif arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=d_model, n_layer=n_layers, n_head=4, n_positions=256, **common)
    elif arch == "gpt_neox":
        cfg = tf.GPTNeoXConfig(
            hidden_size=d_model,
            intermediate_size=128,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            max_position_embeddings=2048,
            **common,
        )
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return model.eval()


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """No code path may reach another host: any Python socket connect beyond loopback fails the test."""
    import socket

    real_connect = socket.socket.connect

    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "localhost", "::1"):
            raise AssertionError(f"test tried to reach {address}: valueprobe must stay offline")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_lm_factory(tiny_tokenizer):
    from valueprobe.model.load import wrap

    cache: dict = {}

    def make(arch: str = "llama", **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in cache:
            model = build_model(arch, len(tiny_tokenizer), **kw)
            cache[key] = wrap(model, tiny_tokenizer, model_id=f"tiny-{arch}")
        return cache[key]

    return make


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_lm_factory) -> str:
    """A tiny random llama and its tokenizer saved as a model folder (what users pass as --model)."""
    lm = tiny_lm_factory("llama")
    path = tmp_path_factory.mktemp("model")
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(params=ARCHS)
def tiny_lm(request, tiny_lm_factory):
    return tiny_lm_factory(request.param)


@pytest.fixture(scope="session")
def default_lm():
    """The real default model through the offline route (slow tests only)."""
    from valueprobe.model.load import load

    return load("smollm2-135m")


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the ``valueprobe`` CLI in-process: (exit status, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def curl_events(url: str, body: dict) -> list[dict]:
    """``curl -N`` (no buffering: each event as it comes) on a streamed request: its data events,
    parsed, after checking that the stream ends in ``[DONE]``."""
    out = subprocess.run(
        ["curl", "-sN", url, "-H", "Content-Type: application/json", "-d", json.dumps(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    events = [line[len("data: ") :] for line in out.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", out
    return [json.loads(e) for e in events[:-1]]
