"""Render the report screenshot shown in the README (docs/report.png), in headless Chromium.

    python docs/make_screenshot.py --from runs/demo          # after `valueprobe demo`
    python docs/make_screenshot.py --from probes/smollm2-135m-value

Rebuilds report.html from the saved results into a temporary folder, opens it with
:func:`valueprobe.report.browser.open_report` (which also checks every figure drew, offline), and keeps
the top of the page as an 8-bit palette PNG under 300 kB.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

from valueprobe.report.browser import open_report
from valueprobe.report.page import load_results, write_report

MAX_BYTES = 300_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", default="runs/demo", help="results folder or probe folder")
    ap.add_argument("--out", default=str(Path(__file__).with_name("report.png")))
    ap.add_argument("--height", type=int, default=1500, help="CSS pixels from the top of the page")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        page = write_report(load_results(args.src), Path(tmp) / "report.html")
        raw = Path(tmp) / "raw.png"
        check = open_report(page, screenshot=raw, height=args.height)
        if not check.ok:
            sys.exit(f"report did not render cleanly: {check.problems()}")
        data = raw.read_bytes()
    data = _quantize(data)
    if len(data) > MAX_BYTES:
        sys.exit(f"screenshot is {len(data)} bytes (> {MAX_BYTES}); lower --height")
    Path(args.out).write_bytes(data)
    print(f"wrote {args.out} ({len(data) // 1000} kB, {check.n_figures} figures drew)")


def _quantize(png: bytes) -> bytes:
    """A 256-colour palette PNG (plots are mostly flat colour), if Pillow is installed; else as is."""
    try:
        from PIL import Image  # optional: only shrinks the file
    except ImportError:
        return png
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue() if out.tell() < len(png) else png


if __name__ == "__main__":
    main()
