"""Layer sweep, grouped splits, controls, transfer matrix and fit_probe on planted stores."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from valueprobe.activations.capture import CaptureSettings, Rows
from valueprobe.activations.manifest import DatasetInfo, StoreManifest
from valueprobe.errors import ValueprobeError
from valueprobe.model.fingerprint import FingerprintWarning
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.fit import fit_probe
from valueprobe.probe.layer_sweep import fit_store, sweep_layers
from valueprobe.probe.source import Source, grouped_splits
from valueprobe.probe.transfer import transfer_matrix
from valueprobe.report.plots import layer_cosine_figure, sweep_figure, transfer_heatmap
from valueprobe.vocab import ChatTemplate, Dtype, Positions, Site

D = 16
V = np.linalg.qr(np.random.default_rng(99).standard_normal((D, 2)))[0].T  # two orthonormal directions


class FakeStore:
    """In-memory stand-in with the ActivationStore interface, served in shards."""

    def __init__(
        self, name: str, acts: dict, rows: Rows, *, shard_rows: int = 64, fingerprint: str = "f" * 16
    ):
        self.path = Path("/stores") / name
        layers = tuple(k for k in acts if k != "embed")
        self.manifest = StoreManifest(
            model_id="tiny",
            fingerprint=fingerprint,
            layers=layers,
            include_embed="embed" in acts,
            site=Site.resid_post,
            positions=Positions.spans,
            span_labels=None,
            group_by=None,
            dtype=Dtype.float16,
            examples_per_shard=shard_rows,
            chat_template=ChatTemplate.model,
            d_model=next(iter(acts.values())).shape[1],
            n_layers=max(layers) + 1,
            dataset=DatasetInfo(f"data/{name}.jsonl", "0" * 64, len(rows)),
            valueprobe_version="test",
        )
        self._acts, self._rows, self._shard = acts, rows, shard_rows

    def rows(self) -> Rows:
        return self._rows

    def iter_shards(self, layers=None):
        layers = list(self._acts) if layers is None else layers
        for k in layers:
            if k not in self._acts:
                raise ValueprobeError(f"store {self.path} has no layer {k!r}")
        for a in range(0, len(self._rows), self._shard):
            idx = np.arange(a, min(len(self._rows), a + self._shard))
            yield {k: self._acts[k][idx].astype(np.float16) for k in layers}, self._rows.select(idx)


def icrl_store(
    name: str = "icrl",
    *,
    n_groups: int = 12,
    convs: int = 6,
    delta=(0.0, 1.0, 2.0),
    direction: int = 0,
    seed: int = 0,
    mode: str = "span",
    position_confound: bool = False,
    **kw,
) -> FakeStore:
    """Per group (rule) `convs` conversations, each a pre and a post span row; the signal is
    planted along V[direction] with strength delta[layer]; layer key "embed" carries none."""
    rng = np.random.default_rng(seed)
    eid, grp, span, label, tok = [], [], [], [], []
    for g in range(n_groups):
        for c in range(convs):
            for s in ("pre", "post"):
                eid.append(f"{name}-{g}-{c}" if mode == "span" else f"{name}-{g}-{c}-{s}")
                grp.append(f"rule{g}")
                span.append(s if mode == "span" else "")
                label.append(1.0 if mode == "span" or s == "post" else 0.0)
                tok.append((40 if s == "post" else 10) + c if position_confound else int(rng.integers(0, 50)))
    y = np.array([s == "post" for s in span]) if mode == "span" else np.array(label) > 0.5
    n = len(y)
    rows = Rows(
        eid,
        np.array(label),
        grp,
        span,
        np.array(tok, dtype=np.int64),
        np.full(n, 100, dtype=np.int64) if not position_confound else np.array(tok, dtype=np.int64) * 2,
    )
    acts = {
        layer: rng.standard_normal((n, D)) + np.outer(y - 0.5, V[direction]) * dlt + 5.0
        for layer, dlt in enumerate(delta)
    }
    acts["embed"] = rng.standard_normal((n, D))
    return FakeStore(name, acts, rows, **kw)


@settings(max_examples=40, deadline=None)
@given(
    n_groups=st.integers(3, 30),
    n_splits=st.integers(1, 4),
    seed=st.integers(0, 1000),
    frac=st.floats(0.1, 0.4),
)
def test_grouped_splits_never_leak_a_group(n_groups, n_splits, seed, frac):
    groups = np.repeat([f"g{i}" for i in range(n_groups)], 4)
    y = np.tile([True, False], 2 * n_groups)
    if n_groups - 2 * max(1, round(frac * n_groups)) < 1:  # nothing left to train on: a clear error
        with pytest.raises(ValueprobeError, match="too few to hold out"):
            grouped_splits(groups, y, val_frac=frac, test_frac=frac)
        return
    for sp in grouped_splits(groups, y, n_splits=n_splits, val_frac=frac, test_frac=frac, seed=seed):
        assert not (sp.train & sp.val or sp.train & sp.test or sp.val & sp.test)
        assert sp.train | sp.val | sp.test == set(groups)
        assert sp.train and sp.val and sp.test


def test_grouped_splits_bad_input():
    y = np.array([True, False] * 2)
    with pytest.raises(ValueprobeError, match="only 2 groups"):
        grouped_splits(np.array(["a", "a", "b", "b"]), y)
    with pytest.raises(ValueprobeError, match="train 0"):
        grouped_splits(np.repeat(["a", "b", "c", "d"], 2), np.tile([True, False], 4), train_groups=0)
    # one class per group: held-out parts cannot hold both classes when only one group has successes
    groups = np.array(["pos", "n1", "n2", "n3"])
    with pytest.raises(ValueprobeError, match="both classes"):
        grouped_splits(groups, np.array([True, False, False, False]))


def test_sweep_finds_the_planted_layer_with_controls_at_chance():
    store = icrl_store(n_groups=20, convs=10)
    sweep = sweep_layers(store, method="diff_means", n_splits=4, seed=1)
    assert sweep.best_layer == 2
    assert sweep.best_layer == sweep.layers[int(np.argmax(sweep.val_auroc.mean(axis=1)))]  # picked on val
    assert sweep.chosen_layers == (2, 2, 2, 2)
    assert sweep.heldout_auroc.mean() == pytest.approx(norm.cdf(2.0 / np.sqrt(2)), abs=0.04)
    assert abs(sweep.test_auroc[0].mean() - 0.5) < 0.1  # layer 0 carries no signal
    controls = sweep.controls()
    assert set(controls) == {
        "shuffled",
        "random",
        "embed",
        "position:token_index",
        "position:relative_index",
        "position:n_tokens",
    }
    for name in ("shuffled", "embed", "position:n_tokens"):
        assert abs(controls[name].mean() - 0.5) < 0.12, name
    assert sweep.margin > 0.2
    # the directions of layers 1 and 2 agree, layer 0 is noise
    assert sweep.cosine[1, 2] > 0.8 and abs(sweep.cosine[0, 2]) < 0.6
    axis = sweep.axis
    assert axis.best_layer == 2 and axis.layers == (0, 1, 2)
    assert float(axis.direction(2).double() @ __import__("torch").tensor(V[0])) > 0.95
    ref = store._acts[2].astype(np.float16).astype(np.float64) @ axis.direction(2).double().numpy()
    assert float(axis.mu[2]) == pytest.approx(ref.mean(), rel=1e-4)
    assert float(axis.sigma[2]) == pytest.approx(ref.std(), rel=1e-4)
    norms = np.linalg.norm(store._acts[2].astype(np.float16).astype(np.float64), axis=1).mean()
    assert float(axis.mean_norm[2]) == pytest.approx(norms, rel=1e-4)
    assert sweep.to_dict()["best_layer"] == 2 and axis.metrics == {}  # fit_probe records the sweep
    headers, rows = sweep.table()
    assert rows[2][0] == "2 *" and len(headers) == len(rows[0])
    assert "margin" in sweep.summary()


def test_position_confound_is_exposed_by_the_controls():
    """No value signal anywhere, but post spans sit later in the text: the position control wins."""
    store = icrl_store(n_groups=12, delta=(0.0, 0.0), position_confound=True)
    sweep = sweep_layers(store, method="span_diff", n_splits=3)
    assert sweep.strongest_control[0].startswith("position:")
    assert sweep.controls()["position:token_index"].mean() == 1.0
    assert sweep.margin < -0.3


def test_label_mode_and_methods_run_on_stores():
    store = icrl_store(mode="label")
    src = Source(store)
    assert src.keep.all() and src.y.sum() == len(src.y) / 2
    for method in ("lda", "logistic", "paired_pca", "span_diff"):
        sweep = sweep_layers(store, method=method, n_splits=2, layers=[2])
        assert sweep.heldout_auroc.mean() > 0.85, method


def test_fit_store_streams_and_equals_in_memory_fit():
    from valueprobe.probe.fitters import DiffMeans

    store = icrl_store(shard_rows=7)
    axis = fit_store(store, method="diff_means", layers="1:3")
    assert axis.layers == (1, 2) and axis.best_layer == 2
    assert axis.metrics["best_layer_rule"] == "in-sample Cohen's d"
    x = store._acts[2].astype(np.float16)
    y = np.array([s == "post" for s in store.rows().span])
    ref = DiffMeans().update(x, y).fit().unit
    np.testing.assert_allclose(axis.direction(2).double().numpy(), ref, atol=1e-6)
    assert fit_store(store, layers=[-1]).layers == (2,)
    assert fit_store(store, layers="-2:").layers == (1, 2)
    assert fit_store(store, layers="0,-1").layers == (0, 2)


def test_store_bad_input_is_one_clear_error():
    store = icrl_store()
    with pytest.raises(ValueprobeError, match="layer 7 out of range: this model has 3 layers"):
        sweep_layers(store, layers=[7])
    gappy = icrl_store()
    del gappy._acts[1]
    gappy.manifest = replace(gappy.manifest, layers=(0, 2))
    with pytest.raises(ValueprobeError, match="no layer 1; layers shared by the stores: 0, 2"):
        sweep_layers(gappy, layers="0:2")
    with pytest.raises(ValueprobeError, match="bad layer range 'a:b'"):
        fit_store(store, layers="a:b")
    bad = icrl_store()
    bad._acts[1][[5, 9]] = np.inf
    with pytest.raises(
        ValueprobeError, match=r"layer 1: NaN or inf in 2 rows \(examples \['icrl-0-2', 'icrl-0-4'\]\)"
    ):
        fit_store(bad, layers=[1])
    one_class = icrl_store(mode="label")
    one_class._rows = Rows(
        one_class._rows.example_id,
        np.ones(len(one_class._rows)),
        one_class._rows.group,
        one_class._rows.span,
        one_class._rows.token_index,
        one_class._rows.n_tokens,
    )
    with pytest.raises(ValueprobeError, match="single class"):
        fit_store(one_class)
    with pytest.raises(ValueprobeError, match="only 2 groups"):
        sweep_layers(icrl_store(n_groups=2))
    with pytest.warns(FingerprintWarning, match="other weights"):  # e.g. a base and a fine-tuned model
        Source([icrl_store("a"), icrl_store("b", fingerprint="e" * 16)])
    with pytest.raises(ValueprobeError, match="different architectures"):
        Source(
            [
                icrl_store("a", fingerprint="a" * 16 + "-" + "f" * 16),
                icrl_store("b", fingerprint="b" * 16 + "-" + "f" * 16),
            ]
        )
    no_embed = icrl_store()
    del no_embed._acts["embed"]
    no_embed.manifest = replace(no_embed.manifest, include_embed=False)
    assert sweep_layers(no_embed, n_splits=2, layers=[2]).embed_auroc is None


def test_transfer_matrix_separates_shared_and_unrelated_directions():
    stores = {
        "icrl": icrl_store("icrl", seed=1),
        "code": icrl_store("code", seed=2, mode="label"),
        "other": icrl_store("other", seed=3, direction=1),
    }
    tr = transfer_matrix(stores, layer=2, n_splits=3)
    assert tr.families == ("icrl", "code", "other")
    assert tr.auroc[0, 1] > 0.8 and tr.auroc[1, 0] > 0.8
    assert abs(tr.auroc[0, 2] - 0.5) < 0.15 and abs(tr.auroc[2, 1] - 0.5) < 0.15
    assert np.all(np.diag(tr.auroc) > 0.8)  # held-out within family
    assert tr.cosine[0, 1] > 0.8 and abs(tr.cosine[0, 2]) < 0.4
    np.testing.assert_allclose(np.diag(tr.cosine), 1.0)
    assert set(tr.controls()) == {
        "embed",
        "shuffled",
        "random",
        "position:token_index",
        "position:relative_index",
        "position:n_tokens",
    }
    assert np.isfinite(np.stack(list(tr.controls().values()))).all()
    assert tr.margin[0, 1] > 0.2
    headers, rows = tr.table()
    assert len(rows) == 9 and rows[0][1] == "icrl (held-out)"
    transfer_heatmap(tr)
    transfer_heatmap(tr, metric="margin")
    with pytest.raises(ValueprobeError, match="at least two"):
        transfer_matrix({"icrl": stores["icrl"]}, layer=2)


def test_fit_probe_writes_an_artifact_with_sweep_and_transfer(tmp_path):
    report = fit_probe(
        {"icrl": icrl_store("icrl"), "code": icrl_store("code", seed=5, mode="label")}, n_splits=2
    )
    assert report.transfer is not None and "transfer at layer" in report.summary()
    axis = report.axis
    assert set(axis.metrics) == {"sweep", "transfer"}
    assert [d["name"] for d in axis.datasets] == ["icrl", "code"]
    axis.save(tmp_path / "probe")
    loaded = ValueAxis.load(tmp_path / "probe")
    assert loaded.metrics == axis.metrics and loaded.datasets == axis.datasets
    sweep_figure(report.sweep)
    layer_cosine_figure(report.sweep)


def test_real_store_from_a_tiny_model(tiny_lm_factory, tmp_path):
    """End to end through capture_to_store: ICRL-style spans, fit, save, load against the model."""
    from valueprobe.activations.store import capture_to_store
    from valueprobe.datasets.io import Example, Span

    lm = tiny_lm_factory("llama")
    examples = []
    for i in range(12):
        text = f"Rule attempt {i}: wrong answer again. Wait, that's right: yes {i} works!"
        cut = text.index("Wait")
        examples.append(
            Example(
                id=f"c{i}",
                label=1.0,
                group=f"rule{i % 4}",
                text=text,
                spans=(Span(0, cut, "pre"), Span(cut, len(text), "post")),
            )
        )
    store = capture_to_store(
        lm,
        examples,
        tmp_path / "store",
        CaptureSettings(layers="all", positions="spans", include_embed=True),
        dtype="float32",
        progress=False,
    )
    report = fit_probe(str(tmp_path / "store"), method="span_diff", n_splits=2, val_frac=0.25, test_frac=0.25)
    report.axis.save(tmp_path / "probe")
    axis = ValueAxis.load(tmp_path / "probe", lm=lm)
    assert axis.layers == store.manifest.layers and axis.d_model == lm.d_model
    assert axis.fingerprint == lm.fingerprint

    # Values, recomputed from what was written: one example's span rows against output_hidden_states
    # (a token belongs to the span holding its first character), then the saved axis direction
    # against SpanDiff by hand on store.acts: mean over conversations of post − pre, normalized.
    layer = 1
    acts, rows = store.acts(layer), store.rows()
    where = {(e, s): i for i, (e, s) in enumerate(zip(rows.example_id, rows.span, strict=True))}
    assert len(where) == len(acts) == 2 * len(examples)
    for ex in examples[:2]:
        enc = lm.tokenizer(ex.text, return_offsets_mapping=True)
        with torch.no_grad():
            out = lm.model(input_ids=torch.tensor([enc["input_ids"]]), output_hidden_states=True)
        h = out.hidden_states[layer + 1][0].double().numpy()  # resid_post[layer]
        for span in ex.spans:
            toks = [
                t for t, (a, b) in enumerate(enc["offset_mapping"]) if b > a and span.start <= a < span.end
            ]
            np.testing.assert_allclose(acts[where[ex.id, span.label]], h[toks].mean(0), atol=1e-5, rtol=0)
    for layer in axis.layers:
        a = store.acts(layer).astype(np.float64)
        v = np.mean([a[where[ex.id, "post"]] - a[where[ex.id, "pre"]] for ex in examples], axis=0)
        np.testing.assert_allclose(
            axis.direction(layer).double().numpy(), v / np.linalg.norm(v), atol=1e-5, rtol=0
        )


def test_relative_position_control_catches_within_paragraph_order():
    """Post spans always follow pre spans in the same conversation, but conversations differ in
    length: absolute token index barely separates them, position within the example does."""
    store = icrl_store(n_groups=12, delta=(0.0, 0.0))
    rng = np.random.default_rng(1)
    r = store._rows
    base = {e: int(rng.integers(0, 2000)) for e in r.example_id}
    tok = np.array([base[e] + (30 if s == "post" else 0) for e, s in zip(r.example_id, r.span, strict=True)])
    store._rows = Rows(r.example_id, r.label, r.group, r.span, tok, r.n_tokens)
    sweep = sweep_layers(store, method="span_diff", n_splits=3)
    controls = {k: v.mean() for k, v in sweep.controls().items()}
    assert controls["position:relative_index"] == 1.0
    assert controls["position:token_index"] < 0.7
    assert sweep.strongest_control[0] == "position:relative_index" and sweep.margin < -0.3
