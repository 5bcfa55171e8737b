"""The one pad helper (`valueprobe.hooks.padding`) against its contract, on arbitrary rows.

Run: ``python -m pytest -q tests/test_padding.py``
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given
from hypothesis import strategies as st

from valueprobe.hooks.padding import pad_id_for, pad_rows

ROWS = st.lists(st.lists(st.integers(0, 50_000), min_size=1, max_size=12), min_size=1, max_size=6)


@given(rows=ROWS, pad=st.integers(0, 9), side=st.sampled_from(["left", "right"]))
def test_each_row_comes_back_whole_on_its_side(rows, pad, side):
    ids, mask = pad_rows(rows, pad_id=pad, side=side)
    width = max(len(r) for r in rows)
    assert ids.shape == mask.shape == (len(rows), width) and ids.dtype == mask.dtype == torch.long
    for i, r in enumerate(rows):
        assert ids[i][mask[i] == 1].tolist() == r  # the row, in order, where the mask is 1
        assert (ids[i][mask[i] == 0] == pad).all()
        real = torch.nonzero(mask[i]).flatten().tolist()
        assert real == (list(range(width - len(r), width)) if side == "left" else list(range(len(r))))


def test_pad_id_falls_back_to_eos_then_zero():
    assert pad_id_for(SimpleNamespace(pad_token_id=3, eos_token_id=7)) == 3
    assert pad_id_for(SimpleNamespace(pad_token_id=0, eos_token_id=7)) == 0  # 0 is a pad id, not "none"
    assert pad_id_for(SimpleNamespace(pad_token_id=None, eos_token_id=7)) == 7
    assert pad_id_for(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0
    assert pad_id_for(None) == 0  # a model wrapped without a tokenizer
