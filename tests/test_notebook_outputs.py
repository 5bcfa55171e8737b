"""The committed notebooks carry the outputs of a real run, figures as PNG, each file under 1 MB.

A reader on the web sees what the notebook printed and drew; ``python docs/run_notebooks.py`` writes
these outputs, and ``tests/test_notebooks.py`` re-executes the code (slow).
"""

from __future__ import annotations

import base64
import json

import pytest
from test_notebooks import EXPECTED, NOTEBOOKS

MAX_BYTES = 1_000_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _code_cells(path) -> list[dict]:
    return [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_executed_and_small(path):
    assert path.stat().st_size < MAX_BYTES, f"{path.name} is {path.stat().st_size} bytes"
    cells = _code_cells(path)
    # every cell ran, once, in order, and none failed
    assert [c["execution_count"] for c in cells] == list(range(1, len(cells) + 1))
    for cell in cells:
        assert cell["outputs"], f"{path.name}: a cell has no output:\n{_source(cell)[:200]}"
        assert not [o for o in cell["outputs"] if o["output_type"] == "error"]
    printed = "".join("".join(o["text"]) for c in cells for o in c["outputs"] if o["output_type"] == "stream")
    for expected in EXPECTED[path.name]:
        assert expected in printed, f"{path.name}'s saved output does not show {expected!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_figure_is_saved_as_a_png(path):
    shows = [c for c in _code_cells(path) if ".show()" in _source(c)]
    assert shows, f"{path.name} draws no figure"
    for cell in shows:
        pngs = [o["data"]["image/png"] for o in cell["outputs"] if "image/png" in o.get("data", {})]
        assert len(pngs) == _source(cell).count(".show()"), f"{path.name}: a figure has no PNG"
        for png in pngs:
            raw = base64.b64decode("".join(png))
            assert raw.startswith(PNG_MAGIC) and len(raw) > 2_000  # a real image, not an empty frame
