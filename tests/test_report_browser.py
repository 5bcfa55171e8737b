"""report.html in a real browser (Debian's headless Chromium): every figure draws, no console error, no network.

The harness itself is checked on pages built to fail each way, so a broken check cannot pass.
Without Chromium these tests skip, unless VALUEPROBE_REQUIRE_BROWSER=1 (``.ci/run`` sets it and installs it).
"""

from __future__ import annotations

import os
import shutil

import pytest
from report_data import all_sections

from valueprobe.report.browser import open_report
from valueprobe.report.page import Results, write_report

HAVE_CHROMIUM = bool(
    shutil.which("chromium") or shutil.which("chromium-browser") or os.environ.get("VALUEPROBE_CHROMIUM")
)
pytestmark = pytest.mark.skipif(
    not HAVE_CHROMIUM and os.environ.get("VALUEPROBE_REQUIRE_BROWSER") != "1",
    reason="no chromium (apt-get install chromium)",
)


def test_report_draws_every_figure_offline(tmp_path):
    path = write_report(Results.from_dict(all_sections()), tmp_path / "report.html")
    shot = tmp_path / "report.png"
    check = open_report(path, screenshot=shot, height=900)
    # one per section figure in tests/report_data.py, the guide budget, the 9 of attribution, CAA's and the
    # audit's 3 (the 2×2's effects and cells, the lens's effects) included
    assert check.n_figures == 24
    assert check.ok, check.problems()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _write(tmp_path, body: str):
    path = tmp_path / "page.html"
    path.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>")
    return path


def _page(tmp_path, body: str):
    return open_report(_write(tmp_path, body), timeout=15)


def test_harness_sees_console_errors(tmp_path):
    check = _page(
        tmp_path,
        '<div class="plotly-graph-div"><svg class="main-svg"></svg></div>'
        "<script>console.error('boom')</script>",
    )
    assert check.n_drawn == 1 and check.console_errors == ["boom"] and not check.ok


def test_harness_sees_uncaught_exceptions(tmp_path):
    check = _page(
        tmp_path,
        '<div class="plotly-graph-div"><svg class="main-svg"></svg></div>'
        "<script>undefinedFunction()</script>",
    )
    assert check.console_errors and not check.ok


def test_harness_sees_network_requests(tmp_path):
    # 192.0.2.0/24 is TEST-NET-1: never routed, so the request is attempted and recorded, never answered.
    check = _page(
        tmp_path,
        '<div class="plotly-graph-div"><svg class="main-svg"></svg></div><img src="http://192.0.2.1/x.png">',
    )
    assert check.network_requests == ["http://192.0.2.1/x.png"] and not check.ok


def test_harness_sees_an_undrawn_figure(tmp_path):
    check = open_report(_write(tmp_path, '<div class="plotly-graph-div"></div>'), timeout=4)
    assert check.n_figures == 1 and check.n_drawn == 0 and not check.ok
