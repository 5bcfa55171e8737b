"""Records all the way: every result record round-trips through its JSON, and the committed ones
under probes/ read back and re-serialise to the same bytes.

For each record ``R``, hypothesis draws ``x`` from the field annotations and checks
``R.from_dict(json(x.to_dict())) == x`` and that the JSON written again is the same text.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from valueprobe.activations.manifest import StoreManifest
from valueprobe.attribute.records import Attribution
from valueprobe.errors import ValueprobeError
from valueprobe.files import from_jsonable, jsonable, record_from_dict
from valueprobe.guided.budget import GuideBudget, GuideReplication
from valueprobe.guided.records import Candidate, Guided, GuideSummary
from valueprobe.model.adapter import TunedBase
from valueprobe.probe.axis import ProbeRef
from valueprobe.probe.contrast import Contrast, MatchedControl
from valueprobe.probe.layer_sweep import LayerSweepSummary
from valueprobe.probe.transfer import AxisEvaluation, TransferSummary
from valueprobe.read.readout import LogitLens
from valueprobe.read.scores import ScoreResult
from valueprobe.records import Record
from valueprobe.replicate.dpo_words import WordsReport
from valueprobe.replicate.safety import SafetyReport
from valueprobe.replicate.steer import ReplicateSteer
from valueprobe.replicate.steer_eval import BenchEval, SteerEvaluation
from valueprobe.report.sections import ShiftSection, SteerSection, TracedText
from valueprobe.stats.metrics import MeanSd, Slope
from valueprobe.steering.decode.generation import Generation, Trace
from valueprobe.steering.experiment.baseline import PromptBaseline
from valueprobe.steering.experiment.caa_result import CaaBehaviour, CaaReplication
from valueprobe.steering.experiment.dose import Curve, Effect, SteerSweep, SweepRow
from valueprobe.steering.experiment.front import Front
from valueprobe.steering.experiment.reliability import Reliability
from valueprobe.steering.experiment.search import SteerSearch
from valueprobe.steering.experiment.settings import SweepSettings
from valueprobe.steering.experiment.side_effects import SideEffects, SideMetric
from valueprobe.steering.hook.operators import Operator
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.tune.shift_records import ShiftResult
from valueprobe.tune.train import TuneRecord
from valueprobe.vocab import ShardSpec, Unit

PROBES = Path(__file__).resolve().parents[1] / "probes"

FINITE = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=6)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | FINITE | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
JSON_OBJECTS = st.dictionaries(TEXT, JSON_VALUES, max_size=3)


def values(tp: Any, overrides: dict[type, dict[str, st.SearchStrategy]]) -> st.SearchStrategy:
    """Values of the annotated type ``tp``, finite floats, records built field by field."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else values(a, overrides) for a in args))
    if origin is Literal:
        return st.sampled_from(args)
    if tp is float:
        return FINITE
    if tp is int:
        return st.integers(-50, 10_000)
    if tp is bool:
        return st.booleans()
    if tp is str:
        return TEXT
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(values(args[0], overrides), max_size=3).map(tuple)
        return st.tuples(*(values(a, overrides) for a in args))
    if origin is list:
        return st.lists(values(args[0], overrides), max_size=3)
    if origin is dict:
        return st.dictionaries(values(args[0], overrides), values(args[1], overrides), max_size=3)
    if tp is dict:
        return JSON_OBJECTS
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return records(tp, overrides)
    if tp is Any:
        return JSON_VALUES
    raise TypeError(f"no strategy for {tp!r}")


def records(
    cls: type, overrides: dict[type, dict[str, st.SearchStrategy]] | None = None
) -> st.SearchStrategy:
    overrides = overrides or {}
    hints = get_type_hints(cls)
    given_ = overrides.get(cls, {})
    fields = {
        f.name: given_[f.name] if f.name in given_ else values(hints[f.name], overrides)
        for f in dataclasses.fields(cls)
        if f.init
    }
    return st.builds(cls, **fields)


def through_json(d: dict) -> dict:
    """What a reader of the written file gets: strict JSON text, parsed."""
    return json.loads(json.dumps(jsonable(d), allow_nan=False))


def text(d: dict) -> str:
    return json.dumps(jsonable(d), indent=2, allow_nan=False)


NO_RECORDS = {ShiftResult: {"records": st.just(())}}  # safety's results.json leaves them out
# A sweep's steering spec, as settings.json can say it (its probe named, no control direction).
OPERATORS = (Operator(), Operator("ablate"), Operator("clamp", lo=-1.0), Operator("set", target=0.5))
SPECS = {
    SweepSettings: {
        "spec": st.builds(
            SteeringSpec,
            probe=st.text(min_size=1, max_size=6),
            layers=st.none() | st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple),
            unit=st.sampled_from(list(Unit)),
            op=st.sampled_from(OPERATORS),
            positions=st.sampled_from(["all", "prompt", "generated"]),
        )
    }
}

ROUND_TRIP: list[tuple[type, st.SearchStrategy]] = [
    (MeanSd, records(MeanSd)),
    (ProbeRef, records(ProbeRef)),
    (Slope, records(Slope)),
    (Curve, records(Curve)),
    (Effect, records(Effect)),
    (SteerSweep, records(SteerSweep, SPECS)),
    (SweepRow, records(SweepRow)),
    (SweepSettings, records(SweepSettings, SPECS)),
    (Trace, records(Trace)),
    (Generation, records(Generation)),
    (AxisEvaluation, records(AxisEvaluation)),
    (Contrast, records(Contrast)),
    (MatchedControl, records(MatchedControl)),
    (LayerSweepSummary, records(LayerSweepSummary)),
    (TransferSummary, records(TransferSummary)),
    (ShiftResult, records(ShiftResult)),
    (TuneRecord, records(TuneRecord)),
    (WordsReport, records(WordsReport)),
    (ReplicateSteer, records(ReplicateSteer, SPECS)),
    (SafetyReport, records(SafetyReport, NO_RECORDS)),
    (LogitLens, records(LogitLens)),
    (TracedText, records(TracedText)),
    (SteerSection, records(SteerSection, SPECS)),
    (ShiftSection, records(ShiftSection)),
    # the steering evaluation's, guided decoding's and attribution's records (the record base)
    (PromptBaseline, records(PromptBaseline)),
    (Front, records(Front)),
    (Reliability, records(Reliability)),
    (SideMetric, records(SideMetric)),
    (SideEffects, records(SideEffects)),
    (BenchEval, records(BenchEval)),
    (SteerEvaluation, records(SteerEvaluation)),
    (SteerSearch, records(SteerSearch)),
    (CaaBehaviour, records(CaaBehaviour, SPECS)),
    (CaaReplication, records(CaaReplication, SPECS)),
    (TunedBase, records(TunedBase)),
    (Candidate, records(Candidate)),
    (Guided, records(Guided)),
    (GuideSummary, records(GuideSummary)),
    (GuideBudget, records(GuideBudget)),
    (GuideReplication, records(GuideReplication)),
    (Attribution, records(Attribution)),
]


@pytest.mark.parametrize(("cls", "strategy"), ROUND_TRIP, ids=[c.__name__ for c, _ in ROUND_TRIP])
def test_record_round_trips_through_its_json(cls, strategy):
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(strategy)
    def check(x):
        d = through_json(x.to_dict())
        y = cls.from_dict(d)
        assert y == x
        assert text(y.to_dict()) == text(x.to_dict())
        # fields that equality skips (curves, metrics, settings, trace) round-trip too
        assert through_json(y.to_dict()) == d

    check()


@settings(max_examples=40, deadline=None)
@given(records(ScoreResult, {ScoreResult: {"records": st.lists(JSON_OBJECTS, max_size=3).map(tuple)}}))
def test_score_result_round_trips_with_its_csv_rows(x):
    y = ScoreResult.from_dict(through_json(x.to_dict()), records=x.records)
    assert y == x and text(y.to_dict()) == text(x.to_dict())


def test_score_result_refuses_rows_the_summary_does_not_count():
    d = {"probe": {}, "layer": 3, "tokens": "all", "summary": [], "n_examples": 2}
    with pytest.raises(ValueprobeError, match="counts 2 examples but 1 rows"):
        ScoreResult.from_dict(d, records=[{"id": "a"}])


@settings(max_examples=40, deadline=None)
@given(
    records(
        StoreManifest,
        {
            StoreManifest: {
                "n_layers": st.integers(1, 100),  # a model has a layer
                # a part is shard I of N with 0 <= I < N, as --shard accepts it
                "part": st.none()
                | st.integers(1, 64).flatmap(
                    lambda n: st.builds(ShardSpec, st.integers(0, n - 1), st.just(n))
                ),
            }
        },
    )
)
def test_store_manifest_round_trips(x):
    y = StoreManifest.from_dict(through_json(x.to_dict()), where=Path("manifest.json"))
    assert y == x and text(y.to_dict()) == text(x.to_dict())


def test_from_jsonable_reads_each_annotation():
    assert from_jsonable(tuple[float, float], [0.5, None])[0] == 0.5
    assert math.isnan(from_jsonable(tuple[float, float], [0.5, None])[1])
    assert from_jsonable(float | None, None) is None  # an optional figure stays absent
    assert from_jsonable(dict[int, tuple[int, ...]], {"3": [1, 2]}) == {3: (1, 2)}
    assert from_jsonable(MeanSd | None, {"mean": 1.0, "sd": 0.0}) == MeanSd(1.0, 0.0)
    with pytest.raises(ValueprobeError, match=r"MeanSd: a field is missing"):
        record_from_dict(MeanSd, {"mean": 1.0})
    with pytest.raises(ValueprobeError, match=r"Slope\.ci: unreadable value"):
        record_from_dict(Slope, {"slope": 1.0, "ci": 3, "n_prompts": 1, "n_rows": 1})
    # unknown keys are ignored: a newer writer may add some
    assert record_from_dict(MeanSd, {"mean": 1.0, "sd": 2.0, "median": 0.0}) == MeanSd(1.0, 2.0)


# ---- the committed records under probes/ ---------------------------------------------------------


def summary_json(d: dict) -> str:
    """How `valueprobe.files.write_summary` writes results.json."""
    return json.dumps(d, indent=2, default=float) + "\n"


@pytest.mark.parametrize(
    ("folder", "cls", "dump"),
    [
        ("dpo-words-smollm2-135m", WordsReport, summary_json),
        ("safety-smollm2-135m", SafetyReport, summary_json),
        # replicate steer writes strict JSON (NaN -> null)
        ("steering-smollm2-135m", ReplicateSteer, lambda d: json.dumps(jsonable(d), indent=2) + "\n"),
    ],
)
def test_committed_results_read_back_to_the_same_bytes(folder, cls, dump):
    path = PROBES / folder / "results.json"
    written = path.read_text()
    record = cls.from_dict(json.loads(written))
    assert dump(record.to_dict()) == written


METRICS = {
    "sweep": LayerSweepSummary,
    "transfer": TransferSummary,
    "icrl_matched_control": MatchedControl,
    "logit_lens": LogitLens,
}


@pytest.mark.parametrize("folder", ["smollm2-135m-value", "smollm2-135m-reward-history"])
def test_committed_probe_metrics_read_back_to_the_same_bytes(folder):
    path = PROBES / folder / "probe.json"
    written = path.read_text()
    info = json.loads(written)
    metrics = info["metrics"]
    read = [k for k in METRICS if k in metrics]
    assert "sweep" in read
    for key in read:
        metrics[key] = METRICS[key].from_dict(metrics[key]).to_dict()
    if "evaluated_on" in metrics:
        metrics["evaluated_on"] = {
            k: AxisEvaluation.from_dict(v).to_dict() for k, v in metrics["evaluated_on"].items()
        }
    # how ValueAxis.save writes probe.json
    assert json.dumps(jsonable(info), indent=2, sort_keys=True, allow_nan=False) + "\n" == written


def test_committed_steering_summary_is_the_markdown_of_its_record():
    # the record read back describes the run exactly as it was written (settings included)
    folder = PROBES / "steering-smollm2-135m"
    record = ReplicateSteer.from_dict(json.loads((folder / "results.json").read_text()))
    assert record.markdown() == (folder / "summary.md").read_text()


# ---- the record base: what a class says instead of a hand-written to_dict / from_dict ----------


class Colour(enum.StrEnum):
    red = "red"


@dataclasses.dataclass(frozen=True)
class _Inner(Record):
    alphas: tuple[float, ...]
    KEYS = {"alphas": "alpha"}


@dataclasses.dataclass(frozen=True)
class _Outer(Record):
    FORMAT = "valueprobe.test"
    FORMAT_VERSION = 2
    OMIT = {"note": None}
    INLINE = ("inner",)

    colour: Colour
    where: Path
    by_layer: dict[int, _Inner]
    inner: _Inner
    note: str | None = None


def test_record_base_derives_the_json_the_class_says():
    x = _Outer(Colour.red, Path("a/b"), {3: _Inner((1.0,))}, _Inner((0.5, 2.0)))
    d = x.to_dict()
    assert list(d) == ["format", "format_version", "colour", "where", "by_layer", "alpha"]
    assert d["colour"] == "red" and d["where"] == "a/b" and d["by_layer"] == {"3": {"alpha": [1.0]}}
    assert _Outer.from_dict(through_json(d)) == x
    noted = dataclasses.replace(x, note="n")
    assert noted.to_dict()["note"] == "n" and _Outer.from_dict(noted.to_dict()) == noted
    # a format this version does not read is refused in one line, naming the file
    with pytest.raises(ValueprobeError, match=r"^x\.json: format_version 3 is newer than this valueprobe"):
        _Outer.from_dict({**d, "format_version": 3}, where="x.json")
    with pytest.raises(ValueprobeError, match="not a valueprobe.test file"):
        _Outer.from_dict({**d, "format": "other"})


def test_a_first_format_1_manifest_reads_with_the_keys_added_later():
    from valueprobe.activations.manifest import FORMAT, DatasetInfo
    from valueprobe.vocab import ChatTemplate, Dtype

    # a store written before dtype, chat templates, n_layers and dataset info were recorded
    d = {"format": FORMAT, "version": 1, "model_id": "m", "fingerprint": "f", "layers": [0, 2]}
    d |= {"include_embed": False, "site": "resid_post", "positions": "last", "d_model": 8}
    m = StoreManifest.from_dict(d, where=Path("manifest.json"))
    assert (m.n_layers, m.dtype, m.chat_template, m.valueprobe_version) == (
        3,
        Dtype.float16,
        ChatTemplate.model,
        "unknown",
    )
    assert m.dataset == DatasetInfo(None, None, None) and m.shards == () and not m.complete and m.part is None
    with pytest.raises(ValueprobeError, match="v0 is not .* capture it again"):
        StoreManifest.from_dict({**d, "version": 0}, where=Path("manifest.json"))
    with pytest.raises(ValueprobeError, match="^manifest.json: store format_version 2 is newer"):
        StoreManifest.from_dict({**d, "format_version": 2}, where=Path("manifest.json"))
    with pytest.raises(ValueprobeError, match="^manifest.json: .*d_model"):
        StoreManifest.from_dict({k: v for k, v in d.items() if k != "d_model"}, where=Path("manifest.json"))
