"""The battery: tests a–e on one axis at one layer, each stage cached so a rerun resumes.

    valueprobe audit --probe smollm2-135m-value --out runs/audit-value

    >>> res = run_audit(lm, axis, Path("runs/audit-value"), AuditSettings(), probe="smollm2-135m-value")
    >>> [(t.key, t.verdict) for t in res.tests]

Every costly stage (the neutral σ of the directions, the readings of the 2×2, of the cuts and of
the sampled answers, the answers themselves, each steered direction) is a JSON file under
``OUT/stages`` keyed by its inputs (`valueprobe.files.StageCache`): Ctrl-C loses at most the stage
running, and the same command resumes after the last one finished. The stages keep readings, not
verdicts: each test's statistics are computed again from them on every run, in seconds. Tests that read the same tokens share their forward:
the tails of the 2×2 are read once for every effect of test a, each construction conversation once
for its real cut, its placebo cuts and its failed attempts, and each sampled answer once for test c.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from tqdm.auto import tqdm

from valueprobe.audit.cut import CutReads, cut_examples, cut_test, read_cuts
from valueprobe.audit.dissociation import SteerRow, dissociation_test, steer_rows
from valueprobe.audit.distance import AnswerReads, answer_examples, distance_test, read_answers
from valueprobe.audit.guard import span_problems
from valueprobe.audit.lens import lens_test
from valueprobe.audit.reading import Directions
from valueprobe.audit.records import TESTS, Audit, AuditSettings, AuditTest
from valueprobe.audit.sampled import ANSWERS, neutral_prompts, sample_answers
from valueprobe.audit.turns import build_turns, check_turns
from valueprobe.audit.two_by_two import TurnReads, read_turns, two_by_two
from valueprobe.datasets.io import Example, read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import StageCache
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import Generation
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import ChatTemplate

__all__ = ["TESTS", "AuditSettings", "rendering_of", "run_audit"]


def rendering_of(lm: LoadedModel) -> tuple[ChatTemplate, str]:
    """How chats are rendered for ``lm``, and the sentence the audit states about it."""
    if getattr(lm.tokenizer, "chat_template", None) is None:
        return ChatTemplate.plain, (
            "the tokenizer has no chat template (a base model): chats are rendered as capture's plain"
            " transcript, 'User: ...\\nAssistant: ...', and the assistant turn is the 'Assistant:' line"
        )
    return ChatTemplate.model, "the model's chat template"


@dataclass
class _Stages:
    """The audit's stages on disk (`StageCache`), keyed by the audit's identity, and their times."""

    cache: StageCache
    key: dict
    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], dict], **inputs: object) -> dict:
        t0 = time.perf_counter()
        result = self.cache.run(name, {**self.key, **inputs}, fn)
        self.seconds[name] = time.perf_counter() - t0 if name in self.cache.ran else 0.0
        return result


@dataclass(frozen=True)
class _Run:
    """What every test of one audit shares."""

    lm: LoadedModel
    axis: ValueAxis
    settings: AuditSettings
    layer: int
    out: Path
    stages: _Stages
    chat_template: ChatTemplate
    progress: bool
    dirs: Directions

    def stage(self, name: str, fn: Callable[[], dict], **inputs: object) -> dict:
        return self.stages.run(name, fn, **inputs)

    @property
    def seconds(self) -> dict[str, float]:
        return self.stages.seconds

    def bar(self, total: int, what: str) -> tqdm:
        return tqdm(total=total, desc=what, unit="seq", disable=not self.progress, leave=False)


def _directions(
    axis: ValueAxis, lm: LoadedModel, stages: _Stages, settings: AuditSettings, layer: int
) -> Directions:
    s = settings

    def read() -> dict:
        dirs = Directions.of(axis, lm, layer=layer, n_random=s.n_random, seed=s.seed, batch_size=s.batch_size)
        return {"sigma": dirs.reference_sigma.tolist(), "tokens": dirs.reference_tokens}

    saved = stages.run("reference", read)
    return Directions.build(
        axis,
        layer=layer,
        n_random=s.n_random,
        seed=s.seed,
        reference_sigma=np.array(saved["sigma"]),
        reference_tokens=int(saved["tokens"]),
    )


def _timed(fn: Callable[[], dict]) -> Callable[[], dict]:
    """``fn`` whose result also records the seconds it took (a reused stage keeps its first run's)."""

    def run() -> dict:
        t0 = time.perf_counter()
        return {**fn(), "seconds": time.perf_counter() - t0}

    return run


def _lists(obj: object, names: tuple[str, ...]) -> dict:
    """Arrays of a reads record as JSON lists (a stage keeps the reads, so a test's statistics can
    change without another forward)."""
    return {n: np.asarray(getattr(obj, n)).tolist() for n in names}


def _turn_sets(run: _Run) -> tuple[list, int]:
    s, lm = run.settings, run.lm
    if s.turns_data is not None:
        return check_turns(lm, read_jsonl(s.turns_data), chat_template=run.chat_template)
    return build_turns(lm, n=s.turns, seed=s.seed, chat_template=run.chat_template)


def _test_a(run: _Run) -> AuditTest:
    sets, dropped = _turn_sets(run)  # rebuilt each time (tokenizing only): the reads stage keeps the arrays
    if not sets:
        raise ValueprobeError(f"no 2×2 conversation could be aligned ({dropped} dropped): check the tails")
    write_jsonl(run.out / "turns.jsonl", [arm for t in sets for arm in t.arms])

    def read() -> dict:
        with run.bar(4 * len(sets), "a: 2×2 tails") as bar:
            reads = read_turns(run.lm, run.dirs, sets, site=run.axis.site, chat_template=run.chat_template,
                               batch_size=run.settings.batch_size, on_batch=bar.update)  # fmt: skip
        return {**_lists(reads, ("tail",)), "n_tokens": reads.n_tokens}

    saved = run.stage("reads-a", _timed(read), turns=run.settings.turns, turns_data=run.settings.turns_data)
    reads = TurnReads(tuple(sets), np.array(saved["tail"]), np.empty((0,)), int(saved["n_tokens"]))
    return two_by_two(reads, run.dirs, dropped=dropped, seconds=saved["seconds"], seed=run.settings.seed)


def _construction(run: _Run) -> list[Example]:
    s = run.settings
    examples = [ex for ex in read_jsonl(s.construction) if not ex.meta.get("control")][: s.n_construction]
    problems = [
        p
        for ex in examples
        for p in span_problems(ex, tokenizer=run.lm.tokenizer, chat_template=run.chat_template)
    ]
    if problems:
        raise ValueprobeError(
            f"{s.construction}: {len(problems)} span problems, the first: {problems[0]} (spans must lie in an"
            " assistant message and cover the labelled token)"
        )
    return cut_examples(examples)


CUT_ARRAYS = ("real", "placebo", "failed", "real_fraction")


def _test_b(run: _Run) -> AuditTest:
    def read() -> dict:
        examples = _construction(run)
        with run.bar(len(examples), "b: construction cuts") as bar:
            reads = read_cuts(run.lm, run.dirs, examples, site=run.axis.site, chat_template=run.chat_template,
                              batch_size=run.settings.batch_size, on_batch=bar.update)  # fmt: skip
        return {**_lists(reads, CUT_ARRAYS), "n_sequences": reads.n_sequences, "n_tokens": reads.n_tokens}

    s = run.settings
    saved = run.stage("reads-b", _timed(read), construction=s.construction, n=s.n_construction)
    real, placebo, failed, where = (np.array(saved[n]) for n in CUT_ARRAYS)
    reads = CutReads(real=real, placebo=placebo, failed=failed, real_fraction=where,
                     n_sequences=saved["n_sequences"], n_tokens=saved["n_tokens"])  # fmt: skip
    return cut_test(reads, run.dirs, seconds=saved["seconds"], seed=run.settings.seed)


def _answers(run: _Run, prompts: list) -> tuple[list[Generation], float]:
    spec = SteeringSpec(run.axis, layers=run.layer)

    def sample() -> dict:
        gens = sample_answers(run.lm, spec, prompts, decoding=ANSWERS, chat_template=run.chat_template,
                              progress=run.progress)  # fmt: skip
        return {"answers": [g.to_dict() for g in gens]}

    saved = run.stage(
        "answers", _timed(sample), prompts=run.settings.prompts, n=len(prompts), decoding=asdict(ANSWERS)
    )
    return [Generation.from_dict(g) for g in saved["answers"]], saved["seconds"]


ANSWER_ARRAYS = ("proj", "answer", "remaining", "position")


def _test_c(run: _Run) -> AuditTest:
    s = run.settings
    prompts = neutral_prompts(read_jsonl(s.prompts), n=s.n_answers)
    answers, sampling = _answers(run, prompts)
    examples = answer_examples(prompts, answers)
    if len(examples) < 2:
        raise ValueprobeError(
            f"only {len(examples)} of {len(answers)} sampled answers ended: raise --answers"
        )

    def read() -> dict:
        with run.bar(len(examples), "c: answers") as bar:
            reads = read_answers(run.lm, run.dirs, examples, site=run.axis.site, chat_template=run.chat_template,
                                 batch_size=s.batch_size, on_batch=bar.update)  # fmt: skip
        return {**_lists(reads, ANSWER_ARRAYS), "n_answers": reads.n_answers, "n_tokens": reads.n_tokens}

    saved = run.stage("reads-c", _timed(read), prompts=s.prompts, n=len(prompts), decoding=asdict(ANSWERS))
    proj, answer, remaining, position = (np.array(saved[n]) for n in ANSWER_ARRAYS)
    reads = AnswerReads(proj=proj, answer=answer, remaining=remaining, position=position,
                        n_answers=saved["n_answers"], n_tokens=saved["n_tokens"])  # fmt: skip
    return distance_test(
        reads, run.dirs, n_sampled=len(answers), seconds=saved["seconds"] + sampling,
        generated=sum(len(g.token_ids) for g in answers), seed=s.seed,
    )  # fmt: skip


def _test_d(run: _Run) -> AuditTest:
    s = run.settings
    prompts = neutral_prompts(read_jsonl(s.prompts), n=s.n_steer)
    rows: list[SteerRow] = []
    seconds = 0.0
    for j in range(s.n_steer_random + 1):
        alphas = (0.0, *s.alphas) if j == 0 else s.alphas  # α = 0 is one run, whatever the direction

        def steer(j: int = j, alphas: tuple[float, ...] = alphas) -> dict:
            got = steer_rows(run.lm, run.axis, run.dirs, prompts, alphas=alphas, direction=j, decoding=ANSWERS,
                             chat_template=run.chat_template, progress=run.progress)  # fmt: skip
            return {"rows": [r.to_dict() for r in got]}

        saved = run.stage(
            f"steer-{j}", _timed(steer), prompts=s.prompts, n=s.n_steer, alphas=list(alphas), direction=j,
            decoding=asdict(ANSWERS),
        )  # fmt: skip
        rows += [SteerRow.from_dict(r) for r in saved["rows"]]
        seconds += saved["seconds"]
    generated = sum(r.n_tokens for r in rows)
    cost = f"{len(rows)} steered answers ({generated} tokens) and as many ratings"
    return dissociation_test(rows, seconds=seconds, cost=cost)


def _test_e(run: _Run) -> AuditTest:
    t0 = time.perf_counter()
    test = lens_test(run.axis, run.lm, run.dirs, k=run.settings.k_lens, seed=run.settings.seed)
    return AuditTest.from_dict({**test.to_dict(), "seconds": time.perf_counter() - t0})


RUNNERS: dict[str, Callable[[_Run], AuditTest]] = {
    "a": _test_a,
    "b": _test_b,
    "c": _test_c,
    "d": _test_d,
    "e": _test_e,
}


def run_audit(
    lm: LoadedModel,
    axis: ValueAxis,
    out: Path,
    settings: AuditSettings = AuditSettings(),
    *,
    probe: str,
    command: str = "",
    console: Console | None = None,
    progress: bool = True,
) -> Audit:
    """Run the battery on ``axis`` (checked against ``lm``) and return the `Audit`; stages go to
    ``out/stages`` (the caller writes audit.json and audit.html)."""
    s = settings.check()
    layer = axis.best_layer if s.layer is None else s.layer
    chat_template, rendering = rendering_of(lm)
    out.mkdir(parents=True, exist_ok=True)
    # what every stage depends on; each stage adds its own inputs, so changing one test's size reruns that test only
    key = {
        "probe": axis.provenance(),
        "model": lm.fingerprint,
        "layer": layer,
        "seed": s.seed,
        "random": s.n_random,
    }
    stages = _Stages(StageCache(out / "stages", console=console or Console()), key)
    t0 = time.perf_counter()
    dirs = _directions(axis, lm, stages, s, layer)
    run = _Run(lm=lm, axis=axis, settings=s, layer=layer, out=out, stages=stages, chat_template=chat_template,
               progress=progress, dirs=dirs)  # fmt: skip
    tests = [RUNNERS[letter](run) for letter in s.tests]  # each reads its stages: only statistics are redone
    return Audit(
        probe=probe, model_id=lm.model_id, layer=layer, site=str(axis.site), axis_sigma=dirs.axis_sigma,
        sigma_reference=str(axis.sigma_reference), reference_sigma=float(dirs.reference_sigma[0]),
        reference_tokens=dirs.reference_tokens, n_random=s.n_random, rendering=rendering, tests=tuple(tests),
        command=command, seconds=time.perf_counter() - t0,
    )  # fmt: skip
