"""Render the screenshots shown in the README (docs/report.png, docs/workbench.png), in headless Chromium.

    python docs/make_screenshot.py --from runs/demo          # after `valueprobe demo`
    python docs/make_screenshot.py --from probes/smollm2-135m-value
    python docs/make_screenshot.py --workbench               # the page of `valueprobe explore`

Rebuilds report.html from the saved results into a temporary folder, opens it with
:func:`valueprobe.report.browser.open_report` (which also checks every figure drew, offline), and keeps
the top of the page as an 8-bit palette PNG under 300 kB. ``--workbench`` serves the default model
with the shipped value axis on a free loopback port (``valueprobe explore``'s app, in this process),
types a prompt, moves α, clicks a steered token and shoots the page; any console error, failed
request or request elsewhere stops it.
"""

from __future__ import annotations

import argparse
import io
import json
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
    ap.add_argument("--workbench", action="store_true", help="shoot the workbench page (docs/workbench.png)")
    args = ap.parse_args()
    if args.workbench:
        out = Path(__file__).with_name("workbench.png") if args.out.endswith("report.png") else Path(args.out)
        data = _quantize(workbench_png(height=min(args.height, 960)))
        if len(data) > MAX_BYTES:
            sys.exit(f"screenshot is {len(data)} bytes (> {MAX_BYTES}); lower --height")
        out.write_bytes(data)
        print(f"wrote {out} ({len(data) // 1000} kB)")
        return
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


def workbench_png(*, height: int, prompt: str = "Is 91 a prime number?", alpha: float = 2.0) -> bytes:
    """The workbench on the default model and the shipped value axis, after one prompt, a slider
    move to ``alpha`` and a click on a steered token: a PNG of the page's top ``height`` pixels."""
    import threading

    import uvicorn  # the serve extra: only this mode needs it

    from valueprobe.model.load import load
    from valueprobe.report.browser import Browser
    from valueprobe.serve.app import bind, build_app
    from valueprobe.serve.hf_engine import HFEngine
    from valueprobe.serve.limits import Limits
    from valueprobe.steering.hook.spec import SteeringSpec

    spec = SteeringSpec(probe="smollm2-135m-value").check()
    lm = load("smollm2-135m")
    spec.first_axis().check(lm)
    sock = bind("127.0.0.1", 0)
    root = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(HFEngine(lm, model="smollm2-135m"), Limits("smollm2-135m", spec)), log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        with Browser(width=1300, height=height, allowed=(f"{root}/",)) as b:
            b.open(f"{root}/")
            b.wait_for("document.body && document.body.dataset.ready === '1'", timeout=120)
            b.evaluate(f"document.getElementById('prompt').value = {json.dumps(prompt)}")
            b.evaluate("document.getElementById('max-tokens').value = '40'")
            b.evaluate("document.getElementById('send').click()")
            done = "['steered','unsteered','random'].every(c => state.columns[c] && state.columns[c].done)"
            b.wait_for(done, timeout=600)
            b.evaluate(
                f"(() => {{ const s = document.getElementById('alpha'); s.value = '{alpha}';"
                " s.dispatchEvent(new Event('input', {bubbles: true})); })()"
            )
            b.wait_for(f"{done} && state.columns.steered.body.steering.alpha === {alpha}", timeout=600)
            b.evaluate(
                "(() => { const t = document.querySelectorAll('#col-steered .tok'); t[Math.min(6, t.length - 1)].click(); })()"
            )
            b.wait_for("document.getElementById('lens').textContent", timeout=120)
            with tempfile.TemporaryDirectory() as tmp:
                png = b.screenshot(Path(tmp) / "workbench.png", height=height).read_bytes()
            check = b.check()
        if check.console_errors or check.network_requests or check.failed_requests:
            sys.exit(f"the workbench did not run cleanly: {check.problems()}")
        return png
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


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
