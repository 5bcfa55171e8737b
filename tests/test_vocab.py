"""The one layer-spec parser: the capture path and the fit path agree on every spec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_probe_sweep import icrl_store

from valueprobe.errors import ValueprobeError
from valueprobe.probe.layer_sweep import fit_store
from valueprobe.probe.source import Source, resolve_layers
from valueprobe.vocab import LayerSelection, Site, choice, layer_ranges, parse_layers

N = 8


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("::2", [0, 2, 4, 6]),
        ("-4:", [4, 5, 6, 7]),
        ("3,5,-1", [3, 5, 7]),
        ("1:7:3", [1, 4]),
        (None, list(range(N))),
    ],
)
def test_capture_and_fit_read_a_spec_alike(tiny_lm_factory, spec, want):
    lm = tiny_lm_factory("llama", n_layers=N)
    store = icrl_store(delta=tuple(0.5 * i for i in range(N)))
    assert parse_layers(spec, n_layers=lm.n_layers) == want  # the capture path
    assert LayerSelection.parse(spec).resolve(lm.n_layers) == want  # the CLI's: syntax first, range later
    assert resolve_layers(spec, Source(store)) == want  # the fit path
    assert fit_store(store, layers=spec).layers == tuple(want)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 40),
    parts=st.lists(
        st.one_of(
            st.integers(-45, 45).map(str),
            st.tuples(
                st.one_of(st.none(), st.integers(-45, 45)),
                st.one_of(st.none(), st.integers(-45, 45)),
                st.one_of(st.none(), st.integers(1, 5)),
            ).map(lambda t: ":".join("" if x is None else str(x) for x in t)),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_parse_layers_is_python_indexing(n, parts):
    """Each part selects what ``range(n)[part]`` selects; a spec that selects nothing valid is one error."""
    spec = ",".join(parts)
    want: set[int] = set()
    ok = True
    for part in parts:
        if ":" in part:
            bounds = [int(b) if b else None for b in part.split(":")]
            if any(b is not None and not -n <= b <= n for b in bounds[:2]):
                ok = False
                continue
            picked = list(range(n))[slice(*bounds)]
            ok &= bool(picked)
            want |= set(picked)
        else:
            i = int(part)
            ok &= -n <= i < n
            want.add(i % n)
    if ok:
        assert parse_layers(spec, n_layers=n) == sorted(want)
    else:
        with pytest.raises(ValueprobeError):
            parse_layers(spec, n_layers=n)


def test_layer_ranges_and_choice():
    assert layer_ranges([5, 0, 1, 2]) == "0..2, 5"
    assert choice(Site, "resid_pre", what="site") is Site.resid_pre
    with pytest.raises(ValueprobeError, match="unknown site 'resid_mid': use one of resid_pre, resid_post"):
        choice(Site, "resid_mid", what="site")
