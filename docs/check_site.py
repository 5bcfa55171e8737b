"""Check the built site opens from file:// in headless Chromium, every link a file that exists.

    mkdocs build --strict && python docs/check_site.py site        (.ci/docs runs it)

Two checks. Every relative ``href`` and ``src`` of every page names a file inside the site (with
``use_directory_urls: false`` no link may end in a folder, which a browser shows as a listing or
not at all from file://). Then Chromium opens ``index.html`` and a guide page through ``file://``
(`valueprobe.report.browser.open_report`: console errors, uncaught exceptions, any request that
leaves the machine; the theme's search is the one thing that needs a server) and must find the
Quickstart link in the page it drew.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from valueprobe.report.browser import open_report

LINK = re.compile(r"""(?:href|src)="([^"]+)\"""")


def broken_links(site: Path) -> list[str]:
    """``page: link`` for each relative link that does not name a file of the site."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":  # a server's page: its links are from the site's root
            continue
        for link in LINK.findall(page.read_text(encoding="utf-8", errors="replace")):
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or not parts.path or link.startswith(("#", "mailto:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                bad.append(f"{page.relative_to(site)}: {link}")
    return bad


def main(site: Path) -> int:
    problems = broken_links(site)
    for page in (site / "index.html", site / "guide" / "quickstart.html"):
        check = open_report(page)
        where = page.relative_to(site)
        # the theme's search loads its index from a worker, which file:// forbids: search needs a
        # server (README: python -m http.server --directory site); everything else must load
        errors = [e for e in check.console_errors if "search" not in e and "ERR_FILE_NOT_FOUND" not in e]
        problems += [f"{where}: console error {e}" for e in errors]
        problems += [f"{where}: a request off the machine, {r}" for r in check.network_requests]
        if check.page_height < 200:
            problems.append(f"{where}: the page drew {check.page_height} px")
    home = (site / "index.html").read_text(encoding="utf-8")
    if 'href="guide/quickstart.html"' not in home:
        problems.append("index.html: no link to guide/quickstart.html")
    for line in problems[:20]:
        print(line)
    print(f"site {site}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "site")))
