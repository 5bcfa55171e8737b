"""Open a report in headless Chromium over the DevTools protocol: did every figure draw, offline?

    from valueprobe.report.browser import open_report
    check = open_report("runs/demo/report.html", screenshot="docs/report.png")
    assert check.ok, check.problems()

Drives Debian's ``chromium`` (``apt-get install chromium``) directly through its DevTools
websocket, so nothing is downloaded: no browser bundle, no driver. It records console errors,
uncaught exceptions and every request whose scheme is not ``file:``/``data:``/``blob:``/``about:``
(a report must open with no network), then checks that each plotly div drew its ``.main-svg``.
Used by ``tests/test_report_browser.py`` and ``docs/make_screenshot.py``; `Browser` drives a
page step by step (the workbench's browser test and its screenshot).
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

__all__ = ["CHROMIUM_FLAGS", "Browser", "BrowserCheck", "find_chromium", "open_report"]

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
    failed_requests: list[str] = field(default_factory=list)  # the browser's own log of HTTP errors
    page_height: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.n_figures > 0
            and self.n_drawn == self.n_figures
            and not self.console_errors
            and not self.network_requests
            and not self.failed_requests
        )

    def problems(self) -> str:
        return (
            f"{self.n_drawn}/{self.n_figures} figures drew; console errors: {self.console_errors};"
            f" network requests: {self.network_requests}; failed requests: {self.failed_requests}"
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


class Browser:
    """Headless Chromium driven over DevTools: a page to open, script to run in it, and what it
    did (console errors, uncaught exceptions, requests beyond ``allowed``), for pages that need
    more than a load (the workbench's browser test and screenshot).

    >>> with Browser(allowed=("http://127.0.0.1:8000/",)) as b:
    ...     b.open("http://127.0.0.1:8000/")
    ...     b.wait_for("document.body.dataset.ready === '1'")
    ...     b.evaluate("document.title"), b.check().console_errors

    Args:
        width, height: the viewport in CSS pixels.
        allowed: URL prefixes the page may request besides ``file:``, ``data:``, ``blob:`` and
            ``about:`` (every other request is recorded as a problem).
        timeout: seconds to wait for the browser to start.
    """

    def __init__(
        self, *, width: int = 1200, height: int = 1500, allowed: tuple[str, ...] = (), timeout: float = 60.0
    ) -> None:
        self.width, self.height, self.allowed, self.timeout = width, height, allowed, timeout
        self._profile = tempfile.TemporaryDirectory(prefix="valueprobe-chromium-", ignore_cleanup_errors=True)
        self._proc: subprocess.Popen | None = None
        self.dt: _DevTools | None = None

    def __enter__(self) -> Browser:
        profile = self._profile.name
        cmd = [
            find_chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = _devtools_port(Path(profile), self._proc, self.timeout)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                targets = json.load(resp)
            page = next(t for t in targets if t.get("type") == "page")
            self.dt = _DevTools(page["webSocketDebuggerUrl"])
            for domain in ("Runtime", "Log", "Network", "Page"):
                self.dt.send(f"{domain}.enable")
            self.dt.send(
                "Emulation.setDeviceMetricsOverride",
                width=self.width,
                height=self.height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.dt is not None:
            self.dt.close()
            self.dt = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
        # Chromium's helper processes may still write the profile while it exits: cleanup is best effort.
        self._profile.cleanup()

    def _tools(self) -> _DevTools:
        if self.dt is None:
            raise RuntimeError("the browser is not open: use Browser(...) as a context manager")
        return self.dt

    def add_init_script(self, source: str) -> None:
        """Run ``source`` in every document this page opens from now on, before the page's own
        scripts (a test's instrument, such as a copy of every response the page reads)."""
        self._tools().send("Page.addScriptToEvaluateOnNewDocument", source=source)

    def open(self, url: str) -> None:
        """Navigate to ``url`` (returns once the navigation is sent; `wait_for` what must be there)."""
        self._tools().send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (promises awaited)."""
        got = self._tools().send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression[:80]!r} threw: {got['exceptionDetails'].get('text')}")
        return got["result"].get("value")

    def wait_for(self, predicate: str, *, timeout: float = 30.0, every: float = 0.1) -> object:
        """Poll the JavaScript ``predicate`` until it is truthy; its value (a TimeoutError past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.evaluate(predicate)
            except RuntimeError:  # the page is between documents (a navigation), or not ready yet
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {predicate!r}")
            time.sleep(every)

    def screenshot(self, path: str | Path, *, height: int | None = None) -> Path:
        """A PNG of the page's top ``height`` CSS pixels (the whole page when None)."""
        got = self.evaluate("document.documentElement.scrollHeight")
        full = int(got) if isinstance(got, int | float) else self.height
        shot_h = full if height is None else min(height, full)
        clip = {"x": 0, "y": 0, "width": self.width, "height": shot_h, "scale": 1}
        png = self._tools().send(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=height is None
        )["data"]
        Path(path).write_bytes(base64.b64decode(png))
        return Path(path)

    def check(self) -> BrowserCheck:
        """What the page did so far: console errors, uncaught exceptions, requests beyond ``allowed``."""
        self.evaluate("1")  # flush the events that arrived before this call
        check = BrowserCheck()
        _collect(self._tools().events, check, allowed=self.allowed)
        return check


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
    with Browser(width=width, height=height or 1500, timeout=timeout) as browser:
        browser.open(url)
        deadline = time.monotonic() + timeout
        state: dict = {}
        while time.monotonic() < deadline:
            try:
                got = browser.evaluate(_FIGURES_JS)
            except RuntimeError:  # between documents while the page loads
                got = None
            state = got if isinstance(got, dict) else {}
            if state.get("ready") == "complete" and state.get("drawn", 0) == state.get("n", -1):
                break
            time.sleep(0.2)
        time.sleep(0.5)  # let late console messages and requests arrive
        check = browser.check()
        check.n_figures, check.n_drawn = int(state.get("n", 0)), int(state.get("drawn", 0))
        check.page_height = int(state.get("height", 0))
        if screenshot is not None:
            browser.screenshot(screenshot, height=height)
    return check


def _collect(events: list[dict], check: BrowserCheck, *, allowed: tuple[str, ...] = ()) -> None:
    for ev in events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            check.console_errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            )
        elif method == "Runtime.exceptionThrown":
            check.console_errors.append(p["exceptionDetails"].get("text", "exception"))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            entry = p["entry"]
            # a response with an error status is the network's entry; anything else is the page's
            kind = check.failed_requests if entry.get("source") == "network" else check.console_errors
            kind.append(entry.get("text", "") + (f" ({entry['url']})" if entry.get("url") else ""))
        elif method == "Network.requestWillBeSent":
            req = p["request"]["url"]
            if not req.startswith(_LOCAL_SCHEMES + allowed):
                check.network_requests.append(req)
