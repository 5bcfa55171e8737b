"""Value-guided decoding: sample N rows per prompt, read the value in the same forward, act on it.

    >>> import valueprobe as vp
    >>> out = vp.guide(lm, axis, ["What is 12 * 7? Answer:"], "best-of-n")           # N = 8, by mean σ
    >>> out = vp.guide(lm, axis, prompts, Prune(n=8, every=8, quantile=0.5))
    >>> spec = vp.SteeringSpec(axis, read_layer=14, layers=16)          # read at 14, rollback pushes at 16
    >>> out = vp.guide(lm, spec, prompts, Rollback(k=8, tau=1.0, alpha=2.0))
    >>> out = vp.guide(lm, vp.SteeringSpec(axis, direction=r, direction_name="random-0"), prompts)  # the null
    >>> out = vp.guide(lm, axis, prompts, "best-of-n", score="logprob")   # the log-probability baseline

``valueprobe guide --probe probes/smollm2-135m-reward-history --prompts data/... --policy prune --out runs/g``
runs it from the command line. The value of a token is read by a recorder on the read layer
(`valueprobe.hooks.route.record`) while the token is fed to the model, inside the forward that
gives the next token's logits: no second pass. What is read and pushed is one
`valueprobe.steering.hook.spec.SteeringSpec`: its read layer, its steered layers, unit, operator
and direction. Rollback's push is the steering handle (`valueprobe.steering.hook.handle.Steering`)
with one α per row, zero but in the ``steer_tokens`` after a rollback. Rows sample with common random numbers
(`valueprobe.steering.decode.sampling`): row (prompt p, sample s) draws from its own generator seeded by
``row_seed(seed, p, s)``, so its tokens do not depend on which rows share its batch, and the same
seed gives the axis, a null direction and the log-probability baseline the same candidates.
Tokens, log-probabilities and readings stay on the device between checkpoints (prune's every
``every`` tokens, `CHECK_EVERY` otherwise): the host looks at EOS, rollback and prune once per
checkpoint, in one copy, and decides as it would have every step (`_checkpoint`); best-of-n picks
at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm

from valueprobe.activations.prompts import Prompt
from valueprobe.errors import ValueprobeError
from valueprobe.guided.cache import CachedDecoder
from valueprobe.guided.policy import Policy, Prune, Rollback, as_policy
from valueprobe.guided.records import SCORES, Guided, tail_mean
from valueprobe.guided.rows import Row, prune_rows, rollback_due
from valueprobe.hooks.padding import pad_id_for
from valueprobe.hooks.route import Handle, Point, Recording, record
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.decode.sampling import Decoding, RowSampler, row_seed
from valueprobe.steering.hook.handle import Specified, Steering
from valueprobe.steering.hook.resident import OnDevice
from valueprobe.steering.hook.spec import SteeringSpec, as_spec

__all__ = ["SCORES", "Score", "guide", "pick"]

Score = Literal["sigma", "cos", "logprob"]


@dataclass(frozen=True)
class _Run:
    """What every chunk of one `guide` call shares."""

    policy: Policy
    score: str
    read: Point
    steer_layer: int
    direction_name: str
    eos: int | None
    decoding: Decoding


def _reading(direction: OnDevice, mu: float, sigma: float, h: Tensor) -> Tensor:
    """Per cell of ``h`` [batch, new, d_model]: (σ-score, cos) along the unit ``direction``, left
    on h's device (the direction goes there once; `_read` takes the step's one copy)."""
    h = h.detach().float()
    proj = h @ direction.on(h.device)
    norm = h.norm(dim=-1)
    cos = torch.where(norm > 0, proj / norm.clamp_min(1e-30), torch.zeros_like(proj))
    return torch.stack([(proj - mu) / sigma, cos], dim=-1)


def _read_stats(axis: ValueAxis, layer: int, score: str, policy: Policy) -> tuple[float, float]:
    """μ and σ of the axis at the read layer; σ-scores need them calibrated, cos does not."""
    if score == "sigma" or isinstance(policy, Rollback):
        return float(axis.mu[axis.layers.index(layer)]), axis.sigma_at(layer)
    i = axis.layers.index(layer)
    sigma = float(axis.sigma[i])
    return float(axis.mu[i]), sigma if sigma > 0 else float("nan")


def _check(
    lm: LoadedModel, spec: SteeringSpec, layer: int, *, score: str, decoding: Decoding, batch_size: int
) -> None:
    axis = spec.first_axis()
    if score not in SCORES:
        raise ValueprobeError(f"unknown score {score!r}: use one of {', '.join(SCORES)}")
    if decoding.max_new_tokens < 1 or batch_size < 1:
        raise ValueprobeError(
            f"max_new_tokens and batch_size must be >= 1, got {decoding.max_new_tokens} and {batch_size}"
        )
    if decoding.samples != 1 or decoding.min_new_tokens:
        raise ValueprobeError(
            "guided decoding takes N from its policy and stops rows itself: leave samples and min_new_tokens out"
        )
    if spec.positions != "all" or spec.window is not None:
        raise ValueprobeError(
            "guided decoding steers the tokens after a rollback: leave positions and window out"
        )
    if axis.d_model != lm.d_model:
        raise ValueprobeError(f"the axis is for d_model {axis.d_model} but the model has {lm.d_model}")
    if layer not in axis.layers:
        raise ValueprobeError(f"the axis has no layer {layer}: read at one of its layers {list(axis.layers)}")


def guide(
    lm: LoadedModel,
    spec: Specified,
    prompts: Sequence[Prompt],
    policy: Policy | str = "best-of-n",
    *,
    score: Score | str = "sigma",
    decoding: Decoding = Decoding(),
    batch_size: int = 32,
    progress: bool = True,
    chat: bool = True,
) -> list[Guided]:
    """Guided decoding of each prompt: one `Guided` record per prompt, in order.

    Args:
        lm: the loaded model.
        spec: what is read and pushed (`valueprobe.steering.hook.spec.SteeringSpec`; an axis
            means every default): the value is read at ``read_layer`` (default the first steered
            layer, so the axis's best), along ``direction`` if one is given (the random-direction
            null, with the axis's μ and σ); rollback's α pushes at the steered layers, in the
            spec's unit and with its operator. Results record ``direction_name`` (default ``axis``,
            or ``direction`` for an override).
        prompts: strings (a user turn through the chat template; ``chat=False``: as is), chats, or
            token ids (`valueprobe.activations.prompts.prompt_ids`).
        policy: ``best-of-n``, ``prune``, ``rollback`` (defaults) or a policy object
            (`valueprobe.guided.policy`: ``BestOfN(n=8, last_k=16)``, ``Prune(...)``, ``Rollback(...)``).
        score: what picks the candidate: ``sigma`` (mean σ-score, the default), ``cos`` (the paper's
            val(s), mean cos) or ``logprob`` (mean log-probability: the baseline); ties by log-probability.
        decoding: seed, max_new_tokens, greedy, temperature, top_p; N comes from the policy, with
            common random numbers per (prompt, sample).
        batch_size: rows per batch; whole prompts' N rows go together (siblings prune together).
    """
    policy = as_policy(policy)
    spec = as_spec(spec)
    axis = spec.first_axis()
    read = spec.read_at(lm.n_layers)
    _check(lm, spec, read, score=str(score), decoding=decoding, batch_size=batch_size)
    mu, sigma = _read_stats(axis, read, str(score), policy)
    spec.points(lm)  # the push's checks (layers, unit, operator), before any work
    vector = (axis.direction(read) if spec.direction is None else spec.direction).detach().float().cpu()
    if vector.shape != (lm.d_model,) or not bool(vector.norm() > 0):
        raise ValueprobeError(f"the read direction must be a non-zero vector of d_model {lm.d_model}")
    encoded = encode_prompts(lm, prompts, chat=chat)
    eos = getattr(lm.tokenizer, "eos_token_id", None)
    run = _Run(
        policy=policy,
        score=str(score),
        read=Point(read, axis.site),
        steer_layer=spec.steered_layers(lm.n_layers)[0],
        direction_name=spec.direction_name or ("axis" if spec.direction is None else "direction"),
        eos=None if eos is None else int(eos),
        decoding=decoding,
    )
    reduce = partial(_reading, OnDevice(vector / vector.norm()), mu, sigma)
    per_chunk = max(1, batch_size // policy.n)
    out: list[Guided] = []
    with tqdm(total=len(encoded), desc=f"guide {policy.name}", unit="prompt", disable=not progress) as bar:
        for start in range(0, len(encoded), per_chunk):
            chosen = range(start, min(start + per_chunk, len(encoded)))
            rows = [
                Row(p, s, None if decoding.greedy else row_seed(decoding.seed, p, s), encoded[p][-1])
                for p in chosen
                for s in range(policy.n)
            ]
            recording = record(lm, [run.read], reduce=reduce)
            steering = _steering(lm, spec, policy)
            with Handle().join(recording, *([steering] if steering is not None else [])):
                _decode(
                    lm, rows, [encoded[p] for p in chosen for _ in range(policy.n)], run, recording, steering
                )
            out.extend(_records(lm, rows, run, chosen))
            bar.update(len(chosen))
    return out


def _steering(lm: LoadedModel, spec: SteeringSpec, policy: Policy) -> Steering | None:
    """Rollback's push as the spec says, α per row (set each forward); none when nothing would
    steer, so best-of-n and prune carry only the read."""
    if not isinstance(policy, Rollback) or policy.alpha == 0 or policy.steer_tokens == 0:
        return None
    return Steering(lm, spec, 0.0).attach()


CHECK_EVERY = 16  # best-of-n and rollback: decode steps between the host's looks at EOS and rollback


@dataclass
class _Batch:
    """The live rows and what the device holds for them between two checkpoints.

    Attributes:
        rows: the live rows, in batch order. sampler: their settings and generators (None: greedy).
        uniforms: ``[all rows, draws]`` every row's uniforms, drawn and copied once per call.
        ids: ``[batch]`` each batch row's index into ``uniforms``; drawn: ``[batch]`` how many it used.
        token: ``[batch]`` the token each row feeds next.
    """

    rows: list[Row]
    sampler: RowSampler | None
    uniforms: Tensor | None
    ids: Tensor
    drawn: Tensor
    token: Tensor

    def pick(self, logits: Tensor) -> Tensor:
        """Each row's next token (argmax, or its own next uniform) from its logits, left on the device;
        returns ``[batch, 2]``: the token and its log-probability at T = 1, for the next checkpoint."""
        if self.sampler is None or self.uniforms is None:
            self.token = logits.argmax(-1)
        else:
            at = self.drawn.clamp(max=self.uniforms.shape[1] - 1)
            self.token = self.sampler.sample(logits, self.uniforms[self.ids, at])
        self.drawn = self.drawn + 1
        logp = torch.log_softmax(logits, dim=-1).gather(1, self.token[:, None]).squeeze(1)
        # float64 holds every token id and float32 log-prob exactly
        return torch.stack([self.token.double(), logp.double()], dim=-1)


def _draws(run: _Run) -> int:
    """Uniforms a row can use: every token it may sample (rolled-back ones too), plus what one
    chunk may draw past the row's end before the checkpoint sees it."""
    policy = run.policy
    again = policy.max_rollbacks * policy.k if isinstance(policy, Rollback) else 0
    return run.decoding.max_new_tokens + again + _interval(policy) + 1


def _interval(policy: Policy) -> int:
    return policy.every if isinstance(policy, Prune) else CHECK_EVERY


def _steps(rows: list[Row], run: _Run) -> int:
    """Decode steps until the next checkpoint: prune's fall where every live row has a multiple of
    ``every`` tokens (the rows stay in step), the others every `CHECK_EVERY`; none past the longest
    row's ``max_new_tokens``."""
    lengths = [len(r.tokens) for r in rows]
    steps = CHECK_EVERY
    if isinstance(run.policy, Prune):
        steps = (-lengths[0]) % run.policy.every or run.policy.every
    return max(1, min(steps, run.decoding.max_new_tokens - min(lengths)))


def _decode(
    lm: LoadedModel,
    rows: list[Row],
    prompts: list[list[int]],
    run: _Run,
    recording: Recording,
    steering: Steering | None,
) -> None:
    """The loop: prefill, then chunks of steps that feed one cell per row per forward, read and
    sample on the device; the host looks once per checkpoint (`_checkpoint`): EOS, rollback, prune.

    A row that ended or rolled back inside a chunk decodes on to its end; `_checkpoint` replays
    the chunk as the per-step loop would have run it and drops those steps (their cache cells are
    taken back, their uniforms drawn again), so the picks are those of a host decision every step."""
    decoder = CachedDecoder(lm, prompts, pad_id=pad_id_for(lm.tokenizer))
    d = run.decoding
    sampler = (
        None
        if d.greedy
        else RowSampler([int(r.seed or 0) for r in rows], temperature=d.temperature, top_p=d.top_p)
    )
    logits = decoder.prefill()
    values = recording.values[run.read]
    values.clear()
    if isinstance(run.policy, Rollback) and not decoder.croppable():
        decoder.unfeed(0, 0)  # refuses in one line, naming the cache that cannot be cropped
    first = torch.arange(len(rows), device=logits.device)
    batch = _Batch(
        rows=list(rows),
        sampler=sampler,
        uniforms=None if sampler is None else sampler.draws(_draws(run), logits.device),
        ids=first,
        drawn=torch.zeros_like(first),
        token=first,
    )
    takes = [batch.pick(logits)]
    index = {id(r): i for i, r in enumerate(rows)}
    alpha: list[float] | None = None
    while _checkpoint(batch, takes, values, run, decoder, index):
        takes = []
        for step in range(_steps(batch.rows, run)):
            alpha = _steer(steering, batch.rows, step, run.policy, alpha)
            takes.append(batch.pick(decoder.step(batch.token)))


def _steer(
    steering: Steering | None, rows: list[Row], step: int, policy: Policy, last: list[float] | None
) -> list[float] | None:
    """Rollback's α per row for this step of the chunk: on for a row's first ``steer_left`` steps
    (known at the checkpoint: a rollback later in the chunk drops the steps after it). Set only
    when it changes, so α goes to the device once per change, not once per step."""
    if steering is None:
        return last
    assert isinstance(policy, Rollback)
    alpha = [policy.alpha if r.steer_left > step else 0.0 for r in rows]
    if alpha != last:
        steering.alpha = torch.tensor(alpha)
    return alpha


def _checkpoint(
    batch: _Batch, takes: list[Tensor], values: list[Tensor], run: _Run, decoder: CachedDecoder, index: dict
) -> bool:
    """The host's look: the chunk's tokens, log-probs and readings in one copy, replayed row by
    row as the per-step loop did (`_replay`); then rollbacks' cells taken back, prune's rows
    dropped, the finished rows left; the live rows' next tokens and draw counts in one copy back.
    False when no row is left."""
    reads = [v[:, -1] for v in values]  # [rows, 2] per forward: (σ-score, cos) of the one new cell
    values.clear()
    host = torch.cat(
        [torch.stack(takes).flatten(), *([torch.stack(reads).double().flatten()] if reads else [])]
    )
    flat = host.tolist()
    n, rows = len(takes), len(batch.rows)
    took = [flat[2 * rows * j : 2 * rows * (j + 1)] for j in range(n)]
    read = [flat[2 * rows * (n + j) : 2 * rows * (n + j + 1)] for j in range(len(reads))]
    unfeed = _replay(batch.rows, took, [None] * (n - len(reads)) + read, run)
    for i, cells in unfeed.items():
        decoder.unfeed(i, cells)
    if isinstance(run.policy, Prune) and reads:
        _prune(batch.rows, run.policy, run.score)
    live = [i for i, r in enumerate(batch.rows) if not r.done]
    if not live:
        return False
    decoder.keep(live)
    batch.rows = [batch.rows[i] for i in live]
    batch.sampler = None if batch.sampler is None else batch.sampler.rows(live)
    state = [[index[id(r)], r.seq[r.fed], r.spent] for r in batch.rows]
    ids, batch.token, batch.drawn = torch.tensor(state, device=batch.ids.device).unbind(1)
    batch.ids = ids
    return True


def _replay(
    rows: list[Row], took: list[list[float]], read: list[list[float] | None], run: _Run
) -> dict[int, int]:
    """Each row through the chunk's steps as the per-step loop ran it: read the cell it fed (none
    for the prefill), roll back if due, else take the sampled token. A row that ends or rolls back
    skips the rest of the chunk; returns, per rolled-back row, the cells to take back (its own and
    the chunk's later ones)."""
    policy = run.policy
    beta = policy.beta if isinstance(policy, Rollback) else 0.0
    unfeed: dict[int, int] = {}
    for i, r in enumerate(rows):
        for j, (take, reading) in enumerate(zip(took, read, strict=True)):
            if reading is not None:
                r.fed += 1
                r.read(reading[2 * i], reading[2 * i + 1], beta)
                if isinstance(policy, Rollback) and rollback_due(r, policy):
                    unfeed[i] = r.roll_back(policy.k, policy) + len(took) - 1 - j
                    break
            r.take(int(take[2 * i]), take[2 * i + 1], eos=run.eos, max_new_tokens=run.decoding.max_new_tokens)
            if r.done:
                break
    return unfeed


def _prune(batch: list[Row], policy: Prune, score: str) -> None:
    """At a checkpoint where every live row has a multiple of ``every`` tokens (rows of a prune run
    stay in step), drop the rows below the quantile."""
    lengths = {len(r.tokens) for r in batch if not r.done}
    if len(lengths) != 1 or next(iter(lengths)) % policy.every:
        return
    for r in prune_rows(batch, policy, score):
        r.pruned_at = len(r.tokens)
        r.done = True


def pick(candidates: Sequence[Row], score: str, last_k: int | None) -> int:
    """The index of the best unpruned candidate: highest mean score (over the last ``last_k`` readings),
    then highest mean log-probability; NaN ranks last, the first index wins a full tie."""

    def key(i: int) -> tuple[float, float]:
        value = tail_mean(candidates[i].scores(score), last_k)
        logp = tail_mean(candidates[i].logprobs, None)
        return (value if value == value else float("-inf"), logp if logp == logp else float("-inf"))

    eligible = [i for i, r in enumerate(candidates) if r.pruned_at is None] or list(range(len(candidates)))
    return max(eligible, key=lambda i: (key(i), -i))


def _records(lm: LoadedModel, rows: list[Row], run: _Run, prompts: Sequence[int]) -> list[Guided]:
    out = []
    settings = {k: v for k, v in asdict(run.policy).items() if k != "name"}
    for p in prompts:
        mine = [r for r in rows if r.prompt == p]
        best = pick(mine, run.score, run.policy.last_k)
        candidates = tuple(
            r.candidate(lm.tokenizer.decode(r.tokens, skip_special_tokens=True), run.policy.last_k)
            for r in mine
        )
        out.append(
            Guided(
                prompt=p,
                policy=run.policy.name,
                score=run.score,
                direction=run.direction_name,
                read_layer=run.read.layer,
                steer_layer=run.steer_layer,
                chosen=best,
                text=candidates[best].text,
                token_ids=candidates[best].token_ids,
                tokens_spent=sum(c.tokens_spent for c in candidates),
                rollbacks=sum(c.rollbacks for c in candidates),
                candidates=candidates,
                settings=settings,
            )
        )
    return out
