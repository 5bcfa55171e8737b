"""Execute the notebooks in place and keep their outputs, figures included, so that a reader on the web sees them.

    flock /tmp/vp-heavy.lock python docs/run_notebooks.py                     # every notebooks/*.ipynb
    python docs/run_notebooks.py notebooks/02_steering.ipynb                  # one

Runs each notebook top to bottom with nbclient (the default model, offline, as in
``tests/test_notebooks.py``), with plotly's ``plotly_mimetype`` renderer so that ``fig.show()`` stores the
figure's JSON and not a copy of plotly.js. Each figure is then drawn once in headless Chromium
(:func:`valueprobe.report.browser.open_report`, offline) and its PNG is added beside the JSON: web
viewers show the PNG, Jupyter the interactive figure. A figure's JSON is dropped, leaving the PNG, when
the notebook would otherwise pass ``MAX_BYTES``. Execution timestamps and stderr (progress bars,
library warnings) are not kept, so that a rerun changes only what the notebook computed. CI re-executes the notebooks from their code; these outputs
are for reading.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from plotly.offline import get_plotlyjs

from valueprobe.report.browser import open_report

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 1_000_000  # per notebook, as tests/test_notebook_outputs.py checks
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8">
<style>body {{ margin: 0; background: white; }}</style><script>{plotlyjs}</script></head><body>
<div id="fig" class="plotly-graph-div" style="width:{w}px;height:{h}px"></div>
<script>const f = {spec}; Plotly.newPlot("fig", f.data, f.layout, {{staticPlot: true}});</script>
</body></html>"""


def figure_png(spec: dict, *, width: int = 1000, height: int = 450) -> bytes:
    """A PNG of one plotly figure (its JSON), drawn by plotly.js in headless Chromium at its own size."""
    layout = spec.get("layout", {})
    w, h = int(layout.get("width") or width), int(layout.get("height") or height)
    with tempfile.TemporaryDirectory() as tmp:
        page, png = Path(tmp) / "fig.html", Path(tmp) / "fig.png"
        page.write_text(
            _PAGE.format(plotlyjs=get_plotlyjs(), w=w, h=h, spec=json.dumps(spec).replace("</", "<\\/")),
            encoding="utf-8",
        )
        check = open_report(page, screenshot=png, width=w, height=h)
        if not check.ok:
            sys.exit(f"a figure did not draw: {check.problems()}")
        return _quantize(png.read_bytes())


def _quantize(png: bytes) -> bytes:
    """A 256-colour palette PNG (plots are mostly flat colour), if Pillow is installed; else as is."""
    try:
        from PIL import Image  # optional: only shrinks the file
    except ImportError:
        return png
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue() if out.tell() < len(png) else png


def run(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype"  # the kernel inherits it: figures as JSON only
    # progress bars are clutter to a reader: with ipywidgets installed tqdm draws them as widgets
    # (kept as outputs), not on stderr (dropped below)
    os.environ["TQDM_DISABLE"] = "1"
    NotebookClient(
        nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    figures = []
    # a widget (vp.explore's slider) lives in a running kernel only: a saved notebook keeps the
    # HTML beside it, and no widget state, whose viewer would be fetched from a CDN
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":  # stderr is progress bars and library warnings: clutter to a reader
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
            # a widget with no static form (a progress bar drawn as one) leaves nothing to read
            cell.outputs = [
                o
                for o in cell.outputs
                if not (WIDGET in o.get("data", {}) and set(o.data) <= {WIDGET, "text/plain"})
            ]
            for out in cell.outputs:
                out.get("data", {}).pop(WIDGET, None)
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                sys.exit(f"{path.name}: a cell failed: {out.ename}: {out.evalue}")
            if PLOTLY in out.get("data", {}):
                spec = out.data[PLOTLY]
                out.data["image/png"] = base64.b64encode(figure_png(spec)).decode()
                title = spec.get("layout", {}).get("title", "Figure")
                out.data["text/plain"] = html.unescape(
                    str(title.get("text", "Figure") if isinstance(title, dict) else title)
                )
                figures.append(out)
    for out in sorted(figures, key=lambda o: -len(json.dumps(o.data[PLOTLY]))):
        if len(nbformat.writes(nb).encode()) <= MAX_BYTES:
            break
        del out.data[PLOTLY]  # the largest interactive copy goes first; its PNG stays
    text = nbformat.writes(nb)
    if len(text.encode()) > MAX_BYTES:
        sys.exit(f"{path.name} is {len(text.encode())} bytes with its outputs (> {MAX_BYTES})")
    path.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: {len(text.encode()) // 1000} kB, {len(figures)} figures")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    args = ap.parse_args()
    for path in args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb")):
        run(path.resolve())


if __name__ == "__main__":
    main()
