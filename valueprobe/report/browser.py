"""Open a report in headless Chromium over the DevTools protocol: did every figure draw, offline?

    from valueprobe.report.browser import open_report
    check = open_report("runs/demo/report.html", screenshot="docs/report.png")
    assert check.ok, check.problems()

Drives Debian's ``chromium`` (``apt-get install chromium``) directly through its DevTools
websocket, so nothing is downloaded: no browser bundle, no driver. It records console errors,
uncaught exceptions and every request whose scheme is not ``file:``/``data:``/``blob:``/``about:``
(a report must open with no network), then checks that each plotly div drew its ``.main-svg``.
Used by ``tests/test_report_browser.py`` and ``docs/make_screenshot.py``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from valueprobe.errors import ValueprobeError

__all__ = ["CHROMIUM_FLAGS", "BrowserCheck", "find_chromium", "open_report"]

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
)  # fmt: skip
_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome:", "devtools:")
_FIGURES_JS = """(() => {
  const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
  return {n: divs.length, drawn: divs.filter(d => d.querySelector('.main-svg')).length,
          ready: document.readyState, height: document.documentElement.scrollHeight};
})()"""


@dataclass
class BrowserCheck:
    """What the browser saw: figures present and drawn, console errors, network requests."""

    n_figures: int = 0
    n_drawn: int = 0
    console_errors: list[str] = field(default_factory=list)
    network_requests: list[str] = field(default_factory=list)
    page_height: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.n_figures > 0
            and self.n_drawn == self.n_figures
            and not self.console_errors
            and not (self.network_requests)
        )

    def problems(self) -> str:
        return (
            f"{self.n_drawn}/{self.n_figures} figures drew; console errors: {self.console_errors};"
            f" network requests: {self.network_requests}"
        )


def find_chromium() -> str:
    """Path of the Chromium binary: $VALUEPROBE_CHROMIUM, else chromium / chromium-browser on PATH."""
    for name in (os.environ.get("VALUEPROBE_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    raise ValueprobeError("no Chromium found: `apt-get install chromium` or set VALUEPROBE_CHROMIUM")


class _DevTools:
    """A minimal synchronous DevTools client: commands by id, events buffered in order."""

    def __init__(self, ws_url: str) -> None:
        import websocket  # optional dependency (test extra): only the browser check needs it

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, **params: object) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"DevTools {method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def evaluate(self, expression: str) -> object:
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def close(self) -> None:
        self.ws.close()


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout: float) -> int:
    """Chromium writes its chosen debugging port to DevToolsActivePort in the profile folder."""
    deadline = time.monotonic() + timeout
    port_file = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited early with status {proc.returncode}")
        if port_file.is_file() and (lines := port_file.read_text().split()):
            return int(lines[0])
        time.sleep(0.1)
    raise RuntimeError(f"chromium did not open its DevTools port within {timeout:.0f}s")


def open_report(
    path: str | Path,
    *,
    screenshot: str | Path | None = None,
    width: int = 1200,
    height: int | None = 1500,
    timeout: float = 60.0,
) -> BrowserCheck:
    """Load ``path`` in headless Chromium, wait for the figures, and report what happened.

    Args:
        path: the HTML file to open (as a file:// URL).
        screenshot: write a PNG of the page's top ``height`` pixels here (the whole page if ``height=None``).
        width: viewport width in CSS pixels.
        timeout: seconds to wait for the browser and for the figures to draw.
    """
    url = Path(path).resolve().as_uri()
    check = BrowserCheck()
    # Chromium's helper processes may still write the profile while it exits: cleanup is best effort.
    with tempfile.TemporaryDirectory(prefix="valueprobe-chromium-", ignore_cleanup_errors=True) as profile:
        cmd = [
            find_chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={width},{height or 1500}",
            "about:blank",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = _devtools_port(Path(profile), proc, timeout)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                targets = json.load(resp)
            page = next(t for t in targets if t.get("type") == "page")
            dt = _DevTools(page["webSocketDebuggerUrl"])
            try:
                for domain in ("Runtime", "Log", "Network", "Page"):
                    dt.send(f"{domain}.enable")
                dt.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=height or 1500,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                dt.send("Page.navigate", url=url)
                deadline = time.monotonic() + timeout
                state: dict = {}
                while time.monotonic() < deadline:
                    got = dt.evaluate(_FIGURES_JS)
                    state = got if isinstance(got, dict) else {}
                    if state.get("ready") == "complete" and state.get("drawn", 0) == state.get("n", -1):
                        break
                    time.sleep(0.2)
                time.sleep(0.5)  # let late console messages and requests arrive
                dt.evaluate("1")
                check.n_figures, check.n_drawn = int(state.get("n", 0)), int(state.get("drawn", 0))
                check.page_height = int(state.get("height", 0))
                if screenshot is not None:
                    shot_h = check.page_height if height is None else min(height, check.page_height)
                    clip = {"x": 0, "y": 0, "width": width, "height": shot_h, "scale": 1}
                    png = dt.send(
                        "Page.captureScreenshot",
                        format="png",
                        clip=clip,
                        captureBeyondViewport=height is None,
                    )["data"]
                    Path(screenshot).write_bytes(base64.b64decode(png))
                _collect(dt.events, check)
            finally:
                dt.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return check


def _collect(events: list[dict], check: BrowserCheck) -> None:
    for ev in events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            check.console_errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            )
        elif method == "Runtime.exceptionThrown":
            check.console_errors.append(p["exceptionDetails"].get("text", "exception"))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            check.console_errors.append(p["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            req = p["request"]["url"]
            if not req.startswith(_LOCAL_SCHEMES):
                check.network_requests.append(req)
