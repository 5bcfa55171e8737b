"""No host sync inside a decode step (issue 27), checked on the CPU.

`syncguard.SyncCount` counts the calls that would sync a GPU made by valueprobe's own lines;
each test runs the same call at two decode lengths and fails naming every line whose count
grew with the number of steps (see tests/syncguard.py). On a GPU the `gpu` tests in
tests/test_gpu.py run the same paths under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from syncguard import SyncCount, grown
from test_steer import PROMPTS, planted_axis

from valueprobe import guide
from valueprobe.guided.policy import BestOfN, Prune, Rollback
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.steering.decode.generation import Tracing, encode_prompts, generate
from valueprobe.steering.decode.rows import RowSpec, generate_rows
from valueprobe.steering.decode.sampling import Decoding, RowSampler
from valueprobe.steering.hook.condition import Condition
from valueprobe.steering.hook.handle import Steering
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec

SHORT, LONG = 4, 10  # decode lengths; a per-step sync grows by LONG - SHORT
# The sampler's shortlist runs on CPU tensors only (a GPU takes the full sort): its nonzero is free.
CPU_ONLY = {"in _cpu_shortlist_pick: Tensor.nonzero": 2 * (LONG - SHORT)}


def _growth(call, *, allowed=None) -> list[str]:
    with SyncCount() as short:
        call(SHORT)
    with SyncCount() as long:
        call(LONG)
    return grown(short, long, steps=LONG - SHORT, allowed=allowed)


OPERATORS = [
    Operator(),
    Operator("ablate"),
    Operator("set", target=1.0),
    Operator("clamp", lo=-1.0, hi=1.0),
    Operator("add-norm"),
]


@pytest.mark.parametrize("op", OPERATORS, ids=lambda o: o.describe())
def test_steered_generate_makes_no_sync_per_step_under_any_operator(tiny_lm_factory, op):
    lm = tiny_lm_factory("llama")
    spec = SteeringSpec(planted_axis(lm), op=op, layers=[0, 1])

    def call(tokens: int) -> None:
        generate(
            lm,
            spec,
            PROMPTS,
            alphas=[-2.0, 0.0, 3.0],
            progress=False,
            decoding=Decoding(greedy=True, max_new_tokens=tokens, min_new_tokens=tokens),
        )

    assert not _growth(call), "\n".join(_growth(call))


@pytest.mark.parametrize(
    "options",
    [
        {"positions": "generated"},
        {"window": (1, 3)},
        {"condition": "plain"},
        {"condition": "latch"},
        {"unit": "norm", "positions": "prompt"},
    ],
    ids=str,
)
def test_positions_windows_conditions_traces_and_sampling_make_no_sync_per_step(tiny_lm_factory, options):
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)
    kw = dict(options)
    if "condition" in kw:
        kw["condition"] = Condition(0.0, when="above", latch=kw["condition"] == "latch")
    spec = SteeringSpec(axis, **kw)

    def call(tokens: int) -> None:
        generate(
            lm,
            spec,
            PROMPTS,
            alphas=[-2.0, 0.0, 3.0],
            progress=False,
            trace=Tracing(read_layers=(0, 2)),
            decoding=Decoding(
                samples=2, temperature=0.8, top_p=0.9, seed=3, max_new_tokens=tokens, min_new_tokens=tokens
            ),
        )

    problems = _growth(call, allowed=CPU_ONLY)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "options",
    [{}, {"positions": "generated", "condition": Condition(-0.2, latch=True)}],
    ids=["all", "generated-latch"],
)
def test_steering_under_a_static_cache_makes_no_sync_per_step(tiny_lm_factory, options):
    """Under transformers' static cache (``cache_implementation="static"``, what a compiled decode
    runs on) the cache counts its columns in a device tensor: the hook takes its step offset from
    there and never reads it on the host, with a trace and a read layer on."""
    lm = tiny_lm_factory("llama")
    spec = SteeringSpec(planted_axis(lm), layers=1, **options)
    pad = pad_id_for(lm.tokenizer)
    ids, mask = pad_rows(encode_prompts(lm, PROMPTS), pad_id=pad, side="left")
    alphas = torch.tensor([2.0, 0.0, -3.0, 1.0])

    def call(tokens: int) -> None:
        steering = Steering(lm, spec, alphas, prompt_length=ids.shape[1], trace=True, read_layers=[2])
        with steering.attach(), torch.no_grad():
            lm.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=pad, cache_implementation="static",
            )  # fmt: skip

    problems = _growth(call)
    assert not problems, "\n".join(problems)


def test_the_sampler_makes_no_sync_per_step():
    sampler = RowSampler([1, 2, 3], temperature=0.7, top_p=0.9, shortlist=8)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    ids = torch.zeros(3, 1, dtype=torch.long)

    def call(steps: int) -> None:
        for _ in range(steps):
            sampler(ids, logits)

    problems = _growth(call, allowed=CPU_ONLY)
    assert not problems, "\n".join(problems)


def test_the_guard_names_the_line_of_a_sync_that_comes_back(tiny_lm_factory, monkeypatch):
    """The guard itself: a hook that asks the host for a value every step is named, by its line
    (this file's lines count here, so the planted sync is found where it is)."""
    from valueprobe.steering.hook import handle

    lm = tiny_lm_factory("llama")
    real = handle.Steering.cells

    def syncing(self, step):
        cells = real(self, step)
        if not bool(cells.any()):  # the kind of sync issue 27 removed from the hook
            return cells
        return cells

    monkeypatch.setattr(handle.Steering, "cells", syncing)
    roots = (str(Path(handle.__file__).parents[2]) + "/", __file__)

    def call(tokens: int) -> None:
        generate(
            lm,
            planted_axis(lm),
            PROMPTS[:2],
            alphas=[1.0],
            progress=False,
            decoding=Decoding(greedy=True, max_new_tokens=tokens, min_new_tokens=tokens),
        )

    with SyncCount(roots=roots) as short:
        call(SHORT)
    with SyncCount(roots=roots) as long:
        call(LONG)
    (problem,) = grown(short, long, steps=LONG - SHORT)
    line = syncing.__code__.co_firstlineno + 2
    assert f"test_sync.py:{line} in syncing: Tensor.__bool__ ×{LONG - SHORT} more" in problem, problem


ASKS = {
    "plain": {},
    # log-probabilities come back in the step's one copy; penalties count tokens on the device
    "logprobs-and-penalties": {"logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": 1.0},
}


@pytest.mark.parametrize("asks", list(ASKS))
@pytest.mark.parametrize("read_layer", [1, 2], ids=["read-at-steered", "read-elsewhere"])
def test_the_serve_engines_rows_copy_once_per_step_for_the_whole_batch(tiny_lm_factory, read_layer, asks):
    """A streaming server may copy once per step; one copy for the whole batch, nothing else."""
    lm = tiny_lm_factory("llama")
    spec = SteeringSpec(planted_axis(lm), layers=1, read_layer=read_layer)
    ids = lm.tokenizer(PROMPTS[0])["input_ids"]

    def call(tokens: int) -> None:
        rows = [
            RowSpec(tuple(ids), max_new_tokens=tokens, ignore_eos=True, **ASKS[asks]),
            RowSpec(
                tuple(ids[:3]), max_new_tokens=tokens, temperature=0.7, top_p=0.9, seed=4, ignore_eos=True
            ),
            RowSpec(tuple(ids), max_new_tokens=tokens, temperature=1.0, seed=5, ignore_eos=True),
        ]
        generate_rows(lm, spec, rows, [0.0, 2.0, -1.0])

    problems = _growth(call, allowed={"rows.py:": LONG - SHORT, **CPU_ONLY})
    assert not problems, "\n".join(problems)
    with SyncCount() as count:
        call(LONG)
    # the CPU-only shortlist's nonzero (a GPU takes the full sort) is not a copy a GPU would make
    per_step = [
        f"{w}: {what}"
        for (w, what), n in count.counts.items()
        if n >= LONG - 1 and not any(name in f"{w}: {what}" for name in CPU_ONLY)
    ]
    assert len(per_step) == 1 and "in __call__: Tensor.tolist" in per_step[0], per_step


# Guided decoding looks at its rows on the host once per checkpoint (issue 27): EOS, rollback and
# prune every `--every` tokens (prune) or every CHECK_EVERY (best-of-n, rollback), the pick at
# the end. Its lines may grow by the checkpoints in the extra steps, nothing per step.
GUIDED = [
    ("best-of-n", BestOfN(n=3), None),
    ("best-of-n-every-3", BestOfN(n=3), 3),
    ("prune-every-2", Prune(n=3, every=2, quantile=0.5), None),
    # τ out of reach: the loop and the push are there, no rollback fires (each one is a look)
    ("rollback-every-3", Rollback(n=2, k=2, tau=1e6, alpha=2.0, steer_tokens=2), 3),
]


@pytest.mark.parametrize(("policy", "every"), [g[1:] for g in GUIDED], ids=[g[0] for g in GUIDED])
def test_guided_decoding_looks_on_the_host_once_per_checkpoint(tiny_lm_factory, monkeypatch, policy, every):
    from valueprobe.guided import run

    if every is not None:
        monkeypatch.setattr(run, "CHECK_EVERY", every)
    interval = policy.every if isinstance(policy, Prune) else run.CHECK_EVERY
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)

    def call(tokens: int) -> None:
        guide(lm, axis, PROMPTS[:2], policy, decoding=Decoding(max_new_tokens=tokens, seed=2), progress=False)

    checkpoints = -(-(LONG - SHORT) // interval)  # in the extra steps
    problems = _growth(call, allowed={"valueprobe/guided/": checkpoints, **CPU_ONLY})
    assert not problems, "\n".join(problems)
